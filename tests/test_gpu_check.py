"""tools/gpu_check.py at tiny size on the CPU: every stage's record, the resume verdict and the
summary; a failing stage reported failed, the exit status 1, the other stages' records kept."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = [
  "--config",
  "experiments/tiny.py",
  "--size",
  "as_config",
  "--steps",
  "2",
  "--eval_limit",
  "2",
  "--eval_new_tokens",
  "8",
  "--eval_batch",
  "2",
  "--bench_args=--quick --only checkpoint --runs 1",
  "--allow_cpu",
  "--cap_scale",
  "8",
  "--budget_s",
  "1800",
]


def gpu_check(out: Path, *args) -> subprocess.CompletedProcess:
  cmd = [sys.executable, "tools/gpu_check.py", *TINY, "--out", str(out / "records")]
  cmd += ["--workdir", str(out / "runs"), *args]
  # One device: the tiny cooper config's 2 prompts a step do not split over conftest's 8.
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1900)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_check")
  r = gpu_check(out)
  return r, out / "records"


def test_every_stage_passes_and_says_so(full_run):
  r, rec = full_run
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  stages = json.loads((rec / "gpu_check.json").read_text())["stages"]
  assert list(stages) == ["env", "rule", "static_rm", "cooper", "resume", "eval", "bench"]
  assert {n: s["status"] for n, s in stages.items()} == dict.fromkeys(stages, "ok")
  assert stages["env"]["backend"] == "cpu" and stages["env"]["jax"]
  assert (rec / "env" / "nvidia-smi.txt").exists() and (rec / "env" / "jax.json").exists()
  for mode, steps in (("rule", [1, 2]), ("static_rm", [1, 2]), ("cooper", [1, 1])):
    assert stages[mode]["step_range"] == steps, stages[mode]
    assert 0.0 <= stages[mode]["rule_acc_last"] <= 1.0
    assert (rec / mode / "metrics.jsonl").exists() and (rec / mode / "starts" / "0.json").exists()
  assert stages["rule"]["steps_per_s"] > 0 and stages["rule"]["new_tokens_per_s"] > 0
  for name in stages:
    assert (rec / name / "log.txt").exists() and stages[name]["wall_s"] > 0


def test_the_resume_is_checked_and_recorded(full_run):
  _, rec = full_run
  verdict = json.loads((rec / "resume" / "verdict.json").read_text())
  assert verdict["verdict"] is True and all(verdict["checks"].values()), verdict["checks"]
  assert verdict["step_range"] == [2, 2]
  start = json.loads((rec / "cooper" / "starts" / "1.json").read_text())
  assert start["step"] == 1 and start["changed"] == {}
  assert "log: resumed at step 1" in verdict["checks"]


def test_eval_bench_and_the_summary_table(full_run):
  _, rec = full_run
  assert json.loads((rec / "eval" / "results.json").read_text())["benchmarks"]["gsm8k/test"]
  assert json.loads((rec / "bench" / "bench.json").read_text())["figures"]
  md = (rec / "gpu_check.md").read_text()
  for row in ("| env | ok |", "| rule | ok |", "| static_rm | ok |", "| cooper | ok |"):
    assert row in md
  assert "| resume | ok |" in md and "| eval | ok |" in md and "| bench | ok |" in md
  assert "## Resume: PASS" in md and "gsm8k/test" in md and "checkpoint save" in md
  assert md.rstrip().endswith("Result: every stage passed")


def test_a_failing_stage_is_reported_and_the_others_are_kept(tmp_path):
  """static_rm given a misspelt optimizer fails; env before it and bench after it still run
  and keep their records; the exit status is 1 and the summary names the failed stage."""
  r = gpu_check(
    tmp_path, "--stages", "env,static_rm,bench", "--set", "static_rm:rm.optim.name=lino"
  )
  assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
  rec = tmp_path / "records"
  stages = json.loads((rec / "gpu_check.json").read_text())["stages"]
  assert stages["static_rm"]["status"] == "failed: exit 1"
  assert "rm.optim.name='lino'" in (rec / "static_rm" / "log.txt").read_text()
  assert stages["env"]["status"] == "ok" and (rec / "env" / "jax.json").exists()
  assert stages["bench"]["status"] == "ok" and (rec / "bench" / "bench.json").exists()
  md = (rec / "gpu_check.md").read_text()
  assert "| static_rm | failed: exit 1 |" in md and "Result: FAILED: static_rm" in md
