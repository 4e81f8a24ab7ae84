"""`cooper-train` (and `python -m cooper_jax.train`): one training run from an ml-collections
config; the loop itself is cooper_jax.train.

  cooper-train --config experiments/smollm2.py:cooper --workdir runs/x --config.train.steps=10
"""

from __future__ import annotations

import logging
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from cooper_jax import config as config_lib
from cooper_jax import distributed as dist
from cooper_jax import run_records
from cooper_jax import train as train_lib
from cooper_jax.cli import refuse_unknown_config_keys, wants_help
from cooper_jax.host_platform import use_compilation_cache

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file[:variant]", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "where metrics and checkpoints go")


def main(argv):
  del argv
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required")
  # Before anything touches a device: a multi-process run must join the runtime first.
  dist.initialize(_CONFIG.value.distributed)
  use_compilation_cache()  # reruns and later jobs read compiled steps back (host_platform)
  # The primary logs the run; the others only warnings and errors (their own failures).
  logging.getLogger().setLevel(logging.INFO if dist.is_primary() else logging.WARNING)
  # Orbax logs every save step at INFO; keep the run's own INFO lines readable.
  for handler in logging.getLogger().handlers:
    handler.addFilter(lambda r: "/orbax/" not in r.pathname or r.levelno >= logging.WARNING)
  try:
    # A bad value (a misspelt optimizer or schedule, sizes that do not divide) is the user's
    # to fix, as a changed config on resume is: one line, no traceback, nothing written.
    config_lib.validate(_CONFIG.value, jax.device_count())
  except ValueError as e:
    raise SystemExit(f"config error: {e}") from None
  try:
    train_lib.train(_CONFIG.value, _WORKDIR.value)
  except run_records.ConfigChanged as e:  # a user's choice to make, not a crash: no traceback
    raise SystemExit(f"error: {e}") from None


def cli() -> None:
  """Console-script entry point (pyproject.toml) and `python -m cooper_jax.train`."""
  if wants_help(train_lib.__doc__, __name__):
    return
  if refuse_unknown_config_keys("cooper-train"):
    sys.exit(2)
  app.run(main)


if __name__ == "__main__":
  cli()
