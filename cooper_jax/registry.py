"""Reward sources and negative generators by name: what `config.reward_mode` and
`config.pairs.negatives` select, checked when the config is validated (an unknown name is an
error that lists the known ones).

A reward source has the interface of `reward_modes.RuleReward` and is built as
`cls(c, mesh, verifier)`; a negative generator has the interface of
`rewards.pairs.NegativeGenerator` and is built by `cls.from_config(c, mesh)`. An ablation (a
format reward, a length penalty, another negative generator) is one small file with its class,
selected either by naming it in the config as "package.module:Class", or by a short name that
its module registers (`register`) before the run starts. Nothing here imports jax: the
targets are imported when a run resolves them.
"""

from __future__ import annotations

import importlib
import re

REWARD_SOURCES: dict[str, str] = {
  "rule": "cooper_jax.reward_modes:RuleReward",
  "rule_chain": "cooper_jax.reward_modes:RuleChainReward",
  "static_rm": "cooper_jax.reward_modes:StaticRMReward",
  "cooper": "cooper_jax.reward_modes:CooperReward",
}
# "on_policy" has no generator: Cooper takes the group's own rule-rejected rollouts.
NEGATIVE_GENERATORS: dict[str, str | None] = {
  "perturb": "cooper_jax.rewards.pairs:PerturbNegatives",
  "llm_rewrite": "cooper_jax.rewards.rewrite:LLMRewriteNegatives",
  "on_policy": None,
}
_TABLES = {"reward_mode": REWARD_SOURCES, "pairs.negatives": NEGATIVE_GENERATORS}
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def register(key: str, name: str, target) -> None:
  """Makes `name` select `target` (a class, or "module:Class") for config key `key`
  ("reward_mode" or "pairs.negatives"); a name already taken by another target is an error."""
  table = _TABLES[key]
  if name in table and table[name] != target:
    raise ValueError(f"config.{key} name {name!r} is already registered as {table[name]!r}")
  table[name] = target


def check(key: str, name: str) -> None:
  """ValueError naming the config key and listing the known names, unless `name` is
  registered or spelled "package.module:Class"."""
  if name in _TABLES[key] or (isinstance(name, str) and _TARGET.match(name)):
    return
  raise ValueError(
    f"config.{key}={name!r}: expected one of {sorted(_TABLES[key])}, or 'package.module:Class'"
  )


def resolve(key: str, name: str):
  """The class `name` selects for config key `key` (None for a name without one)."""
  check(key, name)
  target = _TABLES[key].get(name, name)
  if target is None or not isinstance(target, str):
    return target
  module, attr = target.split(":")
  try:
    return getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"config.{key}={name!r}: cannot import {target!r}: {e}") from e
