"""Decoder configuration for the Llama and Qwen2 families, and its Hugging Face mapping."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from cooper_jax.models import REMAT_CHOICES

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# Hugging Face architectures this port reads and writes, by (family, head).
HF_ARCHITECTURES = {
  ("llama", "lm"): "LlamaForCausalLM",
  ("llama", "score"): "LlamaForSequenceClassification",
  ("qwen2", "lm"): "Qwen2ForCausalLM",
  ("qwen2", "score"): "Qwen2ForSequenceClassification",
}


# rope_type values a config.json may carry; anything else (yarn, dynamic, linear, ...) is refused
# rather than silently run as plain RoPE.
_ROPE_TYPES = ("default", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 ("llama3") RoPE frequency scaling, the parameters of HF's rope_type "llama3".

  Frequencies whose wavelength exceeds original_max_position_embeddings / low_freq_factor are
  divided by `factor`, those shorter than original_max_position_embeddings / high_freq_factor
  are kept, and the band between is interpolated smoothly (see transformer.rope_inv_freq).
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __post_init__(self):
    if not self.factor >= 1.0:
      raise ValueError(f"RopeScaling.factor must be >= 1, got {self.factor}")
    # The smoothing divides by (high - low); equal factors would make it NaN.
    if not self.high_freq_factor > self.low_freq_factor > 0:
      raise ValueError(
        "RopeScaling needs high_freq_factor > low_freq_factor > 0, got"
        f" high_freq_factor={self.high_freq_factor}, low_freq_factor={self.low_freq_factor}"
      )
    if self.original_max_position_embeddings <= 0:
      raise ValueError(
        "RopeScaling.original_max_position_embeddings must be positive, got"
        f" {self.original_max_position_embeddings}"
      )

  def to_hf(self) -> dict[str, Any]:
    return {"rope_type": "llama3", **dataclasses.asdict(self)}


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
  rope_scaling: RopeScaling | None = None
  rms_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = False
  family: str = "llama"
  head: str = "lm"
  max_seq_len: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: str = "projections"
  # Bytes of float32 attention scores per chunk of batch rows (0 = the whole batch at once):
  # see transformer.attend. A CPU setting: on accelerators one large call is faster.
  attn_chunk_bytes: int = 0
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int | None = None

  def __post_init__(self):
    # Checkpoint metadata stores the config through dataclasses.asdict (JSON), so the scaling
    # comes back as a dict; rebuild it to keep the config hashable for jit's static arguments.
    if isinstance(self.rope_scaling, Mapping):
      object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
      raise ValueError(
        f"ModelConfig.rope_scaling must be a RopeScaling, a dict or None, got {self.rope_scaling!r}"
      )
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
    if isinstance(self.remat, bool):  # checkpoint metadata written before remat had policies
      object.__setattr__(self, "remat", "full" if self.remat else "none")
    if self.remat not in REMAT_CHOICES:
      raise ValueError(f"ModelConfig.remat must be one of {REMAT_CHOICES}, got {self.remat!r}")
    if not isinstance(self.attn_chunk_bytes, int) or self.attn_chunk_bytes < 0:
      raise ValueError(
        f"ModelConfig.attn_chunk_bytes must be an int >= 0, got {self.attn_chunk_bytes!r}"
      )
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

  @staticmethod
  def section_overrides(mc) -> dict[str, Any]:
    """The fields a run config's policy / rm section sets on the model it loads."""
    return dict(
      dtype=mc.dtype,
      param_dtype=mc.param_dtype,
      remat=mc.remat,
      attn_chunk_bytes=mc.get("attn_chunk_bytes", 0),
    )

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
  theta, rope_scaling = _rope_from_hf(hf)
  if model_type == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
    raise ValueError("config.json: Llama with attention_bias/mlp_bias is not supported")
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
    rope_theta=theta,
    rope_scaling=rope_scaling,
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


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
  """(rope_theta, scaling) from config.json, with transformers' precedence.

  transformers 5 reads the legacy `rope_scaling` dict (what Llama-3.x checkpoints ship) before
  `rope_parameters` (what it writes itself), and a rope_theta inside that dict before the
  top-level one; an absent original_max_position_embeddings falls back to the top-level key
  of that name, then to max_position_embeddings.
  """
  key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
  params = hf.get(key) or {}
  if not isinstance(params, Mapping):
    raise ValueError(f"config.json {key}={params!r}: expected a dict of rope scaling parameters")
  theta = params.get("rope_theta")
  if theta is None:
    theta = hf.get("rope_theta")
  if theta is None:
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
  partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
  if partial not in (None, 1, 1.0):
    raise ValueError(
      f"config.json partial_rotary_factor={partial!r} is not supported (RoPE on the whole head)"
    )
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type not in _ROPE_TYPES:
    raise ValueError(
      f"config.json {key}['rope_type']={rope_type!r}: this rope scaling type is not supported"
      f" (supported: {', '.join(repr(t) for t in _ROPE_TYPES)})"
    )
  if rope_type == "default":
    return float(theta), None
  missing = [k for k in _LLAMA3_KEYS if params.get(k) is None]
  if missing:
    raise ValueError(f"config.json rope scaling {key}={dict(params)!r} lacks {missing}")
  orig = hf.get("original_max_position_embeddings") or params.get(
    "original_max_position_embeddings", hf.get("max_position_embeddings")
  )
  if orig is None:
    raise ValueError(
      f"config.json rope scaling {key}={dict(params)!r} lacks original_max_position_embeddings"
    )
  scaling = RopeScaling(
    factor=float(params["factor"]),
    low_freq_factor=float(params["low_freq_factor"]),
    high_freq_factor=float(params["high_freq_factor"]),
    original_max_position_embeddings=int(orig),
  )
  return float(theta), scaling


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
    # The legacy key, as Llama-3.x checkpoints ship it: transformers 4.x and 5.x both read it.
    "rope_scaling": None if cfg.rope_scaling is None else cfg.rope_scaling.to_hf(),
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
