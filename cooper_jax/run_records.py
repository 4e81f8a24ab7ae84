"""What a run directory records about each start, and the check that a restart trains the run it
finds (cooper_jax.train calls both).

  <workdir>/config.json       the config of the run's first start (written once)
  <workdir>/starts/<k>.json   one record per start, k = 0, 1, ...: the step it started from,
                              when, the command line, the whole config and what changed since
                              the start before

A start in a workdir that already holds a config record compares its config with the newest
record and refuses a difference (every key, old and new value), unless
`--config.train.allow_config_change=True`: a run's record must describe every step it holds.
Keys in `MAY_DIFFER` are not compared; they change when or what is saved, evaluated or logged,
or how the processes are placed, never what a step computes. Keys one side lacks (a config key
added or removed by a code change) are logged, not refused. A workdir with checkpoints but no
record (a checkpoint copied in to start another run from it) has nothing to compare with.

Every process reads the records and the refusal is agreed, so all processes stop before any
step; the primary alone writes.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from cooper_jax import distributed as dist
from cooper_jax.paths import as_path, write_text

STARTS = "starts"

# Keys that may differ between two starts of one run (a key or a whole section).
MAY_DIFFER = (
  "train.stop_after",  # stops early while the schedules still span train.steps
  "train.allow_config_change",
  "train.checkpoint_every",
  "train.max_to_keep",
  "train.async_checkpoint",
  "train.eval_every",  # when to evaluate; evaluation draws from its own seed
  "train.eval_kl_prompts",  # a monitor at evaluations (kl_monitor), its own key
  "train.eval_kl_samples",
  "train.save_rollouts",
  "train.save_pairs",
  "train.overlap_rm_update",  # the same numbers, the RM update in a thread (tests/test_train.py)
  "verifier.workers",  # processes that verify; the same verdicts
  "distributed",  # how processes join (process_id differs per process, addresses per launch)
)


class ConfigChanged(ValueError):
  """A restart whose config differs from the run's record in a key that changes training."""


def config_dict(c) -> dict:
  """The config as the records hold it (JSON types: tuples are lists)."""
  return json.loads(c.to_json_best_effort())


def flatten(d: dict, prefix: str = "") -> dict:
  """{"a.b.c": value} for every leaf of nested dicts (lists are values)."""
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict) and v:
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def _may_differ(key: str) -> bool:
  return any(key == m or key.startswith(m + ".") for m in MAY_DIFFER)


def differences(old: dict, new: dict) -> tuple[dict, list, list]:
  """(changed {key: (old, new)}, keys only the new config has, keys only the old one has),
  keys in MAY_DIFFER left out."""
  a, b = flatten(old), flatten(new)
  changed = {k: (a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] != b[k]}
  changed = {k: v for k, v in changed.items() if not _may_differ(k)}
  added = sorted(k for k in b.keys() - a.keys() if not _may_differ(k))
  removed = sorted(k for k in a.keys() - b.keys() if not _may_differ(k))
  return changed, added, removed


def _start_indices(workdir) -> list[int]:
  d = as_path(workdir) / STARTS
  if not d.exists():
    return []
  return sorted(int(p.stem) for p in d.iterdir() if p.suffix == ".json" and p.stem.isdigit())


def stored_config(workdir) -> tuple[dict | None, str | None]:
  """(config, where it was read) of the newest record: the last start's, else config.json (a
  run made before start records existed); (None, None) for a workdir without either."""
  workdir = as_path(workdir)
  starts = _start_indices(workdir)
  if starts:
    path = workdir / STARTS / f"{starts[-1]}.json"
    return json.loads(path.read_text())["config"], str(path)
  path = workdir / "config.json"
  if path.exists():
    return json.loads(path.read_text()), str(path)
  return None, None


def check_restart(c, workdir) -> dict | None:
  """Compares c with the workdir's newest config record (every process). Raises ConfigChanged
  naming every differing key unless c.train.allow_config_change; returns {key: [old, new]}
  (empty for the same config), None where the workdir has no record. Writes nothing."""
  old, source = stored_config(workdir)
  if dist.any_process(old is None):  # collective: every process takes both branches alike
    if dist.any_process(old is not None):
      raise ConfigChanged(
        f"{as_path(workdir)}: some processes see a config record and some do not (every "
        "process must see the same workdir)"
      )
    return None
  changed, added, removed = differences(old, config_dict(c))
  if added or removed:
    logging.info(
      "config keys not in the run's record %s (new in this code: %s; gone: %s); not compared",
      source,
      added,
      removed,
    )
  found = dist.any_process(bool(changed))
  allow = c.train.allow_config_change
  if found and not allow:
    if not changed:  # the primary saw a difference this process did not (another file view)
      raise ConfigChanged(f"another process found the config changed since {source} (its log)")
    lines = "\n".join(f"  {k}: {json.dumps(o)} -> {json.dumps(n)}" for k, (o, n) in changed.items())
    raise ConfigChanged(
      f"{as_path(workdir)} holds a run whose config ({source}) differs from this one in "
      f"{len(changed)} key(s):\n{lines}\nUse another --workdir, restore those values, or pass "
      "--config.train.allow_config_change=True to go on with the new config (each start's config "
      f"is kept in {as_path(workdir) / STARTS}/)."
    )
  if changed:
    logging.warning(
      "config changed since %s (train.allow_config_change): %s",
      source,
      "; ".join(f"{k}: {o!r} -> {n!r}" for k, (o, n) in changed.items()),
    )
  return {k: list(v) for k, v in changed.items()}


def write_start(c, workdir, step: int, changed: dict) -> str | None:
  """The primary writes this start's record (and config.json at the run's first start); the
  path of the record, None on the other processes."""
  if not dist.is_primary():
    return None
  workdir = as_path(workdir)
  cfg = config_dict(c)
  if not (workdir / "config.json").exists():
    write_text(workdir / "config.json", json.dumps(cfg, indent=1) + "\n")
  starts = _start_indices(workdir)
  k = starts[-1] + 1 if starts else 0
  record = {
    "start": k,
    "step": int(step),
    "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "argv": list(sys.argv),
    "process_count": dist.process_count(),
    "changed": changed,
    "config": cfg,
  }
  (workdir / STARTS).mkdir(parents=True, exist_ok=True)
  path = workdir / STARTS / f"{k}.json"
  write_text(path, json.dumps(record, indent=1) + "\n")
  return str(path)
