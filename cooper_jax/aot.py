"""Ahead-of-time compilation of one training iteration for a TPU topology, on any host.

`compile_iteration(config, "v5e:2x4")` builds the topology's abstract devices (libtpu's
compile-only client, jax.experimental.topologies), a (data, fsdp, tensor) mesh from the
config, abstract parameters (jax.eval_shape of the model init, no weights) and abstract batches
(ShapeDtypeStruct with NamedSharding), lowers and compiles every jitted function one iteration
of cooper_jax.train runs, and reports per-device memory (XLA's buffer assignment), what stays
resident on the chip while each function runs, analytic FLOPs and HBM bytes and a roofline time.
tools/aot_compile.py is the command line.

FLOPs are counted analytically, not read from cost_analysis(): XLA counts the body of a loop
once (the layer scan, the decode while_loop, a micro-batch scan), so its figure is one layer /
one decode step. The raw XLA figures are kept in the result (xla_flops, xla_bytes) for reference.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from cooper_jax import config as config_lib
from cooper_jax import optim, sharding, steps
from cooper_jax.host_platform import allow_shared_libtpu
from cooper_jax.models.config import ModelConfig, from_hf_config
from cooper_jax.models.transformer import init_params

GIB = 1024**3

# Published per-chip peaks (dense bf16 matmul FLOP/s, HBM bandwidth B/s, HBM capacity bytes), from
# Google Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e).
# The capacity here is only a fallback: the usable HBM per device is asked of the compiler
# (`usable_hbm_bytes`), which reserves some (v5e: 15.75 of 16 GiB).
# Keyed by jax's device_kind. A topology's device may be a TensorCore rather than a chip (v4 in
# libtpu's compile-only topologies: 2 devices per chip, 8 for v4:2x2x1), so per-device peaks are
# these divided by devices-per-chip, counted from the devices' chip coordinates.
CHIP_PEAKS = {
  "TPU v4": dict(flops=275e12, hbm_bw=1.2e12, hbm=32 * GIB, source="cloud.google.com/tpu/docs/v4"),
  "TPU v5 lite": dict(
    flops=197e12, hbm_bw=819e9, hbm=16 * GIB, source="cloud.google.com/tpu/docs/v5e"
  ),
  "TPU v5": dict(
    flops=459e12, hbm_bw=2.76e12, hbm=95 * GIB, source="cloud.google.com/tpu/docs/v5p"
  ),
  "TPU v6 lite": dict(
    flops=918e12, hbm_bw=1.64e12, hbm=32 * GIB, source="cloud.google.com/tpu/docs/v6e"
  ),
}

# config.json fields of the Hugging Face models the paper's configs name (no weights here).
# Lookup is by hub id or its last path part, case-insensitive; a directory with a config.json
# is read instead. The embedded SmolLM2 is here so the small configs compile too.
_QWEN25_15B = dict(
  architectures=["Qwen2ForCausalLM"],
  model_type="qwen2",
  hidden_size=1536,
  intermediate_size=8960,
  num_hidden_layers=28,
  num_attention_heads=12,
  num_key_value_heads=2,
  vocab_size=151936,
  rms_norm_eps=1e-6,
  tie_word_embeddings=True,
  bos_token_id=151643,
  eos_token_id=151645,
)
KNOWN_HF_CONFIGS: dict[str, dict[str, Any]] = {
  "Qwen/Qwen2.5-1.5B-Instruct": dict(
    _QWEN25_15B, rope_theta=1000000.0, max_position_embeddings=32768
  ),
  "Qwen/Qwen2.5-Math-1.5B": dict(
    _QWEN25_15B, rope_theta=10000.0, max_position_embeddings=4096, eos_token_id=151643
  ),
  "Qwen/Qwen2.5-Math-1.5B-Instruct": dict(
    _QWEN25_15B, rope_theta=10000.0, max_position_embeddings=4096
  ),
  "Qwen/Qwen2.5-7B-Instruct": dict(
    _QWEN25_15B,
    hidden_size=3584,
    intermediate_size=18944,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
    rope_theta=1000000.0,
    max_position_embeddings=32768,
  ),
  "meta-llama/Llama-3.2-1B-Instruct": dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=128256,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=dict(
      factor=32.0,
      high_freq_factor=4.0,
      low_freq_factor=1.0,
      original_max_position_embeddings=8192,
      rope_type="llama3",
    ),
    max_position_embeddings=131072,
    tie_word_embeddings=True,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=128000,
    eos_token_id=[128001, 128008, 128009],
  ),
  "HuggingFaceTB/SmolLM2-135M-Instruct": dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
  ),
}
_ALIASES = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


class ConfigError(ValueError):
  """A config the tool cannot compile (unknown model, unmappable architecture, bad mesh)."""


class TopologyError(ValueError):
  """A topology name libtpu does not know."""


# ----------------------------------------------------------------------------------- models
def hf_config_for(source: str) -> dict[str, Any]:
  path = Path(source)
  if (path / "config.json").is_file():
    return json.loads((path / "config.json").read_text())
  key = _ALIASES.get(source.lower(), source)
  for name, hf in KNOWN_HF_CONFIGS.items():
    if key.lower() in (name.lower(), name.split("/")[-1].lower()):
      return hf
  raise ConfigError(
    f"model {source!r}: not a directory with a config.json and not a known architecture "
    f"({', '.join(KNOWN_HF_CONFIGS)})"
  )


def model_config(mc, head: str, *, overrides: bool = True) -> ModelConfig:
  """ModelConfig for a policy/rm sub-config, as train.load_model would build it.

  overrides=False gives the config load_pretrained builds without dtype overrides (the
  assistant: train.py loads it with ModelConfig's defaults, float32).
  """
  kw = dict(dtype=mc.dtype, param_dtype=mc.param_dtype, remat=mc.remat) if overrides else {}
  try:
    if getattr(mc, "model", None) == "random":
      return ModelConfig(**mc.random_model.to_dict(), head=head, **kw)
    return from_hf_config(hf_config_for(mc.model), **kw).replace(head=head)
  except ConfigError:
    raise
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"model {mc.model!r} cannot be mapped to a ModelConfig: {e}") from e


def abstract_params(cfg: ModelConfig, mesh) -> Any:
  shapes = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
  return _with_shardings(shapes, sharding.tree_shardings(shapes, mesh))


def _with_shardings(shapes, shardings):
  return jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
  )


def abstract_state(params, optimizer, mesh):
  shapes = jax.eval_shape(lambda p: steps.init_state(p, optimizer), params)
  return _with_shardings(shapes, sharding.tree_shardings(shapes, mesh))


def device_bytes(tree) -> int:
  """Bytes one device holds of an abstract pytree (its shard of every leaf)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize
  return total


def _batch(mesh, shapes: dict[str, tuple[tuple[int, ...], Any]]):
  return {
    k: jax.ShapeDtypeStruct(s, d, sharding=sharding.batch_sharding(mesh, len(s)))
    for k, (s, d) in shapes.items()
  }


# -------------------------------------------------------------------------------- topology
_LIBTPU_NOISE = re.compile(
  r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|host bounds|"
  r"Source Location Trace|libtpu_init_utils|^\s*$"
)


def _quiet_fd2(fn: Callable[[], Any]):
  """Runs fn with C-level stderr captured; replays what is not libtpu's CPU-host noise (it
  warns that TPU_ACCELERATOR_TYPE etc. are unset, which is expected when compiling only)."""
  with tempfile.TemporaryFile(mode="w+b") as tmp:
    saved = os.dup(2)
    os.dup2(tmp.fileno(), 2)
    try:
      return fn()
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      for line in tmp.read().decode(errors="replace").splitlines():
        if not _LIBTPU_NOISE.search(line):
          os.write(2, (line + "\n").encode())


def get_topology(name: str):
  allow_shared_libtpu()
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  try:
    return _quiet_fd2(lambda: topologies.get_topology_desc(platform="tpu", topology_name=name))
  except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError/ValueError variously
    raise TopologyError(
      f"topology {name!r} is not valid for libtpu ({e}); examples: v5e:2x4, v5e:4x4, "
      "v4:2x2x1, v4:2x2x2, v5p:2x2x1, v6e:2x2"
    ) from e


def count_chips(devices) -> int:
  return len({tuple(d.coords) for d in devices}) if hasattr(devices[0], "coords") else len(devices)


_SIZE_RE = r"([0-9.]+)\s*([KMGT]?)i?B?"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _size(num: str, unit: str) -> int:
  return int(float(num) * _UNITS[unit])


def parse_oom(message: str) -> tuple[int | None, int | None]:
  """(bytes required, bytes available) from a RESOURCE_EXHAUSTED compile error, or None."""
  m = re.search(
    rf"required for HLO temporaries \({_SIZE_RE}\) exceeds available HBM \({_SIZE_RE}\)", message
  )
  if m:
    return _size(m[1], m[2]), _size(m[3], m[4])
  m = re.search(rf"Used {_SIZE_RE} of {_SIZE_RE} hbm", message)
  if m:
    return _size(m[1], m[2]), _size(m[3], m[4])
  m = re.search(_SIZE_RE.replace("?", "", 1), message)
  return (_size(m[1], m[2]), None) if m else (None, None)


def usable_hbm_bytes(devices) -> int | None:
  """HBM per device the compiler will use, read from the error of a program that cannot fit
  (a 1 TiB sort; compiles in well under a second)."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("x",))
  x = jax.ShapeDtypeStruct((len(devices),), jnp.float32, sharding=NamedSharding(mesh, jax.P("x")))

  def huge(x):
    y = jax.lax.broadcasted_iota(jnp.float32, (2**18, 2**20), 1) * x[0]
    return jnp.sort(y, axis=1)[:, :1]

  try:
    jax.jit(huge).lower(x).compile()
  except Exception as e:  # noqa: BLE001
    return parse_oom(str(e))[1]
  return None


# ---------------------------------------------------------------------------- analytic cost
def _layer_matmul_params(cfg: ModelConfig) -> int:
  return cfg.d_model * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * (
    cfg.d_model * cfg.d_ff
  )


def forward_flops(cfg: ModelConfig, rows: int, q_len: int, kv_len: int, head_tokens: int) -> int:
  """Matmul FLOPs of one forward: 2 per weight per token for q/k/v/o and the MLP, attention
  scores and mixing 4*q*kv*heads*head_dim per layer (this implementation computes every
  (query, slot) pair and masks, so no causal halving), the LM head on `head_tokens` positions
  (the score head's d FLOPs are negligible and left out). Norms, RoPE, softmax: left out."""
  layers = 2 * rows * q_len * cfg.n_layers * _layer_matmul_params(cfg)
  attn = 4 * rows * cfg.n_layers * q_len * kv_len * cfg.n_heads * cfg.head_dim
  head = 2 * rows * head_tokens * cfg.d_model * cfg.vocab_size if cfg.head == "lm" else 0
  return layers + attn + head


def train_flops(cfg: ModelConfig, rows: int, seq: int, head_tokens: int) -> int:
  """Forward + backward (2x forward) + the layers' forward once more under remat
  (nothing_saveable recomputes each block in the backward pass); the head is not remat'ed."""
  fwd = forward_flops(cfg, rows, seq, seq, head_tokens)
  layers_only = forward_flops(cfg.replace(head="score"), rows, seq, seq, 0)
  return 3 * fwd + (layers_only if cfg.remat else 0)


def sampler_flops(cfg: ModelConfig, rows: int, prompt: int, new: int) -> int:
  """Prefill (head on the last position) + max_new_tokens decode steps, each one token per row
  attending to all prompt+new cache slots and itself (an upper bound: the loop can stop early)."""
  return forward_flops(cfg, rows, prompt, prompt, 1) + new * forward_flops(
    cfg, rows, 1, prompt + new + 1, 1
  )


def _weight_bytes(cfg: ModelConfig) -> int:
  return cfg.num_params() * jnp.dtype(cfg.jnp_param_dtype).itemsize


def forward_bytes(
  cfg: ModelConfig, rows: int, q_len: int, kv_len: int, head_tokens: int, tensor: int
) -> float:
  """Estimated global HBM traffic of one forward (each large tensor written/read once per use).

  Weights: every device reads the whole (gathered) weight set once per pass, so weight bytes
  count once per device (divided by the tensor-parallel size), i.e. x n_devices/tensor globally.
  Activations per layer and token: ~12 d-wide and 2*(h+2k)*e q/k/v reads/writes, 5 f-wide (gate,
  up, product), in the compute dtype; attention scores materialise as [b, h, q, kv] float32
  (written, read by softmax) plus the probabilities in the compute dtype (written, read), per
  (query, slot) pair. Decode adds the KV-cache read (kv_len slots).
  LM-head logits [rows, head_tokens, v] float32 written and read twice (log-softmax).
  """
  a = jnp.dtype(cfg.jnp_dtype).itemsize
  tok = rows * q_len
  per_tok = (12 * cfg.d_model + 2 * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim) * a
  per_tok += 5 * cfg.d_ff * a
  scores = rows * cfg.n_heads * q_len * kv_len * (4 + 4 + a + a)
  kv_read = rows * kv_len * 2 * cfg.n_kv_heads * cfg.head_dim * a if q_len == 1 else 0
  acts = cfg.n_layers * (tok * per_tok + scores + kv_read)
  logits = 3 * rows * head_tokens * cfg.vocab_size * 4 if cfg.head == "lm" else 0
  return acts + logits


@dataclasses.dataclass
class Cost:
  flops: float  # global, one call
  bytes: float  # per device, one call


def _per_device(total_acts: float, weights: float, n_dev: int, tensor: int, passes: float):
  return total_acts / n_dev + passes * weights / tensor


# ------------------------------------------------------------------------------- functions
@dataclasses.dataclass
class FnSpec:
  name: str
  lower: Callable[[], Any]  # -> jax.stages.Lowered
  persistent_arg_bytes: int  # per device: persistent buffers passed in (not counted twice)
  arg_bytes: int  # per-device argument bytes (used when the compile runs out of memory)
  cost: Cost
  calls: int = 1  # calls per training iteration


@dataclasses.dataclass
class FnResult:
  function: str
  topology: str
  chips: int
  devices: int
  calls: int
  hbm_gib: float
  argument_gib: float | None
  output_gib: float | None
  alias_gib: float | None
  temp_gib: float | None
  peak_gib: float
  resident_gib: float
  fits: bool
  flops: float  # per device, per iteration (all calls)
  bytes: float  # per device, per iteration
  roofline_s: float
  xla_flops: float | None = None  # raw cost_analysis (loop bodies counted once), one call
  xla_bytes: float | None = None
  xla_peak_gib: float | None = None
  error: str | None = None

  def row(self) -> dict:
    return dataclasses.asdict(self)


def _kw_if_accepted(fn, **kw):
  """Keyword args the (possibly older) steps.make_* function accepts; None values dropped."""
  params = inspect.signature(fn).parameters
  return {k: v for k, v in kw.items() if v is not None and k in params}


def _get(node, dotted: str, default=None):
  for part in dotted.split("."):
    if node is None or part not in node:
      return default
    node = node[part]
  return node


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def build_functions(c, mesh) -> tuple[list[FnSpec], dict[str, int]]:
  """The jitted functions of one iteration of train.Run.train_step, with abstract inputs, and
  the per-device bytes of each persistent buffer (states, frozen params)."""
  n_dev = mesh.devices.size
  tensor = mesh.shape["tensor"]
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  p_len, n_new = c.rollout.max_prompt_len, c.rollout.max_new_tokens
  i32, f32 = jnp.int32, jnp.float32
  persistent: dict[str, int] = {}
  fns: list[FnSpec] = []
  pol_cfg = model_config(c.policy, "lm")
  pol_params = abstract_params(pol_cfg, mesh)
  pol_state = abstract_state(pol_params, optim.make_optimizer(c.policy.optim), mesh)
  persistent["policy_state"] = device_bytes(pol_state)
  kl = c.policy.loss.kl_coef > 0
  if kl:
    persistent["ref_params"] = device_bytes(pol_params)
  w_pol = _weight_bytes(pol_cfg)
  rng = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=sharding.replicated(mesh))

  def sampler_spec(name, cfg, params, n_rows, prompt, new, temperature, top_p, top_k, calls):
    batch = _batch(mesh, {"t": ((n_rows, prompt), i32), "m": ((n_rows, prompt), bool)})
    eos = (cfg.eos_id,) if cfg.eos_id is not None else ()
    from cooper_jax.sampling import sample  # pylint: disable=import-outside-toplevel

    kw = dict(
      cfg=cfg,
      max_new_tokens=new,
      temperature=temperature,
      top_p=top_p,
      top_k=top_k,
      eos_ids=eos,
      pad_id=cfg.pad_id or 0,
    )
    acts = forward_bytes(cfg, n_rows, prompt, prompt, 1, tensor) + new * forward_bytes(
      cfg, n_rows, 1, prompt + new + 1, 1, tensor
    )
    w = _weight_bytes(cfg)
    return FnSpec(
      name,
      lambda: sample.lower(params, batch["t"], batch["m"], rng, **kw),
      device_bytes(params),
      device_bytes(params) + device_bytes(batch),
      Cost(sampler_flops(cfg, n_rows, prompt, new), _per_device(acts, w, n_dev, tensor, 1 + new)),
      calls,
    )

  sbs = _get(c, "rollout.sample_batch_size", 0) or rows
  if rows % sbs:
    raise ConfigError(f"rollout.sample_batch_size={sbs} does not divide the rollout batch {rows}")
  ro = c.rollout
  fns.append(
    sampler_spec(
      "sampler",
      pol_cfg,
      pol_params,
      sbs,
      p_len,
      n_new,
      ro.temperature,
      ro.top_p,
      ro.top_k,
      rows // sbs,
    )
  )

  pmb = _get(c, "policy.micro_batch_size")
  chunk = _get(c, "policy.logprob_chunk")
  n_micro = rows // pmb if pmb else 1
  lp_batch = _batch(
    mesh,
    {
      "prompt_tokens": ((rows, p_len), i32),
      "prompt_mask": ((rows, p_len), bool),
      "response_tokens": ((rows, n_new), i32),
      "response_mask": ((rows, n_new), bool),
    },
  )
  seq = p_len + n_new
  fwd_acts = forward_bytes(pol_cfg, rows, seq, seq, n_new, tensor)
  if kl:
    lp_kw = _kw_if_accepted(steps.make_logprob_fn, micro_batch_size=pmb, logprob_chunk=chunk)
    lp_fn = steps.make_logprob_fn(pol_cfg, mesh, pol_params, **lp_kw)
    fns.append(
      FnSpec(
        "ref_logprobs",
        lambda: lp_fn.lower(pol_params, lp_batch),
        device_bytes(pol_params),
        device_bytes(pol_params) + device_bytes(lp_batch),
        Cost(
          forward_flops(pol_cfg, rows, seq, seq, n_new),
          _per_device(fwd_acts, w_pol, n_dev, tensor, n_micro),
        ),
      )
    )

  rm_rows, rm_len = rows, c.rm.max_len
  rmb = _get(c, "rm.micro_batch_size")
  if c.reward_mode in ("static_rm", "cooper"):
    rm_cfg = model_config(c.rm, "score")
    rm_params = abstract_params(rm_cfg, mesh)
    w_rm = _weight_bytes(rm_cfg)
    if c.reward_mode == "cooper":
      rm_state = abstract_state(rm_params, optim.make_optimizer(c.rm.optim), mesh)
      persistent["rm_state"] = device_bytes(rm_state)
    else:
      persistent["rm_params"] = device_bytes(rm_params)
    r_batch = _batch(mesh, {"t": ((rm_rows, rm_len), i32), "m": ((rm_rows, rm_len), bool)})
    r_fn = steps.make_reward_fn(
      rm_cfg, mesh, rm_params, **_kw_if_accepted(steps.make_reward_fn, micro_batch_size=rmb)
    )
    r_micro = rm_rows // rmb if rmb else 1
    fns.append(
      FnSpec(
        "rm_reward",
        lambda: r_fn.lower(rm_params, r_batch["t"], r_batch["m"]),
        device_bytes(rm_params),
        device_bytes(rm_params) + device_bytes(r_batch),
        Cost(
          forward_flops(rm_cfg, rm_rows, rm_len, rm_len, 0),
          _per_device(
            forward_bytes(rm_cfg, rm_rows, rm_len, rm_len, 0, tensor), w_rm, n_dev, tensor, r_micro
          ),
        ),
      )
    )

  pb_shapes = {
    "prompt_tokens": ((rows, p_len), i32),
    "prompt_mask": ((rows, p_len), bool),
    "response_tokens": ((rows, n_new), i32),
    "response_mask": ((rows, n_new), bool),
    "advantages": ((rows,), f32),
  }
  if kl:
    pb_shapes["ref_logp"] = ((rows, n_new), f32)
  p_batch = _batch(mesh, pb_shapes)
  p_kw = _kw_if_accepted(steps.make_policy_step, micro_batch_size=pmb, logprob_chunk=chunk)
  p_fn = steps.make_policy_step(
    pol_cfg,
    c.policy.loss,
    optim.make_optimizer(c.policy.optim),
    mesh,
    pol_state,
    p_batch,
    **p_kw,
  )
  fns.append(
    FnSpec(
      "policy_step",
      lambda: p_fn.lower(pol_state, p_batch),
      device_bytes(pol_state),
      device_bytes(pol_state) + device_bytes(p_batch),
      Cost(
        train_flops(pol_cfg, rows, seq, n_new),
        _train_bytes(pol_cfg, fwd_acts, w_pol, n_dev, tensor, n_micro),
      ),
    )
  )

  if c.reward_mode == "cooper":
    # train.py builds the RM pair batch (one pair per prompt) and always trains it with "bt".
    pairs = c.rollout.prompts_per_step
    rb = _batch(
      mesh,
      {
        "pos_tokens": ((pairs, rm_len), i32),
        "pos_mask": ((pairs, rm_len), bool),
        "neg_tokens": ((pairs, rm_len), i32),
        "neg_mask": ((pairs, rm_len), bool),
        "valid": ((pairs,), f32),
      },
    )
    rm_fn = steps.make_rm_step(
      rm_cfg,
      "bt",
      optim.make_optimizer(c.rm.optim),
      mesh,
      rm_state,
      rb,
      **_kw_if_accepted(steps.make_rm_step, micro_batch_size=rmb),
    )
    rm_micro = 2 * pairs // rmb if rmb else 1
    fns.append(
      FnSpec(
        "rm_step",
        lambda: rm_fn.lower(rm_state, rb),
        device_bytes(rm_state),
        device_bytes(rm_state) + device_bytes(rb),
        Cost(
          train_flops(rm_cfg, 2 * pairs, rm_len, 0),
          _train_bytes(
            rm_cfg,
            forward_bytes(rm_cfg, 2 * pairs, rm_len, rm_len, 0, tensor),
            w_rm,
            n_dev,
            tensor,
            max(rm_micro, 1),
          ),
        ),
      )
    )
    if c.pairs.negatives == "llm_rewrite":
      # train.py loads the assistant with load_pretrained's defaults (float32, no remat). It
      # generates one rewrite per pending prompt, rows padded to a power of two; its prompt
      # holds the question and the positive, estimated as max_prompt_len + max_new_tokens.
      a_mc = type("MC", (), {"model": c.pairs.assistant_model})()
      a_cfg = model_config(a_mc, "lm", overrides=False)
      a_params = abstract_params(a_cfg, mesh)
      persistent["assistant_params"] = device_bytes(a_params)
      a_rows = max(1 << (c.rollout.prompts_per_step - 1).bit_length(), 1)
      a_rows = _round_up(a_rows, mesh.shape["data"] * mesh.shape["fsdp"])
      fns.append(
        sampler_spec(
          "assistant_sampler",
          a_cfg,
          a_params,
          a_rows,
          _round_up(p_len + n_new, 64),
          c.pairs.assistant_max_new_tokens,
          c.pairs.assistant_temperature,
          1.0,
          0,
          1,
        )
      )
  return fns, persistent


def _train_bytes(cfg, fwd_acts, w, n_dev, tensor, n_micro):
  """Forward + backward (~2x forward traffic) + remat recompute (1x), weights read in each of
  those passes per micro-batch, plus the AdamW update: per device, read param/grad/m/v and
  write param/m/v of its shard (fp32 moments as param_dtype here)."""
  passes = 3 + (1 if cfg.remat else 0)
  opt = 7 * w / n_dev
  return _per_device(passes * fwd_acts, w, n_dev, tensor, passes * n_micro) + opt


# -------------------------------------------------------------------------------- compile
@dataclasses.dataclass
class Report:
  topology: str
  device_kind: str
  chips: int
  devices: int
  mesh: dict[str, int]
  peak_flops: float  # per device
  hbm_bw: float  # per device
  hbm_bytes: int  # per device, usable
  persistent: dict[str, int]  # per-device bytes of what stays on the chip all iteration
  results: list[FnResult]

  def header(self) -> str:
    per = self.devices // self.chips
    dev = "chip" if per == 1 else f"device ({per} TensorCores per chip, each its own device)"
    pers = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.persistent.items())
    peaks = CHIP_PEAKS[self.device_kind]
    return (
      f"topology {self.topology}: {self.devices} devices ({self.device_kind}), {self.chips} chips;"
      f" mesh {self.mesh}\n"
      f"per {dev}: HBM {self.hbm_bytes / GIB:.2f} GiB usable, peak "
      f"{self.peak_flops / 1e12:.1f} TFLOP/s bf16, {self.hbm_bw / 1e9:.0f} GB/s "
      f"(published chip peaks, {peaks['source']})\n"
      f"resident all iteration, GiB per device: {pers} "
      f"(total {sum(self.persistent.values()) / GIB:.2f})\n"
      "resident = that total - the function's own persistent arguments + its peak (XLA buffer "
      "assignment: arguments + outputs - aliased + temporaries)\n"
      "FLOPs: analytic matmul count (fwd 2/weight/token, bwd 2x, + remat recompute), per device"
      " per iteration (x calls); bytes: analytic HBM-traffic estimate; roofline = max(FLOPs/peak,"
      " bytes/bandwidth); decode counts all max_new_tokens steps"
    )


