"""Math QA data: validated loading (local files, shipped registry, hub) and resumable batching.

Every row must carry a non-empty string question and a non-empty answer. A bad row is either
an error that names file, 1-based line and key, or (on_bad_row="skip") is dropped *and*
reported in LoadReport plus a logged warning, so a silently shrunken dataset can't happen.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

# Resolved relative to the package so it works from any working directory.
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
REGISTRY = {
  "gsm8k/train": "gsm8k/train.jsonl",
  "gsm8k/test": "gsm8k/test.jsonl",
  "math500/test": "math500/test.jsonl",
  "svamp/test": "svamp/test.jsonl",
  "olympiadbench/test": "olympiadbench/test.jsonl",
  "odyssey_math/test": "odyssey_math/test.jsonl",
}
_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclasses.dataclass
class LoadReport:
  source: str  # what the caller asked for
  location: str  # resolved file path or "datasets:<name>[:<subset>]:<split>"
  rows: int = 0  # rows returned
  skipped: int = 0  # bad rows dropped (on_bad_row="skip")
  bad_rows: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)
  blank_lines: int = 0  # empty JSONL lines (ignored, but counted)


def parse_source(source: str) -> tuple[str, str | None, str | None]:
  """(name, subset, split) of a dataset source as configs and CLIs spell it.

  "NAME" (a shipped name, a local file, or a hub name given a split elsewhere),
  "NAME:SPLIT" or "NAME:SUBSET:SPLIT" (a hub dataset, e.g. "openai/gsm8k:main:train", or a
  local directory in the `datasets` format: a `save_to_disk` folder or a hub repo's copy).
  Hub names and local files never contain ':' here, so the form is unambiguous; an existing
  path with a ':' in it is taken whole."""
  if ":" not in source or Path(source).expanduser().exists():
    return source, None, None
  parts = source.split(":")
  if len(parts) > 3 or not all(parts):
    raise ValueError(
      f"dataset {source!r}: expected NAME, NAME:SPLIT or NAME:SUBSET:SPLIT (non-empty parts)"
    )
  if len(parts) == 2:
    return parts[0], None, parts[1]
  return parts[0], parts[1], parts[2]


def resolve_dataset(source: str, split: str | None = None) -> Path | None:
  """Local path for a registry name or file path; None means "a datasets folder or the hub"."""
  key = f"{source}/{split}" if split and f"{source}/{split}" in REGISTRY else source
  if key in REGISTRY:
    return DATA_DIR / REGISTRY[key]
  path = Path(source).expanduser()
  if path.is_dir():
    return None  # a `datasets` folder: read by _open_hub
  if path.suffix in _LOCAL_SUFFIXES or path.exists():
    # Looks like a file: never fall through to the hub with a typo'd path.
    if not path.is_file():
      raise FileNotFoundError(f"data file not found: {path}")
    return path
  return None


def _normalize_answer(value: Any) -> str | None:
  """Answer as a non-empty string, or None if unusable. Numbers are allowed (SVAMP has 51.0)."""
  if isinstance(value, bool):  # bool is an int subclass, but True is never a math answer
    return None
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    if not math.isfinite(value):
      return None
    # 51.0 -> "51": integral floats come from numeric columns, not from the answer itself.
    return str(int(value)) if value.is_integer() else repr(value)
  if isinstance(value, str) and value.strip():
    return value.strip()
  return None


def _check_row(obj: Any, question_key: str, answer_key: str) -> tuple[dict | None, str | None]:
  """(normalized row, None) or (None, reason naming the key)."""
  if not isinstance(obj, dict):
    return None, f"row is a {type(obj).__name__}, not an object"
  if question_key not in obj:
    return None, f"missing key {question_key!r}"
  q = obj[question_key]
  if not isinstance(q, str):
    return None, f"{question_key!r} must be a string, got {type(q).__name__}"
  if not q.strip():
    return None, f"empty {question_key!r}"
  if answer_key not in obj:
    return None, f"missing key {answer_key!r}"
  a = _normalize_answer(obj[answer_key])
  if a is None:
    return None, f"empty or invalid {answer_key!r}: {obj[answer_key]!r:.80}"
  row = dict(obj)
  row["question"], row["answer"] = q, a
  return row, None


def _iter_jsonl(path: Path, report: LoadReport) -> Iterator[tuple[int, Any, str | None]]:
  """(line_no, object, json_error) per non-blank line, 1-based, so errors can cite lines."""
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        report.blank_lines += 1
        continue
      try:
        yield line_no, json.loads(line), None
      except json.JSONDecodeError as e:
        yield line_no, None, f"invalid JSON ({e.msg} at column {e.colno})"


def _iter_records(records: Iterable[Any]) -> Iterator[tuple[int, Any, str | None]]:
  for i, rec in enumerate(records, start=1):
    yield i, rec, None


def _open_records(path: Path, report: LoadReport, split: str | None):
  """Iterator of (position, object, error) for a local file, and the unit positions count in."""
  if path.suffix == ".jsonl":
    return _iter_jsonl(path, report), "line"
  if path.suffix == ".json":
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if isinstance(data, dict):  # {"test": [...]} style files: pick the split
      if split is None or split not in data:
        raise ValueError(f"{path}: JSON object needs split= one of {sorted(data)}")
      data = data[split]
    if not isinstance(data, list):
      raise ValueError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    return _iter_records(data), "item"
  if path.suffix == ".parquet":
    import pyarrow.parquet as pq  # installed with `datasets`; avoids its on-disk cache

    return _iter_records(pq.read_table(path).to_pylist()), "row"
  raise ValueError(f"{path}: unsupported file type {path.suffix!r} (use {_LOCAL_SUFFIXES})")


def _open_hub(name: str, subset: str | None, split: str | None):
  """Rows of a `datasets` dataset: a local `save_to_disk` folder, or what `load_dataset` reads
  (a hub name, or a local folder laid out like a hub repo, subsets as its configs)."""
  import datasets

  folder = Path(name).expanduser()
  if (folder / "dataset_dict.json").exists() or (folder / "state.json").exists():
    if subset is not None:
      raise ValueError(f"{name}: a save_to_disk folder has no subsets; got subset {subset!r}")
    ds = datasets.load_from_disk(str(folder))
    if isinstance(ds, datasets.DatasetDict):
      if split not in ds:
        raise ValueError(f"{name}: split {split!r} not in its splits {sorted(ds)}")
      ds = ds[split]
    return _iter_records(ds), "row"
  if split is None:
    raise ValueError(
      f"{name!r} is neither a shipped dataset ({sorted(REGISTRY)}) nor a local file; to load "
      "it with `datasets` give a split: NAME:SPLIT or NAME:SUBSET:SPLIT"
    )
  try:
    ds = datasets.load_dataset(name, subset, split=split)
  except Exception as e:
    raise RuntimeError(
      f"{name!r} (subset {subset!r}, split {split!r}) is not a shipped dataset "
      f"({sorted(REGISTRY)}) or local file, and `datasets.load_dataset` failed: {e}"
    ) from e
  return _iter_records(ds), "row"


def load_qa(
  source: str,
  split: str | None = None,
  *,
  question_key: str = "question",
  answer_key: str = "answer",
  on_bad_row: str = "raise",
  limit: int | None = None,
) -> tuple[list[dict], LoadReport]:
  """Load validated {"question", "answer", ...} rows.

  source: a registry name (see REGISTRY; "gsm8k" + split="test" also works), a local
  .jsonl/.json/.parquet file, or a `datasets` dataset spelled NAME:SPLIT / NAME:SUBSET:SPLIT
  (`parse_source`: a hub name or a local datasets folder; `split` may be given here instead).
  Returned rows keep all original fields; "question" and "answer" hold the validated values
  (answer as str).
  """
  if on_bad_row not in ("raise", "skip"):
    raise ValueError(f"on_bad_row must be 'raise' or 'skip', got {on_bad_row!r}")
  name, subset, spelled_split = parse_source(source)
  if spelled_split is not None and split is not None and spelled_split != split:
    raise ValueError(f"dataset {source!r} names split {spelled_split!r}, the caller {split!r}")
  split = spelled_split or split
  path = resolve_dataset(name, split)
  where = ":".join(x for x in (name, subset, split) if x is not None)
  location = str(path) if path is not None else f"datasets:{where}"
  report = LoadReport(source=source, location=location)
  records, unit = _open_records(path, report, split) if path else _open_hub(name, subset, split)

  rows: list[dict] = []
  for pos, obj, err in records:
    if limit is not None and len(rows) >= limit:
      break
    row = None
    if err is None:
      row, err = _check_row(obj, question_key, answer_key)
    if err is not None:
      if on_bad_row == "raise":
        raise ValueError(f"{location}: {unit} {pos}: {err}")
      report.bad_rows.append((location, pos, err))
      continue
    rows.append(row)
  report.rows, report.skipped = len(rows), len(report.bad_rows)
  if report.skipped:
    shown = "; ".join(f"{unit} {p}: {r}" for _, p, r in report.bad_rows[:5])
    logger.warning(
      "%s: skipped %d bad rows of %d (%s%s)",
      location,
      report.skipped,
      report.skipped + report.rows,
      shown,
      "; ..." if report.skipped > 5 else "",
    )
  return rows, report


def run_data_keys(data_cfg, split: str) -> dict:
  """load_qa's keyword arguments for a run's `data.train` or `data.eval` (config `data`): the
  eval set reads data.eval_question_key / eval_answer_key where set, else the train keys
  (DeepMath-103K trains on `final_answer`; MATH500 or GSM8K evaluate on `answer`)."""
  if split not in ("train", "eval"):
    raise ValueError(f"split {split!r}: expected 'train' or 'eval'")
  q, a = data_cfg.question_key, data_cfg.answer_key
  if split == "eval":
    q, a = data_cfg.eval_question_key or q, data_cfg.eval_answer_key or a
  return dict(question_key=q, answer_key=a, on_bad_row=data_cfg.on_bad_row)


def to_dataset(rows: list[dict]):
  """The rows as a `datasets.Dataset`, for code that wants map/filter/save."""
  import datasets

  return datasets.Dataset.from_list(rows)


class PromptIterator:
  """Deterministic epoch-shuffled batches over rows, resumable at the exact position.

  Epoch e uses the permutation from np.random.default_rng([seed, e]), so resuming needs only
  (epoch, index, seed): no RNG state has to be saved.

  In an N-process run every process draws the same global batch (a few prompts, cheap) and
  keeps the groups its devices hold, so the batch does not depend on the process count and
  one saved position resumes every process. Why not grain: its per-process sharding splits
  records by process index, which need not be the rows the mesh gives a process, and this
  iterator is already deterministic and checkpointable with no extra dependency.
  """

  def __init__(self, rows: list[dict], seed: int = 0, shuffle: bool = True):
    if not rows:
      raise ValueError("PromptIterator needs at least one row")
    self.rows, self.seed, self.shuffle = rows, int(seed), shuffle
    self.epoch, self.index = 0, 0
    self._perm_epoch, self._perm = -1, np.arange(0)

  def _order(self) -> np.ndarray:
    if self._perm_epoch != self.epoch:
      n = len(self.rows)
      self._perm = (
        np.random.default_rng([self.seed, self.epoch]).permutation(n)
        if self.shuffle
        else np.arange(n)
      )
      self._perm_epoch = self.epoch
    return self._perm

  def next_batch(self, n: int) -> list[dict]:
    """The next n rows; crosses epoch boundaries (a new shuffle each epoch)."""
    if n <= 0:
      raise ValueError(f"batch size must be positive, got {n}")
    out = []
    while len(out) < n:
      order = self._order()
      take = min(n - len(out), len(order) - self.index)
      out.extend(self.rows[i] for i in order[self.index : self.index + take])
      self.index += take
      if self.index == len(order):
        self.epoch, self.index = self.epoch + 1, 0
    return out

  def state_dict(self) -> dict:
    return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_rows": len(self.rows)}

  def load_state_dict(self, state: dict) -> None:
    # A different row count means a different dataset: the saved position is meaningless.
    if "num_rows" in state and int(state["num_rows"]) != len(self.rows):
      raise ValueError(f"state is for {state['num_rows']} rows, iterator has {len(self.rows)}")
    index = int(state["index"])
    if not 0 <= index < len(self.rows):
      raise ValueError(f"state index {index} out of range for {len(self.rows)} rows")
    self.epoch, self.index, self.seed = int(state["epoch"]), index, int(state["seed"])
    self._perm_epoch = -1
