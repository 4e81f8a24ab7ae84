"""Several JAX processes on this CPU, joined by jax.distributed on localhost (gloo collectives):
the tiny config as 2 processes x 2 devices against 1 process x 4 devices, a process killed
mid-run, a SIGTERM to one process, a corrupt newest checkpoint step, and Cooper's RM pair batch
built by each process from its own pairs (tests/mp_pair_batch_worker.py), rollouts sampled
one step ahead stopped and resumed.

Each process is `python -m cooper_jax.train` with its own --config.distributed.* flags, as a
user would start one per host."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import resume_from
from mp_helpers import HEARTBEAT_S, ROOT
from mp_helpers import dist_flags as _dist_flags
from mp_helpers import launch as _launch
from mp_helpers import log as _log
from mp_helpers import params as _params
from mp_helpers import run as _run
from mp_helpers import spawn as _spawn
from mp_helpers import wait as _wait
from mp_helpers import why as _why
from run_bounds import (
  assert_same_metrics,
  assert_same_step_across_layouts,
  initial,
  logprob_atols,
  logprob_delta,
  run_config,
  score_delta,
)

from cooper_jax.metrics import read_metrics


def _wait_for_steps(workdir, n, procs, timeout=240):
  metrics = Path(workdir) / "metrics.jsonl"
  deadline = time.time() + timeout
  while time.time() < deadline:
    if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
      return
    for i, p in enumerate(procs):
      if p.poll() is not None:
        pytest.fail(f"process {i} ended early ({p.returncode}):\n{_why(workdir, i)}")
    time.sleep(0.2)
  pytest.fail(f"fewer than {n} steps logged in {timeout} s")


def _steps(workdir):
  d = Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


def _comparable(rows):
  # rm/pair_rows is the RM batch's bucketed row count, which follows the process layout
  return [
    {k: v for k, v in r.items() if not k.startswith("time/") and k != "rm/pair_rows"} for r in rows
  ]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
  """2 processes x 2 devices, 6 steps, a checkpoint every step (the reference for both the
  equivalence at steps 1 and 3 and the killed-and-resumed run)."""
  workdir = tmp_path_factory.mktemp("mp") / "two"
  t0 = time.time()
  _run(workdir, 2, 2, "--config.train.checkpoint_every=1", steps=6)
  print(f"2 x 2 devices, 6 steps: {time.time() - t0:.1f} s")
  return workdir


def _assert_same_step(one, other, step, prev_run=None):
  """Step `step` of runs `one` and `other` (4 devices each), taken from the same state: the
  initial one (step 1) or prev_run's checkpoint of the step before, at the bounds of
  tests/run_bounds.py (float32 error analysis)."""
  a = next(r for r in read_metrics(one) if r["step"] == step)
  b = next(r for r in read_metrics(other) if r["step"] == step)
  states = {
    "prev": _params(prev_run, step - 1) if step > 1 else None,
    "a": _params(one, step),
    "b": _params(other, step),
  }
  assert_same_step_across_layouts(run_config(one), a, b, states, n_devices=4)


def test_two_processes_match_one(two_process_run, tmp_path):
  """Steps 1 and 3 of 1 process x 4 devices, each from the 2 x 2 run's state before it (the
  initial state; its step-2 checkpoint, restored on the other layout), against the 2 x 2 run's
  own: equal up to the order of the cross-device sums."""
  one, resumed = tmp_path / "one", tmp_path / "resumed"
  t0 = time.time()
  _run(one, 1, 4, steps=1)
  resume_from(two_process_run, 2, resumed)
  _run(resumed, 1, 4, steps=3)
  print(f"1 x 4 devices, 1 step twice: {time.time() - t0:.1f} s")
  assert "resumed from" in _log(resumed, 0) and [r["step"] for r in read_metrics(resumed)] == [3]
  _assert_same_step(one, two_process_run, 1)
  _assert_same_step(resumed, two_process_run, 3, prev_run=two_process_run)
  # Only the primary wrote (one metrics file, one line per step) and logged progress.
  assert len(read_metrics(two_process_run)) == 6
  assert "checkpoint step 6" in _log(two_process_run, 0)
  assert "checkpoint step" not in _log(two_process_run, 1)


def test_rm_pair_batch_across_processes(tmp_path):
  """Each process puts its own valid pairs first in its rows of the RM batch (one valid pair of
  its 4 prompts here: 2 rows each, its 2 row shards, instead of 4); the RM update equals the
  one on one row per prompt."""
  out = tmp_path / "result.json"
  worker = str(ROOT / "tests" / "mp_pair_batch_worker.py")
  cmd = lambda i, port: [sys.executable, worker, str(i), "2", str(port), str(out)]
  _wait(_spawn(tmp_path / "pairs", 2, 2, cmd), tmp_path / "pairs")
  for i in range(2):
    r = json.loads(Path(f"{out}.{i}").read_text())
    assert r["compact_rows"] == 4 and r["n_valid"] == [2.0, 2.0]
    # Gradients within the float32 bound of their longest path (test_steps), the parameters
    # after the step within the step's own bound (|update| <= lr (1 + wd |p|)), and they moved.
    assert r["grad_scale"] > 0 and r["grad_diff"] <= r["grad_roundoff"] * r["grad_scale"], r
    assert r["max_moved"] > 0 and r["max_diff"] <= 2.1 * r["lr"], r


def test_killed_process_fails_the_other_and_restart_resumes(two_process_run, tmp_path):
  workdir = tmp_path / "killed"
  overrides = ("--config.train.checkpoint_every=1",)
  procs = _launch(workdir, 2, 2, *overrides, steps=6)
  _wait_for_steps(workdir, 3, procs)
  t_kill = time.time()
  procs[1].send_signal(signal.SIGKILL)
  try:
    procs[0].wait(timeout=HEARTBEAT_S * 6)
  except subprocess.TimeoutExpired:
    procs[0].kill()
    pytest.fail("the surviving process hangs after its peer was killed")
  waited = time.time() - t_kill
  print(f"survivor exited {procs[0].returncode} after {waited:.1f} s")
  assert procs[0].returncode != 0
  survivor = _log(workdir, 0)
  why = [
    l
    for l in survivor.splitlines()
    if any(s in l.lower() for s in ("heartbeat", "gloo")) and "connected to" not in l
  ]
  assert why, survivor[-3000:]
  print("survivor's error:", why[0][:300])
  Path(f"{workdir}.p0.log").rename(f"{workdir}.killed.p0.log")
  done = len(read_metrics(workdir))
  t0 = time.time()
  _run(workdir, 2, 2, *overrides, steps=6)
  print(f"killed after {done} steps; restart to step 6: {time.time() - t0:.1f} s")
  assert "resumed from" in _log(workdir, 0)
  assert _comparable(read_metrics(workdir)) == _comparable(read_metrics(two_process_run))
  a, b = _params(workdir, 6), _params(two_process_run, 6)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_sigterm_to_one_process_stops_all_at_one_step(tmp_path):
  workdir = tmp_path / "term"
  procs = _launch(workdir, 2, 2, "--config.train.checkpoint_every=1000", steps=200)
  _wait_for_steps(workdir, 2, procs)
  t0 = time.time()
  procs[1].send_signal(signal.SIGTERM)
  _wait(procs, workdir, timeout=120)
  print(f"SIGTERM to process 1: both exited 0 after {time.time() - t0:.1f} s")
  n = len(read_metrics(workdir))
  assert "stopped by signal" in _log(workdir, 0) and "stopped by signal" in _log(workdir, 1)
  assert _steps(workdir) == [n] and 2 <= n < 200
  assert (workdir / "checkpoints" / str(n) / "cooper_manifest.json").exists()
  from cooper_jax.checkpoint import verify_step_dir  # pylint: disable=import-outside-toplevel

  verify_step_dir(workdir / "checkpoints" / str(n))


def test_corrupt_newest_step_is_moved_aside_and_saved_again(tmp_path):
  workdir = tmp_path / "corrupt"
  every = "--config.train.checkpoint_every=1"
  _run(workdir, 1, 1, every, "--config.train.stop_after=3", steps=4)  # the run's first 3 steps
  first = read_metrics(workdir)
  victim = max(
    (f for f in (workdir / "checkpoints" / "3").rglob("*") if f.is_file()),
    key=lambda f: f.stat().st_size,
  )
  victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
  _run(workdir, 1, 1, every, steps=4)
  log = _log(workdir, 0)
  aside = list((workdir / "checkpoints.corrupt").iterdir())
  assert [p.name.split("-")[0] for p in aside] == ["3"]
  assert str(aside[0]) in log and "resumed from" in log and "at step 2" in log
  assert _steps(workdir) == [1, 2, 3, 4]
  again = read_metrics(workdir)
  assert [r["step"] for r in again] == [1, 2, 3, 4]
  assert _comparable(again[:3]) == _comparable(first)  # step 3 re-trained identically


def test_llm_rewrite_two_processes_match_one(tmp_path):
  """The paper's negative generator across processes: with the small task's policy (it gets
  answers right, so positives form) and its shipped assistant, 2 processes x 2 devices and
  1 x 4 train alike: each process rewrites the positives of its own groups in one global
  assistant batch, every row drawn with its own key. rollout/sampler_compiles and
  rm/pair_rows count shapes, which follow the process layout."""
  small = ROOT / "experiments" / "small_task.py"

  def runner(workdir, n_proc, devices, steps, every=2):
    def cmd(i, port):
      return [
        sys.executable,
        "-m",
        "cooper_jax.train",
        f"--config={small}:cooper_rewrite",
        f"--workdir={workdir}",
        f"--config.train.steps={steps}",
        f"--config.train.checkpoint_every={every}",
        "--config.train.max_to_keep=10",
        "--config.train.eval_every=0",
        "--config.rollout.prompts_per_step=4",
      ] + _dist_flags(i, port, n_proc)

    _wait(_spawn(workdir, n_proc, devices, cmd), workdir, timeout=480)

  two = tmp_path / "two"
  runner(two, 2, 2, steps=2, every=1)
  runner(tmp_path / "one", 1, 4, steps=1)
  resume_from(two, 1, tmp_path / "resumed")
  runner(tmp_path / "resumed", 1, 4, steps=2)
  rows = read_metrics(two)
  assert sum(r["pairs/negative_tries"] for r in rows) > 0
  assert sum(r["pairs/n_valid"] for r in rows) > 0  # rewrites were accepted: the RM trained
  _assert_same_step(tmp_path / "one", two, 1)
  _assert_same_step(tmp_path / "resumed", two, 2, prev_run=two)


def test_merged_rows_two_processes_match_one_unmerged(tmp_path):
  """Greedy rollouts (each group's G samples equal, so the policy step runs one row a prompt
  at weight G and the RM scores one), 2 processes x 2 devices with rows merged, against
  1 process x 4 devices without: the same first step, up to the float32 bounds of two programs
  (tests/run_bounds.py): log-probs within their derived bound, RM rewards within the score
  bound's sigmoid slope 1/4."""
  greedy = "--config.rollout.temperature=0.0"
  merged = (
    greedy,
    "--config.policy.merge_duplicate_rows=True",
    "--config.rm.merge_duplicate_rows=True",
  )
  _run(tmp_path / "two", 2, 2, *merged, steps=1)
  _run(tmp_path / "one", 1, 4, greedy, steps=1)
  (a,), (b,) = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
  assert b["policy/distinct_rows"] == 4  # 4 prompts x 4 equal samples
  # Equal rewards within each group in both runs: advantages exactly 0, so the policy loss is
  # its KL term alone.
  assert a["rm/group_std"] == b["rm/group_std"] == 0.0
  c = run_config(tmp_path / "one")
  init = initial(c)
  width = a["rollout/prompt_width"] + a["policy/response_width"]
  atols = logprob_atols(c, a, b, logprob_delta(c, *init["policy"], width))
  reward_atol = score_delta(c, *init["rm"]) / 4
  atols |= {k: reward_atol for k in ("reward/mean", "rm/reward_mean", "rm/minus_rule_acc")}
  # With A = 0 and the policy still its own reference, the gradient is the KL term's
  # derivative at r ~ 0: float noise on both sides, so its norm is not compared.
  # token_fill: a merged run's share of real tokens in its rows (no such row layout unmerged).
  skip = ("policy/rows", "policy/distinct_rows", "policy/token_fill", "policy/grad_norm")
  assert_same_metrics(a, b, atols, skip=skip)


def test_off_policy_two_processes_stop_and_resume_replay_the_straight_run(tmp_path):
  """Rollouts one step ahead (rollout.off_policy_steps=1) on 2 processes x 2 devices: the
  sampler is dispatched from each main thread, and the batch sampled ahead is saved as global
  arrays beside the models. Stopped after step 2 and resumed, the run equals the straight one
  bit for bit (the same layout: the same programs)."""
  k = ("--config.rollout.off_policy_steps=1",)
  straight, split = tmp_path / "straight", tmp_path / "split"
  _run(straight, 2, 2, *k, steps=4)
  _run(split, 2, 2, *k, "--config.train.stop_after=2", steps=4)
  assert (split / "checkpoints" / "2" / "ahead").is_dir()
  _run(split, 2, 2, *k, steps=4)
  assert "resumed from" in _log(split, 0)
  a, b = read_metrics(straight), read_metrics(split)
  assert [r["rollout/params_age"] for r in a] == [0, 1, 1, 1]
  assert _comparable(a) == _comparable(b)
  jax.tree.map(np.testing.assert_array_equal, _params(straight, 4), _params(split, 4))
