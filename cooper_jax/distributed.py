"""Multi-process plumbing: one code path for 1 and N JAX processes (TPU pod hosts, GPU nodes,
or several CPU processes on one machine in the tests).

In an N-process run every process runs the same program on its own devices and a jax.Array
spans all of them: a process may only read the shards it addresses, and host data entering a
jitted step must be built as a global array. The helpers here keep that in one place:

- `initialize` joins the JAX distributed runtime (config.distributed), or does nothing;
- `put_global` (full host data, identical on every process) and `put_local_rows` (this
  process's rows only) build global arrays; `local_rows` says which rows are this process's;
- `fetch_local_rows` reads this process's rows of a global array, `fetch` the whole of it;
- `gather_rows`, `allgather`, `sum_over_processes`, `max_over_processes`, `any_process`
  agree on host values; `barrier` waits for every process.

With one process every helper reduces to the plain single-process call (jax.device_put,
np.asarray), so a 1-process run computes exactly what it computed before.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

MODES = ("auto", "on", "off")


def _multi_host_tpu_env() -> bool:
  """A Cloud TPU VM that is one host of a multi-host slice (TPU_WORKER_HOSTNAMES lists them)."""
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h.strip()]) > 1


def initialize(dc) -> bool:
  """Joins the distributed runtime as config.distributed says; True if it did.

  mode "off": single process. "on": always (jax detects Cloud TPU, SLURM, Open MPI, ... when no
  coordinator_address is given). "auto": when a coordinator address is given or this is a host
  of a multi-host TPU slice; a single host (CPU, one GPU box, v5e-8, v4-8) stays one process.
  The heartbeat timeout bounds how long the survivors wait for a dead process before failing.
  """
  if dc.mode not in MODES:
    raise ValueError(f"config.distributed.mode={dc.mode!r}: expected one of {MODES}")
  if dc.mode == "off" or (
    dc.mode == "auto" and not dc.coordinator_address and not _multi_host_tpu_env()
  ):
    return False
  kw = dict(
    initialization_timeout=int(dc.initialization_timeout_s),
    heartbeat_timeout_seconds=int(dc.heartbeat_timeout_s),
    shutdown_timeout_seconds=int(dc.shutdown_timeout_s),
  )
  if dc.coordinator_address:
    kw.update(coordinator_address=dc.coordinator_address)
  if dc.num_processes > 0:
    kw.update(num_processes=int(dc.num_processes))
  if dc.process_id >= 0:
    kw.update(process_id=int(dc.process_id))
  jax.distributed.initialize(**kw)
  logging.info(
    "distributed: process %d of %d, %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """The process that writes metrics, logs, manifests and the run's config."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def allgather(x) -> np.ndarray:
  """[process_count, *x.shape]: every process's host value, on every process."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x[None]
  return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def sum_over_processes(x) -> np.ndarray:
  return allgather(x).sum(0)


def max_over_processes(x: int) -> int:
  return int(allgather(np.int64(x)).max())


def any_process(flag: bool) -> bool:
  """True on every process if it is True on any (e.g. a stop request seen by one host)."""
  return bool(allgather(np.int32(bool(flag))).max())


def local_rows(sharding, n_rows: int, ndim: int = 1) -> np.ndarray:
  """Sorted global row indices (axis 0) of an [n_rows, ...] array with `sharding` that this
  process's devices hold; replicas on several local devices count once."""
  shape = (n_rows,) + (1,) * (ndim - 1)
  rows = set()
  for idx in sharding.addressable_devices_indices_map(shape).values():
    rows.update(range(*idx[0].indices(n_rows)))
  return np.asarray(sorted(rows), np.int64)


def put_global(x, sharding) -> jax.Array:
  """A global array from host data that every process holds in full (and identically)."""
  return jax.device_put(np.asarray(x), sharding)


def put_local_rows(x_local, sharding, global_shape) -> jax.Array:
  """A global array of `global_shape` from this process's rows (`local_rows` order)."""
  x_local = np.asarray(x_local)
  if jax.process_count() == 1:
    return jax.device_put(x_local, sharding)
  return jax.make_array_from_process_local_data(sharding, x_local, tuple(global_shape))


def fetch_local_rows(x: jax.Array) -> np.ndarray:
  """This process's rows of a row-sharded global array (`local_rows` order), as numpy."""
  if x.is_fully_addressable:
    return np.asarray(x)
  rows = local_rows(x.sharding, x.shape[0], x.ndim)
  out = np.empty((len(rows),) + x.shape[1:], x.dtype)
  where = {int(r): i for i, r in enumerate(rows)}
  for shard in x.addressable_shards:
    sl = shard.index[0].indices(x.shape[0])
    pos = [where[r] for r in range(*sl)]
    out[pos] = np.asarray(shard.data)
  return out


def fetch(x: jax.Array) -> np.ndarray:
  """The whole value of a global array on every process (a collective when it is not local)."""
  if x.is_fully_addressable or x.is_fully_replicated:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather_rows(rows: np.ndarray, values, n_rows: int) -> np.ndarray:
  """The full [n_rows, ...] host array from every process's (rows, values); each process
  must pass the same number of rows (uniform batch shardings do)."""
  values = np.asarray(values)
  if jax.process_count() == 1:
    if len(rows) != n_rows:
      raise ValueError(f"one process holds {len(rows)} of {n_rows} rows")
    return values[np.argsort(rows)]
  all_rows, all_values = allgather(np.asarray(rows, np.int64)), allgather(values)
  out = np.zeros((n_rows,) + values.shape[1:], values.dtype)
  seen = np.zeros(n_rows, bool)
  for r, v in zip(all_rows, all_values):
    out[r], seen[r] = v, True
  if not seen.all():
    raise ValueError(f"rows {np.flatnonzero(~seen)[:8].tolist()} are held by no process")
  return out
