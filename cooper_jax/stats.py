"""Statistics in one place: bootstrap CIs, paired tests, classifier metrics, study summaries.

Resampling uses `scipy.stats` (percentile bootstrap, sign-flip permutation test); what scipy
has no function for (clustered bootstrap of confusion counts, the two-level seeds-then-problems
bootstrap of a study, the study's table) is written here. numpy-only at import: scipy is
imported where it is used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CLASSIFIER_METRICS = ("precision", "recall", "f1", "accuracy")


# ---------------------------------------------------------------------------------- bootstrap
def _percentile_ci(samples: tuple, statistic, n_resamples: int, seed: int, alpha: float):
  from scipy import stats  # pylint: disable=import-outside-toplevel

  samples = tuple(np.asarray(s, np.float64).reshape(-1) for s in samples)
  if any(s.size == 0 for s in samples):
    raise ValueError("bootstrap over an empty array")
  if all(np.all(s == s[0]) for s in samples):  # scipy warns on degenerate data; the CI is a point
    v = float(statistic(*(s[None] for s in samples), axis=-1)[0])
    return v, v
  res = stats.bootstrap(
    samples,
    statistic,
    n_resamples=n_resamples,
    confidence_level=1 - alpha,
    method="percentile",
    vectorized=True,
    rng=np.random.default_rng(seed),
  )
  return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_ci(
  x, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
  """Percentile bootstrap CI of the mean of x (e.g. per-problem accuracies)."""
  return _percentile_ci((x,), np.mean, n_resamples, seed, alpha)


def bootstrap_ci_average(
  xs: Sequence, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
  """CI of the unweighted mean of the means of several samples, each resampled on its own
  (e.g. the average over benchmarks, every benchmark redrawn in every resample)."""
  mean_of_means = lambda *s, axis: np.mean([v.mean(axis=axis) for v in s], axis=0)
  return _percentile_ci(tuple(xs), mean_of_means, n_resamples, seed, alpha)


def paired_test(a, b, n: int = 10000, seed: int = 0) -> dict:
  """Mean of a - b over pairs, its bootstrap 95% CI, and a two-sided sign-flip permutation p."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if d.shape[0] == 0:
    raise ValueError("paired_test needs at least one pair")
  if np.all(d == 0):
    p = 1.0
  else:
    # One sample + permutation_type="samples" = flipping the sign of each paired difference.
    res = stats.permutation_test(
      (d,),
      lambda x, axis: np.mean(x, axis=axis),
      permutation_type="samples",
      n_resamples=n,
      vectorized=True,
      alternative="two-sided",
      rng=np.random.default_rng(seed),
    )
    p = float(res.pvalue)
  lo, hi = bootstrap_ci(d, n_resamples=2000, seed=seed)
  return {"mean_diff": float(d.mean()), "ci95": [lo, hi], "p_value": p, "n_problems": d.shape[0]}


def roc_auc(scores, labels) -> float | None:
  """Area under the ROC curve: P(score of a random positive > that of a random negative),
  ties counting 1/2 (Mann-Whitney U / (n_pos n_neg)). None without both classes."""
  s, y = np.asarray(scores, np.float64), np.asarray(labels)
  pos, neg = s[y == 1], s[y == 0]
  if pos.size == 0 or neg.size == 0:
    return None
  diff = pos[:, None] - neg[None, :]
  return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def sign_test(wins: int, losses: int) -> float:
  """Two-sided exact sign test: p of a split at least as uneven as wins : losses when each
  non-tied pair goes either way with probability 1/2 (ties are left out before calling)."""
  import math  # pylint: disable=import-outside-toplevel

  n = wins + losses
  if wins < 0 or losses < 0:
    raise ValueError(f"sign_test needs counts >= 0, got {wins}, {losses}")
  if n == 0:
    return 1.0
  k = min(wins, losses)
  tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
  return min(1.0, 2.0 * tail)


