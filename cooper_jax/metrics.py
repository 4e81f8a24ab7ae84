"""Metrics plumbing (JSONL + TensorBoard) and the reward-hacking monitors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from cooper_jax.io import atomic_write_text
from cooper_jax.stats import precision_recall


def reward_hacking_monitors(rm_reward_b: np.ndarray, correct_b: np.ndarray) -> dict[str, float]:
  """How far the RM's judgement drifts from the rule verifier's on the same rollouts.

  The rule verifier is precise but not complete, so RM "false positives" here are an upper
  bound on hacking; a rising gap between RM reward and rule accuracy is the signal the paper's
  static-RM curve shows.
  """
  rm_pos = rm_reward_b > 0.5
  correct = correct_b.astype(bool)
  precision, recall = precision_recall(rm_pos, correct)
  return {
    "rm/reward_mean": float(np.mean(rm_reward_b)),
    "rm/minus_rule_acc": float(np.mean(rm_reward_b) - np.mean(correct)),
    "rm/agreement": float(np.mean(rm_pos == correct)),
    "rm/precision": float(precision),
    "rm/recall": float(recall),
    "rm/positive_rate": float(np.mean(rm_pos)),
  }


class MetricsWriter:
  """Appends one JSON object per step to metrics.jsonl and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str | os.PathLike, resume_step: int = 0):
    self.path = Path(workdir) / "metrics.jsonl"
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._drop_after(resume_step)
    self.file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

      self.tb = SummaryWriter(str(Path(workdir) / "tensorboard"))
    except ImportError:
      self.tb = None

  def _drop_after(self, step: int) -> None:
    """On resume, lines logged after the restored checkpoint are replaced, not duplicated."""
    if not self.path.exists():
      return
    keep = [
      l
      for l in self.path.read_text().splitlines()
      if l.strip() and json.loads(l).get("step", 0) <= step
    ]
    atomic_write_text(self.path, "".join(l + "\n" for l in keep))

  def write(self, step: int, metrics: dict) -> None:
    row = {"step": int(step)}
    for k, v in metrics.items():
      v = (
        float(v)
        if isinstance(v, (np.floating, np.integer, float, int))
        or (hasattr(v, "shape") and getattr(v, "shape") == ())
        else v
      )
      row[k] = v
      if self.tb is not None and isinstance(v, float) and math.isfinite(v):
        self.tb.add_scalar(k, v, step)
    self.file.write(json.dumps(row) + "\n")
    self.file.flush()

  def close(self) -> None:
    self.file.close()
    if self.tb is not None:
      self.tb.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
  path = Path(workdir) / "metrics.jsonl"
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
