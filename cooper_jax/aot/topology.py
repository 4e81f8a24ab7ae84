"""TPU topologies without a TPU: libtpu's compile-only devices, their published peaks, the HBM
the compiler will use, and the out-of-memory message it raises."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from cooper_jax.host_platform import allow_shared_libtpu

GIB = 1024**3

# Published per-chip peaks (dense bf16 matmul FLOP/s, HBM bandwidth B/s, HBM capacity bytes), from
# Google Cloud's TPU system-architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e).
# The capacity here is only a fallback: the usable HBM per device is asked of the compiler
# (`usable_hbm_bytes`), which reserves some (v5e: 15.75 of 16 GiB).
# Keyed by jax's device_kind. A topology's device may be a TensorCore rather than a chip (v4 in
# libtpu's compile-only topologies: 2 devices per chip, 8 for v4:2x2x1), so per-device peaks are
# these divided by devices-per-chip, counted from the devices' chip coordinates.
CHIP_PEAKS = {
  "TPU v4": dict(flops=275e12, hbm_bw=1.2e12, hbm=32 * GIB, source="cloud.google.com/tpu/docs/v4"),
  "TPU v5 lite": dict(
    flops=197e12, hbm_bw=819e9, hbm=16 * GIB, source="cloud.google.com/tpu/docs/v5e"
  ),
  "TPU v5": dict(
    flops=459e12, hbm_bw=2.76e12, hbm=95 * GIB, source="cloud.google.com/tpu/docs/v5p"
  ),
  "TPU v6 lite": dict(
    flops=918e12, hbm_bw=1.64e12, hbm=32 * GIB, source="cloud.google.com/tpu/docs/v6e"
  ),
}


class TopologyError(ValueError):
  """A topology name libtpu does not know."""


_LIBTPU_NOISE = re.compile(
  r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|host bounds|"
  r"Source Location Trace|libtpu_init_utils|^\s*$"
)


def _quiet_fd2(fn: Callable[[], Any]):
  """Runs fn with C-level stderr captured; replays what is not libtpu's CPU-host noise (it
  warns that TPU_ACCELERATOR_TYPE etc. are unset, which is expected when compiling only)."""
  with tempfile.TemporaryFile(mode="w+b") as tmp:
    saved = os.dup(2)
    os.dup2(tmp.fileno(), 2)
    try:
      return fn()
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      for line in tmp.read().decode(errors="replace").splitlines():
        if not _LIBTPU_NOISE.search(line):
          os.write(2, (line + "\n").encode())


def get_topology(name: str):
  allow_shared_libtpu()
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel

  try:
    return _quiet_fd2(lambda: topologies.get_topology_desc(platform="tpu", topology_name=name))
  except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError/ValueError variously
    raise TopologyError(
      f"topology {name!r} is not valid for libtpu ({e}); examples: v5e:2x4, v5e:4x4, "
      "v4:2x2x1, v4:2x2x2, v5p:2x2x1, v6e:2x2"
    ) from e


def count_chips(devices) -> int:
  return len({tuple(d.coords) for d in devices}) if hasattr(devices[0], "coords") else len(devices)


_SIZE_RE = r"([0-9.]+)\s*([KMGT]?)i?B?"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _size(num: str, unit: str) -> int:
  return int(float(num) * _UNITS[unit])


def parse_oom(message: str) -> tuple[int | None, int | None]:
  """(bytes required, bytes available) from a RESOURCE_EXHAUSTED compile error, or None."""
  m = re.search(
    rf"required for HLO temporaries \({_SIZE_RE}\) exceeds available HBM \({_SIZE_RE}\)", message
  )
  if m:
    return _size(m[1], m[2]), _size(m[3], m[4])
  m = re.search(rf"Used {_SIZE_RE} of {_SIZE_RE} hbm", message)
  if m:
    return _size(m[1], m[2]), _size(m[3], m[4])
  m = re.search(_SIZE_RE.replace("?", "", 1), message)
  return (_size(m[1], m[2]), None) if m else (None, None)


def usable_hbm_bytes(devices) -> int | None:
  """HBM per device the compiler will use, read from the error of a program that cannot fit
  (a 1 TiB sort; compiles in well under a second)."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("x",))
  x = jax.ShapeDtypeStruct((len(devices),), jnp.float32, sharding=NamedSharding(mesh, jax.P("x")))

  def huge(x):
    y = jax.lax.broadcasted_iota(jnp.float32, (2**18, 2**20), 1) * x[0]
    return jnp.sort(y, axis=1)[:, :1]

  try:
    jax.jit(huge).lower(x).compile()
  except Exception as e:  # noqa: BLE001
    return parse_oom(str(e))[1]
  return None
