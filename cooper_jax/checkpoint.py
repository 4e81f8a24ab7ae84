"""Joint Orbax checkpoints: policy state, RM state, data position, PRNG, step and config in one step
directory, written atomically (Orbax renames a finished temporary directory into place).

On top of Orbax, every finished step gets a manifest (size + sha256 of every file). Restore
checks it first, so a truncated or bit-rotted checkpoint fails with an error naming the file,
and `restore_latest` falls back to the newest step that verifies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from cooper_jax.io import atomic_write_json
from cooper_jax.models.config import ModelConfig

MANIFEST = "cooper_manifest.json"


class CheckpointCorrupt(RuntimeError):
  """A checkpoint step whose files do not match its manifest, or that Orbax cannot read."""


def _manifest(step_dir: Path) -> dict[str, list]:
  out = {}
  for f in sorted(step_dir.rglob("*")):
    if f.is_file() and f.name != MANIFEST:
      h = hashlib.sha256()
      with open(f, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
          h.update(chunk)
      out[str(f.relative_to(step_dir))] = [f.stat().st_size, h.hexdigest()]
  return out


def verify_step_dir(step_dir: Path) -> None:
  """Raises CheckpointCorrupt naming the first missing/short/changed file."""
  mpath = step_dir / MANIFEST
  if not mpath.exists():
    raise CheckpointCorrupt(f"{step_dir}: no {MANIFEST} (save did not finish)")
  want = json.loads(mpath.read_text())
  for rel, (size, digest) in want.items():
    f = step_dir / rel
    if not f.exists():
      raise CheckpointCorrupt(f"{step_dir}: missing file {rel}")
    if f.stat().st_size != size:
      raise CheckpointCorrupt(
        f"{step_dir}: {rel} has {f.stat().st_size} bytes, expected {size} (truncated?)"
      )
  have = _manifest(step_dir)
  for rel, (size, digest) in want.items():
    if have[rel][1] != digest:
      raise CheckpointCorrupt(f"{step_dir}: {rel} content changed (sha256 mismatch)")


def _abstract(tree):
  """ShapeDtypeStructs carrying the live shardings, so restore lands sharded like the target."""
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree
  )


class CheckpointStore:
  """Holds the Orbax CheckpointManager for one run directory (real state: the manager)."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3):
    self.directory = Path(directory).absolute()
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
      ),
      item_names=("policy", "rm", "meta"),
    )

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def step_dir(self, step: int) -> Path:
    return self.directory / str(step)

  def save(self, step: int, policy_state, rm_state, meta: dict[str, Any]) -> Path:
    """Saves everything for `step`; rm_state may be None (rule mode)."""
    items = {
      "policy": ocp.args.StandardSave(policy_state),
      "meta": ocp.args.JsonSave(dict(meta, step=int(step), has_rm=rm_state is not None)),
    }
    if rm_state is not None:
      items["rm"] = ocp.args.StandardSave(rm_state)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    self.manager.wait_until_finished()
    step_dir = self.step_dir(step)
    atomic_write_json(step_dir / MANIFEST, _manifest(step_dir), sort_keys=True)
    return step_dir

  def restore(self, step: int, policy_target, rm_target) -> tuple[Any, Any, dict]:
    """Restores one step into the shapes/shardings of the given targets (rm_target may be None)."""
    step_dir = self.step_dir(step)
    verify_step_dir(step_dir)
    try:
      meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
        "meta"
      ]
      items = {"policy": ocp.args.StandardRestore(_abstract(policy_target))}
      if rm_target is not None:
        if not meta.get("has_rm"):
          raise CheckpointCorrupt(f"{step_dir}: has no RM state, but this run needs one")
        items["rm"] = ocp.args.StandardRestore(_abstract(rm_target))
      out = self.manager.restore(step, args=ocp.args.Composite(**items))
    except CheckpointCorrupt:
      raise
    except Exception as e:  # noqa: BLE001 - any Orbax/tensorstore failure is a bad checkpoint
      raise CheckpointCorrupt(f"{step_dir}: cannot be restored: {type(e).__name__}: {e}") from e
    return out["policy"], out.get("rm") if rm_target is not None else None, meta

  def restore_latest(self, policy_target, rm_target):
    """Newest step that verifies and restores; logs each bad one. None if there is no step."""
    errors = []
    for step in reversed(self.steps()):
      try:
        return self.restore(step, policy_target, rm_target)
      except CheckpointCorrupt as e:
        logging.error("checkpoint step %d is unusable, trying an older one: %s", step, e)
        errors.append(str(e))
    if errors:
      raise CheckpointCorrupt(f"no usable checkpoint in {self.directory}: " + " | ".join(errors))
    return None

  def close(self):
    self.manager.close()


def model_cfg_to_meta(cfg: ModelConfig) -> dict:
  return dataclasses.asdict(cfg)


def load_policy_for_eval(run_dir: str | os.PathLike, step: int | None = None):
  """(ModelConfig, params, tokenizer source) of a training run's policy, for evaluation."""
  run_dir = Path(run_dir)
  ckpt_dir = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
  store = CheckpointStore(ckpt_dir)
  steps = store.steps()
  if not steps:
    raise FileNotFoundError(f"{ckpt_dir}: no checkpoint steps")
  step = steps[-1] if step is None else step
  verify_step_dir(store.step_dir(step))
  meta = store.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  policy = store.manager.restore(step, args=ocp.args.Composite(policy=ocp.args.StandardRestore()))[
    "policy"
  ]
  store.close()
  cfg = ModelConfig(**meta["policy_model"])
  return cfg, policy["params"], meta["tokenizer"]
