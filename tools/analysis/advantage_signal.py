"""How much of the policy's GRPO signal is about correctness? Read off a run's saved rollouts.

Under the rule reward every group-relative advantage is a function of the rule verdict, and a
group with no right answer carries no gradient (all rewards equal). Under an RM reward part of
each group's advantage ranks answers of the same verdict against each other (which right
answer, which wrong answer), and an all-wrong group still carries a full, std-normalised
advantage. Per window of steps, over the saved groups:

- `explained`: the share of sum(A^2) explained by the rule verdict within groups (between-verdict
  sum of squares / total; 1.0 under the rule reward);
- `all_wrong`: the share of groups with no rule-correct answer, and `all_wrong_weight` their
  share of sum(|A|) (what the policy learns from the RM's preferences among wrong answers);
- `mean_abs`: mean |A| per rollout. Without the std normalisation it is the reward's own
  within-group spread. A scale shared by every step is divided out by Adam (its update is
  g / sqrt(E[g^2])), so this is not the step size: what changes the step is how the weight
  is spread over groups and steps (Dr. GRPO weights a group by its spread, GRPO equally).

A is the trainer's own advantage (`cooper_jax.losses.grpo_advantages`, the run's group size and
`policy.loss.scale_adv_by_std`) of the saved `reward`s. Only the groups a run saved are read
(`train.save_rollouts`, the first rows of each step's batch), whole groups only.

  python tools/analysis/advantage_signal.py --runs results/wide_study8/runs/static_rm_weak_s0 ...
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "analysis"))

from chain_precision import read_rollouts  # noqa: E402

from cooper_jax.io import atomic_write_json  # noqa: E402
from cooper_jax.losses import grpo_advantages  # noqa: E402


def group_signal(groups: list[tuple[np.ndarray, np.ndarray]], scale_by_std: bool = True) -> dict:
  """groups: (rewards [G], rule_correct [G] bool) each. Returns explained, all_wrong,
  all_wrong_weight and mean_abs as described in the module docstring (NaN where nothing to
  divide)."""
  ss_total = ss_verdict = abs_total = abs_wrong = 0.0
  n_wrong = n_rows = 0
  for rewards, correct in groups:
    correct = np.asarray(correct, bool)
    adv = np.asarray(grpo_advantages(np.asarray(rewards), len(rewards), scale_by_std=scale_by_std))
    ss_total += float(np.sum(adv**2))
    abs_total += float(np.sum(np.abs(adv)))
    n_rows += adv.size
    if not correct.any():
      n_wrong += 1
      abs_wrong += float(np.sum(np.abs(adv)))
    for part in (adv[correct], adv[~correct]):
      if part.size:
        ss_verdict += part.size * float(part.mean()) ** 2
  nan = float("nan")
  return {
    "groups": len(groups),
    "explained": ss_verdict / ss_total if ss_total > 0 else nan,
    "all_wrong": n_wrong / len(groups) if groups else nan,
    "all_wrong_weight": abs_wrong / abs_total if abs_total > 0 else nan,
    "mean_abs": abs_total / n_rows if n_rows else nan,
  }


def run_signal(run_dir: Path, window: int) -> dict:
  cfg = json.loads((Path(run_dir) / "config.json").read_text())
  g = int(cfg["rollout"]["group_size"])
  by_group = defaultdict(list)
  for r in read_rollouts(Path(run_dir)):
    by_group[int(r["step"]), int(r["row"]) // g].append(r)
  windows, partial = defaultdict(list), 0
  for (step, _), rows in sorted(by_group.items()):
    if len(rows) != g:
      partial += 1  # a group cut by save_rollouts: counted, not read
      continue
    rows.sort(key=lambda r: r["row"])
    rewards = np.array([r["reward"] for r in rows], np.float32)
    windows[(step - 1) // window].append((rewards, [r["rule_correct"] for r in rows]))
  scale = bool(cfg["policy"]["loss"].get("scale_adv_by_std", True))
  return {
    "windows": {
      f"{w * window + 1}-{(w + 1) * window}": group_signal(gs, scale)
      for w, gs in sorted(windows.items())
    },
    "partial_groups_skipped": partial,
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  p.add_argument("--runs", nargs="+", required=True, help="run directories (runs/<cond>_s<seed>)")
  p.add_argument("--window", type=int, default=50)
  p.add_argument("--out", default=None, help="write the results as JSON here")
  a = p.parse_args(argv)
  out = {}
  for run in a.runs:
    res = out[Path(run).name] = run_signal(Path(run), a.window)
    cells = [
      f"{v['explained']:.2f}/{v['all_wrong']:.2f}/{v['all_wrong_weight']:.2f}/{v['mean_abs']:.3f}"
      for v in res["windows"].values()
    ]
    head = "explained / all-wrong groups / their |A| share / mean |A| per window:"
    print(f"{Path(run).name}: {head}", *cells)
    if res["partial_groups_skipped"]:
      print(f"  {res['partial_groups_skipped']} partial groups skipped")
  if a.out:
    atomic_write_json(a.out, out)
  return out


if __name__ == "__main__":
  main()
