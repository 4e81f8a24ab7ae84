"""Weights in and out: HF checkpoint directories, GGUF files, the embedded SmolLM2."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from cooper_jax.models.config import ModelConfig
from cooper_jax.weights.gguf_io import load_gguf
from cooper_jax.weights.hf_io import load_hf_dir, save_hf_dir

EMBEDDED_NAME = "smollm2-135m-instruct"


def resolve_weights(source: str) -> str:
  """A model source string -> a local path (the embedded name maps to its GGUF file)."""
  if source == EMBEDDED_NAME:
    from cooper_jax.weights.embedded import embedded_gguf_path  # pylint: disable=import-outside-toplevel

    return os.fspath(embedded_gguf_path())
  return source


def load_pretrained(
  source: str, *, head: str | None = None, **cfg_overrides
) -> tuple[ModelConfig, dict]:
  """(config, params) from an HF directory, a .gguf file, the embedded name, or a hub repo id.

  `head="score"` on a causal LM gives a reward model with a fresh zero score head.
  `cfg_overrides` set ModelConfig fields (param_dtype, dtype, remat, ...).
  """
  path = resolve_weights(source)
  if path.endswith(".gguf"):
    if not Path(path).exists():
      raise FileNotFoundError(f"GGUF file not found: {path}")
    return load_gguf(path, head=head or "lm", **cfg_overrides)
  if Path(path).is_dir():
    return load_hf_dir(path, head=head, **cfg_overrides)
  if Path(path).exists():
    raise ValueError(f"{path}: not a checkpoint directory or a .gguf file")
  # Not local: a hub repo id, for users with hub access (fails here without network).
  try:
    from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel

    local = snapshot_download(
      path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
    )
  except Exception as e:  # noqa: BLE001 - re-raised with the source named
    raise FileNotFoundError(
      f"model source {source!r} is not a local directory or .gguf file, "
      f"and downloading it from the hub failed: {e}"
    ) from e
  return load_hf_dir(local, head=head, **cfg_overrides)


def load_from_config(mc, head: str, seed: int) -> tuple[ModelConfig, dict, str]:
  """(config, params, tokenizer source) for a run config's policy or RM sub-config `mc`
  (fields model, tokenizer, random_model and those ModelConfig.section_overrides reads).
  `model="random"` builds a randomly initialised model of `mc.random_model`'s shape from
  `seed`."""
  overrides = ModelConfig.section_overrides(mc)
  if mc.model == "random":
    import jax  # pylint: disable=import-outside-toplevel

    from cooper_jax.models.transformer import init_params  # pylint: disable=import-outside-toplevel

    if not mc.tokenizer:
      raise ValueError("a random model needs an explicit tokenizer (config.*.tokenizer)")
    cfg = ModelConfig(**mc.random_model.to_dict(), head=head, **overrides)
    return cfg, init_params(cfg, jax.random.key(seed)), mc.tokenizer
  cfg, params = load_pretrained(mc.model, head=head, **overrides)
  if head == "score" and not np.any(np.asarray(params["score"]["kernel"])):
    logging.warning("RM %s has no trained score head: starting from a fresh (zero) head", mc.model)
  return cfg, params, mc.tokenizer or mc.model


__all__ = [
  "load_from_config",
  "EMBEDDED_NAME",
  "load_pretrained",
  "load_gguf",
  "load_hf_dir",
  "save_hf_dir",
  "resolve_weights",
]
