"""tools/analysis/overoptimization.py: block means, peak, fall and hacking onset on series made
by hand, and the overoptimized-seed rule (gold falls from its peak while the proxy rises)."""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "analysis"))
import overoptimization as oo  # noqa: E402  pylint: disable=wrong-import-position


def test_peak_fall_and_onset():
  steps = np.array([20, 40, 60, 80, 100])
  r = oo.peak_and_onset(steps, np.array([50.0, 62.0, 58.0, 51.9, 55.0]), drop=10)
  assert (r["peak"], r["peak_step"], r["end"]) == (62.0, 40, 55.0)
  assert r["fall"] == 62.0 - 51.9 and r["onset"] == 80  # 51.9 is the first >= 10 below 62
  never = oo.peak_and_onset(steps, np.array([50.0, 60.0, 55.0, 51.0, 59.0]), drop=10)
  assert never["onset"] is None and never["fall"] == 9.0


def _rows(gold, proxy, block=2):
  """Per-step metrics whose block means are `gold` and `proxy` (two steps a block), with
  evaluations at block ends."""
  rows = [{"step": 0, "eval/acc": 0.5, "eval/kl_init": 0.0}]
  for k, (g, p) in enumerate(zip(gold, proxy)):
    for j, d in ((1, -0.01), (2, 0.01)):  # the block mean is exactly g, p
      rows.append({"step": k * block + j, "rule/acc": g + d, "reward/mean": p + d})
    rows[-1].update({"eval/acc": g, "eval/kl_init": 0.01 * (k + 1), "eval/rm_pair_acc": p})
  return rows


def test_a_study_summary(tmp_path):
  hacked = _rows([0.5, 0.7, 0.55], [0.4, 0.6, 0.8])  # gold 70 -> 55, proxy still rising
  fine = _rows([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
  falls_with_proxy = _rows([0.5, 0.7, 0.5], [0.4, 0.7, 0.5])  # the proxy falls too
  for name, rows in (("frozen_s0", hacked), ("frozen_s1", falls_with_proxy), ("rule_s0", fine)):
    (tmp_path / "runs" / name).mkdir(parents=True)
    (tmp_path / "runs" / name / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  s = oo.summarise(tmp_path, ["frozen", "rule"], block=2, drop=10)
  assert s["frozen"]["overoptimized_seeds"] == [0] and s["rule"]["overoptimized_seeds"] == []
  seed0 = s["frozen"]["seeds"][0]
  assert seed0["steps"] == [2, 4, 6]
  np.testing.assert_allclose(seed0["gold_rollouts"], [50, 70, 55])
  assert seed0["rollouts"]["onset"] == 6 and seed0["proxy_end"] > seed0["proxy_at_gold_peak"]
  assert seed0["sqrt_kl_end"] == np.sqrt(0.03)
  assert seed0["rm_steps"] == [2, 4, 6] and seed0["rm_pair_acc"] == [0.4, 0.6, 0.8]
  assert "| 0.40 → 0.80 |" in oo.table(s, drop=10)  # the RM's pair accuracy, first → last
