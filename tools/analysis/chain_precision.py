"""The premise of Cooper's positives, measured: of the rollouts the rule verifier (math-verify)
marks correct, how many reach the right number through a correct chain of computation lines?

Cooper trusts a rule-verified rollout as a positive. On the arithmetic task the task itself can
check the whole chain (`cooper_jax.tasks.arith.chain_is_correct`: every line equal to the gold
solution's), so the precision of those positives at the chain level can be read off a study's
saved rollouts, per condition and over training:

  python tools/analysis/chain_precision.py --study results/wide_study8 \\
      --data experiments/assets/small_task/data/train.jsonl

writes STUDY/chain_precision.md and .json. Rollouts are each run's `rollouts.jsonl(.gz)` (the
first train.save_rollouts of every step's batch). A rollout whose question is not in --data is
counted and reported, not dropped silently.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

# The study report's rollout reader (rollouts.jsonl or .jsonl.gz).
from cooper_jax.cli import study_report as _report

ROOT = Path(__file__).resolve().parents[2]


def read_rollouts(run_dir: Path) -> list[dict]:
  """A run's saved rollouts, [] when it saved none."""
  return _report.read_rollouts(run_dir) or []


def run_precision(rollouts: list[dict], solutions: dict[str, str], window: int) -> dict:
  """Per step window: rule-correct rollouts, of them with a correct chain, the precision."""
  from cooper_jax.tasks.arith import chain_is_correct  # pylint: disable=import-outside-toplevel

  counts = defaultdict(lambda: [0, 0])
  unknown = 0
  for r in rollouts:
    if not r["rule_correct"]:
      continue
    sol = solutions.get(r["question"])
    if sol is None:
      unknown += 1
      continue
    c = counts[(int(r["step"]) - 1) // window]
    c[0] += 1
    c[1] += int(chain_is_correct(r["response"], sol))
  return {
    "windows": {
      f"{w * window + 1}-{(w + 1) * window}": {"rule_correct": n, "chain_correct": k}
      for w, (n, k) in sorted(counts.items())
    },
    "unknown_questions": unknown,
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--study", required=True, help="a cooper_jax/cli/study.py --out folder")
  p.add_argument("--data", required=True, help="arith rows (question, solution) of the prompts")
  p.add_argument("--window", type=int, default=25, help="steps per row of the table")
  a = p.parse_args(argv)
  from cooper_jax.io import atomic_write_json  # pylint: disable=import-outside-toplevel

  with open(a.data, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  solutions = {r["question"]: r["solution"] for r in rows}
  study = Path(a.study)
  per_run = {}
  for run_dir in sorted((study / "runs").iterdir()):
    if run_dir.is_dir():
      ro = read_rollouts(run_dir)
      if ro:
        per_run[run_dir.name] = run_precision(ro, solutions, a.window)
  by_cond = defaultdict(dict)
  for name, res in per_run.items():
    cond, _, seed = name.rpartition("_s")
    by_cond[cond][int(seed)] = res
  lines = [
    "# Chain-level precision of the rule verifier's positives",
    "",
    "Share of math-verify-correct training rollouts whose every computation line equals the "
    "gold solution's (`tools/analysis/chain_precision.py`); mean over seeds of each run's share, per-seed "
    "values in brackets. Rollouts: the first train.save_rollouts of each step's batch.",
    "",
  ]
  windows = sorted(
    {w for c in by_cond.values() for r in c.values() for w in r["windows"]},
    key=lambda w: int(w.split("-")[0]),
  )
  lines += ["| condition | " + " | ".join(f"steps {w}" for w in windows) + " |"]
  lines += ["|---|" + "---|" * len(windows)]
  for cond, seeds in sorted(by_cond.items()):
    cells = []
    for w in windows:
      shares = [
        r["windows"][w]["chain_correct"] / r["windows"][w]["rule_correct"]
        for _, r in sorted(seeds.items())
        if w in r["windows"] and r["windows"][w]["rule_correct"]
      ]
      n = sum(r["windows"].get(w, {}).get("rule_correct", 0) for r in seeds.values())
      cells.append(
        f"{np.mean(shares):.3f} [{', '.join(f'{x:.2f}' for x in shares)}] (n {n})"
        if shares
        else "-"
      )
    lines.append(f"| {cond} | " + " | ".join(cells) + " |")
  unknown = sum(r["unknown_questions"] for r in per_run.values())
  lines += ["", f"Rule-correct rollouts whose question is not in {a.data}: {unknown}."]
  (study / "chain_precision.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
  atomic_write_json(study / "chain_precision.json", {"per_run": per_run, "unknown": unknown})
  print("\n".join(lines))
  return per_run


if __name__ == "__main__":
  main()
