"""tools/analysis/pair_format.py: the boxed-answer format cue of a run's RM pairs, per block,
on pairs written by hand."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "analysis"))
import pair_format as pf  # noqa: E402  pylint: disable=wrong-import-position


@pytest.mark.parametrize(
  "text,boxed",
  [
    ("2 + 3 = 5\nThe answer is \\boxed{5}.", True),
    ("2 + 3 = 5\nThe answer is \\boxed", False),  # unclosed: math-verify reads the last number
    ("2 + 3 = 5\nThe answer is \\boxed{}.", False),  # empty
    ("2 + 3 = 5\nThe answer is \\boxed{ }.", False),
    ("\\boxed{4} then \\boxed{", True),  # an unclosed last box falls back to the one before
    ("no box at all: 5", False),
  ],
)
def test_boxed_answer(text, boxed):
  assert pf.boxed_answer(text) is boxed


def test_block_shares_count_accepted_pairs_only(tmp_path):
  good, bare = "x = 5\nThe answer is \\boxed{5}.", "x = 5\nThe answer is \\boxed{}."
  pairs = [
    {"step": 1, "accepted": True, "positive": good, "negative": good},
    {"step": 2, "accepted": True, "positive": bare, "negative": good},
    {"step": 2, "accepted": False, "positive": bare, "negative": ""},  # not a pair
    {"step": 3, "accepted": True, "positive": bare, "negative": good},
    {"step": 4, "accepted": True, "positive": good, "negative": bare},
  ]
  run = tmp_path / "run"
  run.mkdir()
  (run / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
  ((first, second),) = pf.main([str(run), "--block", "2"]).values()
  assert first == {"end_step": 2, "pairs": 2, "pos_boxed": 0.5, "neg_boxed": 1.0, "separated": 0.5}
  assert second == {"end_step": 4, "pairs": 2, "pos_boxed": 0.5, "neg_boxed": 0.5, "separated": 1.0}


def test_a_run_without_pairs_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="pairs.jsonl"):
    pf.main([str(tmp_path)])
