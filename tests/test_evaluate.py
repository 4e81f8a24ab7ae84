"""Evaluation: bootstrap CIs, accuracy arithmetic on a tiny random model, table, atomic writes."""

import json
import types

import numpy as np
import pytest

from cooper_jax import evaluate as ev
from cooper_jax import io, stats


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
