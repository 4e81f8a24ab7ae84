"""The one mapping between Hugging Face tensor names/layouts and this port's parameter pytree.

HF stores Linear weights as [out, in]; the Flax tree stores kernels as [in, out] with heads
split out ([d, h, e] for q/k/v, [h, e, d] for o) and layers stacked on a leading axis.
Every loader (safetensors, GGUF) first produces HF-named [out, in] numpy arrays, and the
exporter writes them back, so this file is the single place the layouts meet.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cooper_jax.models.config import ModelConfig


def _layer_specs(cfg: ModelConfig):
  """(hf suffix, tree path, to_tree, from_tree) for the tensors of one layer."""
  d, h, k, e, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
  specs = [
    ("input_layernorm.weight", ("attn_norm", "scale"), (d,), lambda w: w, lambda w: w),
    ("post_attention_layernorm.weight", ("mlp_norm", "scale"), (d,), lambda w: w, lambda w: w),
    (
      "self_attn.q_proj.weight",
      ("attn", "q", "kernel"),
      (h * e, d),
      lambda w: w.T.reshape(d, h, e),
      lambda w: w.reshape(d, h * e).T,
    ),
    (
      "self_attn.k_proj.weight",
      ("attn", "k", "kernel"),
      (k * e, d),
      lambda w: w.T.reshape(d, k, e),
      lambda w: w.reshape(d, k * e).T,
    ),
    (
      "self_attn.v_proj.weight",
      ("attn", "v", "kernel"),
      (k * e, d),
      lambda w: w.T.reshape(d, k, e),
      lambda w: w.reshape(d, k * e).T,
    ),
    (
      "self_attn.o_proj.weight",
      ("attn", "o", "kernel"),
      (d, h * e),
      lambda w: w.T.reshape(h, e, d),
      lambda w: w.reshape(h * e, d).T,
    ),
    ("mlp.gate_proj.weight", ("mlp", "gate", "kernel"), (f, d), lambda w: w.T, lambda w: w.T),
    ("mlp.up_proj.weight", ("mlp", "up", "kernel"), (f, d), lambda w: w.T, lambda w: w.T),
    ("mlp.down_proj.weight", ("mlp", "down", "kernel"), (d, f), lambda w: w.T, lambda w: w.T),
  ]
  if cfg.qkv_bias:
    for name, heads in (("q", h), ("k", k), ("v", k)):
      specs.append(
        (
          f"self_attn.{name}_proj.bias",
          ("attn", name, "bias"),
          (heads * e,),
          lambda w, heads=heads: w.reshape(heads, e),
          lambda w, heads=heads: w.reshape(heads * e),
        )
      )
  return specs


def _top_specs(cfg: ModelConfig):
  specs = [
    ("model.embed_tokens.weight", ("embed", "embedding"), (cfg.vocab_size, cfg.d_model)),
    ("model.norm.weight", ("final_norm", "scale"), (cfg.d_model,)),
  ]
  if cfg.head == "score":
    specs.append(("score.weight", ("score", "kernel"), (1, cfg.d_model)))
  elif not cfg.tie_embeddings:
    specs.append(("lm_head.weight", ("lm_head", "kernel"), (cfg.vocab_size, cfg.d_model)))
  return specs


def _set(tree: dict, path: tuple[str, ...], value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def params_from_hf(
  cfg: ModelConfig,
  get_tensor: Callable[[str], np.ndarray | None],
  source: str,
  dtype=np.float32,
  fresh_score_head: bool = False,
) -> dict:
  """Builds the parameter pytree; `get_tensor(name)` returns an HF-layout array or None.

  fresh_score_head: the score head starts at zero (a causal LM becoming a reward model: every
  input scores 0, reward 0.5, until RM training moves it). Raises ValueError naming the missing
  or mis-shaped tensor and the source file.
  """

  def fetch(name, shape):
    if fresh_score_head and name == "score.weight":
      return np.zeros(shape, dtype)
    w = get_tensor(name)
    if w is None:
      raise ValueError(f"{source}: missing tensor {name!r} (expected shape {shape})")
    if tuple(w.shape) != tuple(shape):
      raise ValueError(
        f"{source}: tensor {name!r} has shape {tuple(w.shape)}, "
        f"expected {tuple(shape)} for this config"
      )
    return np.asarray(w, dtype=dtype)

  params: dict = {}
  for name, path, shape in _top_specs(cfg):
    w = fetch(name, shape)
    _set(params, path, w.T if path[0] in ("lm_head", "score") else w)
  for suffix, path, shape, to_tree, _ in _layer_specs(cfg):
    stacked = [to_tree(fetch(f"model.layers.{i}.{suffix}", shape)) for i in range(cfg.n_layers)]
    _set(params, ("layers",) + path, np.stack(stacked))
  return params


def hf_from_params(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
  """The inverse of params_from_hf: HF-named [out, in] arrays (in the parameters' dtype)."""
  out: dict[str, np.ndarray] = {}
  for name, path, _ in _top_specs(cfg):
    w = np.asarray(_get(params, path))
    out[name] = w.T if path[0] in ("lm_head", "score") else w
  for suffix, path, _, _, from_tree in _layer_specs(cfg):
    stacked = np.asarray(_get(params["layers"], path))
    for i in range(cfg.n_layers):
      out[f"model.layers.{i}.{suffix}"] = np.ascontiguousarray(from_tree(stacked[i]))
  return out


def expected_hf_names(cfg: ModelConfig) -> set[str]:
  names = {name for name, _, _ in _top_specs(cfg)}
  for suffix, *_ in _layer_specs(cfg):
    names |= {f"model.layers.{i}.{suffix}" for i in range(cfg.n_layers)}
  return names
