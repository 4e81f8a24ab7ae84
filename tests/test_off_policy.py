"""Off-policy rollouts (rollout.off_policy_steps, cooper_jax/rollouts.py): which parameters and
prompts each step's batch is sampled from, the ratio against the sampler's log-probs, and a run
killed mid-overlap that resumes into the straight run's numbers."""

import os
import signal
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import comparable, final_params, train_cmd

from cooper_jax import rollouts
from cooper_jax.config import base_config, validate
from cooper_jax.data import PromptIterator
from cooper_jax.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")


# ------------------------------------------------------------------- the queue, by itself
class _FakeRun:
  """What RolloutQueue reads of a train.Run; the 'parameters' are a version number."""

  def __init__(self, steps, prompts=2):
    self.c = base_config()
    self.c.train.steps = steps
    self.c.rollout.prompts_per_step = prompts
    self.group = 2
    self.iterator = PromptIterator([{"question": f"q{i}"} for i in range(10)], seed=0)
    self.policy_state = {"params": 0}

  def rng(self, step):
    return jax.random.fold_in(jax.random.key(0), step)


@pytest.fixture
def fake_sampler(monkeypatch):
  """encode: the questions; sample_encoded: records (questions, key, parameter version)."""
  calls = []

  def encode(run, rows):
    q = np.array([[int(r["question"][1:])] for r in rows])
    return q, np.ones_like(q, bool)

  def sample_encoded(run, tok_u, mask_u, rng, params):
    calls.append((tok_u[:, 0].tolist(), params))
    return {"questions": tok_u[:, 0].tolist(), "key": rng, "params": params}

  monkeypatch.setattr(rollouts, "encode", encode)
  monkeypatch.setattr(rollouts, "sample_encoded", sample_encoded)
  return calls


@pytest.mark.parametrize("ahead", [1, 2])
def test_step_t_is_sampled_with_the_parameters_of_step_t_minus_k(fake_sampler, ahead):
  steps = 6
  run = _FakeRun(steps)
  on_policy = PromptIterator([{"question": f"q{i}"} for i in range(10)], seed=0)
  queue = rollouts.RolloutQueue(run, ahead)
  for t in range(steps):
    b = queue.take(t)
    assert b.params_step == max(t - ahead, 0)
    assert b.out["params"] == max(t - ahead, 0)  # the parameters current at that step
    # The prompts and key an on-policy run uses at step t.
    want = [int(r["question"][1:]) for r in on_policy.next_batch(2)]
    assert b.out["questions"] == want
    assert np.array_equal(
      jax.random.key_data(b.out["key"]), jax.random.key_data(rollouts.step_key(run, t))
    )
    assert b.tok[:, 0].tolist() == np.repeat(want, run.group).tolist()  # G rows a prompt
    run.policy_state["params"] += 1  # the update of step t
  # One batch sampled per step, none at or past train.steps.
  assert len(fake_sampler) == steps and not queue.pending
  queue.close()


def test_the_checkpoint_position_is_before_the_batches_sampled_ahead(fake_sampler):
  run = _FakeRun(6)
  queue = rollouts.RolloutQueue(run, 2)
  queue.take(0)  # steps 1 and 2 are sampled ahead
  after_step0 = PromptIterator([{"question": f"q{i}"} for i in range(10)], seed=0)
  after_step0.next_batch(2)
  assert queue.data_position() == after_step0.state_dict()
  assert run.iterator.state_dict() != after_step0.state_dict()
  queue.close()


def test_off_policy_steps_is_validated():
  for bad in (-1, True):  # (a float is refused by ConfigDict itself)
    c = base_config()
    c.rollout.off_policy_steps = bad
    with pytest.raises(ValueError, match="off_policy_steps"):
      validate(c, 1)
  c = base_config()
  c.rollout.off_policy_steps = 1
  c.rollout.dynamic_sampling.enable = True
  with pytest.raises(ValueError, match="dynamic_sampling"):
    validate(c, 1)