def compile_iteration(c, topology: str, *, only: tuple[str, ...] | None = None) -> Report:
  """Compiles the iteration's functions for `topology` and measures each one.

  `only` restricts to some function names (sampler, ref_logprobs, rm_reward, policy_step,
  rm_step, assistant_sampler). Raises TopologyError / ConfigError.
  """
  topo = get_topology(topology)
  devices = list(topo.devices)
  kind = devices[0].device_kind
  if kind not in CHIP_PEAKS:
    raise TopologyError(f"topology {topology!r}: no peak figures for device kind {kind!r}")
  chips = count_chips(devices)
  per_chip = len(devices) / chips
  peaks = CHIP_PEAKS[kind]
  flops_s, bw = peaks["flops"] / per_chip, peaks["hbm_bw"] / per_chip
  hbm = usable_hbm_bytes(devices) or int(peaks["hbm"] / per_chip)
  try:
    config_lib.validate(c, len(devices))
  except ValueError as e:
    raise ConfigError(f"config on {topology} ({len(devices)} devices): {e}") from e
  try:
    mesh = sharding.make_mesh(**c.mesh, devices=devices)
  except ValueError as e:
    raise ConfigError(
      f"config.mesh {dict(c.mesh)} on {topology} ({len(devices)} devices): {e}"
    ) from e
  fns, persistent = build_functions(c, mesh)
  resident_base = sum(persistent.values())
  results = []
  for spec in fns:
    if only and spec.name not in only:
      continue
    err, xf, xb, avail, xpeak = None, None, None, None, None
    try:
      compiled = spec.lower().compile()
      m = compiled.memory_analysis()
      arg, out, alias, temp = (
        m.argument_size_in_bytes,
        m.output_size_in_bytes,
        m.alias_size_in_bytes,
        m.temp_size_in_bytes,
      )
      # The TPU runtime allocates the temporaries as one block of temp_size, so the footprint
      # is the buffer-assignment sum; XLA's own peak_memory (a liveness simulation, can be
      # lower) is kept as xla_peak_gib.
      peak = arg + out - alias + temp
      xpeak = getattr(m, "peak_memory_in_bytes", None)
      ca = compiled.cost_analysis()
      ca = ca[0] if isinstance(ca, (list, tuple)) else ca
      xf, xb = ca.get("flops"), ca.get("bytes accessed")
    except Exception as e:  # noqa: BLE001 - an OOM is a result, anything else is re-raised
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      need, avail = parse_oom(str(e))
      arg, out, alias = spec.arg_bytes, None, None
      temp = need
      peak = arg + (need or 0)
      err = str(e).splitlines()[0][:300]
    # What else stays on the chip while this runs, plus this function's own footprint.
    resident = resident_base - spec.persistent_arg_bytes + peak
    f_dev = spec.cost.flops / len(devices) * spec.calls
    b_dev = spec.cost.bytes * spec.calls
    g = lambda x: None if x is None else x / GIB
    results.append(
      FnResult(
        function=spec.name,
        topology=topology,
        chips=chips,
        devices=len(devices),
        calls=spec.calls,
        hbm_gib=(avail if err and avail else hbm) / GIB,
        argument_gib=g(arg),
        output_gib=g(out),
        alias_gib=g(alias),
        temp_gib=g(temp),
        peak_gib=peak / GIB,
        resident_gib=resident / GIB,
        fits=err is None and resident <= hbm,  # an OOM compile never fits
        flops=f_dev,
        bytes=b_dev,
        roofline_s=max(f_dev / flops_s, b_dev / bw),
        xla_flops=xf,
        xla_bytes=xb,
        xla_peak_gib=g(xpeak),
        error=err,
      )
    )
  return Report(
    topology=topology,
    device_kind=kind,
    chips=chips,
    devices=len(devices),
    mesh=dict(mesh.shape),
    peak_flops=flops_s,
    hbm_bw=bw,
    hbm_bytes=hbm,
    persistent=persistent,
    results=results,
  )