def seed_paired_test(a_seeds, b_seeds) -> dict:
  """Condition a vs b at the level of independent runs: a_seeds[i], b_seeds[i] are the two
  conditions' accuracies with seed i (same data, same seed). Returns the per-seed differences,
  their mean, a paired t-test p and the exact two-sided sign-flip p (which cannot go below
  2 / 2**n_seeds: three seeds can never give p < 0.25)."""
  from scipy import stats  # pylint: disable=import-outside-toplevel

  d = np.asarray(a_seeds, np.float64) - np.asarray(b_seeds, np.float64)
  if d.size < 2:
    raise ValueError("a seed-level test needs at least two seeds")
  t_p = float(stats.ttest_rel(a_seeds, b_seeds).pvalue) if np.any(d != d[0]) else float("nan")
  flip_p = paired_test(a_seeds, b_seeds)["p_value"]  # 1.0 when every difference is 0
  return {
    "per_seed_diff": d.tolist(),
    "mean_diff": float(d.mean()),
    "t_test_p": t_p,
    "sign_flip_p": float(flip_p),
    "n_seeds": int(d.size),
    # The smallest true mean difference this design detects with 80% power (paired t, 0.05
    # two-sided), at the observed seed-to-seed spread of the differences.
    "mde80": detectable_difference(float(d.std(ddof=1)), int(d.size)),
  }


