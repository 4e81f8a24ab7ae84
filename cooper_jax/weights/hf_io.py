"""Hugging Face checkpoint directories (config.json + safetensors, single or sharded) in and out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from cooper_jax.io import atomic_dir
from cooper_jax.models.config import ModelConfig, from_hf_config, to_hf_config
from cooper_jax.weights.convert import expected_hf_names, hf_from_params, params_from_hf

_INDEX = "model.safetensors.index.json"


def _tensor_files(ckpt_dir: Path) -> dict[str, Path]:
  """Tensor name -> file that holds it, for a single-file or sharded checkpoint."""
  index = ckpt_dir / _INDEX
  if index.exists():
    weight_map = json.loads(index.read_text())["weight_map"]
    return {name: ckpt_dir / fname for name, fname in weight_map.items()}
  single = ckpt_dir / "model.safetensors"
  if not single.exists():
    raise FileNotFoundError(f"{ckpt_dir}: neither model.safetensors nor {_INDEX} found")
  with safe_open(single, framework="numpy") as f:
    return {name: single for name in f.keys()}


def load_hf_dir(
  ckpt_dir: str | os.PathLike, *, head: str | None = None, **cfg_overrides
) -> tuple[ModelConfig, dict]:
  """Loads a Llama/Qwen2 *ForCausalLM or *ForSequenceClassification directory.

  `head="score"` on a causal-LM checkpoint gives a reward model with the backbone's weights and
  a fresh (zero) score head, the usual start for RM training.
  """
  ckpt_dir = Path(ckpt_dir)
  cfg_path = ckpt_dir / "config.json"
  if not cfg_path.exists():
    raise FileNotFoundError(f"{ckpt_dir}: no config.json")
  cfg = from_hf_config(json.loads(cfg_path.read_text()), **cfg_overrides)
  fresh_head = head == "score" and cfg.head == "lm"
  if head is not None:
    cfg = cfg.replace(head=head)
  files = _tensor_files(ckpt_dir)
  handles = {}

  def get_tensor(name):
    path = files.get(name)
    if path is None:
      return None
    if path not in handles:
      handles[path] = safe_open(path, framework="numpy")
    return handles[path].get_tensor(name)

  try:
    params = params_from_hf(
      cfg, get_tensor, str(ckpt_dir), dtype=cfg.jnp_param_dtype, fresh_score_head=fresh_head
    )
  finally:
    handles.clear()
  unused = set(files) - expected_hf_names(cfg) - {"lm_head.weight"}
  if unused:
    raise ValueError(
      f"{ckpt_dir}: tensors not used by this config: {sorted(unused)[:5]}"
      f"{' ...' if len(unused) > 5 else ''}"
    )
  return cfg, params


def save_hf_dir(
  cfg: ModelConfig, params, out_dir: str | os.PathLike, *, tokenizer=None, dtype: str | None = None
) -> Path:
  """Exports to a directory transformers loads (`AutoModelFor*.from_pretrained(out_dir)`).

  Written to a temporary sibling and renamed, so a crash never leaves a half-written export.
  """
  out_dir = Path(out_dir)
  dtype = dtype or cfg.param_dtype
  np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
  tensors = {
    k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in hf_from_params(cfg, params).items()
  }
  hf_cfg = to_hf_config(cfg.replace(param_dtype=dtype))
  with atomic_dir(out_dir) as tmp:
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    if cfg.head == "lm":  # what `generate` stops on and pads with, as the sampler uses them
      gen = {"bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id}
      gen = {k: v for k, v in gen.items() if v is not None}
      (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if tokenizer is not None:
      tokenizer.hf.save_pretrained(tmp)
  return out_dir
