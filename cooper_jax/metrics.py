"""Metrics plumbing (JSONL + TensorBoard) and the reward-hacking monitors."""

from __future__ import annotations

import json
import logging
import math
import os
import struct

import numpy as np

from cooper_jax.io import atomic_write
from cooper_jax.paths import as_path, is_remote, write_text
from cooper_jax.stats import precision_recall


def reward_hacking_monitors(
  rm_reward_b: np.ndarray, correct_b: np.ndarray, group_size: int | None = None
) -> dict[str, float]:
  """How far the RM's judgement drifts from the rule verifier's on the same rollouts.

  The rule verifier is precise but not complete, so RM "false positives" here are an upper
  bound on hacking; a rising gap between RM reward and rule accuracy is the signal the paper's
  static-RM curve shows.

  Batch-level numbers mix two things: how hard the questions are (an RM that only predicts
  difficulty agrees with the rule across groups) and whether the RM tells right from wrong
  answers to one question, which is all that GRPO's group-relative advantage uses. Given
  group_size (rollouts prompt-major), two within-group monitors isolate the second:
  rm/group_std, the mean over groups of the RM reward's std inside the group (0: the policy
  gets no signal), and rm/group_auc, the probability that a correct rollout outscores a wrong
  one of the same question (ties count 1/2), over all such pairs of the groups that have both
  (NaN-free: omitted when no group has both); rm/group_auc_pairs counts those pairs.
  """
  rm_pos = rm_reward_b > 0.5
  correct = correct_b.astype(bool)
  precision, recall = precision_recall(rm_pos, correct)
  m = {
    "rm/reward_mean": float(np.mean(rm_reward_b)),
    "rm/minus_rule_acc": float(np.mean(rm_reward_b) - np.mean(correct)),
    "rm/agreement": float(np.mean(rm_pos == correct)),
    "rm/precision": float(precision),
    "rm/recall": float(recall),
    "rm/positive_rate": float(np.mean(rm_pos)),
  }
  if group_size:
    r = np.asarray(rm_reward_b, np.float64).reshape(-1, group_size)
    ok = correct.reshape(-1, group_size)
    m["rm/group_std"] = float(r.std(axis=1).mean())
    # [groups, G, G]: correct i vs wrong j of one group
    both = ok[:, :, None] & ~ok[:, None, :]
    diff = r[:, :, None] - r[:, None, :]
    n_pairs = int(both.sum())
    m["rm/group_auc_pairs"] = n_pairs
    if n_pairs:
      m["rm/group_auc"] = float(((diff > 0) + 0.5 * (diff == 0))[both].sum() / n_pairs)
  return m


class JsonlLog:
  """Appends JSON objects, each with a "step", to one JSONL file of the workdir.

  On resume, lines of steps after the restored checkpoint are dropped first, so they are
  replaced, not duplicated. `active=False` (every process but the primary in a multi-process
  run) writes nothing. The workdir may be a URI (gs://...): objects cannot be appended to, so
  there the whole file is rewritten at every step (a few MB at most, next to a step's seconds
  to minutes)."""

  def __init__(self, path, resume_step: int = 0, active: bool = True):
    self.active, self.remote = active, is_remote(path)
    self.path = as_path(path)
    self.file = None
    self._lines: list[str] = []
    if not active:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if self.path.exists():
      self._lines = [
        l
        for l in self.path.read_text().splitlines()
        if l.strip() and json.loads(l).get("step", 0) <= resume_step
      ]
      write_text(self.path, "".join(l + "\n" for l in self._lines))
    if not self.remote:
      self.file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

  def append(self, rows: list[dict]) -> None:
    if not self.active or not rows:
      return
    lines = [json.dumps(r) for r in rows]
    if self.file is not None:
      self.file.write("".join(l + "\n" for l in lines))
      self.file.flush()
    else:
      self._lines += lines
      write_text(self.path, "".join(l + "\n" for l in self._lines))

  def close(self) -> None:
    if self.file is not None:
      self.file.close()


def _event_records(data: bytes) -> list[tuple[int, bytes]]:
  """(step, raw record) of each whole record of a TensorBoard event file (TFRecord framing:
  uint64 length, uint32 crc, data, uint32 crc); a record cut short by a kill ends the list."""
  from tensorboardX.proto.event_pb2 import Event  # pylint: disable=import-outside-toplevel

  out, pos = [], 0
  while pos + 12 <= len(data):
    (n,) = struct.unpack("<Q", data[pos : pos + 8])
    end = pos + 12 + n + 4
    if end > len(data):
      break
    out.append((Event.FromString(data[pos + 12 : pos + 12 + n]).step, data[pos:end]))
    pos = end
  return out


