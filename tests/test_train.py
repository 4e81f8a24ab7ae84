"""The host loop end to end on a tiny model: resume exactness, SIGTERM, config errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import comparable, final_params, resume_from, train_cmd
from mp_helpers import params
from run_bounds import (
  assert_same_adam_update,
  assert_same_metrics,
  assert_sampler_matches_trainer,
  grad_norm_atol,
  initial,
  logprob_atols,
  logprob_delta,
  run_config,
)

from cooper_jax.metrics import read_metrics
from cooper_jax.models.tolerance import float32_gradient_roundoff

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "experiments" / "tiny.py")


def _train(workdir, *overrides, steps=4, timeout=600, wait=True):
  cmd = train_cmd(workdir, steps, *overrides)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  if not wait:
    return subprocess.Popen(
      cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
  p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return p


def test_resume_is_exact(tmp_path):
  straight, split = tmp_path / "straight", tmp_path / "split"
  _train(straight, steps=4)
  _train(split, "--config.train.stop_after=2", steps=4)  # exits after step 2, checkpointed
  p = _train(split, steps=4)  # a new process resumes at step 2
  assert "resumed from" in p.stderr
  a, b = read_metrics(straight), read_metrics(split)
  assert [r["step"] for r in b] == [1, 2, 3, 4]
  assert comparable(a) == comparable(b)
  sa, pa = final_params(straight)
  sb, pb = final_params(split)
  assert sa == sb == 4
  import jax  # pylint: disable=import-outside-toplevel

  jax.tree.map(np.testing.assert_array_equal, pa, pb)
  # And training really changed the policy (not a no-op that trivially matches).
  assert float(a[0]["policy/grad_norm"]) > 0
  # The learning rates are logged every step (tiny: constant 1e-3 for both models).
  assert all(r["policy/lr"] == pytest.approx(1e-3) for r in a)
  assert all(r["rm_train/lr"] == pytest.approx(1e-3) for r in a)


def test_stop_after_runs_the_first_steps_of_the_whole_schedule(tmp_path):
  """train.stop_after=2 of 4 steps: the 4-step run's first two steps (the same floats, its lr
  schedule, a checkpoint at 2); resumed without it, the run finishes as the straight one."""
  decay = (
    "--config.policy.optim.schedule=warmup_linear_decay",
    "--config.policy.optim.warmup_steps=0",
  )
  full, part = tmp_path / "full", tmp_path / "part"
  _train(full, *decay, steps=4)
  _train(part, *decay, "--config.train.stop_after=2", steps=4)
  a, b = read_metrics(full), read_metrics(part)
  assert [r["step"] for r in b] == [1, 2] and final_params(part)[0] == 2
  # Step 2's update at schedule step 1 of a 4-step linear decay from 1e-3 (a 2-step one: 5e-4).
  assert b[1]["policy/lr"] == pytest.approx(1e-3 * (1 - 1 / 4))
  assert comparable(b) == comparable(a[:2])
  p = _train(part, *decay, steps=4)
  assert "resumed from" in p.stderr
  assert comparable(read_metrics(part)) == comparable(a)


def test_sigterm_saves_and_exits_cleanly(tmp_path):
  proc = _train(tmp_path, "--config.train.checkpoint_every=1000", steps=200, wait=False)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
    time.sleep(0.5)
  assert metrics.exists(), "training never logged a step"
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out[-3000:]
  assert "stopped by signal" in out
  n_logged = len(read_metrics(tmp_path))
  step, _ = final_params(tmp_path)
  assert step == n_logged and 1 <= step < 200


def test_bad_overrides_fail_naming_the_key(tmp_path):
  for override, needle in (("rollout.groupsize=8", "groupsize"), ("rm.optim.lr=fast", "lr")):
    cmd = [sys.executable, "-m", "cooper_jax.train", f"--config={TINY}", f"--workdir={tmp_path}"]
    p = subprocess.run(
      cmd + [f"--config.{override}"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode != 0 and needle in p.stderr


def test_ppo_ratio_at_the_rollout_temperature(tmp_path):
  """At T 0.7 with 2 epochs x 2 mini-batches the first update starts at the sampling
  parameters: ratio 1 within 1e-5 and the sampler-vs-trainer mismatch at float noise (both
  were off when the trainer read softmax(logits) while the sampler drew from logits / T). The
  shipped small-task policy, whose logits are sharp: a random tiny model's are nearly uniform,
  where T hardly changes a log-prob."""
  (m,) = _small(
    tmp_path,
    "rule",
    "--config.rollout.temperature=0.7",
    "--config.policy.ppo_epochs=2",
    "--config.policy.ppo_mini_batch_size=8",
    "--config.policy.merge_duplicate_rows=False",  # mini-batches need the unmerged rows
    "--config.policy.pack_rows=False",  # (packed rows are merged ones)
    steps=1,
  )
  assert m["policy/updates"] == 4
  assert abs(m["policy/first_ratio_mean"] - 1.0) < 1e-5  # the figure (item 5)
  c = run_config(tmp_path)
  assert_sampler_matches_trainer(c, m, *initial(c)["policy"])


def test_ppo_epochs_and_mini_batches(tmp_path):
  """One epoch of one mini-batch is today's on-policy update (ratio exactly 1); 2 epochs x 2
  mini-batches take 4 updates clipped against the sampler's log-probs, which agree with the
  trainer's at the sampling parameters (fp32, temperature 1)."""
  one, ppo = tmp_path / "one", tmp_path / "ppo"
  _train(one, "--config.reward_mode=rule", "--config.train.save_rollouts=3", steps=1)
  _train(
    ppo,
    "--config.reward_mode=rule",
    "--config.policy.ppo_epochs=2",
    "--config.policy.ppo_mini_batch_size=4",
    steps=1,
  )
  (a,), (b,) = read_metrics(one), read_metrics(ppo)
  assert a["policy/updates"] == 1 and a["policy/ratio_mean"] == 1.0
  assert b["policy/updates"] == 4 and b["policy/ratio_mean"] != 1.0
  c = run_config(one)
  cfg, init = initial(c)["policy"]
  for m in (a, b):
    assert_sampler_matches_trainer(c, m, cfg, init)
  assert a["reward/mean"] == b["reward/mean"]  # same rollouts, different updates
  # rollouts.jsonl: train.save_rollouts rows of the step, each row's reward its rule verdict
  # (resumed runs rewriting the steps after the checkpoint: tests/test_gcs.py)
  rows = [json.loads(l) for l in (one / "rollouts.jsonl").read_text().splitlines()]
  assert [(r["step"], r["row"]) for r in rows] == [(1, 0), (1, 1), (1, 2)]
  assert {"question", "reference", "response"} <= set(rows[0])
  assert all(r["reward"] == float(r["rule_correct"]) for r in rows)
  # At the sampling parameters the first update's ratio is 1 whatever the temperature: the
  # trainer's log-probs read softmax(logits / T) as the sampler did.
  for m in (a, b):
    assert abs(m["policy/first_ratio_mean"] - 1.0) < 1e-5
  _, pa = final_params(one, ("policy",))
  _, pb = final_params(ppo, ("policy",))
  assert not np.array_equal(
    np.asarray(pa["policy"]["params"]["embed"]["embedding"]),
    np.asarray(pb["policy"]["params"]["embed"]["embedding"]),
  )


