"""Statistics and figures for a reproduction study: conditions x seeds, evaluated on one held-out
split. Used by tools/run_study.py; kept separate so the numbers are unit-tested.

Per condition, the per-problem accuracy is averaged over seeds and samples; the 95% CI is a
bootstrap over problems (the variance a benchmark's problem sample adds) and the seed spread is
reported next to it. Comparisons are paired by problem: a bootstrap CI of the mean difference
and a sign-flip permutation test (two-sided) of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_mean_ci(x: np.ndarray, n: int = 2000, seed: int = 0, alpha: float = 0.05):
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(x), (n, len(x)))
  means = x[idx].mean(axis=1)
  return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def paired_test(a: np.ndarray, b: np.ndarray, n: int = 10000, seed: int = 0) -> dict:
  """Mean of a - b over paired problems, its bootstrap 95% CI, and a sign-flip permutation p."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if d.shape[0] == 0:
    raise ValueError("paired_test needs at least one pair")
  rng = np.random.default_rng(seed)
  observed = abs(d.mean())
  signs = rng.choice([-1.0, 1.0], size=(n, d.shape[0]))
  null = np.abs((signs * d).mean(axis=1))
  # +1 in both counts: the observed labelling is one of the permutations (never p = 0).
  p = (np.sum(null >= observed - 1e-12) + 1) / (n + 1)
  lo, hi = bootstrap_mean_ci(d, seed=seed)
  return {
    "mean_diff": float(d.mean()),
    "ci95": [lo, hi],
    "p_value": float(p),
    "n_problems": int(d.shape[0]),
  }


def condition_summary(per_seed_problem_acc: Sequence[np.ndarray]) -> dict:
  """per_seed_problem_acc: one [n_problems] array per seed (mean over samples)."""
  m = np.stack([np.asarray(x, np.float64) for x in per_seed_problem_acc])  # [seeds, problems]
  per_problem = m.mean(axis=0)
  seed_means = m.mean(axis=1)
  lo, hi = bootstrap_mean_ci(per_problem)
  return {
    "accuracy": float(per_problem.mean()),
    "ci95": [lo, hi],
    "seed_accuracies": seed_means.tolist(),
    "seed_sd": float(seed_means.std(ddof=1)) if len(seed_means) > 1 else 0.0,
    "per_problem": per_problem.tolist(),
  }


def format_study_table(
  summaries: dict[str, dict], tests: dict[str, dict], n_problems: int, n_seeds: int, samples: int
) -> str:
  lines = [
    f"| condition | held-out acc % (95% CI over {n_problems} problems) | seed sd "
    f"(n={n_seeds}) | per-seed % |",
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
    f"Paired by problem (mean over {n_seeds} seeds x {samples} samples), "
    "bootstrap 95% CI of the difference and a two-sided sign-flip permutation test:",
    "",
    "| comparison | diff (points) | 95% CI | p |",
    "|---|---|---|---|",
  ]
  for name, t in tests.items():
    lines.append(
      f"| {name} | {100 * t['mean_diff']:+.1f} | {100 * t['ci95'][0]:+.1f} to "
      f"{100 * t['ci95'][1]:+.1f} | {t['p_value']:.3g} |"
    )
  return "\n".join(lines) + "\n"


COLORS = {"rule": "C0", "static_rm": "C1", "cooper": "C2", "untrained": "C7"}


def curves(runs: dict[str, list[list[dict]]], key: str):
  """{condition: (steps, mean, lo, hi)} of a metric over seeds (steps where every seed has it)."""
  out = {}
  for cond, seeds in runs.items():
    per_seed = [{r["step"]: r[key] for r in rows if key in r} for rows in seeds]
    common = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not common:
      continue
    vals = np.array([[s[t] for t in common] for s in per_seed], np.float64)
    out[cond] = (np.array(common), vals.mean(0), vals.min(0), vals.max(0))
  return out


def plot_dynamics(runs: dict[str, list[list[dict]]], path, title: str) -> None:
  """Two panels as the paper's training-dynamics figure: training reward, held-out accuracy."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  panels = [
    ("reward/mean", "training reward (what the policy optimises)"),
    ("rule/acc", "rule-verified accuracy of training rollouts"),
    ("eval/acc", "held-out accuracy (greedy)"),
  ]
  for ax, (key, label) in zip(axes, panels):
    for cond, (x, mean, lo, hi) in curves(runs, key).items():
      ax.plot(x, mean, label=cond, color=COLORS.get(cond))
      ax.fill_between(x, lo, hi, alpha=0.2, color=COLORS.get(cond))
    ax.set_title(label, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.suptitle(title + " (line: mean over seeds; band: min-max)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_rm_stability(runs: dict[str, list[list[dict]]], path, title: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, ax = plt.subplots(figsize=(6, 4))
  for cond, (x, mean, lo, hi) in curves(runs, "eval/rm_pair_acc").items():
    ax.plot(x, mean, label=cond, color=COLORS.get(cond))
    ax.fill_between(x, lo, hi, alpha=0.2, color=COLORS.get(cond))
  ax.set_xlabel("step")
  ax.set_ylabel("RM held-out pair accuracy")
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
