"""Metrics plumbing (JSONL + TensorBoard) and the reward-hacking monitors."""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np

from cooper_jax.paths import as_path, is_remote, write_text
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
  """Appends one JSON object per step to metrics.jsonl and mirrors scalars to TensorBoard.

  `active=False` (every process but the primary in a multi-process run) writes nothing. The
  workdir may be a URI (gs://...): objects cannot be appended to, so there the whole file is
  rewritten at every step (a few MB at most, next to a step's seconds to minutes)."""

  def __init__(self, workdir: str | os.PathLike, resume_step: int = 0, active: bool = True):
    self.active, self.remote = active, is_remote(workdir)
    self.path = as_path(workdir) / "metrics.jsonl"
    self.file = self.tb = None
    self._lines: list[str] = []
    if not active:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._drop_after(resume_step)
    if not self.remote:
      self.file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

      self.tb = SummaryWriter(str(self.path.parent / "tensorboard"))
    except Exception as e:  # noqa: BLE001 - no tensorboardX, or no writer for this scheme
      logging.warning("no TensorBoard logs (%s: %s); metrics.jsonl has everything", type(e), e)

  def _drop_after(self, step: int) -> None:
    """On resume, lines logged after the restored checkpoint are replaced, not duplicated."""
    if not self.path.exists():
      return
    self._lines = [
      l
      for l in self.path.read_text().splitlines()
      if l.strip() and json.loads(l).get("step", 0) <= step
    ]
    write_text(self.path, "".join(l + "\n" for l in self._lines))

  def write(self, step: int, metrics: dict) -> None:
    if not self.active:
      return
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
    line = json.dumps(row)
    if self.file is not None:
      self.file.write(line + "\n")
      self.file.flush()
    else:
      self._lines.append(line)
      write_text(self.path, "".join(l + "\n" for l in self._lines))

  def close(self) -> None:
    if self.file is not None:
      self.file.close()
    if self.tb is not None:
      self.tb.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
  path = as_path(workdir) / "metrics.jsonl"
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