def test_static_rm_holds_no_optimizer_state_and_resumes(tmp_path):
  """A frozen RM keeps no AdamW moments (two copies of the RM on the device) and a run with
  it checkpoints and resumes."""
  _train(tmp_path, "--config.reward_mode=static_rm", "--config.train.stop_after=1", steps=2)
  p = _train(tmp_path, "--config.reward_mode=static_rm", steps=2)
  assert "resumed from" in p.stderr
  _, state = final_params(tmp_path)
  import jax  # pylint: disable=import-outside-toplevel

  assert jax.tree.leaves(state["rm"]["opt_state"]) == []
  assert jax.tree.leaves(state["policy"]["opt_state"])  # the policy's AdamW is there


def test_bucket_rounds_up_within_the_cap():
  from cooper_jax.train import _bucket  # pylint: disable=import-outside-toplevel

  assert [_bucket(n, 32, 96) for n in (0, 1, 32, 33, 64, 65, 96)] == [32, 32, 32, 64, 64, 96, 96]
  assert _bucket(20, 0, 96) == 96 and _bucket(90, 64, 96) == 96


SMALL = str(ROOT / "experiments" / "small_task.py")


def _small(workdir, cond, *overrides, steps=2):
  """A few steps of the shipped small task (its policy answers some questions right)."""
  cmd = [
    sys.executable,
    "-m",
    "cooper_jax.train",
    f"--config={SMALL}:{cond}",
    f"--workdir={workdir}",
    f"--config.train.steps={steps}",
    "--config.train.eval_every=0",
    "--config.rollout.prompts_per_step=4",
    "--config.rollout.group_size=4",
    *overrides,
  ]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return read_metrics(workdir)


