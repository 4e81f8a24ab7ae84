"""Joint Orbax checkpoints: policy state, RM state, data position, PRNG, step and config in one step
directory, written atomically (Orbax renames a finished temporary directory into place).

On top of Orbax, every finished step gets a manifest (size + sha256 of every file). Restore
checks it first, so a truncated or bit-rotted checkpoint fails with an error naming the file,
and `restore_latest` moves such a step aside (into `<checkpoints>.corrupt/`, kept for a look)
and falls back to the newest step that verifies, so the run can save that step again.

Paths go through etils `epath` (as Orbax does), so a run directory may be `gs://...`. In an
N-process run every process calls save/restore (Orbax writes each process's shards and
syncs them); the manifest is hashed, written and checked by the primary process only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from cooper_jax import distributed as dist
from cooper_jax.models.config import ModelConfig
from cooper_jax.paths import as_path, write_text

MANIFEST = "cooper_manifest.json"


class CheckpointCorrupt(RuntimeError):
  """A checkpoint step whose files do not match its manifest, or that Orbax cannot read."""


def _files(step_dir: epath.Path) -> list[epath.Path]:
  """Every file under step_dir, one listing per directory (epath refuses `**` globs, and its
  `walk` on gs:// yields roots without the scheme, which would then name local paths)."""
  out = []
  for p in step_dir.iterdir():
    out.extend(_files(p) if p.is_dir() else [p])
  return sorted(out)


def _manifest(step_dir: epath.Path) -> dict[str, list]:
  out = {}
  for f in _files(step_dir):
    if f.name != MANIFEST:
      h = hashlib.sha256()
      with f.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
          h.update(chunk)
      out[str(f.relative_to(step_dir))] = [f.stat().length, h.hexdigest()]
  return out


def verify_step_dir(step_dir: str | os.PathLike) -> None:
  """Raises CheckpointCorrupt naming the first missing/short/changed file."""
  step_dir = as_path(step_dir)
  mpath = step_dir / MANIFEST
  if not mpath.exists():
    raise CheckpointCorrupt(f"{step_dir}: no {MANIFEST} (save did not finish)")
  want = json.loads(mpath.read_text())
  for rel, (size, digest) in want.items():
    f = step_dir / rel
    if not f.exists():
      raise CheckpointCorrupt(f"{step_dir}: missing file {rel}")
    if f.stat().length != size:
      raise CheckpointCorrupt(
        f"{step_dir}: {rel} has {f.stat().length} bytes, expected {size} (truncated?)"
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

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3, async_save: bool = False):
    self.directory = as_path(directory)
    self.manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
      ),
      item_names=("policy", "rm", "meta", "ahead"),
    )
    self._unsealed: list[int] = []  # saved steps whose manifest is not written yet

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def save(self, step: int, policy_state, rm_state, meta: dict[str, Any], ahead=None) -> epath.Path:
    """Saves everything for `step`; rm_state may be None (rule mode); ahead: the rollouts
    sampled ahead of their step (rollout.off_policy_steps), a pytree of arrays, or None. Every
    process calls it. With async saving it returns once the arrays are copied off the devices;
    the manifest follows when the write has finished (at the next save, or `finish`)."""
    self.finish()
    items = {
      "policy": ocp.args.StandardSave(policy_state),
      "meta": ocp.args.JsonSave(dict(meta, step=int(step), has_rm=rm_state is not None)),
    }
    if rm_state is not None:
      items["rm"] = ocp.args.StandardSave(rm_state)
    if ahead is not None:
      items["ahead"] = ocp.args.StandardSave(ahead)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    self._unsealed.append(int(step))
    if not self.manager.is_saving_in_progress():
      self.finish()
    return self.step_dir(step)

  def finish(self) -> None:
    """Waits for pending saves and writes their manifests (primary), then syncs processes."""
    if not self._unsealed:
      return
    self.manager.wait_until_finished()
    if dist.is_primary():
      for step in self._unsealed:
        step_dir = self.step_dir(step)
        if step_dir.exists():  # max_to_keep may already have removed it
          write_text(step_dir / MANIFEST, json.dumps(_manifest(step_dir), sort_keys=True))
    self._unsealed = []
    dist.barrier("cooper_checkpoint_manifest")

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

  def restore_ahead(self, step: int, target):
    """The rollouts sampled ahead that `step` saved, into target's shapes and shardings (a
    step `restore` has verified)."""
    try:
      args = ocp.args.Composite(ahead=ocp.args.StandardRestore(target))
      return self.manager.restore(step, args=args)["ahead"]
    except Exception as e:  # noqa: BLE001 - as in restore
      raise CheckpointCorrupt(
        f"{self.step_dir(step)}: its rollouts sampled ahead cannot be restored: "
        f"{type(e).__name__}: {e}"
      ) from e

  def _verified(self, step: int) -> str | None:
    """None if `step` matches its manifest, else why not; hashed by the primary only (every
    process would read every byte otherwise) and agreed by all."""
    err = None
    if dist.is_primary():
      try:
        verify_step_dir(self.step_dir(step))
      except CheckpointCorrupt as e:
        err = str(e)
    if dist.process_count() > 1 and dist.any_process(err is not None) and err is None:
      err = f"{self.step_dir(step)}: the primary process found it corrupt (see its log)"
    return err

  def restore_latest(self, policy_target, rm_target):
    """Newest step that verifies and restores; each bad one is logged and moved aside so the
    run can save that step again. None if there is no step."""
    errors = []
    for step in reversed(self.steps()):
      err = self._verified(step)
      if err is None:
        try:
          out = self.restore(step, policy_target, rm_target)
        except CheckpointCorrupt as e:
          out, err = None, str(e)
        if not dist.any_process(err is not None):
          return out
        err = err or f"{self.step_dir(step)}: another process could not restore it"
      logging.error("checkpoint step %d is unusable, trying an older one: %s", step, err)
      errors.append(f"{err} (moved to {self._move_aside(step)})")
    if errors:
      raise CheckpointCorrupt(f"no usable checkpoint in {self.directory}: " + " | ".join(errors))
    return None

  def _move_aside(self, step: int) -> epath.Path:
    """Moves a corrupt step out of Orbax's view (kept, for inspection); returns where to."""
    aside = self.directory.parent / f"{self.directory.name}.corrupt"
    dest = aside / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    if dist.is_primary():
      aside.mkdir(parents=True, exist_ok=True)
      self.step_dir(step).rename(dest)
      logging.error("checkpoint step %d moved aside to %s", step, dest)
    dist.barrier("cooper_checkpoint_move_aside")
    self.manager.reload()
    return dest

  def close(self):
    self.finish()
    self.manager.close()


