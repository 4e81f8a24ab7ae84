"""Data loading: validation with line numbers, registry, hub path, resumable iteration."""

import json
import logging
from pathlib import Path

import datasets
import pytest

from cooper_jax.data import (
  REGISTRY,
  PromptIterator,
  load_qa,
  parse_source,
  run_data_keys,
  to_dataset,
)


@pytest.fixture
def bad_jsonl(tmp_path):
  lines = [
    json.dumps({"question": "q1", "answer": "1"}),
    json.dumps({"question": "q2", "answer": 2}),
    json.dumps({"question": "q3"}),  # line 3: missing answer
    json.dumps({"question": "q4", "answer": "4"}),
    json.dumps({"question": "  ", "answer": "5"}),  # line 5: empty question
    json.dumps({"question": "q6", "answer": 6.0}),
    '{"question": "q7", "answer": ',  # line 7: broken JSON
    json.dumps({"question": "q8", "answer": "\\frac{1}{2}"}),
  ]
  path = tmp_path / "bad.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def test_bad_row_raises_with_file_line_and_key(bad_jsonl):
  with pytest.raises(ValueError) as e:
    load_qa(str(bad_jsonl))
  msg = str(e.value)
  assert str(bad_jsonl) in msg and "line 3" in msg and "'answer'" in msg


def test_bad_rows_skipped_and_reported(bad_jsonl, caplog):
  with caplog.at_level(logging.WARNING):
    rows, rep = load_qa(str(bad_jsonl), on_bad_row="skip")
  assert [r["question"] for r in rows] == ["q1", "q2", "q4", "q6", "q8"]
  assert [r["answer"] for r in rows] == ["1", "2", "4", "6", "\\frac{1}{2}"]
  assert rep.rows == 5 and rep.skipped == 3
  assert [(f, line) for f, line, _ in rep.bad_rows] == [(str(bad_jsonl), n) for n in (3, 5, 7)]
  reasons = [r for _, _, r in rep.bad_rows]
  assert "missing key 'answer'" in reasons[0]
  assert "empty 'question'" in reasons[1]
  assert "invalid JSON" in reasons[2]
  assert "skipped 3 bad rows" in caplog.text


def test_limit_custom_keys_and_other_formats(tmp_path):
  rows = [{"problem": f"p{i}", "solution_value": i} for i in range(1, 6)]
  js = tmp_path / "d.json"
  js.write_text(json.dumps(rows))
  out, rep = load_qa(str(js), question_key="problem", answer_key="solution_value", limit=3)
  assert [r["question"] for r in out] == ["p1", "p2", "p3"] and out[0]["answer"] == "1"
  assert out[0]["problem"] == "p1"  # original fields kept
  pq = tmp_path / "d.parquet"
  to_dataset([{"question": "a", "answer": "1"}, {"question": "", "answer": "2"}]).to_parquet(pq)
  with pytest.raises(ValueError, match=r"row 2: empty 'question'"):
    load_qa(str(pq))
  with pytest.raises(FileNotFoundError):
    load_qa(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
  "name,count",
  [
    ("gsm8k/test", 1319),
    ("gsm8k/train", 7473),
    ("math500/test", 500),
    ("svamp/test", 1000),
    ("olympiadbench/test", 675),
    ("odyssey_math/test", 387),
  ],
)
def test_registry_row_counts(name, count):
  rows, rep = load_qa(name)
  assert len(rows) == rep.rows == count and rep.skipped == 0
  assert all(isinstance(r["answer"], str) and r["answer"] for r in rows)


def test_registry_split_argument_and_content():
  rows, rep = load_qa("gsm8k", split="test", limit=2)
  assert rep.location.endswith("gsm8k/test.jsonl") and len(rows) == 2
  assert rows[0]["answer"] == "18" and rows[0]["question"].startswith("Janet")
  assert set(REGISTRY) >= {"gsm8k/train", "math500/test"}


def test_hub_path(monkeypatch):
  calls = []

  def fake_load(name, subset=None, split=None):
    calls.append((name, subset, split))
    if name == "org/missing":
      raise ConnectionError("no network")
    return datasets.Dataset.from_list([{"q": "x", "a": 3}])

  monkeypatch.setattr(datasets, "load_dataset", fake_load)
  rows, rep = load_qa("org/ds", split="test", question_key="q", answer_key="a")
  assert rows[0]["answer"] == "3" and calls[-1] == ("org/ds", None, "test")
  load_qa("org/ds:main:train", question_key="q", answer_key="a")
  assert calls[-1] == ("org/ds", "main", "train")
  with pytest.raises(RuntimeError, match="load_dataset. failed: no network"):
    load_qa("org/missing:test")
  with pytest.raises(ValueError, match="NAME:SPLIT"):
    load_qa("org/ds")
  with pytest.raises(ValueError, match="names split 'train', the caller 'test'"):
    load_qa("org/ds:train", split="test")


