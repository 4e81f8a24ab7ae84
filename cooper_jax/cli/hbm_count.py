"""How the AOT tools count bytes: as HBM bytes, with v5e's VMEM prefetching off.

On v5e, XLA's memory-space assignment prefetches buffers into VMEM, and its "bytes accessed"
then counts a prefetched buffer three times (the HBM read, the VMEM write, the consumer's VMEM
read), so the same program reads as ~1.4x more bytes (docs/tpu.md). Every figure in the
project's record is counted with the prefetching off. libtpu reads LIBTPU_INIT_ARGS when it
starts, so `use_hbm_count()` must run before jax touches libtpu: the tools call it at import,
before they import jax. No jax import here.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VMEM_FLAG = "--xla_vf_vmem_memory_space_assignment=false"
_SETTING = "xla_vf_vmem"  # any value of the flag the user gave: theirs stands


def compile_only_environment(environ: MutableMapping[str, str] = os.environ) -> str:
  """What the AOT tools set before jax is imported: the CPU backend only (never open a local
  TPU/GPU), libtpu loadable beside another process (no machine-wide lock), and the HBM count
  (use_hbm_count). Returns use_hbm_count's header line."""
  environ["JAX_PLATFORMS"] = "cpu"
  environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  return use_hbm_count(environ)


def use_hbm_count(environ: MutableMapping[str, str] = os.environ) -> str:
  """Adds VMEM_FLAG to LIBTPU_INIT_ARGS unless it already holds an xla_vf_vmem setting (other
  libtpu arguments are kept). Returns the line the tool prints in its header: which count its
  byte figures are."""
  given = environ.get("LIBTPU_INIT_ARGS", "")
  mine = [a for a in given.split() if _SETTING in a]
  if mine:
    off = all(a.endswith("=false") for a in mine)
    what = (
      "HBM bytes (VMEM prefetching off)"
      if off
      else (
        "XLA's bytes with VMEM prefetching on: a prefetched buffer counts three times, so they "
        f"are not comparable with docs/tpu.md's figures ({VMEM_FLAG})"
      )
    )
    return f"bytes: {what}; LIBTPU_INIT_ARGS as given: {' '.join(mine)}"
  environ["LIBTPU_INIT_ARGS"] = f"{given} {VMEM_FLAG}".strip()
  return (
    f"bytes: HBM bytes (VMEM prefetching off: this tool added {VMEM_FLAG} to LIBTPU_INIT_ARGS, "
    "as docs/tpu.md counts; give another xla_vf_vmem value there to override)"
  )


def hbm_count_kind(environ: MutableMapping[str, str] = os.environ) -> str:
  """ "vmem_prefetch_off" (the documented count) or "vmem_prefetch_on", from LIBTPU_INIT_ARGS:
  the value each JSON row records in its "hbm_count" field."""
  mine = [a for a in environ.get("LIBTPU_INIT_ARGS", "").split() if _SETTING in a]
  off = bool(mine) and all(a.endswith("=false") for a in mine)
  return "vmem_prefetch_off" if off else "vmem_prefetch_on"
