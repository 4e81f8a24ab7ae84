"""The dapo_sampling study's table from its runs (results/dapo_sampling/runs/<name>_s<seed>/,
git-ignored): per run, RM pairs per step, the share of informative groups, batches drawn per
step, step time, and the length tail. Writes results.json beside this file and prints the
markdown table of README.md.

  python results/dapo_sampling/summarize.py

Informative share: with dynamic sampling, sampling/informative_frac (informative groups over
groups drawn); without it, from rollouts.jsonl (every rollout saved, train.save_rollouts=64):
the share of groups whose reward is not flat by the filter's own test (rule: not all equal;
cooper: not all equal and std >= 0.05, the cooper_ds runs' min_std).
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from cooper_jax.dynamic_sampling import flat_groups  # noqa: E402

G = 8
MIN_STD = {"rule": 0.0, "cooper": 0.05}


def _rows(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def informative_from_rollouts(run: Path, min_std: float) -> float:
  by_step = defaultdict(list)
  for r in _rows(run / "rollouts.jsonl"):
    by_step[r["step"]].append((r["row"], r["reward"]))
  flat = []
  for rows in by_step.values():
    rewards = [v for _, v in sorted(rows)]
    if len(rewards) % G == 0:
      flat.extend(flat_groups(rewards, G, min_std))
  return float(1 - np.mean(flat))


def summarize(run: Path) -> dict:
  m = [r for r in _rows(run / "metrics.jsonl") if r["step"] > 0]
  name, seed = run.name.rsplit("_s", 1)
  mean = lambda k, rows=m: float(np.mean([r[k] for r in rows])) if k in rows[0] else None
  last = m[-10:]
  out = {
    "run": name,
    "seed": int(seed),
    "steps": len(m),
    "pairs_per_step": mean("pairs/n_valid"),
    "batches_per_step": mean("sampling/batches_drawn") or 1.0,
    "padded_groups_total": int(sum(r.get("sampling/padded_groups", 0) for r in m)),
    "step_s_median": float(np.median([r["time/step_s"] for r in m[2:]])),
    "rule_acc_last10": mean("rule/acc", last),
    "truncated_frac": mean("response/truncated_frac"),
    "truncated_frac_last10": mean("response/truncated_frac", last),
    "len_mean": mean("response/len_mean"),
    "len_mean_last10": mean("response/len_mean", last),
    "overlong_penalty_mean": mean("response/overlong_penalty_mean"),
    "rm_group_std": mean("rm/group_std"),
  }
  if "sampling/informative_frac" in m[0]:
    out["informative_share"] = mean("sampling/informative_frac")
    for k in ("dropped_all_correct", "dropped_all_wrong", "dropped_flat", "kept_no_positive"):
      out[k + "_per_step"] = mean("sampling/" + k)
  else:
    out["informative_share"] = informative_from_rollouts(run, MIN_STD[name.split("_")[0]])
  if (run / "rollouts.jsonl").exists():  # the policy batch's groups not exactly flat
    out["batch_not_tied_share"] = informative_from_rollouts(run, 0.0)
  return out


def fmt(x, spec=".2f"):
  return "-" if x is None else format(x, spec)


def main():
  runs = sorted(p for p in (HERE / "runs").iterdir() if (p / "metrics.jsonl").exists())
  table = [summarize(p) for p in runs]
  print(
    "| run | seed | steps | RM pairs/step | informative share | batches/step | padded groups |"
    " step s (median) | rule acc (last 10) | truncated frac | len mean (last 10) |"
    " batch groups not tied |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in table:
    print(
      f"| {r['run']} | {r['seed']} | {r['steps']} | {fmt(r['pairs_per_step'])} | "
      f"{fmt(r['informative_share'])} | {fmt(r['batches_per_step'])} | "
      f"{r['padded_groups_total']} | {fmt(r['step_s_median'])} | {fmt(r['rule_acc_last10'], '.3f')} | "
      f"{fmt(r['truncated_frac'], '.4f')} | {fmt(r['len_mean_last10'], '.1f')} | "
      f"{fmt(r.get('batch_not_tied_share'), '.3f')} |"
    )
  long = long_runs()
  results = {"runs": table, "long_runs": long}
  (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")


def long_runs():
  """runs/long/: cooper seed 0, 120 steps, overlong penalty off / on: the tail by 40-step window."""
  runs = sorted(p for p in (HERE / "runs" / "long").glob("*") if (p / "metrics.jsonl").exists())
  if not runs:
    return []
  print(
    "\n| run (120 steps) | steps | window | truncated frac | len mean | penalty mean | rule acc |"
  )
  print("|---|---|---|---|---|---|---|")
  out = []
  for run in runs:
    m = [r for r in _rows(run / "metrics.jsonl") if r["step"] > 0]
    for lo in range(0, len(m), 40):
      w = m[lo : lo + 40]
      mean = lambda k: float(np.mean([r.get(k, 0.0) for r in w]))
      row = {
        "run": run.name,
        "steps": len(m),
        "window": f"{w[0]['step']}-{w[-1]['step']}",
        "truncated_frac": mean("response/truncated_frac"),
        "len_mean": mean("response/len_mean"),
        "penalty_mean": mean("response/overlong_penalty_mean"),
        "rule_acc": mean("rule/acc"),
      }
      out.append(row)
      print(
        f"| {run.name} | {len(m)} | {row['window']} | {row['truncated_frac']:.4f} | "
        f"{row['len_mean']:.1f} | {row['penalty_mean']:.4f} | {row['rule_acc']:.3f} |"
      )
  return out


if __name__ == "__main__":
  main()