def test_response_width_cut_leaves_the_update_unchanged(tmp_path):
  """Responses cut to the batch's longest (rounded up to 32) train the same policy as the
  full max_new_tokens width: the cut positions are padding. Each step is taken both ways from
  the same state (step 1 from the shipped policy, step 2 from the cut run's step-1
  checkpoint), so the bounds are one step's (tests/run_bounds.py): the two widths run the same
  sums in other orders, over extra masked zeros."""
  # Unpacked rows: packed ones fill rows of the response width, so their row count (and
  # compiled shapes) would follow the width too.
  keep = ("--config.train.checkpoint_every=1", "--config.train.max_to_keep=10")
  no_pack = "--config.policy.pack_rows=False"
  full_width = ("--config.rollout.response_pad_multiple=0", no_pack)
  cut = _small(
    tmp_path / "cut", "rule", *keep, no_pack, "--config.rollout.response_pad_multiple=32"
  )
  full = _small(tmp_path / "full", "rule", *full_width, steps=1)
  resume_from(tmp_path / "cut", 1, tmp_path / "full2")
  full += _small(tmp_path / "full2", "rule", *full_width, steps=2)
  assert [r["step"] for r in full] == [1, 2]
  assert all(r["policy/response_width"] == 96 for r in full)
  assert all(r["policy/response_width"] < 96 for r in cut)  # the SFT policy stops early
  # one compiled policy step per (prompt, response) width, one sampler per prompt width
  widths = {(r["rollout/prompt_width"], r["policy/response_width"]) for r in cut}
  assert cut[-1]["policy/step_compiles"] == len(widths)
  assert cut[-1]["rollout/sampler_compiles"] == len({r["rollout/prompt_width"] for r in cut})
  c = run_config(tmp_path / "cut")
  cfg, init = initial(c)["policy"]
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  for a, b in zip(cut, full):
    step = a["step"]
    prev = params(tmp_path / "cut", step - 1, ("policy",))["policy"] if step > 1 else None
    sa = params(tmp_path / "cut", step, ("policy",))["policy"]
    sb = params(tmp_path / ("full" if step == 1 else "full2"), step, ("policy",))["policy"]
    width = b["rollout/prompt_width"] + b["policy/response_width"]
    delta = logprob_delta(c, cfg, prev["params"] if prev else init, width)
    atols = logprob_atols(c, a, b, delta)
    atols["policy/grad_norm"] = grad_norm_atol(prev, sa, sb)
    # token_fill: real tokens over rows x width, so it follows the width by definition.
    assert_same_metrics(a, b, atols, skip=("policy/response_width", "policy/token_fill"))
    roundoff = float32_gradient_roundoff(cfg, rows, width)
    assert_same_adam_update(prev, sa, sb, a["policy/lr"], roundoff)


