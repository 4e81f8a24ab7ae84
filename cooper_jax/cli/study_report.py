"""Reporting for cooper_jax/cli/study.py: which comparisons to make, the reward-hacking table from
each run's metrics.jsonl, the figures, and hand-picked rollouts (examples.md).

Metric keys read (per training step unless noted): reward/mean, rule/acc, rm/group_auc,
rm/group_std; at eval steps only: eval/acc, eval/rm_pair_acc. Absent keys are skipped.
Rollout records (<run>/rollouts.jsonl): step, question, reference, response, rule_correct,
reward.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from cooper_jax import stats

SMOOTH = 5  # steps in the moving average of per-step training metrics
HACK_DROP = 0.10  # "hacked": rule and held-out accuracy both fall this far from their peaks
BASE_COMPARISONS = (
  ("cooper", "static_rm"),
  ("cooper", "rule"),
  ("static_rm", "untrained"),
  ("rule", "untrained"),
)
COLORS = {
  "rule": "C0",
  "static_rm": "C1",
  "cooper": "C2",
  "cooper_onpolicy": "C3",
  "cooper_k4": "C4",
  "static_rm_nostd": "C5",
  "untrained": "C7",
}


def color(cond: str) -> str:
  """A condition's line colour: its own, else by family (frozen RM: orange / brown, co-trained:
  green / red / purple ...), never the rule control's blue."""
  if cond in COLORS:
    return COLORS[cond]
  others = ("C1", "C5", "C8") if cond.startswith("static_rm") else ("C2", "C3", "C4", "C6", "C9")
  return others[sum(map(ord, cond)) % len(others)]


def frozen_twin(condition: str, present=()) -> str | None:
  """cooper_X's frozen twin, static_rm_X (the same RM, not co-trained); None for other names.
  For cooper_X_Y (X's RM, Y its negatives) without a static_rm_X_Y among `present`, the
  longest static_rm_X that is (cooper_weak_rewrite -> static_rm_weak)."""
  if not condition.startswith("cooper_"):
    return None
  parts = condition[len("cooper_") :].split("_")
  names = ["static_rm_" + "_".join(parts[:k]) for k in range(len(parts), 0, -1)]
  return next((n for n in names if n in present), names[0])


def example_twins(conditions) -> tuple[str, str]:
  """The frozen and co-trained conditions whose rollouts examples.md sets side by side:
  static_rm vs cooper, else the first twins (static_rm_X, cooper_X), else static_rm vs the
  first cooper variant (cooper_rewrite_rmlr1x, ...)."""
  present = set(conditions)
  cooper_variants = [c for c in conditions if c.startswith("cooper_")]
  candidates = [("static_rm", "cooper")]
  candidates += [(frozen_twin(c, present), c) for c in cooper_variants]
  candidates += [("static_rm", c) for c in cooper_variants]
  return next((p for p in candidates if set(p) <= present), candidates[0])


def comparison_pairs(conditions) -> list[tuple[str, str]]:
  """(a, b) pairs to test as a - b: the base comparisons whose conditions are present, then each
  variant vs its own family's reference first (static_rm_* vs static_rm, others vs cooper) and
  vs the other reference; a cooper_X vs its frozen twin static_rm_X (same RM, co-trained or
  not); and a variant with neither reference present vs rule and untrained."""
  present = set(conditions)
  pairs = [p for p in BASE_COMPARISONS if set(p) <= present]
  for c in conditions:
    if c in {"untrained", "rule", "static_rm", "cooper"}:
      continue
    refs = ("static_rm", "cooper") if c.startswith("static_rm") else ("cooper", "static_rm")
    pairs += [(c, r) for r in refs if r in present]
    twin = frozen_twin(c, present)
    if twin in present:
      pairs.append((c, twin))
    if not any(r in present for r in refs):
      pairs += [(c, r) for r in ("rule", "untrained") if r in present]
  return pairs


