"""Reward-model overoptimization curves of a study (Gao et al. 2022): per seed, the proxy (the
reward the policy trains on: the RM's score of its rollouts) and the gold (the rule accuracy of
the same rollouts; greedy held-out accuracy) against step and against sqrt(KL(pi_t || pi_0))
(eval/kl_init, train.eval_kl_prompts), with each seed's peak, fall and hacking onset.

  python tools/analysis/overoptimization.py --study results/overopt_competent \
      --conditions static_rm_competent,rule [--block 20] [--drop 10]

Reads <study>/runs/<condition>_s<seed>/metrics.jsonl. Rollout metrics are averaged over blocks
of --block steps (block k: steps k*block+1 .. (k+1)*block, placed at its last step, where the
in-run evaluation and the KL monitor also sit). Per seed and gold:
  peak   the highest block (its step), and the fall: the peak minus the lowest block after it;
  onset  the first block at least --drop points below the running peak (None: never), the
         issue's hacking onset.
A condition shows overoptimization when in most seeds the rollouts' gold falls >= --drop points
from its peak while the proxy at the end is above the proxy at the gold's peak. Writes
<study>/overoptimization.{md,json,png}.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np


def read_metrics(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def blocks(rows: list[dict], key: str, block: int) -> tuple[np.ndarray, np.ndarray]:
  """(block end steps, block means of `key`) over the training steps (step >= 1)."""
  steps = np.array([r["step"] for r in rows if key in r and r["step"] >= 1])
  vals = np.array([r[key] for r in rows if key in r and r["step"] >= 1], float)
  ends, means = [], []
  for k in range(int(steps.max()) // block if len(steps) else 0):
    sel = (steps > k * block) & (steps <= (k + 1) * block)
    if sel.any():
      ends.append((k + 1) * block)
      means.append(float(vals[sel].mean()))
  return np.array(ends), np.array(means)


def at_evals(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of an evaluation metric, step 0 included."""
  pts = [(r["step"], r[key]) for r in rows if key in r]
  return np.array([p[0] for p in pts]), np.array([p[1] for p in pts], float)


def peak_and_onset(steps: np.ndarray, gold: np.ndarray, drop: float) -> dict:
  """Peak (value, step), the fall after it, and the onset: the first point `drop` below the
  running peak (in the gold's units)."""
  i = int(np.argmax(gold))
  running = np.maximum.accumulate(gold)
  below = np.nonzero(running - gold >= drop)[0]
  return {
    "start": float(gold[0]),
    "peak": float(gold[i]),
    "peak_step": int(steps[i]),
    "end": float(gold[-1]),
    "fall": float(gold[i] - gold[i:].min()),
    "onset": int(steps[below[0]]) if len(below) else None,
  }


def seed_curves(rows: list[dict], block: int, drop: float) -> dict | None:
  """One run's curves and summary, accuracies in percentage points; None before its first
  whole block."""
  s_roll, gold_roll = blocks(rows, "rule/acc", block)
  if not len(s_roll):  # not one whole block yet (a run in progress)
    return None
  _, proxy = blocks(rows, "reward/mean", block)
  s_eval, gold_eval = at_evals(rows, "eval/acc")
  s_kl, kl = at_evals(rows, "eval/kl_init")
  s_rm, rm_acc = at_evals(rows, "eval/rm_pair_acc")  # the RM's held-out pair accuracy
  roll = peak_and_onset(s_roll, 100 * gold_roll, drop)
  i = int(np.argmax(gold_roll))
  return {
    "steps": s_roll.tolist(),
    "gold_rollouts": (100 * gold_roll).tolist(),
    "proxy": proxy.tolist(),
    "eval_steps": s_eval.tolist(),
    "gold_heldout": (100 * gold_eval).tolist(),
    "kl_steps": s_kl.tolist(),
    "kl": kl.tolist(),
    "rm_steps": s_rm.tolist(),
    "rm_pair_acc": rm_acc.tolist(),
    "rollouts": roll,
    "heldout": peak_and_onset(s_eval, 100 * gold_eval, drop) if len(s_eval) else None,
    "proxy_at_gold_peak": float(proxy[i]),
    "proxy_end": float(proxy[-1]),
    "sqrt_kl_end": float(np.sqrt(max(kl[-1], 0.0))) if len(kl) else None,
  }


