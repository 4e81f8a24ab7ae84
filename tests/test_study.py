"""Study statistics (cooper_jax.stats): paired tests, per-condition summaries; the study tool's
curves over seeds."""

import numpy as np
import pytest

from cooper_jax import stats
from cooper_jax.cli import study as run_study


def test_paired_test_identical_conditions_is_not_significant():
  a = np.array([1.0, 0.0, 0.5, 0.25, 1.0, 0.0])
  t = stats.paired_test(a, a.copy())
  assert t["mean_diff"] == 0.0 and t["p_value"] == 1.0 and t["ci95"] == [0.0, 0.0]


def test_paired_test_constant_gain_has_the_exact_permutation_p():
  # Ten problems each +0.5: only the all-plus and all-minus sign patterns reach |mean| = 0.5,
  # so the exact two-sided p is 2 / 2**10; the Monte Carlo estimate must be close to it.
  a, b = np.full(10, 0.75), np.full(10, 0.25)
  t = stats.paired_test(a, b, n=20000, seed=1)
  assert t["mean_diff"] == pytest.approx(0.5)
  assert t["p_value"] == pytest.approx(2 / 1024, abs=0.0015)
  assert t["ci95"] == pytest.approx([0.5, 0.5])


def test_condition_summary_means_over_seeds_then_problems():
  s = stats.condition_summary([np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 1.0])])
  assert s["accuracy"] == pytest.approx(0.625)
  assert s["seed_accuracies"] == pytest.approx([0.75, 0.5])
  assert s["seed_sd"] == pytest.approx(np.std([0.75, 0.5], ddof=1))
  assert s["per_problem"] == pytest.approx([0.5, 0.0, 1.0, 1.0])
  assert s["ci95"][0] <= 0.625 <= s["ci95"][1]


def test_curves_keep_steps_every_seed_has():
  runs = {
    "c": [
      [{"step": 0, "x": 1.0}, {"step": 5, "x": 3.0}],
      [{"step": 0, "x": 3.0}, {"step": 5, "x": 5.0}, {"step": 10, "x": 9.0}],
    ]
  }
  steps, mean, lo, hi = run_study.curves(runs, "x")["c"]
  np.testing.assert_array_equal(steps, [0, 5])
  np.testing.assert_allclose(mean, [2.0, 4.0])
  np.testing.assert_allclose(lo, [1.0, 3.0])
  np.testing.assert_allclose(hi, [3.0, 5.0])


def test_table_formats_points():
  s = {"rule": stats.condition_summary([np.array([1.0, 0.0])])}
  t = {"cooper - rule": {"mean_diff": 0.031, "ci95": [-0.01, 0.07], "p_value": 0.2}}
  md = stats.format_study_table(s, t, 2, 1, 4)
  assert "| rule | 50.0 (" in md and "| cooper - rule | +3.1 | -1.0 to +7.0 | 0.2 |" in md


def test_seed_level_test_uses_runs_not_problems():
  # Three seeds that disagree in sign: of the 8 sign patterns of (5.9, 4.9, 4.0) points, 4
  # reach |mean| >= 2.27 (the observed one, its mirror, all-plus, all-minus): p = 4/8. No
  # 3-seed result can go below 2/8.
  t = stats.seed_paired_test([0.225, 0.248, 0.160], [0.166, 0.199, 0.200])
  assert t["per_seed_diff"] == pytest.approx([0.059, 0.049, -0.040])
  assert t["sign_flip_p"] == pytest.approx(0.5)
  assert 0.4 < t["t_test_p"] < 0.7
  t = stats.seed_paired_test([0.40, 0.41, 0.42], [0.20, 0.20, 0.21])  # all seeds agree
  assert t["sign_flip_p"] == pytest.approx(0.25) and t["t_test_p"] < 0.01


def test_table_puts_seed_level_comparisons_first():
  s = {"rule": stats.condition_summary([np.array([1.0, 0.0]), np.array([1.0, 1.0])])}
  t = {"cooper - rule": {"mean_diff": 0.031, "ci95": [-0.01, 0.07], "p_value": 0.2}}
  st = {"cooper - rule": stats.seed_paired_test([0.5, 0.6], [0.4, 0.45])}
  md = stats.format_study_table(s, t, 2, 2, 4, st)
  assert "| cooper - rule | +10.0, +15.0 | +12.5 |" in md
  assert md.index("Paired by seed") < md.index("Paired by problem")
