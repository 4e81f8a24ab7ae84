"""Where a training step's time goes: per-phase wall times with a device sync after each
compiled call, over steady-state steps of a real run (compiles excluded).

  python tools/analysis/profile_step.py --config experiments/small_task.py:cooper --steps 30 --warmup 5

Each compiled function the host loop calls (the sampler, the reference log-prob pass, the RM
reward forward, policy_step, rm_step, the assistant's sampler) is wrapped so that its call
blocks until its outputs are ready; what is left of the step is host work (tokenising,
verifying, building pairs, transfers). Prints the median seconds per step of each phase and the
step's own timers (`time/*` in metrics.jsonl), so the profile and the run's timers can be read
side by side. The syncs add no work, only remove overlap, so the total here is an upper bound
of an unprofiled step.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cooper_jax.host_platform import use_cpu_unless_accelerator  # noqa: E402

use_cpu_unless_accelerator()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cooper_jax import rollouts as rollouts_lib  # noqa: E402
from cooper_jax import train as train_lib  # noqa: E402
from cooper_jax.config import load_config  # noqa: E402

TIMES: dict[str, float] = collections.defaultdict(float)
_SAMPLE = rollouts_lib.sample


def timed(name: str, fn):
  """fn, blocking on its outputs and adding its wall time to TIMES[name]."""

  def wrapper(*args, **kwargs):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    TIMES[name] += time.perf_counter() - t0
    return out

  wrapper.__wrapped__ = fn
  return wrapper


def instrument(run: train_lib.Run) -> None:
  """Wrap the compiled calls of one Run (after its first step built them)."""
  rollouts_lib.sample = timed("sampler", _SAMPLE)
  run.logprob_fn = timed("reference logprobs", run.logprob_fn)
  if run._policy_step is not None:
    run._policy_step = timed("policy_step", run._policy_step)
  reward = run.reward
  if hasattr(reward, "reward_fn"):
    reward.reward_fn = timed("RM reward forward", reward.reward_fn)
  if hasattr(reward, "_rm_steps"):
    reward._rm_steps = _TimedDict("rm_step", reward._rm_steps)
  neg = getattr(reward, "negatives", None)
  if neg is not None and hasattr(neg, "_sample"):
    neg._sample = timed("assistant sampler", neg._sample)


class _TimedDict(dict):
  """A dict of compiled functions whose values come back wrapped by `timed`."""

  def __init__(self, name, base):
    super().__init__(base)
    self.name = name

  def __getitem__(self, key):
    return timed(self.name, super().__getitem__(key))


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", default="experiments/small_task.py:cooper")
  ap.add_argument("--steps", type=int, default=30, help="profiled steps")
  ap.add_argument("--warmup", type=int, default=5, help="steps run first, not profiled")
  ap.add_argument("--set", action="append", default=[], help="config override key=value")
  ap.add_argument(
    "--resume",
    default="",
    help="a run's workdir: profile from its latest checkpoint (a copy; e.g. a hacked policy "
    "whose responses run to the length cap) instead of from step 0",
  )
  ap.add_argument(
    "--cprofile", type=int, default=0, help="also print the N host functions of most own time"
  )
  args = ap.parse_args(argv)
  c = load_config(args.config, args.set)
  ckpts = Path(args.resume) / "checkpoints" if args.resume else None
  if ckpts is not None and not ckpts.is_dir():
    raise SystemExit(f"--resume {args.resume}: no checkpoints/ folder at {ckpts}")
  with c.unlocked():
    if ckpts is None:  # resumed: the run's own train.steps, so its lr schedule goes on as it did
      c.train.steps = args.warmup + args.steps
    c.train.eval_every = 0
    c.train.checkpoint_every = 10**9
  with tempfile.TemporaryDirectory() as work:
    if ckpts is not None:
      shutil.copytree(ckpts, Path(work) / "checkpoints")
    run = train_lib.Run(c, work)
    for _ in range(args.warmup):
      run.train_step()
    instrument(run)
    step_times, own = [], collections.defaultdict(list)
    per_step = collections.defaultdict(list)
    prof = cProfile.Profile() if args.cprofile else None
    if prof:
      prof.enable()
    metrics = []
    for _ in range(args.steps):
      TIMES.clear()
      t0 = time.perf_counter()
      metrics.append(run.train_step())
      step_times.append(time.perf_counter() - t0)
      for k, v in TIMES.items():
        per_step[k].append(v)
    run.finish_rm_update()  # train.overlap_rm_update: the last step's RM update
    for m in metrics:
      for k in ("time/sample_s", "time/verify_s", "time/policy_s", "time/rm_s", "time/step_s"):
        own[k].append(m[k])
    if prof:
      prof.disable()
    run.close()
  total = float(np.median(step_times))
  rows = {k: float(np.median(v)) for k, v in per_step.items()}
  # With train.overlap_rm_update the RM update's phases run during the next step's sampler,
  # so the phases can sum to more than the step (the rest is then negative).
  rows["host and transfers (rest)"] = total - sum(rows.values())
  print(f"{args.config}  {args.steps} steps after {args.warmup}; median seconds per step")
  print(f"  {'step (profiled, synced)':<28} {total:7.3f}")
  for k, v in sorted(rows.items(), key=lambda kv: -kv[1]):
    print(f"  {k:<28} {v:7.3f}  {100 * v / total:5.1f}%")
  print("the run's own timers (median):")
  for k, v in own.items():
    print(f"  {k:<28} {float(np.median(v)):7.3f}")
  print(json.dumps({"step_s": total, **rows}))
  if prof:
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.cprofile)


if __name__ == "__main__":
  main()