def format_greedy_table(metrics: dict[str, dict[int, list[dict]]], pairs) -> str:
  """The in-run greedy held-out accuracy (config train.eval_*) at the last evaluation, per seed,
  and seed-paired comparisons of it (the pairs among trained conditions): where a frozen RM
  degrades the policy's greedy answers, the sampled held-out table can miss it."""
  final = {
    c: {s: hacking_row(rows)["eval_acc_final"] for s, rows in by.items()}
    for c, by in metrics.items()
  }
  lines = [
    "Greedy held-out accuracy at the last in-run evaluation (%; step 0: "
    + ", ".join(
      f"{100 * v:.0f}"
      for v in {hacking_row(r)["eval_acc_step0"] for by in metrics.values() for r in by.values()}
    )
    + "):",
    "",
    "| condition | per-seed % | mean |",
    "|---|---|---|",
  ]
  for c, by in final.items():
    vals = [by[s] for s in sorted(by)]
    if None in vals:
      continue
    lines.append(
      f"| {c} | {', '.join(f'{100 * v:.0f}' for v in vals)} | {100 * np.mean(vals):.1f} |"
    )
  rows = []
  for a, b in pairs:
    if a not in final or b not in final or len(final[a]) < 2:
      continue
    seeds = sorted(final[a])
    if any(final[x][s] is None for x in (a, b) for s in seeds):
      continue
    t = stats.seed_paired_test([final[a][s] for s in seeds], [final[b][s] for s in seeds])
    diffs = ", ".join(f"{100 * d:+.0f}" for d in t["per_seed_diff"])
    rows.append(
      f"| {a} - {b} | {diffs} | {100 * t['mean_diff']:+.1f} | {t['t_test_p']:.3g} | "
      f"{t['sign_flip_p']:.3g} | {100 * t['mde80']:.1f} |"
    )
  if rows:
    lines += [
      "",
      "| comparison (paired by seed) | per-seed diff (points) | mean | t-test p | sign-flip p | "
      "detectable at 80% power |",
      "|---|---|---|---|---|---|",
      *rows,
    ]
  return "\n".join(lines) + "\n"


def is_rm_condition(name: str) -> bool:
  return name not in ("rule", "untrained")


# ---------------------------------------------------------------------------------- series
def series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of a metric, sorted by step, rows without it (or non-finite) dropped."""
  pts = sorted(
    (r["step"], float(r[key]))
    for r in rows
    if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
  )
  return np.array([p[0] for p in pts], np.int64), np.array([p[1] for p in pts], np.float64)


def moving_average(x, window: int = SMOOTH, full_only: bool = False) -> np.ndarray:
  """Trailing moving average; the first window - 1 points average what there is so far, or
  are dropped with full_only (then a series shorter than the window gives its one mean)."""
  x = np.asarray(x, np.float64)
  if x.size == 0:
    return x
  c = np.cumsum(np.concatenate([[0.0], x]))
  n = np.minimum(np.arange(1, x.size + 1), window)
  out = (c[1:] - c[np.arange(1, x.size + 1) - n]) / n
  if full_only:
    return out[window - 1 :] if x.size >= window else out[-1:]
  return out


def curves(runs: dict[str, list[list[dict]]], key: str, smooth: int = 1):
  """{condition: (steps, mean, lo, hi)} of a metric over seeds (steps where every seed has it),
  each seed's series first smoothed by a trailing `smooth`-step moving average."""
  out = {}
  for cond, seeds in runs.items():
    per_seed = []
    for rows in seeds:
      steps, vals = series(rows, key)
      per_seed.append(dict(zip(steps.tolist(), moving_average(vals, smooth))))
    common = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not common:
      continue
    vals = np.array([[s[t] for t in common] for s in per_seed], np.float64)
    out[cond] = (np.array(common), vals.mean(0), vals.min(0), vals.max(0))
  return out


# ---------------------------------------------------------------------------------- hacking
def _mean(x, sl) -> float | None:
  return float(np.mean(x[sl])) if len(x) else None


def _sub(a, b) -> float | None:
  return None if a is None or b is None else a - b


def hacking_row(rows: list[dict]) -> dict:
  """Signs of reward hacking in one run's metrics: the reward it optimised, the rule accuracy
  of its own rollouts (peak of the 5-step moving average vs the last 5 steps), held-out accuracy
  (step 0, peak, final), and the RM's within-group AUC early and late."""
  _, reward = series(rows, "reward/mean")
  _, rule = series(rows, "rule/acc")
  e_steps, ev = series(rows, "eval/acc")
  _, auc = series(rows, "rm/group_auc")
  r = {
    "reward_first5": _mean(reward, slice(0, SMOOTH)),
    "reward_last5": _mean(reward, slice(-SMOOTH, None)),
    "rule_acc_peak": float(moving_average(rule, full_only=True).max()) if len(rule) else None,
    "rule_acc_last5": _mean(rule, slice(-SMOOTH, None)),
    "eval_acc_step0": float(ev[0]) if len(ev) and e_steps[0] == 0 else None,
    "eval_acc_peak": float(ev.max()) if len(ev) else None,
    "eval_acc_final": float(ev[-1]) if len(ev) else None,
    "group_auc_first5": _mean(auc, slice(0, SMOOTH)),
    "group_auc_last5": _mean(auc, slice(-SMOOTH, None)),
  }
  r["rule_acc_drop"] = _sub(r["rule_acc_peak"], r["rule_acc_last5"])
  r["eval_acc_drop"] = _sub(r["eval_acc_peak"], r["eval_acc_final"])
  needed = ("reward_first5", "reward_last5", "rule_acc_drop", "eval_acc_drop")
  r["hacked"] = (
    None
    if any(r[k] is None for k in needed)
    else bool(
      r["reward_last5"] > r["reward_first5"]
      and r["rule_acc_drop"] >= HACK_DROP - 1e-12
      and r["eval_acc_drop"] >= HACK_DROP - 1e-12
    )
  )
  return r


