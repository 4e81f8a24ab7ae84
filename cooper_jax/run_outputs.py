"""What a run writes besides its checkpoints: metrics (metrics.jsonl and TensorBoard), a sample
of each step's rollouts (rollouts.jsonl) and of its RM pairs (pairs.jsonl), each also as text in
TensorBoard, and the list of artefacts printed at the end. The primary process writes; on the
others the writers are inactive. A resumed run cuts each file back to its step (MetricsWriter,
JsonlLog)."""

from __future__ import annotations

import numpy as np

from cooper_jax import distributed as dist
from cooper_jax.metrics import JsonlLog, MetricsWriter, samples_markdown
from cooper_jax.reward_modes import Rollouts

ROLLOUT_TEXT_KEYS = ("question", "reference", "response", "rule_correct", "reward")
PAIR_TEXT_KEYS = ("question", "reference", "positive", "negative", "reason", "candidates")


class RunOutputs:
  def __init__(self, c, workdir, step: int, makes_pairs: bool, start_record):
    primary = dist.is_primary()
    self.workdir, self.start_record = workdir, start_record
    self.save_rollouts = c.train.save_rollouts
    self.metrics = MetricsWriter(workdir, resume_step=step, active=primary)
    self.rollouts = JsonlLog(
      workdir / "rollouts.jsonl", step, active=primary and c.train.save_rollouts > 0
    )
    self.pairs = JsonlLog(
      workdir / "pairs.jsonl", step, active=primary and makes_pairs and c.train.save_pairs > 0
    )

  def write(self, step: int, m: dict) -> None:
    self.metrics.write(step, m)

  def write_rollouts(self, ro: Rollouts, rewards: np.ndarray, step: int) -> None:
    """The first train.save_rollouts of this process's rollouts (the primary writes its own)."""
    k = min(self.save_rollouts, len(ro.texts))
    rows = [
      {
        "step": step + 1,  # the step these rollouts trained (as in metrics.jsonl)
        "row": int(ro.index[i]),
        "question": ro.questions[i],
        "reference": str(ro.refs[i]),
        "response": ro.texts[i],
        "rule_correct": bool(ro.correct[i]),
        "reward": float(rewards[ro.index[i]]),
      }
      for i in range(k)
    ]
    self.rollouts.append(rows)
    if rows and self.rollouts.active:
      self.metrics.write_text(
        step + 1, "samples/rollouts", samples_markdown(rows, ROLLOUT_TEXT_KEYS)
      )

  def write_pairs(self, pairs: list[dict]) -> None:
    """A finished RM update's pair records (main thread, in step order)."""
    self.pairs.append(pairs)
    if pairs and self.pairs.active:
      text = samples_markdown(pairs, PAIR_TEXT_KEYS)
      self.metrics.write_text(pairs[0]["step"], "samples/pairs", text)

  def artefacts(self, store) -> list[tuple[str, str]]:
    """(what, where) of everything the run has written (the primary's), for the end print."""
    w = self.workdir
    out = [
      ("config", f"{w / 'config.json'} (this start: {self.start_record})"),
      ("metrics", str(w / "metrics.jsonl")),
    ]
    if self.rollouts.active:
      out.append(("rollouts", str(w / "rollouts.jsonl")))
    if self.pairs.active:
      out.append(("pairs", str(w / "pairs.jsonl")))
    if self.metrics.tb is not None:
      out.append(("tensorboard", str(w / "tensorboard")))
    steps = ", ".join(map(str, store.steps()))
    out.append(("checkpoints", f"{store.directory} (steps {steps})"))
    return out

  def close(self) -> None:
    self.metrics.close()
    self.rollouts.close()
    self.pairs.close()