def summarise(study: Path, conditions: list[str], block: int, drop: float) -> dict:
  out = {}
  for cond in conditions:
    runs = [p for p in (study / "runs").glob(f"{cond}_s*") if p.is_dir()]  # not the .log
    runs.sort(key=lambda p: int(re.sub(r".*_s", "", p.name)))
    per_seed = {}
    for r in runs:
      m = r / "metrics.jsonl"
      curves = seed_curves(read_metrics(m), block, drop) if m.exists() else None
      if curves is not None:
        per_seed[int(re.sub(r".*_s", "", r.name))] = curves
    over = [
      s
      for s, v in per_seed.items()
      if v["rollouts"]["fall"] >= drop and v["proxy_end"] > v["proxy_at_gold_peak"]
    ]
    out[cond] = {"seeds": per_seed, "overoptimized_seeds": over}
  return out


def table(summary: dict, drop: float) -> str:
  head = (
    "| condition | seed | rollouts' rule acc: start → peak (step) → end, fall | onset | "
    "held-out greedy: start → peak (step) → end | onset | proxy at gold peak → end | "
    "sqrt KL end | RM pair acc: start → end |\n|---|---|---|---|---|---|---|---|---|\n"
  )
  lines = []
  for cond, v in summary.items():
    for seed, s in v["seeds"].items():
      r, h = s["rollouts"], s["heldout"] or {}
      kl = "-" if s["sqrt_kl_end"] is None else f"{s['sqrt_kl_end']:.2f}"
      rm = s.get("rm_pair_acc") or []
      rm = f"{rm[0]:.2f} → {rm[-1]:.2f}" if rm else "-"
      lines.append(
        f"| {cond} | {seed} | {r['start']:.1f} → {r['peak']:.1f} ({r['peak_step']}) → "
        f"{r['end']:.1f}, {r['fall']:.1f} | {r['onset'] or '-'} | "
        f"{h.get('start', 0):.0f} → {h.get('peak', 0):.0f} ({h.get('peak_step', '-')}) → "
        f"{h.get('end', 0):.0f} | {h.get('onset') or '-'} | "
        f"{s['proxy_at_gold_peak']:.3f} → {s['proxy_end']:.3f} | {kl} | {rm} |"
      )
  foot = "".join(
    f"\n{cond}: overoptimized (rollouts' gold falls >= {drop:g} points from its peak while the "
    f"proxy ends above its value there) in {len(v['overoptimized_seeds'])} of "
    f"{len(v['seeds'])} seeds {v['overoptimized_seeds']}"
    for cond, v in summary.items()
  )
  return head + "\n".join(lines) + "\n" + foot + "\n"


def figure(summary: dict, path: Path) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  conds = list(summary)
  fig, axes = plt.subplots(len(conds), 2, figsize=(11, 3.6 * len(conds)), squeeze=False)
  for row, cond in enumerate(conds):
    for seed, s in summary[cond]["seeds"].items():
      ax = axes[row][0]
      ax.plot(s["steps"], s["gold_rollouts"], color=f"C{seed}", label=f"seed {seed} gold")
      ax.plot(s["steps"], np.asarray(s["proxy"]) * 100, "--", color=f"C{seed}")
      if s["kl"]:
        kl_at = dict(zip(s["kl_steps"], s["kl"]))
        xs = [np.sqrt(max(kl_at[t], 0.0)) for t in s["steps"] if t in kl_at]
        ys = [g for t, g in zip(s["steps"], s["gold_rollouts"]) if t in kl_at]
        ps = [100 * p for t, p in zip(s["steps"], s["proxy"]) if t in kl_at]
        axes[row][1].plot(xs, ys, "o-", color=f"C{seed}", ms=3)
        axes[row][1].plot(xs, ps, "x--", color=f"C{seed}", ms=3)
    axes[row][0].set(title=f"{cond}: gold (solid) and proxy x100 (dashed)", xlabel="step")
    axes[row][1].set(title=f"{cond}: against sqrt KL(pi_t || pi_0)", xlabel="sqrt KL (nats)")
    axes[row][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=80)


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--study", required=True)
  ap.add_argument("--conditions", required=True)
  ap.add_argument("--block", type=int, default=20)
  ap.add_argument("--drop", type=float, default=10.0)
  a = ap.parse_args(argv)
  study = Path(a.study)
  summary = summarise(study, a.conditions.split(","), a.block, a.drop)
  text = table(summary, a.drop)
  (study / "overoptimization.md").write_text(text)
  (study / "overoptimization.json").write_text(json.dumps(summary, indent=1))
  figure(summary, study / "overoptimization.png")
  print(text)
  return summary


if __name__ == "__main__":
  main()
