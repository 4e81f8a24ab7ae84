"""Files in one place: atomic writes (a crash never leaves half a file or directory) and readers
of the project's JSONL formats, whose errors name the file and line.

Formats: question files {"question", "answer", ...} are read by `cooper_jax.data`; completion
files {"question", "reference", "completion", "label"?} (annotation output, RM training
triples, verifier-comparison items) by `read_completions`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def atomic_write(path, write_fn: Callable, mode: str = "w") -> Path:
  """write_fn(file) into a temp file beside `path`, fsync, then os.replace: all or nothing."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
      write_fn(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise
  return path


def atomic_write_text(path, text: str) -> Path:
  return atomic_write(path, lambda f: f.write(text))


def atomic_write_json(path, obj, sort_keys: bool = False) -> Path:
  text = json.dumps(obj, indent=1, allow_nan=False, sort_keys=sort_keys)  # fails before writing
  return atomic_write_text(path, text + "\n")


def write_jsonl(path, rows: Iterable[dict]) -> Path:
  """One JSON object per line, atomically."""

  def write(f):
    for r in rows:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")

  return atomic_write(path, write)


@contextlib.contextmanager
def atomic_dir(out_dir):
  """Yields a temporary sibling directory that replaces `out_dir` only if the block succeeds."""
  out_dir = Path(out_dir)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
  try:
    yield tmp
    if out_dir.exists():
      shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def read_jsonl(path, limit: int | None = None) -> list[tuple[int, dict]]:
  """(line number, object) for each non-blank line; invalid JSON raises naming file and line."""
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {n}: invalid JSON ({e.msg})") from e
      if not isinstance(obj, dict):
        raise ValueError(f"{path}: line {n}: expected a JSON object, got {type(obj).__name__}")
      out.append((n, obj))
      if limit is not None and len(out) >= limit:
        break
  return out


COMPLETION_KEYS = ("question", "reference", "completion")


def read_completions(path, require_label: bool = False, limit: int | None = None) -> list[dict]:
  """Validated {question, reference, completion[, label]} rows; errors name file and line.

  `label` (1 correct, 0 wrong; a JSON bool is accepted) is required with require_label, else
  optional (None when absent)."""
  rows = []
  for n, r in read_jsonl(path, limit):
    for k in COMPLETION_KEYS + (("label",) if require_label else ()):
      if k not in r:
        raise ValueError(f"{path}: line {n}: missing key {k!r}")
    for k in ("question", "completion"):
      if not isinstance(r[k], str):
        raise ValueError(f"{path}: line {n}: {k!r} must be a string")
    if not isinstance(r["reference"], (str, int, float)) or isinstance(r["reference"], bool):
      raise ValueError(f"{path}: line {n}: 'reference' must be a string or a number")
    label = r.get("label")
    if isinstance(label, bool):
      label = int(label)
    if label is not None and label not in (0, 1):
      raise ValueError(f"{path}: line {n}: label must be 0 or 1, got {r['label']!r}")
    rows.append({**r, "reference": str(r["reference"]), "label": label})
  if not rows:
    raise ValueError(f"{path}: no rows")
  return rows
