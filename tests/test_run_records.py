"""What a run directory records and what a restart may do with it: the config check on resume,
one config record per start, TensorBoard cut back to the resumed step, Ctrl-C handled like
SIGTERM, and a start that cannot run writing nothing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cooper_jax import run_records
from cooper_jax.config import load_config
from cooper_jax.metrics import MetricsWriter, _event_records, read_metrics, truncate_events

ROOT = Path(__file__).resolve().parents[1]
SMALL = str(ROOT / "experiments" / "small_task.py")


def _small_config(*overrides):
  return load_config(f"{SMALL}:cooper", ["train.eval_every=0", *overrides])


def test_differences_name_each_key_and_leave_out_the_ones_that_may_differ():
  old = {"policy": {"optim": {"lr": 1e-3}}, "train": {"stop_after": 0, "steps": 4}, "seed": 0}
  new = {"policy": {"optim": {"lr": 5e-2}}, "train": {"stop_after": 2, "steps": 4}, "seed": 0}
  new["distributed"] = {"process_id": 1}  # per process: never compared
  new["rollout"] = {"top_k": 0}  # a key the old record lacks (a code change): not refused
  changed, added, removed = run_records.differences(old, new)
  assert changed == {"policy.optim.lr": (1e-3, 5e-2)}
  assert added == ["rollout.top_k"] and removed == []


def test_a_restart_is_compared_with_the_newest_record(tmp_path):
  """The record of each start is kept (config.json: the first's); a changed key is refused
  naming old and new value, unless allowed; keys in MAY_DIFFER pass."""
  c = _small_config()
  assert run_records.check_restart(c, tmp_path) is None  # a new workdir
  run_records.write_start(c, tmp_path, 0, None)
  first = (tmp_path / "config.json").read_text()
  assert run_records.check_restart(_small_config("train.stop_after=50"), tmp_path) == {}
  with pytest.raises(run_records.ConfigChanged) as e:
    run_records.check_restart(_small_config("policy.optim.lr=5e-2", "seed=3"), tmp_path)
  msg = str(e.value)
  # the small task's RM lr is 10x the policy's (a reference): it moves with it, and says so
  assert "policy.optim.lr: 0.0001 -> 0.05" in msg and "rm.optim.lr: 0.001 -> 0.5" in msg
  assert "seed: 0 -> 3" in msg and "allow_config_change" in msg
  allowed = _small_config("policy.optim.lr=5e-2", "train.allow_config_change=True")
  assert run_records.check_restart(allowed, tmp_path) == {
    "policy.optim.lr": [1e-4, 5e-2],
    "rm.optim.lr": [1e-3, 0.5],
  }
  run_records.write_start(allowed, tmp_path, 7, {"policy.optim.lr": [1e-4, 5e-2]})
  assert (tmp_path / "config.json").read_text() == first  # never overwritten
  records = [json.loads((tmp_path / "starts" / f"{k}.json").read_text()) for k in (0, 1)]
  assert [r["step"] for r in records] == [0, 7]
  assert [r["config"]["policy"]["optim"]["lr"] for r in records] == [1e-4, 5e-2]
  # The next restart is compared with the newest record: the new lr is now the run's.
  assert run_records.check_restart(_small_config("policy.optim.lr=5e-2"), tmp_path) == {}
  with pytest.raises(run_records.ConfigChanged, match="policy.optim.lr: 0.05 -> 0.0001"):
    run_records.check_restart(_small_config(), tmp_path)


def _tb_steps(tb_dir) -> list[int]:
  """Steps of every scalar event in a TensorBoard directory, read back from the files."""
  from tensorboardX.proto.event_pb2 import Event  # pylint: disable=import-outside-toplevel

  steps = []
  for f in sorted(Path(tb_dir).iterdir()):
    data = f.read_bytes()
    for _, rec in _event_records(data):
      ev = Event.FromString(rec[12:-4])
      steps += [ev.step for v in ev.summary.value if v.tag == "policy/lr"]
  return sorted(steps)


def test_tensorboard_is_cut_back_to_the_resumed_step(tmp_path):
  """A run killed after step 5 whose last checkpoint is step 3: the restart's writer drops the
  events of steps 4-5 (metrics.jsonl drops their lines), so every step has one point."""
  w = MetricsWriter(tmp_path)
  for step in range(1, 6):
    w.write(step, {"policy/lr": 0.1 * step})
  w.close()
  assert _tb_steps(tmp_path / "tensorboard") == [1, 2, 3, 4, 5]
  w = MetricsWriter(tmp_path, resume_step=3)
  for step in (4, 5, 6):
    w.write(step, {"policy/lr": 0.1 * step})
  w.close()
  assert _tb_steps(tmp_path / "tensorboard") == [1, 2, 3, 4, 5, 6]
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]


def test_an_event_cut_short_by_a_kill_is_dropped(tmp_path):
  w = MetricsWriter(tmp_path)
  for step in (1, 2, 3):
    w.write(step, {"policy/lr": 0.1})
  w.close()
  (f,) = (tmp_path / "tensorboard").glob("*tfevents*")
  f.write_bytes(f.read_bytes()[:-7])  # step 3's record, half written
  assert truncate_events(tmp_path / "tensorboard", 10) == 0  # nothing after step 10
  assert _tb_steps(tmp_path / "tensorboard") == [1, 2]


@pytest.mark.parametrize(
  "override,needle",
  [
    ("policy.model=/nonexistent/policy", "/nonexistent/policy"),
    ("pairs.negatives=no_such_module:Negatives", "no_such_module"),
  ],
)
def test_a_start_that_cannot_run_writes_nothing(tmp_path, override, needle):
  from cooper_jax.train import train  # pylint: disable=import-outside-toplevel

  workdir = tmp_path / "run"
  with pytest.raises(Exception, match=needle):
    train(_small_config(override), str(workdir))
  assert not workdir.exists()


def _launch(workdir, *overrides, cond="rule"):  # rule: the smallest step, no RM
  cmd = [
    sys.executable,
    "-m",
    "cooper_jax.train",
    f"--config={SMALL}:{cond}",
    f"--workdir={workdir}",
    "--config.train.eval_every=0",
    "--config.rollout.prompts_per_step=2",
    "--config.rollout.group_size=4",
    "--config.rollout.max_new_tokens=32",
    *overrides,
  ]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  # Its own process group: Ctrl-C in a terminal signals the whole group (the verifier's
  # workers too), as os.killpg does here.
  return subprocess.Popen(
    cmd,
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )


def test_ctrl_c_checkpoints_the_step_and_a_restart_resumes_from_it(tmp_path):
  every = "--config.train.checkpoint_every=1000"
  proc = _launch(tmp_path, "--config.train.steps=200", every)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().strip()):
    time.sleep(0.2)
  os.killpg(proc.pid, signal.SIGINT)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out[-3000:]
  assert "SIGINT: will checkpoint" in out and "stopped by signal" in out
  assert "Traceback" not in out, out[-3000:]
  n = len(read_metrics(tmp_path))
  assert 1 <= n < 200
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [str(n)]
  assert (tmp_path / "checkpoints" / str(n) / "cooper_manifest.json").exists()

  # A restart with another lr is refused before it writes anything, naming the key.
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  p = _launch(tmp_path, "--config.train.steps=200", every, "--config.policy.optim.lr=5e-2")
  out, _ = p.communicate(timeout=300)
  assert p.returncode != 0 and "policy.optim.lr: 0.0001 -> 0.05" in out, out[-3000:]
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before

  # The same run with a stop one step later resumes from the step Ctrl-C saved.
  stop = f"--config.train.stop_after={n + 1}"
  p = _launch(tmp_path, "--config.train.steps=200", every, stop)
  out, _ = p.communicate(timeout=300)
  assert p.returncode == 0 and f"at step {n}" in out, out[-3000:]
  assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, n + 2))
  starts = sorted((tmp_path / "starts").iterdir())
  assert [json.loads(s.read_text())["step"] for s in starts] == [0, n]
  assert np.isfinite(read_metrics(tmp_path)[-1]["policy/grad_norm"])


def test_what_a_cooper_run_leaves(tmp_path):
  """pairs.jsonl (every prompt's pair here, accounted as the step's pair metrics), tokens/s,
  sample texts in TensorBoard, a plain line per step when stderr is not a terminal, no
  transformers notice, and the end print naming every artefact, which exists. The RM update
  runs in its thread (train.overlap_rm_update, on in the small task)."""
  from tensorboardX.proto.event_pb2 import Event  # pylint: disable=import-outside-toplevel

  p = _launch(
    tmp_path,
    "--config.train.steps=2",
    "--config.train.save_pairs=2",
    cond="cooper",
  )
  out, _ = p.communicate(timeout=600)
  assert p.returncode == 0, out[-3000:]
  assert "\r" not in out and "PyTorch was not found" not in out
  assert "step 1/2 | reward" in out and "step 2/2 | reward" in out
  printed = dict(l.split(": ", 1) for l in out.splitlines()[-6:] if ": " in l)
  for what in ("config", "metrics", "rollouts", "pairs", "tensorboard", "checkpoints"):
    assert Path(printed[what].split(" (")[0]).exists(), (what, out[-2000:])
  rows = read_metrics(tmp_path)
  pairs = [json.loads(l) for l in (tmp_path / "pairs.jsonl").read_text().splitlines()]
  assert [r["step"] for r in pairs] == [1, 1, 2, 2]  # all 2 prompts of each step
  assert any(r["accepted"] for r in pairs) and any(r["candidates"] for r in pairs)
  for m in rows:
    mine = [r for r in pairs if r["step"] == m["step"]]
    assert sum(r["accepted"] for r in mine) == m["pairs/n_valid"]
    cands = [c for r in mine for c in r["candidates"]]
    assert len(cands) == m["pairs/negative_tries"]
    for reason in ("same_answer", "no_answer", "timeout", "error", "empty"):
      assert sum(c["reason"] == reason for c in cands) == m[f"pairs/reject_{reason}"]
    assert all(r["accepted"] == (r["reason"] is None) for r in mine)
    assert m["rollout/new_tokens"] == round(m["response/len_mean"] * 8)
    assert m["time/sample_tokens_per_s"] > 0 and m["time/step_tokens_per_s"] > 0
  texts = {}
  for f in (tmp_path / "tensorboard").iterdir():
    for _, rec in _event_records(f.read_bytes()):
      ev = Event.FromString(rec[12:-4])
      for v in ev.summary.value:
        if v.tag.startswith("samples/"):
          texts.setdefault(v.tag.split("/")[1], []).append(ev.step)
  assert sorted(texts.get("rollouts", [])) == [1, 2]
  assert sorted(texts.get("pairs", [])) == [1, 2]


def test_the_transformers_notice_is_silenced_in_every_entry_point():
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
  run = lambda code: subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )
  assert "PyTorch was not found" in run("import transformers").stderr  # the notice exists
  assert "PyTorch was not found" not in run("import cooper_jax, transformers").stderr
