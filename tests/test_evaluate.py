"""Evaluation: bootstrap CIs, accuracy arithmetic on a tiny random model, table, atomic writes."""

import io as io_lib
import json
import logging
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import evaluate as ev
from cooper_jax import io, stats
from cooper_jax.checkpoint import CheckpointStore, model_cfg_to_meta
from cooper_jax.cli import evaluate as ev_cli
from cooper_jax.weights import load_pretrained


def test_bootstrap_ci_all_ones_and_zeros():
  assert stats.bootstrap_ci(np.ones(50)) == (1.0, 1.0)
  assert stats.bootstrap_ci(np.zeros(50)) == (0.0, 0.0)


def test_bootstrap_ci_half():
  n = 400
  x = np.array([0.0, 1.0] * (n // 2))
  lo, hi = stats.bootstrap_ci(x, n_resamples=1000, seed=0)
  assert lo < 0.5 < hi
  expected = 2 * 1.96 * np.sqrt(0.25 / n)
  assert abs((hi - lo) - expected) < 0.3 * expected
  assert stats.bootstrap_ci(x, seed=3) == stats.bootstrap_ci(x, seed=3)  # seeded


def test_bootstrap_ci_average_contains_mean():
  a, b = np.array([0.0, 1.0] * 100), np.ones(50)
  lo, hi = stats.bootstrap_ci_average([a, b])
  assert lo < 0.75 < hi and hi <= 1.0


class StubVerifier:
  """Correct exactly at the given rollout indexes; records what it was asked."""

  def __init__(self, correct_idx):
    self.correct_idx = set(correct_idx)
    self.calls = []

  def verify(self, completions, references, deadline_s=5.0):
    self.calls.append((list(completions), list(references)))
    n = len(completions)
    correct = np.array([i in self.correct_idx for i in range(n)])
    status = ["ok" if i % 3 else "no_answer" for i in range(n)]
    counts = {s: status.count(s) for s in ("ok", "no_answer", "timeout", "error")}
    return types.SimpleNamespace(
      correct=correct, status=status, pred=[None] * n, counts=counts, worker_restarts=0
    )


@pytest.fixture(scope="module")
def tiny(tiny_smol):
  return tiny_smol


def test_evaluate_model_arithmetic_and_structure(tiny):
  cfg, params, tok = tiny
  rows = [
    {"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)
  ]
  # rollouts are problem-major: problem 0 -> 0,1; problem 1 -> 2,3; problem 2 -> 4,5
  stub = StubVerifier({0, 1, 2})
  res = ev.evaluate_model(
    cfg,
    params,
    tok,
    {"toy": rows, "toy2": rows[:2]},
    samples=2,
    temperature=0.7,
    top_p=0.95,
    max_new_tokens=4,
    batch_size=4,
    seed=0,
    verifier=stub,
  )
  b = res["benchmarks"]["toy"]
  assert b["per_problem_acc"] == [1.0, 0.5, 0.0]
  assert b["per_problem_correct"] == [[1, 1], [1, 0], [0, 0]]
  assert b["accuracy"] == pytest.approx(0.5)
  assert b["ids"] == ["q0", "q1", "q2"]
  assert b["rollouts"] == 6 and b["batch_shape"][0] == 4  # 6 rollouts -> 2 batches of 4
  assert b["counts"]["no_answer"] == 2 and b["counts"]["ok"] == 4  # passed through
  lo, hi = b["ci95"]
  assert 0.0 <= lo <= 0.5 <= hi <= 1.0
  b2 = res["benchmarks"]["toy2"]
  assert b2["per_problem_acc"] == [1.0, 0.5]  # 4 rollouts, one batch
  assert res["average"]["accuracy"] == pytest.approx((0.5 + 0.75) / 2)
  # references follow the problem-major rollout order; dummy pad rows never reach the verifier
  assert stub.calls[0][1] == ["0", "0", "2", "2", "4", "4"]
  assert len(stub.calls[1][0]) == 4
  tp = b["throughput"]
  assert tp["new_tokens"] <= 6 * 4 and tp["sample_s"] > 0
  assert 0 <= b["mean_response_tokens"] <= 4
  recs = res["records"]["toy"]
  assert [(r["id"], r["sample"], r["correct"]) for r in recs] == [
    ("q0", 0, True),
    ("q0", 1, True),
    ("q1", 0, True),
    ("q1", 1, False),
    ("q2", 0, False),
    ("q2", 1, False),
  ]
  json.dumps({k: v for k, v in res.items() if k != "records"}, allow_nan=False)

  # Same shapes again (periodic eval): cached executable, no compile time.
  res2 = ev.evaluate_model(
    cfg,
    params,
    tok,
    {"toy": rows},
    samples=2,
    temperature=0.7,
    top_p=0.95,
    max_new_tokens=4,
    batch_size=4,
    seed=0,
    verifier=StubVerifier(set()),
  )
  assert res2["benchmarks"]["toy"]["throughput"]["compile_s"] == 0.0
  assert res2["benchmarks"]["toy"]["accuracy"] == 0.0
  assert res2["records"]["toy"][0]["completion"] == recs[0]["completion"]  # seeded


def test_greedy(tiny):
  cfg, params, tok = tiny
  rows = [{"id": "a", "question": "1+1?", "answer": "2"}]
  res = ev.evaluate_model(
    cfg,
    params,
    tok,
    {"g": rows},
    samples=2,
    temperature=0.0,
    top_p=1.0,
    max_new_tokens=3,
    batch_size=2,
    verifier=StubVerifier({0}),
  )
  recs = res["records"]["g"]
  assert recs[0]["completion"] == recs[1]["completion"]
  assert res["benchmarks"]["g"]["accuracy"] == 0.5


def _fake_results():
  return {
    "benchmarks": {
      "gsm8k/test": {"accuracy": 0.7412, "ci95": [0.7, 0.78]},
      "svamp/test": {"accuracy": 0.5, "ci95": [0.45, 0.551]},
    },
    "average": {"accuracy": 0.6206, "ci95": [0.59, 0.65]},
    "records": {"gsm8k/test": [{"id": "x", "sample": 0, "completion": "c"}]},
  }


def test_format_table():
  t = ev.format_table(_fake_results(), "SmolLM2")
  lines = t.strip().splitlines()
  assert lines[0] == "| model | gsm8k/test | svamp/test | avg |"
  assert lines[1] == "|---|---|---|---|"
  assert lines[2] == (
    "| SmolLM2 | 74.12 (70.00-78.00) | 50.00 (45.00-55.10) | 62.06 (59.00-65.00) |"
  )


def test_atomic_write_leaves_no_partial_file(tmp_path):
  target = tmp_path / "results.json"

  def broken(f):
    f.write('{"partial": ')
    raise RuntimeError("boom")

  with pytest.raises(RuntimeError):
    io.atomic_write(target, broken)
  assert not target.exists() and list(tmp_path.iterdir()) == []

  io.atomic_write_json(target, {"a": 1})
  with pytest.raises(RuntimeError):
    io.atomic_write(target, broken)
  assert json.loads(target.read_text()) == {"a": 1}  # old content intact
  with pytest.raises((TypeError, ValueError)):
    io.atomic_write_json(target, {"a": object()})
  with pytest.raises(ValueError):
    io.atomic_write_json(target, {"a": float("nan")})
  assert json.loads(target.read_text()) == {"a": 1}
  assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_write_outputs(tmp_path):
  paths = ev.write_outputs(_fake_results(), tmp_path / "out", "m")
  summary = json.loads(open(paths["results"]).read())
  assert "records" not in summary and summary["label"] == "m"
  assert json.loads(open(paths["samples"]).read().splitlines()[0])["id"] == "x"
  assert "74.12 (70.00-78.00)" in open(paths["table"]).read()


# ---------------------------------------------------------------------------------- the CLI
SMALL = Path(__file__).resolve().parents[1] / "experiments" / "assets" / "small_task"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
  """A run folder whose checkpoints hold the shipped small-task policy at step 1 and the same
  policy with every weight zeroed at step 2 (greedy decoding then emits token 0 throughout)."""
  cfg, params = load_pretrained(str(SMALL / "policy"))
  run = tmp_path_factory.mktemp("run")
  store = CheckpointStore(run / "checkpoints")
  meta = {"policy_model": model_cfg_to_meta(cfg), "tokenizer": str(SMALL / "policy")}
  store.save(1, {"params": params}, None, meta)
  store.save(2, {"params": jax.tree.map(jnp.zeros_like, params)}, None, meta)
  store.close()
  return run


def test_resolve_checkpoint_run_folder_step_folder_and_step(small_run):
  ck = small_run / "checkpoints"
  assert ev.resolve_checkpoint(str(small_run)) == (small_run, ck, 2)  # newest
  assert ev.resolve_checkpoint(str(ck)) == (small_run, ck, 2)
  assert ev.resolve_checkpoint(str(small_run), 1) == (small_run, ck, 1)
  assert ev.resolve_checkpoint(str(ck / "1")) == (small_run, ck, 1)  # a step folder
  assert ev.resolve_checkpoint(str(ck / "1"), 1) == (small_run, ck, 1)
  with pytest.raises(ValueError, match=r"is step 1 but --step is 2"):
    ev.resolve_checkpoint(str(ck / "1"), 2)
  with pytest.raises(ValueError, match=r"--step 3: .* holds steps \[1, 2\]"):
    ev.resolve_checkpoint(str(small_run), 3)
  with pytest.raises(FileNotFoundError, match="no such directory"):
    ev.resolve_checkpoint(str(small_run / "nope"))
  assert ev_cli.default_out(None, str(ck / "1")) == small_run / "eval" / "step_1"
  assert ev_cli.default_out("./experiments/assets/x/policy", None) == Path(
    "eval/experiments_assets_x_policy"
  )


def _samples(out_dir):
  return [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]


def test_cli_defaults_step_folder_and_paper_preset(small_run, tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  bench = ["--benchmarks", str(SMALL / "data" / "test.jsonl"), "--limit", "3"]
  ev_cli.main(
    ["--checkpoint", str(small_run / "checkpoints" / "1"), "--max_new_tokens", "24", *bench]
  )
  out1 = small_run / "eval" / "step_1"
  cfg1 = json.loads((out1 / "results.json").read_text())["config"]
  # the quick preset, one explicit override, the step recorded
  assert (cfg1["samples"], cfg1["temperature"], cfg1["batch_size"]) == (1, 0.0, 16)
  assert (cfg1["max_new_tokens"], cfg1["preset"], cfg1["step"]) == (24, "quick", 1)
  # the same weights as the shipped policy: its greedy completions, word for word
  ev_cli.main(["--model", str(SMALL / "policy"), "--max_new_tokens", "24", *bench])
  by_model = _samples(tmp_path / "eval" / ev_cli.default_out(str(SMALL / "policy"), None).name)
  assert [r["completion"] for r in _samples(out1)] == [r["completion"] for r in by_model]
  assert any("answer" in r["completion"] for r in by_model)  # a real policy's text

  ev_cli.main(
    ["--checkpoint", str(small_run), "--preset", "paper", "--max_new_tokens", "4", *bench]
  )
  out2 = small_run / "eval" / "step_2"  # the newest step
  cfg2 = json.loads((out2 / "results.json").read_text())["config"]
  assert (cfg2["samples"], cfg2["temperature"], cfg2["top_p"]) == (8, 0.7, 0.95)
  assert (cfg2["batch_size"], cfg2["step"]) == (64, 2)
  assert len(_samples(out2)) == 3 * 8
  assert {r["completion"] for r in _samples(out2)}.isdisjoint(r["completion"] for r in by_model)
  with pytest.raises(SystemExit):
    ev_cli.main(["--model", str(SMALL / "policy"), "--step", "1", *bench])
  assert "--step selects a checkpoint step" in capsys.readouterr().err


def test_progress_is_plain_log_lines_off_a_terminal(caplog):
  stream = io_lib.StringIO()  # not a terminal
  with caplog.at_level(logging.INFO, logger=ev.logger.name):
    p = ev.Progress("toy", 6, stream=stream)
    p.update(4, 100, 2.0)
    p.update(2, 50, 3.0)
    p.close()
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sample toy")]
  assert len(lines) == 2 and "4/6 rollouts, 50 new tok/s" in lines[0]
  assert "6/6 rollouts, 50 new tok/s" in lines[1]
  assert stream.getvalue() == ""  # no bar, no carriage returns
