"""Reward sources and negative generators by name (cooper_jax.registry): a new one is one
small file (tests/plugin_example.py) selected by config; unknown names list the known ones."""

import json

import pytest
from conftest import TINY_CONFIG

from cooper_jax import config as config_lib
from cooper_jax import registry
from cooper_jax.config import load_config


def _tiny(*overrides):
  return load_config(TINY_CONFIG, list(overrides))


@pytest.mark.parametrize(
  "key,value,known",
  [
    ("reward_mode", "rulez", "['cooper', 'rule', 'rule_chain', 'static_rm']"),
    ("pairs.negatives", "perturbb", "['llm_rewrite', 'on_policy', 'perturb']"),
  ],
)
def test_unknown_names_list_the_known_ones(key, value, known):
  c = _tiny(f"{key}={value}")
  with pytest.raises(ValueError, match=rf"config.{key}='{value}': expected one of \{known}"):
    config_lib.validate(c)


def test_a_missing_plugin_names_the_key():
  with pytest.raises(ValueError, match=r"config.reward_mode='nowhere:Reward': cannot import"):
    registry.resolve("reward_mode", "nowhere:Reward")


def test_a_plugin_reward_source_trains_the_policy_on_its_reward(tmp_path):
  """The tiny loop with reward_mode = a class in a test file: the logged reward is that
  class's (short responses), recomputed here from the saved rollouts."""
  from plugin_example import SHORT  # pylint: disable=import-outside-toplevel

  from cooper_jax.metrics import read_metrics  # pylint: disable=import-outside-toplevel
  from cooper_jax.train import train  # pylint: disable=import-outside-toplevel

  c = _tiny(
    "reward_mode=plugin_example:ShortResponseReward",
    "train.steps=1",
    "train.save_rollouts=8",
    "rollout.max_new_tokens=24",
  )
  train(c, str(tmp_path))
  (m,) = read_metrics(tmp_path)
  rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
  assert len(rollouts) == 8
  want = sum(len(r["response"]) < SHORT for r in rollouts) / 8
  assert m["reward/mean"] == pytest.approx(want) and m["short/frac"] == pytest.approx(want)
  assert all(r["reward"] == float(len(r["response"]) < SHORT) for r in rollouts)


def test_a_plugin_negative_generator_is_built_from_the_config():
  import jax  # pylint: disable=import-outside-toplevel
  from plugin_example import EchoNegatives  # pylint: disable=import-outside-toplevel

  from cooper_jax import sharding  # pylint: disable=import-outside-toplevel
  from cooper_jax.reward_modes import make_reward_mode  # pylint: disable=import-outside-toplevel

  c = _tiny("pairs.negatives=plugin_example:EchoNegatives", "rollout.prompts_per_step=8")
  config_lib.validate(c, jax.device_count())
  mesh = sharding.make_mesh(**c.mesh)
  reward = make_reward_mode(c, mesh, verifier=None)
  assert isinstance(reward.negatives, EchoNegatives) and reward.trains_rm
