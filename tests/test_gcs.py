"""gs:// run directories for real: the tiny config trained with `--workdir gs://<bucket>/run`
against a local GCS server (tests/gcs_emulator.py), killed with SIGKILL mid-run and restarted;
metrics, saved rollouts and final parameters must equal a local run's exactly, and metrics,
config, manifests and Orbax checkpoints must be objects in the bucket. And several writers: a
2-process run writing one bucket equals the same run on a local directory."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import comparable, final_params, free_port, train_cmd
from gcs_emulator import client_env
from mp_helpers import params, run

from cooper_jax.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "cooper-test"
STEPS = 4


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """(port, env for the clients): the emulator serving BUCKET for this module. This process
  reads the bucket too, so the env is set here, before gcsfs is imported if it has not been
  (gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT at import; if it was imported already, its
  plain filesystem class is registered for gs:// instead)."""
  for mod in ("gcsfs", "gcp_storage_emulator"):
    if importlib.util.find_spec(mod) is None:
      pytest.skip(f"{mod} not installed")
  port = free_port()
  mp = pytest.MonkeyPatch()
  for k, v in client_env(port).items():
    mp.setenv(k, v)
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  with open(log, "w", encoding="utf-8") as out:
    proc = subprocess.Popen(
      [
        sys.executable,
        str(ROOT / "tests" / "gcs_emulator.py"),
        "--port",
        str(port),
        "--bucket",
        BUCKET,
      ],
      stdout=out,
      stderr=subprocess.STDOUT,
    )
  deadline = time.time() + 60
  while True:
    try:
      urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)  # its health check
      break
    except OSError:
      if time.time() > deadline or proc.poll() is not None:
        proc.kill()
        pytest.fail(f"GCS emulator did not start: {log.read_text()[-2000:]}")
      time.sleep(0.2)
  if "gcsfs" in sys.modules:  # imported earlier, perhaps with the bucket-type lookup on
    import fsspec  # pylint: disable=import-outside-toplevel
    import gcsfs  # pylint: disable=import-outside-toplevel

    for proto in ("gs", "gcs"):
      fsspec.register_implementation(proto, gcsfs.core.GCSFileSystem, clobber=True)
  yield port, client_env(port)
  proc.kill()
  proc.wait()
  mp.undo()


def _env(gcs_env):
  return dict(os.environ, **gcs_env, XLA_FLAGS="--xla_force_host_platform_device_count=1")


def _run(workdir, env, steps=STEPS, wait=True):
  cmd = train_cmd(
    workdir, steps, "--config.train.checkpoint_every=1", "--config.train.save_rollouts=3"
  )
  if not wait:
    return subprocess.Popen(
      cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
  p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return p


def test_killed_gs_run_resumes_to_the_local_runs_parameters(gcs, tmp_path):
  _, env = gcs
  import gcsfs  # pylint: disable=import-outside-toplevel

  fs = gcsfs.core.GCSFileSystem(token="anon")
  local, remote = tmp_path / "local", f"gs://{BUCKET}/run"
  _run(local, _env({}))

  proc = _run(remote, _env(env), wait=False)
  metrics = f"{BUCKET}/run/metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if fs.exists(metrics) and len(fs.cat(metrics).splitlines()) >= 2:
      break
    fs.invalidate_cache()
    time.sleep(0.1)
  assert proc.poll() is None, (
    "the gs:// run ended before it could be killed:\n" + proc.stdout.read()[-3000:]
  )
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  fs.invalidate_cache()
  left = sorted(
    int(p.rsplit("/", 1)[1])
    for p in fs.ls(f"{BUCKET}/run/checkpoints")
    if p.rsplit("/", 1)[1].isdigit()
  )
  print(f"killed after {len(fs.cat(metrics).splitlines())} steps; steps in the bucket: {left}")
  assert left and max(left) < STEPS

  p = _run(remote, _env(env))
  assert "resumed from" in p.stderr, p.stderr[-3000:]
  fs.invalidate_cache()
  for name in ("config.json", "metrics.jsonl", f"checkpoints/{STEPS}/cooper_manifest.json"):
    assert fs.exists(f"{BUCKET}/run/{name}"), name
  manifest = json.loads(fs.cat(f"{BUCKET}/run/checkpoints/{STEPS}/cooper_manifest.json"))
  assert any(k.startswith("policy/") for k in manifest) and any(
    k.startswith("rm/") for k in manifest
  )
  assert not list(Path.cwd().glob(f"{BUCKET}*")), "a gs:// path was written as a local directory"

  # rollouts.jsonl: the restart rewrote the steps after its checkpoint, no duplicates
  saved = [json.loads(l) for l in fs.cat(f"{BUCKET}/run/rollouts.jsonl").splitlines()]
  assert [(r["step"], r["row"]) for r in saved] == [
    (s, i) for s in range(1, STEPS + 1) for i in range(3)
  ]
  assert saved == [json.loads(l) for l in (local / "rollouts.jsonl").read_text().splitlines()]
  rows = read_metrics(remote)
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
  assert comparable(rows) == comparable(read_metrics(local))
  (sa, pa), (sb, pb) = final_params(local), final_params(remote)
  assert sa == sb == STEPS
  import jax  # pylint: disable=import-outside-toplevel

  jax.tree.map(np.testing.assert_array_equal, pa, pb)
  assert float(rows[0]["policy/grad_norm"]) > 0  # training moved the policy


def test_two_processes_write_one_bucket_as_they_write_a_local_directory(gcs, tmp_path):
  """Several writers: 2 processes x 2 devices (a 2-host slice in miniature) with the run
  directory in the bucket. Each process writes its own shards of every checkpoint through
  tensorstore and the primary the rest; the run must equal the same 2-process run on a local
  directory step for step and bit for bit, every checkpoint step complete in the bucket."""
  _, env = gcs
  import gcsfs  # pylint: disable=import-outside-toplevel

  local, remote, steps = tmp_path / "two", f"gs://{BUCKET}/two", 3
  every = ("--config.train.checkpoint_every=1",)
  run(local, 2, 2, *every, steps=steps)
  run(remote, 2, 2, *every, steps=steps, env=env)
  fs = gcsfs.core.GCSFileSystem(token="anon")
  fs.invalidate_cache()
  names = {p.rsplit("/", 1)[1] for p in fs.ls(f"{BUCKET}/two/checkpoints")}
  assert {str(s) for s in range(1, steps + 1)} <= names, names
  for s in range(1, steps + 1):
    assert fs.exists(f"{BUCKET}/two/checkpoints/{s}/cooper_manifest.json"), s
  # Both processes wrote data of their own (Orbax's OCDBT store per process) into the bucket.
  objs = fs.find(f"{BUCKET}/two/checkpoints/{steps}/policy")
  for i in range(2):
    assert any(f"/ocdbt.process_{i}/d/" in o for o in objs), (i, objs)
  rows = read_metrics(remote)
  assert [r["step"] for r in rows] == list(range(1, steps + 1))  # the primary's lines only
  assert comparable(rows) == comparable(read_metrics(local))
  import jax  # pylint: disable=import-outside-toplevel

  jax.tree.map(np.testing.assert_array_equal, params(local, steps), params(remote, steps))
