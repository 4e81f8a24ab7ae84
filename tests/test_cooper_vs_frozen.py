"""tools/analysis/cooper_vs_frozen.py: Cooper - frozen at the frozen arm's peak and at the end,
per-seed onsets and their reading, on two study folders written by hand."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "analysis"))
import cooper_vs_frozen as cvf  # noqa: E402  pylint: disable=wrong-import-position

STEPS = [20, 40, 60, 80]


def _study(path: Path, arms: dict[str, dict[int, tuple[list[float], float]]]) -> str:
  """A study folder with, per condition and seed, the gold blocks (points) and the final
  held-out accuracy (fraction)."""
  path.mkdir(parents=True)
  seeds = sorted({s for a in arms.values() for s in a})
  over = {
    c: {"seeds": {str(s): {"steps": STEPS, "gold_rollouts": g} for s, (g, _) in a.items()}}
    for c, a in arms.items()
  }
  res = {
    "seeds": seeds,
    "summaries": {c: {"seed_accuracies": [a[s][1] for s in seeds]} for c, a in arms.items()},
  }
  (path / "overoptimization.json").write_text(json.dumps(over))
  (path / "results.json").write_text(json.dumps(res))
  return f"{path}:{','.join(arms)}"


def test_paired_differences_onsets_and_readings(tmp_path):
  frozen = _study(
    tmp_path / "a",
    {
      "frozen": {
        0: ([50.0, 55.0, 44.0, 30.0], 0.30),  # peak 55 at 40, onset 60 (44 <= 55 - 10)
        1: ([52.0, 45.0, 43.0, 40.0], 0.40),  # peak at 20, onset 80 (40 <= 52 - 10; 43 is not)
        2: ([50.0, 51.0, 50.0, 49.0], 0.60),  # never 10 below its peak: not hacked
      }
    },
  )
  cooper = _study(
    tmp_path / "b",
    {
      "cooper": {
        0: ([50.0, 56.0, 58.0, 60.0], 0.70),  # never falls: prevented
        1: ([51.0, 53.0, 50.0, 42.0], 0.45),  # onset 80 (42 <= 53 - 10): not delayed
        2: ([50.0, 40.0, 40.0, 45.0], 0.55),
      }
    },
  )
  out = tmp_path / "cmp"
  r = cvf.main(["--frozen", frozen, "--cooper", cooper, "--out", str(out)])["cooper"]
  rows = {x["seed"]: x for x in r["per_seed"]}
  assert [rows[s]["frozen_peak_step"] for s in (0, 1, 2)] == [40, 20, 40]
  assert [rows[s]["at_peak"] for s in (0, 1, 2)] == [56.0 - 55.0, 51.0 - 52.0, 40.0 - 51.0]
  assert [rows[s]["at_end"] for s in (0, 1, 2)] == [60.0 - 30.0, 42.0 - 40.0, 45.0 - 49.0]
  assert [rows[s]["heldout"] for s in (0, 1, 2)] == pytest.approx([40.0, 5.0, -5.0])
  assert [(rows[s]["onset_frozen"], rows[s]["onset_cooper"]) for s in (0, 1, 2)] == [
    (60, None),
    (80, 80),
    (None, 40),
  ]
  assert [rows[s]["verdict"] for s in (0, 1, 2)] == [
    "prevented",
    "not delayed",
    "frozen not hacked",
  ]
  assert r["at_end"]["mean_diff"] == pytest.approx((30.0 + 2.0 - 4.0) / 3)
  lo, hi = r["at_end"]["ci95"]  # t(0.975, 2) = 4.303; sd of (30, 2, -4) = 18.15
  assert (lo + hi) / 2 == pytest.approx(28.0 / 3)
  assert (hi - lo) / 2 == pytest.approx(4.302653 * 18.147543 / 3**0.5, rel=1e-5)
  assert (
    "| 0 | +1.0 (40) | +30.0 | +40.0 | 60 → - | prevented |" in out.with_suffix(".md").read_text()
  )


def test_a_condition_missing_from_the_study_names_it(tmp_path):
  spec = _study(tmp_path / "a", {"frozen": {0: ([50.0, 40.0, 40.0, 40.0], 0.3)}})
  with pytest.raises(KeyError, match="'cooper'"):
    cvf.load_arms(spec.replace("frozen", "cooper"), 10.0)
