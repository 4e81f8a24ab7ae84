"""The study's two-level bootstrap (cooper_jax.stats): seeds, then problems within each seed."""

import numpy as np
import pytest

from cooper_jax import stats

Z = 1.959964  # two-sided 95% normal quantile


def test_no_seed_spread_gives_the_analytic_problem_level_width():
  # Every seed has the same 0/1 row (population sd 0.5): a resample is the mean of S * P
  # independent draws from it, so the 95% CI is mean +- Z * 0.5 / sqrt(S * P).
  n_seeds, n_problems = 4, 100
  m = np.tile(np.arange(n_problems) % 2, (n_seeds, 1)).astype(np.float64)
  lo, hi = stats.hierarchical_bootstrap_ci(m, n_resamples=8000, seed=0)
  assert hi - lo == pytest.approx(2 * Z * 0.5 / np.sqrt(n_seeds * n_problems), rel=0.08)
  assert lo < 0.5 < hi


def test_width_follows_both_variance_components():
  # Variance of a two-level resample's grand mean: var(seed means) / S + mean within-seed
  # variance / (S * P) (population variances of the data being resampled).
  rng = np.random.default_rng(5)
  n_seeds, n_problems = 10, 60
  m = np.clip(rng.normal(0.5, 0.1, (n_seeds, 1)) + rng.normal(0, 0.2, (n_seeds, n_problems)), 0, 1)
  var = m.mean(axis=1).var() / n_seeds + m.var(axis=1).mean() / (n_seeds * n_problems)
  lo, hi = stats.hierarchical_bootstrap_ci(m, n_resamples=8000, seed=1)
  assert hi - lo == pytest.approx(2 * Z * np.sqrt(var), rel=0.1)


def test_seed_spread_widens_the_ci_where_a_problem_bootstrap_stays_narrow():
  # Half the seeds score 0.2 on every problem, half 0.8: no problem noise at all.
  m = np.repeat([[0.2], [0.8], [0.2], [0.8]], 50, axis=1)
  lo, hi = stats.hierarchical_bootstrap_ci(m, n_resamples=4000, seed=0)
  assert lo <= 0.3 and hi >= 0.7  # most of [0.2, 0.8]
  p_lo, p_hi = stats.bootstrap_ci(m.mean(axis=0), n_resamples=4000, seed=0)
  assert p_hi - p_lo < 1e-9  # per-problem means are all 0.5: the old CI is a point
  s = stats.condition_summary(list(m))
  assert s["ci95"] == pytest.approx([lo, hi], abs=0.05) and s["ci95"][1] - s["ci95"][0] > 0.35
  assert s["ci95_problems"][1] - s["ci95_problems"][0] < 1e-9
  assert s["seed_accuracies"] == pytest.approx([0.2, 0.8, 0.2, 0.8])
  assert s["n_seeds"] == 4 and s["n_problems"] == 50


def test_diff_ci_of_identical_conditions_is_zero():
  rng = np.random.default_rng(0)
  a = rng.random((5, 30))
  assert stats.hierarchical_bootstrap_diff_ci(a, a.copy()) == (0.0, 0.0)
  lo, hi = stats.hierarchical_bootstrap_diff_ci(a + 0.1, a)
  assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)


def test_diff_ci_is_paired_by_seed_and_problem():
  # Large seed and problem effects shared by both conditions, a constant +0.05 on top for a
  # plus small independent noise: pairing cancels the shared effects, so the CI is narrow and
  # excludes 0, while the two conditions' own CIs overlap.
  rng = np.random.default_rng(2)
  shared = rng.normal(0, 0.2, (5, 1)) + rng.normal(0, 0.3, (1, 80))
  b = shared + rng.normal(0, 0.01, (5, 80))
  a = shared + 0.05 + rng.normal(0, 0.01, (5, 80))
  lo, hi = stats.hierarchical_bootstrap_diff_ci(a, b, seed=0)
  assert 0.0 < lo < 0.05 < hi < 0.1 and hi - lo < 0.02
  a_lo, a_hi = stats.hierarchical_bootstrap_ci(a)
  b_lo, b_hi = stats.hierarchical_bootstrap_ci(b)
  assert a_lo < b_hi and (a_hi - a_lo) > 10 * (hi - lo)


def test_reproducible_with_a_seed():
  rng = np.random.default_rng(3)
  a, b = rng.random((3, 20)), rng.random((3, 20))
  assert stats.hierarchical_bootstrap_ci(a, seed=7) == stats.hierarchical_bootstrap_ci(a, seed=7)
  assert stats.hierarchical_bootstrap_ci(a, seed=7) != stats.hierarchical_bootstrap_ci(a, seed=8)
  d1 = stats.hierarchical_bootstrap_diff_ci(a, b, seed=7)
  assert d1 == stats.hierarchical_bootstrap_diff_ci(a, b, seed=7)


def test_bad_shapes_raise():
  with pytest.raises(ValueError):
    stats.hierarchical_bootstrap_ci(np.zeros(5))
  with pytest.raises(ValueError):
    stats.hierarchical_bootstrap_ci(np.zeros((0, 3)))
  with pytest.raises(ValueError):
    stats.hierarchical_bootstrap_diff_ci(np.zeros((2, 3)), np.zeros((3, 3)))


def test_seed_level_comparison_adds_the_hierarchical_ci():
  a = np.array([[0.5, 0.6], [0.6, 0.7], [0.4, 0.5]])
  b = a - np.array([[0.1], [0.2], [0.1]])
  c = stats.seed_level_comparison(a, b)
  assert c["per_seed_diff"] == pytest.approx([0.1, 0.2, 0.1])
  assert c["n_seeds"] == 3 and c["sign_flip_p"] == pytest.approx(0.25)
  assert 0.1 - 1e-9 <= c["ci95"][0] <= c["ci95"][1] <= 0.2 + 1e-9
  md = stats.format_study_table({"x": stats.condition_summary(list(a))}, {}, 2, 3, 4, {"x - y": c})
  assert f"| +13.3 | {100 * c['ci95'][0]:+.1f} to {100 * c['ci95'][1]:+.1f} |" in md


def test_detectable_difference_has_the_stated_power():
  """At the returned difference, simulated paired t-tests over n runs reject with ~80%
  probability (a check independent of the noncentral-t formula), and above the normal
  approximation's value (small-n t critical values are wider)."""
  from scipy import stats as sps  # pylint: disable=import-outside-toplevel

  from cooper_jax.stats import detectable_difference  # pylint: disable=import-outside-toplevel

  n, sd = 8, 0.05
  delta = detectable_difference(sd, n)
  assert delta > (1.959964 + 0.841621) * sd / np.sqrt(n)  # the z approximation, 0.0495
  rng = np.random.default_rng(0)
  d = rng.normal(delta, sd, size=(20000, n))
  p = sps.ttest_1samp(d, 0.0, axis=1).pvalue
  power = float(np.mean(p < 0.05))
  # 20000 draws: the binomial standard error of 0.8 is 0.0028.
  assert abs(power - 0.8) < 0.012, power
