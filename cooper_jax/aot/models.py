"""The model table of the AOT tool: Hugging Face config.json fields of the models the paper's
configs name (no weights needed), their ModelConfigs as the run builds them, and abstract
(shape + sharding, no data) parameters, optimizer states and batches on a mesh."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import sharding, steps
from cooper_jax.models.config import ModelConfig, from_hf_config
from cooper_jax.models.transformer import init_params


class ConfigError(ValueError):
  """A config the tool cannot compile (unknown model, unmappable architecture, bad mesh)."""


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


def model_config(mc, head: str) -> ModelConfig:
  """ModelConfig for a policy/rm sub-config, as weights.load_from_config builds it
  (ModelConfig.section_overrides from the sub-config)."""
  kw = ModelConfig.section_overrides(mc)
  try:
    if mc.model == "random":
      return ModelConfig(**mc.random_model.to_dict(), head=head, **kw)
    return from_hf_config(hf_config_for(mc.model), **kw).replace(head=head)
  except ConfigError:
    raise
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"model {mc.model!r} cannot be mapped to a ModelConfig: {e}") from e


def assistant_config(c) -> ModelConfig:
  """The llm_rewrite assistant as reward_modes loads it: params and compute in
  pairs.assistant_dtype, no remat (it only samples)."""
  d = c.pairs.assistant_dtype
  try:
    return from_hf_config(hf_config_for(c.pairs.assistant_model), dtype=d, param_dtype=d)
  except ConfigError:
    raise
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"assistant {c.pairs.assistant_model!r}: {e}") from e


def abstract_params(cfg: ModelConfig, mesh, decode_layout: str | None = None) -> Any:
  """The params as ShapeDtypeStructs, sharded as train.py shards them; decode_layout: stored
  in that decode layout's own (sharding.decode_tree_shardings: the llm_rewrite assistant)."""
  shapes = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
  if decode_layout is not None:
    return _with_shardings(shapes, sharding.decode_tree_shardings(shapes, mesh, decode_layout))
  return _with_shardings(shapes, sharding.tree_shardings(shapes, mesh))


def _with_shardings(shapes, shardings):
  return jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
  )


def abstract_state(params, optimizer, mesh):
  shapes = jax.eval_shape(lambda p: steps.init_state(p, optimizer), params)
  return _with_shardings(shapes, sharding.tree_shardings(shapes, mesh))


def abstract_batch(mesh, shapes: dict[str, tuple[tuple[int, ...], Any]]):
  """{name: ((shape), dtype)} -> ShapeDtypeStructs split over data x fsdp like train's batches."""
  return {
    k: jax.ShapeDtypeStruct(s, d, sharding=sharding.batch_sharding(mesh, len(s)))
    for k, (s, d) in shapes.items()
  }


def decode_weight_copy(params, dtype, weights_sharding=None):
  """transformer.split_layers(params, dtype) on ShapeDtypeStructs, as `sampling.sample` hands
  the weights to its decode steps: per layer, the shape and partition spec without the leading
  layer axis, every leaf in dtype, every leaf in `weights_sharding` if given (sample's,
  rollout.decode_weights; None: as the params are; a sharding.MLPSplit: its MLP kernels)."""
  from jax.sharding import NamedSharding  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel

  cast = lambda s: jax.ShapeDtypeStruct(s.shape, dtype, sharding=s.sharding)
  drop = lambda s: jax.ShapeDtypeStruct(
    s.shape[1:], dtype, sharding=NamedSharding(s.sharding.mesh, P(*s.sharding.spec[1:]))
  )
  layer = jax.tree.map(drop, params["layers"])
  n = jax.tree.leaves(params["layers"])[0].shape[0]
  split = {**jax.tree.map(cast, params), "layers": (layer,) * n}
  if weights_sharding is None:
    return split
  put = lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)
  if isinstance(weights_sharding, sharding.MLPSplit):  # the MLP kernels by columns
    return weights_sharding.place(split, put)
  return jax.tree.map(lambda s: put(s, weights_sharding), split)


def device_bytes(tree) -> int:
  """Bytes one device holds of an abstract pytree (its shard of every leaf)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize
  return total
