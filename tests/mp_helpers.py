"""Several `python -m cooper_jax.train` processes on this CPU, joined by jax.distributed on
localhost, as a user starts one per host: launching, waiting, reading a checkpoint step back.
Used by test_multiprocess.py and test_gcs.py."""

import os
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import free_port, train_cmd

from cooper_jax.paths import as_path

ROOT = Path(__file__).resolve().parents[1]
# 4 prompts x G=4: every process holds whole groups and the RM pairs split over data=4.
COMMON = ("--config.rollout.prompts_per_step=4", "--config.train.max_to_keep=10")
# Long enough that a process starved of CPU (4 JAX processes and 2 pytest workers on CI's 2
# cores) is not declared dead: at 10 s CI lost a 2-process test to an abort at step 1-2, and at
# 30 s a clean-clone run lost test_gcs's 2-process run at step 1 (the other pytest worker then
# ran small-task tests whose RM update overlaps their sampler: two busy threads).
HEARTBEAT_S = 60


def dist_flags(i, port, n_proc) -> list[str]:
  """Process i's --config.distributed flags (none for a single process)."""
  if n_proc == 1:
    return []
  return [
    f"--config.distributed.coordinator_address=localhost:{port}",
    f"--config.distributed.num_processes={n_proc}",
    f"--config.distributed.process_id={i}",
    f"--config.distributed.heartbeat_timeout_s={HEARTBEAT_S}",
    "--config.distributed.initialization_timeout_s=120",
  ]


def _logfile(workdir, i) -> Path:
  """Process i's log: next to a local workdir; for a gs:// one, in the temp directory under
  the URI's name."""
  w = str(workdir)
  if w.startswith("gs://"):
    return Path(tempfile.gettempdir()) / f"{w.replace('://', '_').replace('/', '_')}.p{i}.log"
  return Path(f"{w}.p{i}.log")


def spawn(workdir, n_proc, devices, cmd, env=None):
  """Starts n_proc processes `cmd(i, port)` (devices CPU devices each, logs next to
  workdir, extra environment `env`); returns the Popens."""
  full = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    ALLOW_MULTIPLE_LIBTPU_LOAD="1",
    **(env or {}),
    # XLA aborts a process whose local device threads meet at a collective more than 40 s
    # apart (the default); a starved CI machine is not a hung program.
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}"
    " --xla_cpu_collective_call_terminate_timeout_seconds=600",
  )
  port = free_port()
  procs = []
  for i in range(n_proc):
    log = open(_logfile(workdir, i), "w")  # pylint: disable=consider-using-with
    procs.append(
      subprocess.Popen(
        cmd(i, port), cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT, text=True
      )
    )
  return procs


def launch(workdir, n_proc, devices, *overrides, steps, env=None):
  """Starts n_proc training processes of the tiny config; returns the Popens."""

  def cmd(i, port):
    return train_cmd(workdir, steps, *COMMON, *overrides) + dist_flags(i, port, n_proc)

  return spawn(workdir, n_proc, devices, cmd, env)


def log(workdir, i) -> str:
  return _logfile(workdir, i).read_text()


_ERROR_MARKS = ("error", "fatal", "heartbeat", "gloo", "check failed", "terminat", "abort")


def why(workdir, i) -> str:
  """Process i's log for a failure message: its lines that name an error (a fatal abort prints
  them above a long thread dump), then its last 1500 characters."""
  text = log(workdir, i)
  marked = [l for l in text.splitlines() if any(m in l.lower() for m in _ERROR_MARKS)]
  return "\n".join(marked[:30]) + "\n...\n" + text[-1500:]


def wait(procs, workdir, timeout=240):
  deadline = time.time() + timeout
  for p in procs:
    try:
      p.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail(f"timed out; log of process 0:\n{why(workdir, 0)}")
  for i, p in enumerate(procs):
    assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{why(workdir, i)}"


def run(workdir, n_proc, devices, *overrides, steps, env=None):
  wait(launch(workdir, n_proc, devices, *overrides, steps=steps, env=env), workdir)


def params(workdir, step, items=("policy", "rm")):
  """The policy and RM states (`items`) of one checkpoint step (local or gs://), on this
  process's first device (the checkpoint may come from another topology)."""
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  out = {}
  with ocp.StandardCheckpointer() as ck:
    for item in items:
      path = as_path(workdir) / "checkpoints" / str(step) / item
      tree = ck.metadata(path).item_metadata.tree
      target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), tree)
      out[item] = jax.tree.map(np.asarray, ck.restore(path, target))
  return out