def truncate_events(tb_dir, resume_step: int) -> int:
  """Drops the events of steps after resume_step from every event file in tb_dir (each file
  rewritten whole), so a resumed run's curves hold each step once, as metrics.jsonl does.
  Returns how many events were dropped."""
  tb_dir = as_path(tb_dir)
  if not tb_dir.exists():
    return 0
  dropped = 0
  for path in sorted(tb_dir.iterdir()):
    if "tfevents" not in path.name:
      continue
    records = _event_records(path.read_bytes())
    keep = b"".join(r for step, r in records if step <= resume_step)
    if len(keep) == path.stat().length:
      continue
    dropped += sum(step > resume_step for step, _ in records)
    if is_remote(path):
      path.write_bytes(keep)
    else:
      atomic_write(os.fspath(path), lambda f, b=keep: f.write(b), mode="wb")
  return dropped


class MetricsWriter:
  """One JSON object per step in metrics.jsonl (`JsonlLog`), scalars mirrored to TensorBoard.
  On resume both are cut back to resume_step first (`truncate_events`)."""

  def __init__(self, workdir: str | os.PathLike, resume_step: int = 0, active: bool = True):
    self.active = active
    self.log = JsonlLog(as_path(workdir) / "metrics.jsonl", resume_step, active)
    self.tb = None
    if not active:
      return
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel

      tb_dir = as_path(workdir) / "tensorboard"
      n = truncate_events(tb_dir, resume_step)
      if n:
        logging.info("tensorboard: %d events after step %d dropped", n, resume_step)
      # Named by pid too: the file name has the time in seconds, and a restart within the
      # second would otherwise open (and empty) the previous start's file.
      self.tb = SummaryWriter(str(tb_dir), filename_suffix=f".{os.getpid()}.{resume_step}")
    except Exception as e:  # noqa: BLE001 - no tensorboardX, or no writer for this scheme
      logging.warning("no TensorBoard logs (%s: %s); metrics.jsonl has everything", type(e), e)

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
    self.log.append([row])

  def write_text(self, step: int, tag: str, text: str) -> None:
    """A text (markdown) in TensorBoard's Text tab, at `step`; metrics.jsonl is not touched."""
    if self.active and self.tb is not None:
      self.tb.add_text(tag, text, step)

  def close(self) -> None:
    self.log.close()
    if self.tb is not None:
      self.tb.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
  path = as_path(workdir) / "metrics.jsonl"
  return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def progress_line(step: int, recent: list[dict]) -> str:
  """One line per evaluation: the interval's mean training reward and rule accuracy (what the
  policy optimises vs what is true), the RM's within-group AUC, then the evaluation."""

  def mean(key):
    vals = [r[key] for r in recent if key in r]
    return f"{np.mean(vals):.3f}" if vals else "-"

  parts = [
    f"step {step}: train reward {mean('reward/mean')}",
    f"rule acc {mean('rule/acc')}",
  ]
  if any("rm/group_auc" in r for r in recent):
    parts.append(f"RM within-group AUC {mean('rm/group_auc')}")
  last = recent[-1]
  if "eval/acc" in last:
    parts.append(f"held-out acc {last['eval/acc']:.3f}")
  if "eval/rm_pair_acc" in last:
    parts.append(f"RM held-out pair acc {last['eval/rm_pair_acc']:.3f}")
  if "eval/rm_probe_score" in last:
    parts.append(f"RM on probe {last['eval/rm_probe_score']:.3f}")
  return " | ".join(parts)


def step_line(step: int, total: int, m: dict) -> str:
  """One plain line per step, for logs that are not a terminal."""
  parts = [
    f"step {step}/{total}",
    f"reward {m['reward/mean']:.3f}",
    f"rule acc {m['rule/acc']:.3f}",
  ]
  if "pairs/n_valid" in m:
    parts.append(f"pairs {m['pairs/n_valid']}")
  parts.append(f"{m['time/step_s']:.2f} s")
  if "time/sample_tokens_per_s" in m:
    parts.append(f"{m['time/sample_tokens_per_s']:.0f} sampled tok/s")
  return " | ".join(parts)


def samples_markdown(rows: list[dict], keys: tuple[str, ...], limit: int = 4) -> str:
  """The first `limit` rows as markdown sections (TensorBoard's Text tab), each key's value in a
  code block so that a response's own markup shows as written."""
  parts = []
  for i, r in enumerate(rows[:limit]):
    fields = [f"**{k}**\n\n```\n{r.get(k)}\n```" for k in keys if k in r]
    parts.append(f"#### {i}\n\n" + "\n\n".join(fields))
  return "\n\n".join(parts)
