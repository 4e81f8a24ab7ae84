"""Cooper - frozen against the RM's initial competence: one row per RM, each a
frozen arm and its co-trained twin from cooper-study folders, paired by seed; the x of a row is
the RM's held-out pair accuracy at step 0 (`eval/rm_pair_acc`, the same pairs for every RM),
read from the frozen arm's runs.

  python tools/analysis/dose_response.py \
      --row results/wide_fixed_s3-7:static_rm_weak:cooper_weak_rewrite \
      --row results/dose_rm:static_rm:cooper_rewrite \
      --row results/dose_competent:static_rm_competent:cooper_competent_rewrite \
      --out results/dose_response/dose_response

Each --row is STUDY:FROZEN:COOPER; its results.json (cooper-study's) gives the final held-out
accuracy per seed, runs/<FROZEN>_s<seed>/metrics.jsonl the RM's step-0 accuracy (every seed
must agree: the RM is the same file) and runs/<COOPER>_s<seed>/metrics.jsonl the co-trained RM's
accuracy at its last evaluation. Writes <out>.md, <out>.json and <out>.png (left: the arms per
seed; right: Cooper - frozen, mean and 95% t CI over seeds, seeds as dots).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from cooper_vs_frozen import heldout, t_ci  # this folder (run as a script; tests add it)
from overoptimization import at_evals, read_metrics

from cooper_jax import stats


def rm_accs(study: Path, cond: str, seed: int) -> list[float]:
  """The RM's held-out pair accuracy at each in-run evaluation (step 0 first) of one run."""
  path = study / "runs" / f"{cond}_s{seed}" / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path}: missing (the RM's pair accuracy is read from it)")
  steps, accs = at_evals(read_metrics(path), "eval/rm_pair_acc")
  if not steps.size or steps[0] != 0:
    raise KeyError(f"{path}: no step-0 eval/rm_pair_acc (was rm.eval_pairs set?)")
  return accs.tolist()


def initial_rm_acc(study: Path, cond: str, seeds: list[int]) -> float:
  """The RM's step-0 held-out pair accuracy in the runs of `cond`; every seed's must agree."""
  accs = {s: rm_accs(study, cond, s)[0] for s in seeds}
  if len(set(accs.values())) != 1:
    raise ValueError(f"{study}:{cond}: the RM's step-0 pair accuracy differs by seed: {accs}")
  return next(iter(accs.values()))


def row(spec: str) -> dict:
  study, frozen, cooper = (spec.rsplit(":", 2) + ["", ""])[:3]
  if not (study and frozen and cooper):
    raise ValueError(f"{spec!r}: expected STUDY:FROZEN_CONDITION:COOPER_CONDITION")
  f, c = ({s: 100 * a for s, a in heldout(Path(study), cond).items()} for cond in (frozen, cooper))
  seeds = sorted(f)
  if len(seeds) < 2:
    raise ValueError(f"{spec}: {len(seeds)} seed(s) in both arms; a seed-level test needs 2")
  fz, co = np.array([f[s] for s in seeds]), np.array([c[s] for s in seeds])
  return {
    "study": study,
    "frozen": frozen,
    "cooper": cooper,
    "rm_pair_acc": initial_rm_acc(Path(study), frozen, seeds),
    # Where co-training took the RM: its pair accuracy at the Cooper runs' last evaluation.
    "cooper_rm_acc_end": [rm_accs(Path(study), cooper, s)[-1] for s in seeds],
    "seeds": seeds,
    "frozen_heldout": fz.tolist(),
    "cooper_heldout": co.tolist(),
    **stats.seed_paired_test(co, fz),
    "ci95": t_ci(co - fz),
  }


def cells(xs, fmt=".1f") -> str:
  return ", ".join(f"{x:{fmt}}" for x in xs)


def table(rows: list[dict]) -> str:
  lines = [
    "| RM (step-0 pair acc) | seeds | frozen held-out % | Cooper held-out % | Cooper − frozen "
    "per seed | mean (95% t CI) | sign-flip p | detectable (80%) | Cooper's RM acc at the end |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['frozen'].removeprefix('static_')} ({r['rm_pair_acc']:.3f}) | "
      f"{','.join(map(str, r['seeds']))} | {cells(r['frozen_heldout'])} | "
      f"{cells(r['cooper_heldout'])} | {', '.join(f'{d:+.1f}' for d in r['per_seed_diff'])} | "
      f"{r['mean_diff']:+.1f} ({r['ci95'][0]:+.1f} to {r['ci95'][1]:+.1f}) | "
      f"{r['sign_flip_p']:.3g} | {r['mde80']:.1f} | {cells(r['cooper_rm_acc_end'], '.3f')} |"
    )
  return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
  for r in rows:
    x = r["rm_pair_acc"]
    for key, color, dx in (
      ("frozen_heldout", "tab:blue", -0.004),
      ("cooper_heldout", "tab:red", 0.004),
    ):
      ys = r[key]
      ax0.scatter([x + dx] * len(ys), ys, color=color, s=14, alpha=0.6)
      ax0.scatter([x + dx], [np.mean(ys)], color=color, marker="_", s=300)
    ax1.scatter([x] * len(r["per_seed_diff"]), r["per_seed_diff"], color="gray", s=14, alpha=0.6)
    lo, hi = r["ci95"]
    ax1.annotate(
      r["frozen"].removeprefix("static_"), (x, hi), textcoords="offset points", xytext=(4, 4)
    )
    ax1.errorbar(
      [x],
      [r["mean_diff"]],
      yerr=[[r["mean_diff"] - lo], [hi - r["mean_diff"]]],
      fmt="o",
      color="black",
      capsize=4,
    )
  xs = [r["rm_pair_acc"] for r in rows]
  ax1.plot(xs, [r["mean_diff"] for r in rows], color="black", lw=0.8)
  ax1.axhline(0, color="gray", lw=0.8, ls="--")
  ax0.set(
    xlabel="RM's initial held-out pair accuracy",
    ylabel="held-out accuracy %",
    title="frozen (blue) and Cooper (red), per seed",
  )
  ax1.set(
    xlabel="RM's initial held-out pair accuracy",
    ylabel="Cooper − frozen, points",
    title="paired by seed: mean, 95% t CI",
  )
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--row", required=True, action="append", help="STUDY:FROZEN:COOPER, repeatable")
  ap.add_argument("--out", required=True, help="path prefix: writes <out>.{md,json,png}")
  a = ap.parse_args(argv)
  rows = sorted((row(spec) for spec in a.row), key=lambda r: r["rm_pair_acc"])
  out = Path(a.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  text = table(rows)
  Path(a.out + ".md").write_text(text)
  Path(a.out + ".json").write_text(json.dumps(rows, indent=1))
  plot(rows, Path(a.out + ".png"))
  print(text)
  return rows


if __name__ == "__main__":
  main()
