"""Ahead-of-time compilation of one training iteration for a TPU topology, on any host.

`compile_iteration(config, "v5e:2x4")` builds the topology's abstract devices (libtpu's
compile-only client, jax.experimental.topologies), a (data, fsdp, tensor) mesh from the
config, abstract parameters (jax.eval_shape of the model init, no weights) and abstract batches
(ShapeDtypeStruct with NamedSharding), lowers and compiles every jitted function one iteration
of cooper_jax.train runs, and reports per-device memory (XLA's buffer assignment), what stays
resident on the chip while each function runs, analytic FLOPs and HBM bytes and a roofline time.
cooper_jax/cli/aot.py is the command line.

Modules: models (the table of known Hugging Face architectures, abstract params / states /
batches), topology (libtpu topologies, published chip peaks, usable HBM, OOM parsing), cost
(analytic FLOPs and bytes: XLA's cost_analysis counts a loop body once, so its figure is one
layer / one decode step; the raw XLA figures are kept as xla_flops, xla_bytes), functions (the
iteration's jitted functions as train.py builds them) and report (compile, measure, fits).
"""

from cooper_jax.aot.cost import (
  Cost,
  forward_bytes,
  forward_flops,
  sampler_flops,
  shared_forward_flops,
  train_flops,
)
from cooper_jax.aot.functions import FUNCTIONS, FnSpec, build_functions
from cooper_jax.aot.models import (
  KNOWN_HF_CONFIGS,
  ConfigError,
  abstract_batch,
  abstract_params,
  abstract_state,
  assistant_config,
  device_bytes,
  hf_config_for,
  model_config,
)
from cooper_jax.aot.report import FnResult, Report, compile_iteration
from cooper_jax.aot.topology import (
  CHIP_PEAKS,
  GIB,
  TopologyError,
  count_chips,
  get_topology,
  parse_oom,
  usable_hbm_bytes,
)

__all__ = [
  "CHIP_PEAKS",
  "FUNCTIONS",
  "GIB",
  "KNOWN_HF_CONFIGS",
  "ConfigError",
  "Cost",
  "FnResult",
  "FnSpec",
  "Report",
  "TopologyError",
  "abstract_batch",
  "abstract_params",
  "abstract_state",
  "assistant_config",
  "build_functions",
  "compile_iteration",
  "count_chips",
  "device_bytes",
  "forward_bytes",
  "forward_flops",
  "get_topology",
  "hf_config_for",
  "model_config",
  "parse_oom",
  "sampler_flops",
  "shared_forward_flops",
  "train_flops",
  "usable_hbm_bytes",
]
