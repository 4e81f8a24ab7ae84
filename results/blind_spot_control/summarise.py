"""Per-run numbers of the blind-spot control (run from the repository root):
  python results/blind_spot_control/summarise.py
Training reward, rule accuracy of the rollouts, greedy held-out accuracy, the RM's mean score on
the probe (wrong, even answers) at each evaluation and the first step it is below 0.5, and the
share of even final answers among the saved rollouts (all / rule-wrong), first vs last 20 steps.
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cooper_jax.tasks.blind_spot import has_pattern  # noqa: E402

RUNS = Path(__file__).resolve().parent / "runs"


def main():
  for run in sorted(RUNS.iterdir()):
    if not (run / "heldout.json").exists() or run.name.startswith("untrained"):
      continue  # an untrained baseline, or a run still going
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tr = [r for r in rows if "rule/acc" in r]
    rew, acc = np.array([r["reward/mean"] for r in tr]), np.array([r["rule/acc"] for r in tr])
    ev = [r["eval/acc"] for r in rows if "eval/acc" in r]
    probe = [(r["step"], r["eval/rm_probe_score"]) for r in rows if "eval/rm_probe_score" in r]
    below = next((s for s, v in probe if v < 0.5), None)
    gz, plain = run / "rollouts.jsonl.gz", run / "rollouts.jsonl"
    src = gzip.open(gz, "rt") if gz.exists() else (open(plain) if plain.exists() else [])
    ro = [json.loads(line) for line in src]

    def even(lo, hi, wrong_only=False):
      sel = [r for r in ro if lo <= r["step"] <= hi and (not wrong_only or not r["rule_correct"])]
      return np.mean([has_pattern(r["response"]) for r in sel]) if sel else float("nan")

    held = json.loads((run / "heldout.json").read_text())["accuracy"]
    print(
      f"{run.name}: reward {rew[:5].mean():.3f}->{rew[-5:].mean():.3f} | rule acc "
      f"{acc[:10].mean():.3f}->{acc[-10:].mean():.3f} | greedy {ev[0]:.2f}->{ev[-1]:.2f} "
      f"(min {min(ev):.2f}) | held-out T=1 {held:.3f} | probe "
      f"{' '.join(f'{v:.2f}' for _, v in probe)} | below 0.5 at step {below} | even share "
      f"{even(1, 20):.2f}/{even(1, 20, True):.2f} -> {even(81, 100):.2f}/{even(81, 100, True):.2f}"
    )


if __name__ == "__main__":
  main()
