"""tools/analysis/dose_response.py: rows of Cooper - frozen paired by seed, placed at the RM's
step-0 pair accuracy, on study folders written by hand."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "analysis"))
import dose_response as dr  # noqa: E402  pylint: disable=wrong-import-position


def _study(
  path: Path, arms: dict[str, dict[int, float]], rm_acc: dict[int, float | None], end=0.5
) -> None:
  """A cooper-study folder: held-out accuracy (fraction) per condition and seed; each run's
  RM pair accuracy at step 0 (None: a metrics file without it) and, for the cooper runs, `end`
  at their last evaluation."""
  seeds = sorted({s for a in arms.values() for s in a})
  res = {
    "seeds": seeds,
    "summaries": {c: {"seed_accuracies": [a.get(s) for s in seeds]} for c, a in arms.items()},
  }
  path.mkdir(parents=True)
  (path / "results.json").write_text(json.dumps(res))
  for cond in arms:
    for s, acc in rm_acc.items():
      run = path / "runs" / f"{cond}_s{s}"
      run.mkdir(parents=True)
      rows = [{"step": 0, "eval/acc": 0.9} | ({} if acc is None else {"eval/rm_pair_acc": acc})]
      last = {} if acc is None else {"eval/rm_pair_acc": acc if cond == "frozen" else end}
      rows += [{"step": 1}, {"step": 20} | last]
      (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rows_paired_by_seed_sorted_by_rm_accuracy(tmp_path):
  _study(
    tmp_path / "good",
    {"frozen": {0: 0.70, 1: 0.60, 2: 0.50}, "cooper": {0: 0.40, 1: 0.45, 2: 0.20}},
    {0: 0.9, 1: 0.9, 2: 0.9},
    end=0.7,
  )
  _study(
    tmp_path / "weak",
    {"frozen": {3: 0.10, 4: 0.20}, "cooper": {3: 0.30, 4: 0.25}},
    {3: 0.6, 4: 0.6},
  )
  out = tmp_path / "dose" / "d"
  rows = dr.main(
    [
      "--row",
      f"{tmp_path / 'good'}:frozen:cooper",
      "--row",
      f"{tmp_path / 'weak'}:frozen:cooper",
      "--out",
      str(out),
    ]
  )
  assert [r["rm_pair_acc"] for r in rows] == [0.6, 0.9]  # sorted by the x, not by --row order
  assert rows[1]["cooper_rm_acc_end"] == [0.7, 0.7, 0.7]  # the cooper runs' last evaluation
  weak, good = rows
  assert weak["seeds"] == [3, 4] and good["seeds"] == [0, 1, 2]
  assert weak["per_seed_diff"] == pytest.approx([20.0, 5.0])
  assert good["per_seed_diff"] == pytest.approx([-30.0, -15.0, -30.0])
  assert good["mean_diff"] == pytest.approx(-25.0)
  # t CI by hand: sd of (-30, -15, -30) = sqrt(75) = 8.660; t(0.975, 2) = 4.3027; n = 3
  half = 4.302653 * np.sqrt(75.0) / np.sqrt(3.0)
  assert good["ci95"] == pytest.approx([-25.0 - half, -25.0 + half], abs=1e-4)
  for ext in ("md", "json", "png"):
    assert (out.parent / f"d.{ext}").stat().st_size > 0
  assert "+20.0, +5.0" in (out.parent / "d.md").read_text()


def test_bad_rows_are_named(tmp_path):
  _study(tmp_path / "a", {"frozen": {0: 0.5, 1: 0.5}, "cooper": {0: 0.5, 1: 0.4}}, {0: 0.8, 1: 0.7})
  with pytest.raises(ValueError, match="differs by seed"):
    dr.row(f"{tmp_path / 'a'}:frozen:cooper")
  _study(tmp_path / "b", {"frozen": {0: 0.5, 1: 0.5}, "cooper": {0: 0.5, 1: 0.4}}, {0: 0.8})
  with pytest.raises(FileNotFoundError, match="frozen_s1/metrics.jsonl"):
    dr.row(f"{tmp_path / 'b'}:frozen:cooper")
  _study(
    tmp_path / "c", {"frozen": {0: 0.5, 1: 0.5}, "cooper": {0: 0.5, 1: 0.4}}, {0: None, 1: None}
  )
  with pytest.raises(KeyError, match="no step-0 eval/rm_pair_acc"):
    dr.row(f"{tmp_path / 'c'}:frozen:cooper")
  with pytest.raises(KeyError, match="no condition 'cooperx'"):
    dr.row(f"{tmp_path / 'a'}:frozen:cooperx")
  with pytest.raises(ValueError, match="STUDY:FROZEN_CONDITION:COOPER_CONDITION"):
    dr.row("results/x:frozen")
