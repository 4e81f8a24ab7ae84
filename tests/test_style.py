"""The tree is formatted and lint-clean under the ruff settings in pyproject.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args):
  exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
  if exe is None:
    pytest.fail("ruff is not installed (it is pinned in requirements.txt)")
  return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True)


def test_tree_is_formatted():
  r = _ruff("format", "--check", ".")
  assert r.returncode == 0, f"run `ruff format .`:\n{r.stdout}{r.stderr}"


def test_tree_passes_lint():
  r = _ruff("check", ".")
  assert r.returncode == 0, f"run `ruff check .`:\n{r.stdout}{r.stderr}"
