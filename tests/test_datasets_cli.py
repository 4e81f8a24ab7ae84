"""Datasets in the `datasets` format reach the train and evaluate CLIs by name alone:
NAME:SPLIT / NAME:SUBSET:SPLIT in `config.data.train` / `config.data.eval` and `--benchmarks`
(a hub name for users; here local folders, since tests have no hub)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from test_data import write_datasets_folders

from cooper_jax.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")


def _run(args, cwd=ROOT):
  p = subprocess.run(
    [sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600
  )
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return p


def test_train_and_evaluate_clis_read_datasets_folders(tmp_path):
  saved, repo = write_datasets_folders(tmp_path)
  run = tmp_path / "run"
  _run(
    [
      "-m",
      "cooper_jax.train",
      f"--config={ROOT / 'experiments' / 'small_task.py'}:rule",
      f"--workdir={run}",
      f"--config.data.train={repo}:other:train",  # a subset and a split
      f"--config.data.eval={saved}:test",
      "--config.data.eval_limit=0",
      "--config.train.steps=1",
      "--config.train.eval_every=1",
      "--config.train.eval_max_new_tokens=8",
      "--config.rollout.prompts_per_step=2",
      "--config.rollout.group_size=2",
      "--config.rollout.max_new_tokens=8",
    ]
  )
  rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
  assert {r["question"] for r in rollouts} == {"other-train 0", "other-train 1"}
  (m,) = [r for r in read_metrics(run) if r["step"] == 1]
  assert "eval/acc" in m  # the eval split was loaded and sampled

  out = tmp_path / "eval"
  _run(
    [
      "-m",
      "cooper_jax.evaluate",
      "--model",
      str(ROOT / "experiments" / "assets" / "small_task" / "policy"),
      "--benchmarks",
      f"{repo}:main:test,{saved}:test",
      "--samples",
      "1",
      "--temperature",
      "0",
      "--max_new_tokens",
      "8",
      "--pad_multiple",
      "8",
      "--out",
      str(out),
    ]
  )
  res = json.loads((out / "results.json").read_text())
  n = {name: b["n_problems"] for name, b in res["benchmarks"].items()}
  assert n == {f"{repo}:main:test": 4, f"{saved}:test": 3}