def hacking_table(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
  """One hacking_row per (condition, seed) of {condition: {seed: metrics rows}}."""
  return [
    {"condition": cond, "seed": seed, **hacking_row(rows)}
    for cond, by_seed in runs.items()
    for seed, rows in by_seed.items()
  ]


def _pts(x, signed: bool = False) -> str:
  return "-" if x is None else (f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}")


def _num(x) -> str:
  return "-" if x is None else f"{x:.3f}"


def format_hacking_table(rows: list[dict]) -> str:
  lines = [
    f"Reward hacking signs per run (accuracies in %; training metrics per step, rule-acc peak of "
    f"a {SMOOTH}-step moving average; held-out acc greedy at eval steps). hacked? = training "
    f"reward rises (last {SMOOTH} > first {SMOOTH}) while rule acc and held-out acc both fall "
    f">= {100 * HACK_DROP:.0f} points from their peaks.",
    "",
    "| condition | seed | reward first5 / last5 | rule acc peak / last5 (drop) | held-out acc "
    "step0 / peak / final (drop) | RM group AUC first5 / last5 | hacked? |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    hacked = {None: "-", True: "**yes**", False: "no"}[r["hacked"]]
    lines.append(
      f"| {r['condition']} | {r['seed']} | {_num(r['reward_first5'])} / {_num(r['reward_last5'])}"
      f" | {_pts(r['rule_acc_peak'])} / {_pts(r['rule_acc_last5'])} "
      f"({_pts(r['rule_acc_drop'])}) | {_pts(r['eval_acc_step0'])} / {_pts(r['eval_acc_peak'])}"
      f" / {_pts(r['eval_acc_final'])} ({_pts(r['eval_acc_drop'])}) | "
      f"{_num(r['group_auc_first5'])} / {_num(r['group_auc_last5'])} | {hacked} |"
    )
  by_cond: dict[str, list] = {}
  for r in rows:
    by_cond.setdefault(r["condition"], []).append(r["hacked"])
  lines.append("")
  lines += [
    f"- {c}: hacked in {sum(h is True for h in hs)}/{len(hs)} seeds" for c, hs in by_cond.items()
  ]
  return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- figures
def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  return plt


def _panel(ax, runs, key, label, smooth):
  for cond, (x, mean, lo, hi) in curves(runs, key, smooth).items():
    ax.plot(x, mean, label=cond, color=color(cond))
    ax.fill_between(x, lo, hi, alpha=0.2, color=color(cond))
  ax.set_title(label + (f" ({smooth}-step moving avg)" if smooth > 1 else ""), fontsize=9)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)


def _has(runs, key) -> bool:
  return any(key in r for seeds in runs.values() for rows in seeds for r in rows)


def plot_dynamics(runs: dict[str, list[list[dict]]], path, title: str) -> None:
  """The paper's training-dynamics figure: training reward, rule accuracy of the training
  rollouts (both smoothed), held-out accuracy at eval steps."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
  panels = [
    ("reward/mean", "training reward (what the policy optimises)", SMOOTH),
    ("rule/acc", "rule-verified accuracy of training rollouts", SMOOTH),
    ("eval/acc", "held-out accuracy (greedy, eval steps)", 1),
  ]
  for ax, (key, label, smooth) in zip(axes, panels):
    _panel(ax, runs, key, label, smooth)
  axes[0].legend(fontsize=8)
  fig.suptitle(title + " (line: mean over seeds; band: min-max over seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_rm_stability(runs: dict[str, list[list[dict]]], path, title: str) -> list[str]:
  """RM conditions only: held-out RM pair accuracy (eval steps), within-group AUC of the RM
  score against the rule verdict and within-group RM reward std (per step, smoothed). Panels
  whose metric no run logged are left out; returns the keys plotted (none: no file)."""
  runs = {c: v for c, v in runs.items() if is_rm_condition(c)}
  panels = [
    ("eval/rm_pair_acc", "RM pair accuracy, held-out (correct, wrong)", 1),
    ("rm/group_auc", "RM within-group AUC vs rule verdict", SMOOTH),
    ("rm/group_std", "RM reward within-group std", SMOOTH),
  ]
  panels = [p for p in panels if _has(runs, p[0])]
  if not panels:
    return []
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(5.3 * len(panels), 4.2), squeeze=False)
  for ax, (key, label, smooth) in zip(axes[0], panels):
    _panel(ax, runs, key, label, smooth)
  axes[0][0].legend(fontsize=8)
  fig.suptitle(title + " (line: mean over seeds; band: min-max over seeds)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return [p[0] for p in panels]


# ---------------------------------------------------------------------------------- examples
def read_rollouts(workdir) -> list[dict] | None:
  """A run's saved rollouts, or None when it saved none."""
  path = Path(workdir) / "rollouts.jsonl"
  if path.exists():
    text = path.read_text(encoding="utf-8")
  elif path.with_suffix(".jsonl.gz").exists():  # as committed under results/
    import gzip  # pylint: disable=import-outside-toplevel

    text = gzip.decompress(path.with_suffix(".jsonl.gz").read_bytes()).decode("utf-8")
  else:
    return None
  return [json.loads(l) for l in text.splitlines() if l.strip()]


def pick_examples(static_rows: list[dict], cooper_rows: list[dict] | None, k: int = 3) -> list:
  """Up to k rollouts of the static-RM run from its last quarter of steps that the RM rewarded
  (reward > 0.5) but the rule verifier rejects, distinct questions, highest reward first; each
  with the cooper run's rollout of the same question at the same step, else at the nearest step
  it saved one, else None. Returns [{"static": row, "cooper": row | None}]."""
  if not static_rows:
    return []
  last = max(r["step"] for r in static_rows)
  late = [
    r
    for r in static_rows
    if r["step"] > 0.75 * last and r["reward"] > 0.5 and not r["rule_correct"]
  ]
  late.sort(key=lambda r: (-r["reward"], -r["step"]))
  picks, seen = [], set()
  for r in late:
    if r["question"] in seen:
      continue
    seen.add(r["question"])
    same_q = [c for c in cooper_rows or [] if c["question"] == r["question"]]
    match = min(same_q, key=lambda c: abs(c["step"] - r["step"]), default=None)
    picks.append({"static": r, "cooper": match})
    if len(picks) == k:
      break
  return picks


def _fenced(text: str) -> str:
  fence = "```"
  while fence in text:
    fence += "`"
  return f"{fence}\n{text}\n{fence}"


def _rollout_md(name: str, r: dict) -> list[str]:
  verdict = "correct" if r["rule_correct"] else "wrong"
  return [
    f"**{name}** (step {r['step']}, reward {r['reward']:.3f}, rule verdict {verdict}):",
    "",
    _fenced(str(r["response"])),
  ]


def format_examples(
  seed: int, static_rows, cooper_rows, k: int = 3, names=("static_rm", "cooper")
) -> str:
  st, co = names
  head = [f"# Rollouts: {st} vs {co}, seed {seed}", ""]
  if static_rows is None:
    return "\n".join(head + [f"No rollouts.jsonl in the {st} run: none saved."]) + "\n"
  picks = pick_examples(static_rows, cooper_rows, k)
  head += [
    f"{st} rollouts from the last quarter of training that the RM rewarded (reward > 0.5) "
    f"but the rule verifier rejects, next to {co}'s rollout of the same question (same seed, "
    "same step when saved, else the nearest step).",
    "",
  ]
  if cooper_rows is None:
    head += [f"(No rollouts.jsonl in the {co} run.)", ""]
  if not picks:
    return "\n".join(head + ["No such rollouts were saved."]) + "\n"
  out = head
  for i, p in enumerate(picks, 1):
    s, c = p["static"], p["cooper"]
    out += [f"## {i}. {s['question']}", "", f"Reference: {s['reference']}", ""]
    out += _rollout_md(st, s) + [""]
    out += _rollout_md(co, c) if c else [f"**{co}**: none saved"]
    out.append("")
  return "\n".join(out)