def detectable_difference(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
  """The true mean difference a two-sided paired t-test over n independent runs detects with
  probability `power`, when the per-run differences have standard deviation `sd`: the delta
  where the noncentral t (df n-1, noncentrality delta sqrt(n) / sd) exceeds the critical value
  with that probability (exact, not the normal approximation)."""
  from scipy import optimize, stats  # pylint: disable=import-outside-toplevel

  if n < 2:
    raise ValueError("a detectable difference needs at least two runs")
  if sd == 0:
    return 0.0
  df, crit = n - 1, float(stats.t.ppf(1 - alpha / 2, n - 1))

  def power_at(delta):
    nc = delta * np.sqrt(n) / sd
    # The wrong-sign tail is below 1e-8 wherever it matters; scipy returns NaN for it at
    # large noncentrality.
    return stats.nct.sf(crit, df, nc) + np.nan_to_num(stats.nct.cdf(-crit, df, nc))

  # The bracket ends at noncentrality 200: power above 0.99 for any df >= 1.
  return float(optimize.brentq(lambda x: power_at(x) - power, 1e-12, 200 * sd / np.sqrt(n)))


# ---------------------------------------------------------------------------------- classifiers
def precision_recall(pred, true):
  """(precision, recall) of boolean predictions; 0 where undefined (nothing predicted / no
  positives). Works on numpy and jax arrays alike (only operators and .sum() are used), so the
  jitted BCE loss and the host-side monitors share it."""
  tp = (pred & true).sum()
  n_pred, n_true = pred.sum(), true.sum()
  return tp / (n_pred + (n_pred == 0)), tp / (n_true + (n_true == 0))


def confusion_metrics(tp, fp, fn, tn) -> dict:
  """precision / recall / f1 / accuracy from confusion counts (scalars or arrays); NaN where
  undefined."""
  tp, fp, fn, tn = (np.asarray(x, np.float64) for x in (tp, fp, fn, tn))
  with np.errstate(divide="ignore", invalid="ignore"):
    return {
      "precision": tp / (tp + fp),
      "recall": tp / (tp + fn),
      "f1": 2 * tp / (2 * tp + fp + fn),
      "accuracy": (tp + tn) / (tp + fp + fn + tn),
    }


def _confusion(pred, gold):
  p, g = np.asarray(pred) == 1, np.asarray(gold) == 1  # undecided (-1) predicts negative
  return (p & g), (p & ~g), (~p & g), (~p & ~g)


def binary_metrics(pred, gold) -> dict:
  """tp/fp/fn/tn, precision, recall, f1, accuracy (None where undefined) of pred vs gold.
  pred in {1, 0, -1} (-1 undecided, scored negative and counted), gold in {1, 0}."""
  pred, gold = np.asarray(pred), np.asarray(gold)
  if pred.shape != gold.shape:
    raise ValueError(f"shape mismatch {pred.shape} vs {gold.shape}")
  if not np.isin(gold, (0, 1)).all():
    raise ValueError("gold labels must be 0/1 (drop undecidable items first)")
  c = [int(x.sum()) for x in _confusion(pred, gold)]
  out = dict(zip(("tp", "fp", "fn", "tn"), c), n=int(gold.size), undecided=int((pred < 0).sum()))
  out.update({k: None if np.isnan(v) else float(v) for k, v in confusion_metrics(*c).items()})
  return out


def bootstrap_binary_metrics(
  pred, gold, groups, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05
) -> dict:
  """{metric: [lo, hi] or None, "undefined": {metric: resamples dropped}}: a cluster bootstrap
  (all items of a group, e.g. one question's completions, are drawn together)."""
  _, inv = np.unique(np.asarray(groups), return_inverse=True)
  n_groups = int(inv.max()) + 1 if inv.size else 0
  per_group = np.zeros((n_groups, 4))
  for k, x in enumerate(_confusion(pred, gold)):
    per_group[:, k] = np.bincount(inv, weights=x.astype(np.float64), minlength=n_groups)
  rng = np.random.default_rng(seed)
  draws = per_group[rng.integers(0, n_groups, size=(n_resamples, n_groups))].sum(axis=1)
  ms = confusion_metrics(*draws.T)
  out, undefined = {}, {}
  for k in CLASSIFIER_METRICS:
    ok = ~np.isnan(ms[k])
    undefined[k] = int((~ok).sum())
    out[k] = (
      [float(v) for v in np.quantile(ms[k][ok], [alpha / 2, 1 - alpha / 2])] if ok.any() else None
    )
  out["undefined"] = undefined
  return out


# ---------------------------------------------------------------------------------- studies
def _as_seed_problem(m, name: str = "m") -> np.ndarray:
  m = np.asarray(m, np.float64)
  if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
    raise ValueError(f"{name} must be a non-empty [seeds, problems] array, got shape {m.shape}")
  return m


def _hierarchical_means(ms: Sequence[np.ndarray], n_resamples: int, seed: int) -> np.ndarray:
  """[len(ms), n_resamples] grand means of two-level resamples of the [seeds, problems] arrays
  in ms, all drawn with the same indices (so several arrays stay paired by seed and problem):
  seeds with replacement, then, for each drawn seed on its own, problems with replacement."""
  n_seeds, n_problems = ms[0].shape
  rng = np.random.default_rng(seed)
  out = np.empty((len(ms), n_resamples))
  chunk = max(1, (1 << 22) // (n_seeds * n_problems))  # ~32 MB of int64 indices at a time
  for start in range(0, n_resamples, chunk):
    r = min(chunk, n_resamples - start)
    si = rng.integers(0, n_seeds, size=(r, n_seeds, 1))
    pi = rng.integers(0, n_problems, size=(r, n_seeds, n_problems))
    for k, m in enumerate(ms):
      out[k, start : start + r] = m[si, pi].mean(axis=(1, 2))
  return out


def _quantile_ci(x: np.ndarray, alpha: float) -> tuple[float, float]:
  lo, hi = np.quantile(x, [alpha / 2, 1 - alpha / 2])
  return float(lo), float(hi)


def hierarchical_bootstrap_ci(
  m, n_resamples: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
  """Percentile CI of the grand mean of m = [seeds, problems] accuracies, resampling at both
  levels: seeds with replacement, then problems with replacement within each drawn seed. Both
  the run-to-run spread and the benchmark's finite size widen it; a problem-only bootstrap sees
  only the second."""
  m = _as_seed_problem(m)
  return _quantile_ci(_hierarchical_means([m], n_resamples, seed)[0], alpha)


def hierarchical_bootstrap_diff_ci(
  a, b, n_resamples: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
  """Percentile CI of mean(a) - mean(b) for two conditions run with the same seeds on the same
  problems (a, b: [seeds, problems]): every resample draws the same seed indices for both, and
  within a drawn seed the same problem indices, so seed and problem effects shared by the two
  conditions cancel."""
  a, b = _as_seed_problem(a, "a"), _as_seed_problem(b, "b")
  if a.shape != b.shape:
    raise ValueError(f"paired conditions need equal shapes, got {a.shape} vs {b.shape}")
  means = _hierarchical_means([a, b], n_resamples, seed)
  return _quantile_ci(means[0] - means[1], alpha)


def seed_level_comparison(a, b, n_resamples: int = 2000, seed: int = 0) -> dict:
  """a vs b, both [seeds, problems] with the same seeds and problems: seed_paired_test on the
  per-seed accuracies plus the paired hierarchical bootstrap CI of the difference ("ci95")."""
  a, b = _as_seed_problem(a, "a"), _as_seed_problem(b, "b")
  out = seed_paired_test(a.mean(axis=1), b.mean(axis=1))
  out["ci95"] = list(hierarchical_bootstrap_diff_ci(a, b, n_resamples, seed))
  return out


def condition_summary(per_seed_problem_acc: Sequence[np.ndarray], seed: int = 0) -> dict:
  """per_seed_problem_acc: one [n_problems] array per seed (mean over samples). "ci95" is the
  hierarchical (seeds, then problems) bootstrap CI; "ci95_problems" the problem-only one of the
  per-problem means over seeds, which ignores the run-to-run spread."""
  m = np.stack([np.asarray(x, np.float64) for x in per_seed_problem_acc])  # [seeds, problems]
  per_problem = m.mean(axis=0)
  seed_means = m.mean(axis=1)
  lo, hi = hierarchical_bootstrap_ci(m, n_resamples=2000, seed=seed)
  return {
    "accuracy": float(per_problem.mean()),
    "ci95": [lo, hi],
    "ci95_problems": list(bootstrap_ci(per_problem, n_resamples=2000, seed=seed)),
    "seed_accuracies": seed_means.tolist(),
    "seed_sd": float(seed_means.std(ddof=1)) if len(seed_means) > 1 else 0.0,
    "n_seeds": int(m.shape[0]),
    "n_problems": int(m.shape[1]),
    "per_problem": per_problem.tolist(),
  }


def _ci_points(ci) -> str:
  return "-" if ci is None else f"{100 * ci[0]:+.1f} to {100 * ci[1]:+.1f}"


def format_study_table(
  summaries: dict[str, dict],
  tests: dict[str, dict],
  n_problems: int,
  n_seeds: int,
  samples: int,
  seed_tests: dict[str, dict] | None = None,
) -> str:
  """Per-condition accuracies; comparisons at the seed level first (what a claim rests on),
  then at the problem level (the benchmark's sampling noise only)."""
  lines = [
    f"| condition | held-out acc % (95% CI: {n_seeds} seeds, then {n_problems} problems) | "
    f"seed sd (n={n_seeds}) | per-seed % |",
    "|---|---|---|---|",
  ]
  for name, s in summaries.items():
    seeds = ", ".join(f"{100 * a:.1f}" for a in s["seed_accuracies"])
    lines.append(
      f"| {name} | {100 * s['accuracy']:.1f} ({100 * s['ci95'][0]:.1f}-"
      f"{100 * s['ci95'][1]:.1f}) | {100 * s['seed_sd']:.1f} | {seeds} |"
    )
  lines += [
    "",
    "CI: percentile bootstrap resampling seeds with replacement, then problems with replacement "
    "within each drawn seed (run-to-run spread and benchmark size both count).",
  ]
  if seed_tests:
    lines += [
      "",
      f"Paired by seed (independent runs; the exact sign-flip p cannot go below 2/2^{n_seeds}; "
      "95% CI: hierarchical bootstrap of the difference, paired by seed and problem):",
      "",
      "| comparison | per-seed diff (points) | mean | 95% CI | t-test p | sign-flip p | "
      "detectable at 80% power (points) | resolved |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in seed_tests.items():
      diffs = ", ".join(f"{100 * d:+.1f}" for d in t["per_seed_diff"])
      ci = t.get("ci95")
      resolved = "-" if ci is None else ("yes" if ci[0] > 0 or ci[1] < 0 else "no")
      mde = t.get("mde80")
      lines.append(
        f"| {name} | {diffs} | {100 * t['mean_diff']:+.1f} | {_ci_points(ci)} | "
        f"{t['t_test_p']:.3g} | {t['sign_flip_p']:.3g} | "
        f"{'-' if mde is None else f'{100 * mde:.1f}'} | {resolved} |"
      )
    lines += [
      "",
      "Resolved: the 95% CI of the difference excludes 0. Detectable: the true difference a "
      "paired t-test over these seeds finds with 80% power at the observed spread.",
    ]
  lines += [
    "",
    f"Paired by problem, secondary (mean over {n_seeds} seeds x {samples} samples; the "
    "benchmark's sampling noise only, not evidence of a difference between methods), "
    "bootstrap 95% CI of the difference and a two-sided sign-flip permutation test:",
    "",
    "| comparison | diff (points) | 95% CI | p |",
    "|---|---|---|---|",
  ]
  for name, t in tests.items():
    lines.append(
      f"| {name} | {100 * t['mean_diff']:+.1f} | {_ci_points(t['ci95'])} | {t['p_value']:.3g} |"
    )
  return "\n".join(lines) + "\n"
