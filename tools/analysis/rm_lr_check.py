"""Cooper's RM steps with no policy in the loop: is an RM learning rate stable on its own pairs?

The small task's shipped RM (experiments/small_task.py:cooper), one `CooperReward.update` per
step on fixed-distribution pairs: each group is a gold solution (rule-correct, the positive) and
a one-slip wrong solution; the negative comes from the configured generator (perturb by
default), exactly as in training. Nothing else moves, so a BT loss that rises, or a held-out
pair accuracy that falls, is the RM's optimiser at that lr, not the policy's drift.

  python tools/analysis/rm_lr_check.py --lrs 6e-4,1.8e-3,6e-3,1.8e-2 --steps 100 --out results/rm_lr_check

Prints and writes (out/results.json, out/README-ready table.md) per lr: BT loss and pair
accuracy on the step's own pairs (mean of steps 1-10, 41-60, 81-100), the held-out pair accuracy
(data/rm_eval_pairs.jsonl) and within-group score spread every `--eval_every` steps.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cooper_jax import sharding  # noqa: E402
from cooper_jax.config import load_config  # noqa: E402
from cooper_jax.io import atomic_write_json, atomic_write_text, read_jsonl  # noqa: E402
from cooper_jax.reward_modes import CooperReward  # noqa: E402
from cooper_jax.rewards.verify import RuleVerifier  # noqa: E402
from cooper_jax.tasks import blind_spot  # noqa: E402

ASSETS = ROOT / "experiments" / "assets" / "small_task"
WINDOWS = ((1, 10), (41, 60), (81, 100))


def run_lr(lr: float, a, pool: list[dict]) -> dict:
  c = load_config(
    f"{ROOT}/experiments/small_task.py:cooper",
    [
      f"rm.optim.lr={lr}",
      f"rm.optim.warmup_steps={a.warmup}",
      f"train.steps={a.steps}",
      "rollout.group_size=2",
      f"pairs.negatives={a.negatives}",
    ],
  )
  mesh = sharding.make_mesh(**c.mesh)
  verifier = RuleVerifier(1)
  try:
    reward = CooperReward(c, mesh, verifier)
    rng = np.random.default_rng(a.seed)
    curve, evals = [], [{"step": 0, **reward.evaluate()}]
    for step in range(1, a.steps + 1):
      rows = [pool[i] for i in rng.choice(len(pool), c.rollout.prompts_per_step, replace=False)]
      ro = blind_spot.gold_and_slip_rollouts(rows, rng)
      m = reward.update(ro, step)
      curve.append({k: float(m[k]) for k in ("rm_train/bt_loss", "rm_train/pair_acc")})
      if step % a.eval_every == 0:
        r, _ = reward.score(ro.questions, ro.refs, ro.texts)
        spread = float(np.mean(np.abs(r[0::2] - r[1::2])))
        evals.append({"step": step, **reward.evaluate(), "gold_minus_slip": spread})
  finally:
    verifier.close()
  windows = {}
  for lo, hi in WINDOWS:
    part = curve[lo - 1 : hi]
    if part:
      windows[f"{lo}-{hi}"] = {
        "bt_loss": float(np.mean([p["rm_train/bt_loss"] for p in part])),
        "pair_acc": float(np.mean([p["rm_train/pair_acc"] for p in part])),
      }
  return {"lr": lr, "windows": windows, "evals": evals, "curve": curve}


def table(results: list[dict]) -> str:
  keys = list(results[0]["windows"])
  head = ["RM lr"] + [f"BT loss {k}" for k in keys] + [f"pair acc {k}" for k in keys]
  head += ["held-out pair acc (every eval)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in results:
    w = r["windows"]
    held = ", ".join(f"{e['eval/rm_pair_acc']:.2f}" for e in r["evals"])
    cells = [f"{r['lr']:g}"] + [f"{w[k]['bt_loss']:.3f}" for k in keys]
    cells += [f"{w[k]['pair_acc']:.2f}" for k in keys] + [held]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--lrs", default="6e-4,1.8e-3,6e-3,1.8e-2")
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--warmup", type=int, default=20)
  p.add_argument("--eval_every", type=int, default=20)
  p.add_argument("--negatives", default="perturb")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="results/rm_lr_check")
  a = p.parse_args(argv)
  pool = [r for _, r in read_jsonl(ASSETS / "data" / "train.jsonl")]
  results = []
  for lr in (float(x) for x in a.lrs.split(",")):
    results.append(run_lr(lr, a, pool))
    w = results[-1]["windows"]
    print(
      f"lr {lr:g}: "
      + "; ".join(f"{k} BT {v['bt_loss']:.3f} acc {v['pair_acc']:.2f}" for k, v in w.items())
    )
    print(
      "  held-out pair acc: "
      + ", ".join(f"{e['eval/rm_pair_acc']:.2f}" for e in results[-1]["evals"])
    )
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  atomic_write_json(out / "results.json", {"args": vars(a), "results": results})
  atomic_write_text(out / "table.md", table(results))
  print(table(results))
  return results


if __name__ == "__main__":
  main()