# ----------------------------------------------------------------- the loop, end to end
SMALL = ("--config.rollout.off_policy_steps=1",)


def _run(workdir, steps, *overrides, wait=True, models="small_task"):
  """A tiny-config run; models=small_task: the small task's policy, some rollouts right.
  wait=False: the process, its output in <workdir>.log."""
  cmd = train_cmd(workdir, steps, *overrides)
  cmd[3] += f":cooper,models={models}"
  if not wait:
    log = open(f"{workdir}.log", "w")  # pylint: disable=consider-using-with
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
  p = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return read_metrics(workdir)


def test_with_a_fixed_policy_off_policy_samples_what_on_policy_samples(tmp_path):
  """The tiny random policy never answers right: under the rule reward every group is all
  wrong, every advantage 0, every gradient 0, and plain SGD without a KL term leaves the
  parameters where they are. Sampling one step ahead then sees the parameters on-policy sees,
  and must draw the same prompts with the same keys: the same rollouts, step by step."""
  fixed = (
    "--config.reward_mode=rule",
    "--config.policy.optim.name=sgd",
    "--config.policy.loss.kl_coef=0.0",
  )
  on = _run(tmp_path / "on", 3, *fixed, models="random")
  off = _run(tmp_path / "off", 3, *fixed, *SMALL, models="random")
  assert all(r["policy/grad_norm"] == 0.0 for r in on + off)  # the premise
  text = lambda d: (tmp_path / d / "rollouts.jsonl").read_text()
  assert text("on") == text("off") and len(text("on").splitlines()) == 3 * 8
  same = ("rule/acc", "response/len_mean", "rollout/new_tokens")
  assert [[r[k] for k in same] for r in on] == [[r[k] for k in same] for r in off]
  assert [r["rollout/params_age"] for r in off] == [0, 1, 1]


def test_kill_mid_overlap_and_resume_equals_the_straight_run(tmp_path):
  """k = 1: a run killed (SIGKILL) while step t + 1's batch samples resumes from its last
  checkpoint, which holds that batch, and ends with the straight run's metrics and models.
  Stale rollouts move the first update's ratio off 1 (old_logp = the sampler's)."""
  steps = 24
  straight = _run(tmp_path / "straight", steps, *SMALL)
  assert straight[0]["policy/first_ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # age 0
  ages = [r["rollout/params_age"] for r in straight]
  assert ages == [0] + [1] * (steps - 1)
  drift = [abs(r["policy/first_ratio_mean"] - 1.0) for r in straight[1:]]
  assert max(drift) > 1e-3  # one update old: the ratio is not 1

  killed = tmp_path / "killed"
  proc = _run(killed, steps, *SMALL, wait=False)
  metrics, deadline = killed / "metrics.jsonl", time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)
  saved = sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and saved[-1] < steps, "the run ended before it was killed"
  assert (killed / "checkpoints" / str(saved[0]) / "ahead").is_dir()  # the batch sampled ahead
  resumed = _run(killed, steps, *SMALL)
  assert [r["step"] for r in resumed] == list(range(1, steps + 1))
  assert comparable(resumed) == comparable(straight)
  (sa, pa), (sb, pb) = final_params(tmp_path / "straight"), final_params(killed)
  assert sa == sb == steps
  jax.tree.map(np.testing.assert_array_equal, pa, pb)


def test_old_logp_is_carried_where_the_ratio_is_not_the_trainers_own():
  """One update, on-policy: sg(logp). Several updates, or rollouts sampled ahead without a
  sampler correction: the batch carries old_logp (the AOT tool compiles the same batch)."""
  from cooper_jax.run_steps import old_logp_in_batch  # pylint: disable=import-outside-toplevel

  c = base_config()
  assert not old_logp_in_batch(c, 1) and old_logp_in_batch(c, 2)
  c.rollout.off_policy_steps = 1
  assert old_logp_in_batch(c, 1)
  c.policy.loss.sampler_is.kind = "token_tis"
  assert not old_logp_in_batch(c, 1) and old_logp_in_batch(c, 4)
