"""GGUF (llama architecture) files in: dequantise, undo llama.cpp's q/k row permutation."""

from __future__ import annotations

import os

import numpy as np

from cooper_jax.models.config import ModelConfig
from cooper_jax.weights.convert import params_from_hf

_LAYER_NAMES = {  # GGUF blk.{i}.<name> -> HF model.layers.{i}.<name>
  "attn_norm.weight": "input_layernorm.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}


def _field(reader, key, default=None):
  field = reader.fields.get(key)
  if field is None:
    if default is None:
      raise ValueError(f"GGUF metadata key {key!r} missing")
    return default
  return field.contents()


def unpermute_rope_rows(w_oi: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's convert_hf_to_gguf permute for q/k rows (per head, halves interleaved).

  llama.cpp reorders each head's rows from [first half, second half] (HF rotate-half) to
  interleaved pairs; HF-style RoPE needs the original order back. For k, n_heads is the
  number of KV heads.
  """
  out_dim = w_oi.shape[0]
  return (
    w_oi.reshape(n_heads, out_dim // n_heads // 2, 2, *w_oi.shape[1:])
    .swapaxes(1, 2)
    .reshape(w_oi.shape)
  )


def config_from_gguf(reader, **overrides) -> ModelConfig:
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
  n_heads = int(_field(reader, "llama.attention.head_count"))
  d_model = int(_field(reader, "llama.embedding_length"))
  names = {t.name for t in reader.tensors}
  tokens = reader.fields.get("tokenizer.ggml.tokens")  # the fallback for a missing vocab_size
  kw = dict(
    vocab_size=int(
      _field(reader, "llama.vocab_size", None if tokens is None else len(tokens.data))
    ),
    d_model=d_model,
    n_layers=int(_field(reader, "llama.block_count")),
    n_heads=n_heads,
    n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", n_heads)),
    head_dim=int(_field(reader, "llama.rope.dimension_count", d_model // n_heads)),
    d_ff=int(_field(reader, "llama.feed_forward_length")),
    rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
    rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
    qkv_bias=False,
    tie_embeddings="output.weight" not in names,
    family="llama",
    max_seq_len=int(_field(reader, "llama.context_length", 4096)),
    bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id", -1)),
    eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id", -1)),
    pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", -1)),
  )
  kw = {k: (None if v == -1 and k.endswith("_id") else v) for k, v in kw.items()}
  kw.update(overrides)
  return ModelConfig(**kw)


def load_gguf(path: str | os.PathLike, **cfg_overrides) -> tuple[ModelConfig, dict]:
  """Loads a llama-architecture GGUF file as float parameters (any quantisation gguf reads)."""
  import gguf  # pylint: disable=import-outside-toplevel

  reader = gguf.GGUFReader(os.fspath(path))
  head = cfg_overrides.pop("head", "lm")
  cfg = config_from_gguf(reader, **cfg_overrides)
  fresh_head = head == "score"
  cfg = cfg.replace(head=head, tie_embeddings=cfg.tie_embeddings and not fresh_head)
  by_hf_name = {}
  for t in reader.tensors:
    if t.name.endswith("rope_freqs.weight"):
      # llama.cpp stores Llama-3 RoPE scaling as per-frequency factors; loading without them
      # would silently give plain RoPE, so refuse rather than guess.
      raise ValueError(
        f"{path}: tensor {t.name!r} holds Llama-3-style RoPE frequency factors, which the GGUF "
        "loader does not apply; load the model's Hugging Face directory (its config.json "
        "rope_scaling is supported) instead"
      )
    if t.name in _TOP_NAMES:
      by_hf_name[_TOP_NAMES[t.name]] = t
    elif t.name.startswith("blk.") and t.name.split(".", 2)[2] in _LAYER_NAMES:
      _, idx, rest = t.name.split(".", 2)
      by_hf_name[f"model.layers.{idx}.{_LAYER_NAMES[rest]}"] = t
    else:
      raise ValueError(f"{path}: unexpected GGUF tensor {t.name!r}")

  def get_tensor(name):
    t = by_hf_name.get(name)
    if t is None:
      return None
    # GGUF lists dims fastest-first; dequantize returns numpy order, i.e. [out, in].
    w = gguf.quants.dequantize(t.data, t.tensor_type)
    w = w.reshape(tuple(int(x) for x in reversed(t.shape)))
    if name.endswith("q_proj.weight"):
      w = unpermute_rope_rows(w, cfg.n_heads)
    elif name.endswith("k_proj.weight"):
      w = unpermute_rope_rows(w, cfg.n_kv_heads)
    return w

  return cfg, params_from_hf(
    cfg, get_tensor, os.fspath(path), dtype=cfg.jnp_param_dtype, fresh_score_head=fresh_head
  )
