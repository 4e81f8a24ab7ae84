"""An ablation in one small file, as cooper_jax.registry promises: a reward source and a
negative generator that configs select as "plugin_example:ShortResponseReward" and
"plugin_example:EchoNegatives" (tests/test_registry.py)."""

import numpy as np

from cooper_jax.reward_modes import RuleReward

SHORT = 40  # characters


class ShortResponseReward(RuleReward):
  """1 for a response shorter than SHORT characters, else 0 (a length-penalty ablation)."""

  def rewards(self, ro):
    short = np.asarray([len(t) < SHORT for t in ro.texts], np.float32)
    return ro.gather(short), {"short/frac": float(ro.gather(short).mean())}


class EchoNegatives:
  """The positive with its last character dropped (a stand-in for another generator)."""

  name = "echo"

  @classmethod
  def from_config(cls, c, mesh):
    del c, mesh
    return cls()

  def generate(self, questions, positives, attempt, rng):
    del questions, attempt, rng
    return [p[:-1] for p in positives]