def test_rm_updates_per_step_and_on_policy_pairs(tmp_path):
  """rm.updates_per_step=K takes K RM optimizer steps at every step that has pairs; on-policy
  negatives are the group's own rejected rollouts (no candidates generated)."""
  rows = _small(
    tmp_path,
    "cooper",
    "--config.rm.updates_per_step=3",
    "--config.pairs.negatives=on_policy",
    steps=3,
  )
  updated = sum(r["rm_train/updated"] for r in rows)
  assert updated >= 1, "no step formed a pair: the test needs the SFT policy's right answers"
  assert all(r["pairs/negative_tries"] == 0 for r in rows)
  _, state = final_params(tmp_path)
  assert int(state["rm"]["step"]) == 3 * updated


def test_llm_rewrite_negatives_in_the_loop_with_the_shipped_assistant(tmp_path):
  """The paper's negative generator end to end on the small task: the shipped assistant
  (experiments/assets/small_task/rewriter) rewrites each positive, math-verify accepts the
  rewrites whose answer differs, and the RM trains on those pairs."""
  rows = _small(tmp_path, "cooper_rewrite", steps=2)
  assert sum(r["pairs/negative_tries"] for r in rows) > 0
  assert sum(r["pairs/n_valid"] for r in rows) > 0  # some rewrites were accepted
  assert any(r["rm_train/updated"] == 1.0 for r in rows)
  for r in rows:  # every try is accepted or rejected for a counted reason
    rejected = sum(v for k, v in r.items() if k.startswith("pairs/reject_"))
    assert r["pairs/negative_tries"] == r["pairs/n_valid"] + rejected


def test_overlapped_rm_update_replays_the_sequential_run(tmp_path):
  """train.overlap_rm_update (on in the small task's configs): each step's RM update (the
  paper's llm_rewrite pairs, the assistant, rm_step) runs in a thread while the next step
  samples. The run's metrics and final policy and RM equal the sequential run's bit for bit,
  across evaluations (every 2 steps), a stop with its checkpoint after step 3 and a resume."""
  kw = dict(steps=5)
  rewrite = ("cooper_rewrite", "--config.train.eval_every=2")
  seq = _small(tmp_path / "seq", *rewrite, "--config.train.overlap_rm_update=False", **kw)
  over = tmp_path / "overlap"
  _small(over, *rewrite, "--config.train.stop_after=3", **kw)
  rows = _small(over, *rewrite, **kw)  # resumes after step 3
  assert json.loads((over / "config.json").read_text())["train"]["overlap_rm_update"] is True
  assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]
  assert sum(r.get("pairs/n_valid", 0) for r in rows) > 0  # the RM trained on rewrites
  assert all("time/rm_s" in r for r in rows if r["step"] > 0)  # each step's update joined
  drop = ("rollout/sampler_compiles", "policy/step_compiles")  # per process: 2 processes here
  same = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in comparable(rs)]
  assert same(seq) == same(rows)
  (sa, pa), (sb, pb) = final_params(tmp_path / "seq"), final_params(over)
  assert sa == sb == 5
  import jax  # pylint: disable=import-outside-toplevel

  jax.tree.map(np.testing.assert_array_equal, pa, pb)


def test_cli_turns_on_the_compilation_cache_unless_one_is_set():
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax import host_platform  # pylint: disable=import-outside-toplevel

  before = jax.config.jax_compilation_cache_dir
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    assert host_platform.use_compilation_cache() == host_platform.COMPILATION_CACHE_DIR
    assert jax.config.jax_compilation_cache_dir == host_platform.COMPILATION_CACHE_DIR
    jax.config.update("jax_compilation_cache_dir", "/elsewhere")  # the user's choice stays
    assert host_platform.use_compilation_cache() is None
    assert jax.config.jax_compilation_cache_dir == "/elsewhere"
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
