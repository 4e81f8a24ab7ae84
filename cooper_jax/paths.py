"""Run-directory paths through etils `epath` (what Orbax uses), so `gs://bucket/run` keeps its
scheme end to end (`pathlib.Path("gs://b/r")` is `gs:/b/r`, a local directory)."""

from __future__ import annotations

import os

from etils import epath

from cooper_jax.io import atomic_write_text


def is_remote(path: str | os.PathLike) -> bool:
  return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
  """An epath for a local path (made absolute) or a URI (kept as given)."""
  if is_remote(path):
    return epath.Path(path)
  return epath.Path(os.path.abspath(os.fspath(path)))


def write_text(path: str | os.PathLike, text: str) -> None:
  """Whole-file write that a reader never sees half done: a renamed temp file locally, one
  object upload on a bucket (objects appear whole)."""
  if is_remote(path):
    epath.Path(path).write_text(text)
  else:
    atomic_write_text(os.fspath(path), text)
