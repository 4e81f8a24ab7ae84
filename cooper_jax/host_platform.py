"""Pick the CPU backend on hosts without an accelerator, before JAX initialises.

With libtpu installed (for ahead-of-time compilation, cooper_jax/cli/aot.py), every JAX process
tries the TPU backend first: on a CPU-only host that logs "Unable to initialize backend 'tpu'",
libtpu prints TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES warnings and takes a machine-wide
lock file. `use_cpu_unless_accelerator()` sets JAX_PLATFORMS=cpu in exactly that case and
leaves every other host alone:
  - JAX_PLATFORMS (or the older JAX_PLATFORM_NAME) already set: the user chose, keep it;
  - a TPU device node (/dev/accel*, /dev/vfio): a TPU VM;
  - a GPU device node (/dev/nvidia*, /dev/kfd, /dev/dri/renderD*) or a GPU jax plugin installed
    (jax_cuda*/jax_rocm* packages or `jax_plugins` entry points): a GPU host, or a user who
    asked for accelerator-specific jax.
Call it first thing in a CLI's main, before anything touches jax devices.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import sys
from importlib.metadata import entry_points

_TPU_NODES = ("/dev/accel*", "/dev/vfio")
_GPU_NODES = ("/dev/nvidia*", "/dev/kfd", "/dev/dri/renderD*")
_GPU_PLUGIN_MODULES = (
  "jax_cuda12_plugin",
  "jax_cuda13_plugin",
  "jax_rocm60_plugin",
  "jax_rocm7_plugin",
)


def _any_path(patterns) -> bool:
  return any(glob.glob(p) for p in patterns)


def _gpu_plugin_installed() -> bool:
  if any(importlib.util.find_spec(m) is not None for m in _GPU_PLUGIN_MODULES):
    return True
  try:
    names = [ep.name for ep in entry_points(group="jax_plugins")]
  except Exception:  # noqa: BLE001 - broken metadata must not stop a run
    names = []
  return any(("cuda" in n or "rocm" in n) for n in names)


def accelerator_present() -> bool:
  """True if this host has (or was set up for) a TPU or GPU."""
  return _any_path(_TPU_NODES) or _any_path(_GPU_NODES) or _gpu_plugin_installed()


def use_cpu_unless_accelerator() -> str | None:
  """Sets JAX_PLATFORMS=cpu on accelerator-less hosts; returns what it set, else None.

  Idempotent. If jax is already imported it updates jax's config instead of the environment
  (jax reads JAX_PLATFORMS at import); if jax's backends are already initialised it is too
  late to change anything, and it only logs that.
  """
  if os.environ.get("JAX_PLATFORMS") or os.environ.get("JAX_PLATFORM_NAME"):
    return None
  if accelerator_present():
    return None
  jax = sys.modules.get("jax")
  if jax is not None:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel

    if xla_bridge.backends_are_initialized():
      logging.info("host_platform: jax backends already initialised; too late for cpu-only")
      return None
    jax.config.update("jax_platforms", "cpu")
  os.environ["JAX_PLATFORMS"] = "cpu"  # also for subprocesses (verifier pool, tools)
  return "cpu"


def allow_shared_libtpu() -> None:
  """libtpu's machine-wide lock lets one process load it; compile-only use (topology AOT) and
  tests that run next to another JAX process need several."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


# XLA's persistent compilation cache, shared by CLI runs and study jobs (one place).
COMPILATION_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "cooper_jax", "xla")


def use_compilation_cache() -> str | None:
  """Turns on XLA's persistent compilation cache in COMPILATION_CACHE_DIR unless one is set
  (JAX_COMPILATION_CACHE_DIR or jax's config); returns the directory it set, else None.

  A run compiles its step functions once per input shape (response widths and, with merged
  rows, row counts: the small task's 300-step main command compiled ~20 shapes, ~4 of its
  7.7 minutes); a rerun, or the next job of a study, reads them back. Entries are keyed by
  the program, the compile options and the jax version, and XLA's CPU loader rejects an
  entry compiled for other CPU features (then it compiles again)."""
  import jax  # pylint: disable=import-outside-toplevel

  if jax.config.jax_compilation_cache_dir:
    return None
  jax.config.update("jax_compilation_cache_dir", COMPILATION_CACHE_DIR)
  return COMPILATION_CACHE_DIR