def model_cfg_to_meta(cfg: ModelConfig) -> dict:
  return dataclasses.asdict(cfg)


def load_model_from_run(run_dir, which: str = "policy", step: int | None = None):
  """(ModelConfig, params, tokenizer source) of a training run's policy or RM (`which`), at the
  newest step or `step`; the step's manifest is verified first."""
  if which not in ("policy", "rm"):
    raise ValueError(f"which={which!r}: expected 'policy' or 'rm'")
  run_dir = as_path(run_dir)
  ckpt_dir = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
  store = CheckpointStore(ckpt_dir)
  steps = store.steps()
  if not steps:
    raise FileNotFoundError(f"{ckpt_dir}: no checkpoint steps")
  step = steps[-1] if step is None else step
  verify_step_dir(store.step_dir(step))
  meta = store.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  if which == "rm" and "rm_model" not in meta:
    store.close()
    raise ValueError(
      f"{ckpt_dir}: step {step} has no RM (reward_mode {meta['config']['reward_mode']!r})"
    )
  args = ocp.args.Composite(**{which: ocp.args.StandardRestore()})
  state = store.manager.restore(step, args=args)[which]
  store.close()
  if which == "policy":
    return ModelConfig(**meta["policy_model"]), state["params"], meta["tokenizer"]
  rm = meta["config"]["rm"]
  return ModelConfig(**meta["rm_model"]), state["params"], rm.get("tokenizer") or rm["model"]


def load_policy_for_eval(run_dir, step: int | None = None):
  """(ModelConfig, params, tokenizer source) of a training run's policy, for evaluation."""
  return load_model_from_run(run_dir, "policy", step)
