"""Positive control for the whole GRPO loop: with a reward a policy can learn trivially, the host
loop (sampling, rewards, advantages, masks, policy_step) must raise it within a few dozen steps.

A sign error, advantages misaligned with their rows or a mask that drops the response tokens all
leave the reward flat or push it down, so this fails where a unit test of each piece passes.
"""

import json
from pathlib import Path

import numpy as np

from cooper_jax.config import load_config
from cooper_jax.reward_modes import RuleReward

ROOT = Path(__file__).resolve().parents[1]
SMALL_TOKENIZER = str(ROOT / "experiments" / "assets" / "small_task" / "policy")


class DigitShareReward(RuleReward):
  """reward = the share of a response's characters that are digits (0 for an empty one): dense,
  learnable by a random model (the small-task vocabulary has its own digit tokens)."""

  def rewards(self, ro):
    share = [sum(ch.isdigit() for ch in t) / len(t) if t else 0.0 for t in ro.texts]
    return ro.gather(np.asarray(share, np.float32)), {}


def _config(steps: int):
  c = load_config(str(ROOT / "experiments" / "tiny.py") + ":rule")
  c.policy.tokenizer = SMALL_TOKENIZER
  c.policy.random_model.vocab_size = 529
  c.policy.random_model.n_layers = 1
  c.data.train = str(ROOT / "experiments" / "assets" / "small_task" / "data" / "train.jsonl")
  c.rollout.prompts_per_step = 4
  c.rollout.group_size = 8
  c.rollout.max_prompt_len = 128
  c.rollout.prompt_pad_multiple = 32
  c.rollout.max_new_tokens = 8
  c.rollout.response_pad_multiple = 8
  c.policy.optim.lr = 1e-2
  c.policy.loss.kl_coef = 0.0
  c.train.steps = steps
  c.train.checkpoint_every = steps
  c.train.save_rollouts = 0
  c.mesh.data = 1  # one device: what is tested is the learning, not the sharding
  return c


def test_grpo_raises_a_trivially_learnable_reward(tmp_path):
  from cooper_jax.train import train  # pylint: disable=import-outside-toplevel

  steps = 40
  train(_config(steps), str(tmp_path), reward=DigitShareReward())
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  reward = np.asarray([r["reward/mean"] for r in rows if "reward/mean" in r])
  assert len(reward) == steps
  first, last = reward[:5].mean(), reward[-5:].mean()
  # A random policy over 529 tokens writes digits in about 10 / 529 of its characters'
  # worth of tokens; learned, most of each 8-token response is digits.
  assert first < 0.2, reward[:5]
  assert last > first + 0.3, (first, last, reward.round(3).tolist())
