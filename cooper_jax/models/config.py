"""Decoder configuration for the Llama and Qwen2 families, and its Hugging Face mapping."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# Hugging Face architectures this port reads and writes, by (family, head).
HF_ARCHITECTURES = {
  ("llama", "lm"): "LlamaForCausalLM",
  ("llama", "score"): "LlamaForSequenceClassification",
  ("qwen2", "lm"): "Qwen2ForCausalLM",
  ("qwen2", "score"): "Qwen2ForSequenceClassification",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shapes and numerics of a decoder-only transformer.

  `head` selects the output: "lm" (next-token logits) or "score" (a bias-free scalar head on
  the last non-pad token, as HF's *ForSequenceClassification with num_labels=1).
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  rope_theta: float = 10000.0
  rms_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = False
  family: str = "llama"
  head: str = "lm"
  max_seq_len: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int | None = None

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
        f"ModelConfig.n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
      )
    if self.head not in ("lm", "score"):
      raise ValueError(f"ModelConfig.head must be 'lm' or 'score', got {self.head!r}")
    if self.family not in ("llama", "qwen2"):
      raise ValueError(f"ModelConfig.family must be 'llama' or 'qwen2', got {self.family!r}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(
          f"ModelConfig.{name} must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}"
        )

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  def replace(self, **kw) -> ModelConfig:
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    attn = self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
    if self.qkv_bias:
      attn += self.head_dim * (self.n_heads + 2 * self.n_kv_heads)
    layer = attn + 3 * self.d_model * self.d_ff + 2 * self.d_model
    out = (
      0
      if self.tie_embeddings and self.head == "lm"
      else (self.d_model * (self.vocab_size if self.head == "lm" else 1))
    )
    return self.vocab_size * self.d_model + self.n_layers * layer + self.d_model + out


def from_hf_config(hf: dict[str, Any], **overrides) -> ModelConfig:
  """Builds a ModelConfig from a Hugging Face config.json dict (Llama or Qwen2)."""
  model_type = hf.get("model_type")
  if model_type not in ("llama", "qwen2"):
    raise ValueError(
      f"config.json model_type={model_type!r}: only 'llama' and 'qwen2' are supported"
    )
  archs = hf.get("architectures") or []
  head = "score" if any(a.endswith("ForSequenceClassification") for a in archs) else "lm"
  if head == "score" and hf.get("num_labels", len(hf.get("id2label", {0: 0}))) != 1:
    raise ValueError("a reward model must have num_labels=1 in config.json")
  n_heads = hf["num_attention_heads"]
  if hf.get("rope_scaling") or (hf.get("rope_parameters") or {}).get(
    "rope_type", "default"
  ) not in ("default",):
    raise ValueError(
      f"config.json rope scaling {hf.get('rope_scaling') or hf.get('rope_parameters')}"
      " is not supported (only plain RoPE)"
    )
  if model_type == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
    raise ValueError("config.json: Llama with attention_bias/mlp_bias is not supported")
  theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))
  eos = hf.get("eos_token_id")
  if isinstance(eos, list):
    eos = eos[0]
  kw = dict(
    vocab_size=hf["vocab_size"],
    d_model=hf["hidden_size"],
    n_layers=hf["num_hidden_layers"],
    n_heads=n_heads,
    n_kv_heads=hf.get("num_key_value_heads", n_heads),
    head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
    d_ff=hf["intermediate_size"],
    rope_theta=float(theta),
    rms_eps=hf.get("rms_norm_eps", 1e-6),
    qkv_bias=model_type == "qwen2",
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    family=model_type,
    head=head,
    max_seq_len=hf.get("max_position_embeddings", 4096),
    bos_id=hf.get("bos_token_id"),
    eos_id=eos,
    pad_id=hf.get("pad_token_id"),
  )
  kw.update(overrides)
  return ModelConfig(**kw)


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The config.json transformers needs to load exported weights."""
  hf = {
    "architectures": [HF_ARCHITECTURES[(cfg.family, cfg.head)]],
    "model_type": cfg.family,
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "intermediate_size": cfg.d_ff,
    "num_hidden_layers": cfg.n_layers,
    "num_attention_heads": cfg.n_heads,
    "num_key_value_heads": cfg.n_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": cfg.max_seq_len,
    "rms_norm_eps": cfg.rms_eps,
    "rope_theta": cfg.rope_theta,
    "tie_word_embeddings": cfg.tie_embeddings,
    "torch_dtype": cfg.param_dtype,
    "bos_token_id": cfg.bos_id,
    "eos_token_id": cfg.eos_id,
    "pad_token_id": cfg.pad_id,
  }
  if cfg.family == "llama":
    hf.update(attention_bias=cfg.qkv_bias, mlp_bias=False)
  if cfg.head == "score":
    hf.update(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
  return hf
