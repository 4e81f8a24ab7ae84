"""On-policy against one-step-off-policy rollouts (config rollout.off_policy_steps), side by side
in one sitting: training runs of the same config alternating on / off, each its own process,
the median step time of each after its warm-up steps, and the ratio off / on per pair.

  python benchmarks/off_policy.py [--config experiments/small_task_wide.py:cooper_weak_rewrite]
      [--steps 40] [--warmup 8] [--runs 2] [--ahead 1] [--set key=value ...]

A step's time is `time/step_s` of metrics.jsonl: the main thread's wall time from the start of
the step (its rollouts' wait included) to its end, evaluations and checkpoints excluded (the
benchmark turns both off). Off-policy, the sampler of a later step runs during the step, so the
steady-state step time is the iteration time. Every step does the same work either way (one
batch sampled, verified, scored, one policy and RM update).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", default="experiments/small_task_wide.py:cooper_weak_rewrite")
  ap.add_argument("--steps", type=int, default=40)
  ap.add_argument("--warmup", type=int, default=8, help="first steps left out (compiles)")
  ap.add_argument("--runs", type=int, default=2, help="pairs of runs (on, off)")
  ap.add_argument("--ahead", type=int, default=1, help="rollout.off_policy_steps of the off side")
  ap.add_argument("--set", action="append", default=[], help="config override key=value")
  return ap.parse_args(argv)


def run_once(a, ahead: int, workdir: Path) -> dict:
  """One training run; its median step time after the warm-up, and its step count."""
  cmd = [
    sys.executable,
    "-m",
    "cooper_jax.train",
    f"--config={a.config}",
    f"--workdir={workdir}",
    f"--config.train.steps={a.steps}",
    "--config.train.eval_every=0",
    f"--config.train.checkpoint_every={10**6}",
    f"--config.rollout.off_policy_steps={ahead}",
    *[f"--config.{kv}" for kv in a.set],
  ]
  p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if p.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if r["step"] > a.warmup]
  return {
    "step_s": statistics.median(r["time/step_s"] for r in steps),
    "wait_s": statistics.median(r["time/sample_s"] for r in steps),
    "steps": len(steps),
  }


def main(argv=None) -> dict:
  a = parse_args(argv)
  results = {"on": [], "off": []}
  with tempfile.TemporaryDirectory() as tmp:
    for i in range(a.runs):
      for side, ahead in (("on", 0), ("off", a.ahead)):
        r = run_once(a, ahead, Path(tmp) / f"{side}{i}")
        results[side].append(r)
        print(
          f"run {i} {side:>3} (off_policy_steps={ahead}): median step {r['step_s']:.3f} s, "
          f"rollout wait {r['wait_s']:.3f} s, {r['steps']} steps",
          flush=True,
        )
  ratios = [off["step_s"] / on["step_s"] for on, off in zip(results["on"], results["off"])]
  on_s = statistics.median(r["step_s"] for r in results["on"])
  off_s = statistics.median(r["step_s"] for r in results["off"])
  print(
    f"{a.config}: on-policy {on_s:.3f} s, off-policy (k={a.ahead}) {off_s:.3f} s a step; "
    f"off / on per pair {', '.join(f'{x:.3f}' for x in ratios)}"
  )
  out = {"config": a.config, "on_s": on_s, "off_s": off_s, "ratios": ratios, **results}
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