@pytest.mark.parametrize(
  "source,want",
  [
    ("gsm8k/test", ("gsm8k/test", None, None)),
    ("openai/gsm8k:main:train", ("openai/gsm8k", "main", "train")),
    ("HuggingFaceH4/MATH-500:test", ("HuggingFaceH4/MATH-500", None, "test")),
  ],
)
def test_parse_source(source, want):
  assert parse_source(source) == want


@pytest.mark.parametrize("bad", ["a:b:c:d", "org/ds:", ":test", "org/ds::test"])
def test_parse_source_names_a_bad_form(bad):
  with pytest.raises(ValueError, match="NAME:SUBSET:SPLIT"):
    parse_source(bad)


def write_datasets_folders(root: Path) -> tuple[Path, Path]:
  """(a save_to_disk DatasetDict with train/test, a hub-repo layout with subsets 'main' and
  'other' as README configs), both with question/answer columns; test and CLI fixtures."""
  rows = lambda tag, n: [{"question": f"{tag} {i}", "answer": str(i)} for i in range(n)]
  saved = root / "saved"
  datasets.DatasetDict(
    train=datasets.Dataset.from_list(rows("saved-train", 5)),
    test=datasets.Dataset.from_list(rows("saved-test", 3)),
  ).save_to_disk(str(saved))
  repo = root / "repo"
  for subset, n in (("main", 4), ("other", 2)):
    (repo / subset).mkdir(parents=True)
    for split in ("train", "test"):
      datasets.Dataset.from_list(rows(f"{subset}-{split}", n)).to_parquet(
        str(repo / subset / f"{split}-00000-of-00001.parquet")
      )
  configs = "".join(
    f"- config_name: {s}\n  data_files:\n  - split: train\n    path: {s}/train-*\n"
    f"  - split: test\n    path: {s}/test-*\n"
    for s in ("main", "other")
  )
  (repo / "README.md").write_text(f"---\nconfigs:\n{configs}---\n")
  return saved, repo


def test_local_datasets_folders(tmp_path):
  saved, repo = write_datasets_folders(tmp_path)
  rows, rep = load_qa(f"{saved}:test")
  assert [r["question"] for r in rows] == ["saved-test 0", "saved-test 1", "saved-test 2"]
  assert rep.location == f"datasets:{saved}:test"
  rows, _ = load_qa(f"{repo}:other:train")
  assert [r["question"] for r in rows] == ["other-train 0", "other-train 1"]
  rows, _ = load_qa(f"{repo}:main:test", limit=2)
  assert [r["answer"] for r in rows] == ["0", "1"]
  with pytest.raises(ValueError, match=r"split 'validation' not in its splits \['test', 'train'\]"):
    load_qa(f"{saved}:validation")


def _drain(it, sizes):
  return [[r["id"] for r in it.next_batch(n)] for n in sizes]


def test_prompt_iterator_resume_matches_uninterrupted():
  rows = [{"id": i} for i in range(10)]
  sizes = [3, 4, 7, 2, 9, 5, 1, 6]
  full = _drain(PromptIterator(rows, seed=7), sizes)
  # Every epoch is a permutation of all rows, and epochs are shuffled differently.
  flat = [i for b in full for i in b]
  assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
  assert flat[:10] != flat[10:20]

  it = PromptIterator(rows, seed=7)
  first = _drain(it, sizes[:3])
  state = json.loads(json.dumps(it.state_dict()))  # survives a checkpoint round trip
  assert state["epoch"] == 1 and state["index"] == 4 and state["seed"] == 7
  resumed = PromptIterator(rows, seed=0)
  resumed.load_state_dict(state)
  assert first + _drain(resumed, sizes[3:]) == full

  assert _drain(PromptIterator(rows, seed=8), sizes) != full
  with pytest.raises(ValueError):
    PromptIterator(rows[:5]).load_state_dict(state)


def test_eval_set_reads_its_own_keys(tmp_path):
  """A DeepMath-style train file (final_answer) beside a GSM8K-style eval file (answer): the
  eval keys, when set, are the eval set's; unset, it reads the train keys (and fails naming
  the missing key, as before)."""
  from cooper_jax.config import base_config  # pylint: disable=import-outside-toplevel

  train = tmp_path / "train.jsonl"
  train.write_text(json.dumps({"question": "1+1", "final_answer": "2"}) + "\n")
  ev = tmp_path / "eval.jsonl"
  ev.write_text(json.dumps({"question": "2+2", "answer": "4"}) + "\n")
  c = base_config()
  c.data.answer_key = "final_answer"
  rows, _ = load_qa(str(train), **run_data_keys(c.data, "train"))
  assert rows[0]["answer"] == "2"
  with pytest.raises(ValueError, match="missing key 'final_answer'"):
    load_qa(str(ev), **run_data_keys(c.data, "eval"))
  c.data.eval_answer_key = "answer"
  rows, _ = load_qa(str(ev), **run_data_keys(c.data, "eval"))
  assert rows[0]["answer"] == "4"
  assert run_data_keys(c.data, "train")["answer_key"] == "final_answer"
