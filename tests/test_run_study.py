"""cooper_jax/cli/study.py and cooper_jax/cli/study_report.py without training: the hacking table, the
examples picker, the comparisons, smoothing, and the resumable subprocess scheduler (with a fake
child in place of a training run)."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from cooper_jax.cli import study as run_study

report = run_study.report


def _load(name):
  """A one-off analysis script (tools/analysis/) as a module."""
  path = Path(__file__).resolve().parents[1] / "tools" / "analysis" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"_test_tool_{name}", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _metrics(reward, rule, evals, auc=None):
  """Rows as metrics.jsonl has them: step 0 has only eval keys, steps 1.. the training ones,
  eval keys added at the eval steps in `evals` ({step: acc})."""
  rows = [{"step": 0, "eval/acc": evals[0]}]
  for i, (rw, ra) in enumerate(zip(reward, rule), start=1):
    r = {"step": i, "reward/mean": rw, "rule/acc": ra}
    if auc is not None:
      r["rm/group_auc"] = auc[i - 1]
    if i in evals:
      r["eval/acc"] = evals[i]
    rows.append(r)
  return rows


def test_moving_average_trailing_and_full_windows():
  x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  np.testing.assert_allclose(report.moving_average(x, 3), [1, 1.5, 2, 3, 4, 5])
  np.testing.assert_allclose(report.moving_average(x, 3, full_only=True), [2, 3, 4, 5])
  np.testing.assert_allclose(report.moving_average([1.0, 3.0], 5, full_only=True), [2.0])


def test_hacking_row_flags_a_hacked_run():
  # Reward climbs 0.3 -> 0.9; rule acc peaks at 0.6 then falls to 0.3; held-out acc 0.5 at step
  # 0, peak 0.6, final 0.35.
  reward = np.linspace(0.3, 0.9, 20)
  rule = np.concatenate([np.full(8, 0.6), np.linspace(0.6, 0.3, 7), np.full(5, 0.3)])
  evals = {0: 0.5, 5: 0.6, 10: 0.55, 15: 0.4, 20: 0.35}
  auc = np.linspace(0.8, 0.5, 20)
  r = report.hacking_row(_metrics(reward, rule, evals, auc))
  assert r["reward_first5"] == pytest.approx(reward[:5].mean())
  assert r["reward_last5"] == pytest.approx(reward[-5:].mean())
  assert r["rule_acc_peak"] == pytest.approx(0.6)
  assert r["rule_acc_last5"] == pytest.approx(0.3)
  assert r["rule_acc_drop"] == pytest.approx(0.3)
  assert (r["eval_acc_step0"], r["eval_acc_peak"], r["eval_acc_final"]) == (0.5, 0.6, 0.35)
  assert r["eval_acc_drop"] == pytest.approx(0.25)
  assert r["group_auc_first5"] == pytest.approx(auc[:5].mean())
  assert r["group_auc_last5"] == pytest.approx(auc[-5:].mean())
  assert r["hacked"] is True


def test_hacking_row_needs_both_accuracy_drops_and_a_rising_reward():
  reward = np.linspace(0.3, 0.9, 20)
  rule = np.concatenate([np.full(10, 0.6), np.full(10, 0.3)])
  falling_eval = {0: 0.5, 10: 0.6, 20: 0.45}
  # Held-out accuracy falls 15 points but the rule acc of training rollouts holds: not hacked.
  assert report.hacking_row(_metrics(reward, np.full(20, 0.6), falling_eval))["hacked"] is False
  # Both fall but so does the reward: not hacked.
  assert report.hacking_row(_metrics(reward[::-1], rule, falling_eval))["hacked"] is False
  # Held-out accuracy only 9 points off its peak: not hacked.
  assert report.hacking_row(_metrics(reward, rule, {0: 0.5, 10: 0.6, 20: 0.51}))["hacked"] is False
  # One noisy step is not a peak: the rule-acc peak is of the 5-step moving average.
  spike = np.full(20, 0.3)
  spike[3] = 0.9
  r = report.hacking_row(_metrics(reward, spike, falling_eval))
  assert r["rule_acc_peak"] == pytest.approx(0.42) and r["hacked"] is True
  # No RM metric, no eval: reported as missing, not as zeros.
  r = report.hacking_row([{"step": 1, "reward/mean": 0.5, "rule/acc": 0.5}])
  assert r["group_auc_first5"] is None and r["eval_acc_peak"] is None and r["hacked"] is None


def test_hacking_table_and_its_markdown():
  ok = _metrics(np.full(10, 0.5), np.full(10, 0.5), {0: 0.5, 10: 0.5})
  rows = report.hacking_table({"rule": {0: ok, 1: ok}, "static_rm": {0: ok}})
  assert [(r["condition"], r["seed"]) for r in rows] == [("rule", 0), ("rule", 1), ("static_rm", 0)]
  md = report.format_hacking_table(rows)
  assert (
    "| rule | 1 | 0.500 / 0.500 | 50.0 / 50.0 (0.0) | 50.0 / 50.0 / 50.0 (0.0) | - / - | no |" in md
  )
  assert "- rule: hacked in 0/2 seeds" in md and "- static_rm: hacked in 0/1 seeds" in md


def _roll(step, q, reward, correct, resp="r"):
  return {
    "step": step,
    "question": q,
    "reference": "ref " + q,
    "response": resp,
    "rule_correct": correct,
    "reward": reward,
  }


def test_pick_examples_late_rewarded_rule_wrong_with_cooper_match():
  static = [
    _roll(39, "q1", 0.9, False),  # picked (highest reward)
    _roll(38, "q1", 0.8, False),  # same question again: skipped
    _roll(40, "q2", 0.7, False),  # picked
    _roll(40, "q3", 0.95, True),  # rule-correct: no
    _roll(35, "q4", 0.4, False),  # reward <= 0.5: no
    _roll(10, "q5", 0.99, False),  # early (not in the last quarter): no
    _roll(31, "q6", 0.6, False),  # picked
    _roll(32, "q7", 0.55, False),  # a fourth: over k
  ]
  cooper = [_roll(39, "q1", 0.1, False, "c39"), _roll(20, "q2", 0.9, True, "c20")]
  cooper.append(_roll(36, "q2", 0.9, True, "c36"))
  picks = report.pick_examples(static, cooper, k=3)
  assert [(p["static"]["question"], p["static"]["step"]) for p in picks] == [
    ("q1", 39),
    ("q2", 40),
    ("q6", 31),
  ]
  assert picks[0]["cooper"]["response"] == "c39"  # same step and question
  assert picks[1]["cooper"]["response"] == "c36"  # same question, nearest step
  assert picks[2]["cooper"] is None
  assert report.pick_examples([], cooper) == []


def test_example_twins_pair_the_frozen_rm_with_its_co_trained_counterpart():
  assert report.example_twins(["rule", "static_rm", "cooper"]) == ("static_rm", "cooper")
  assert report.example_twins(["static_rm_weak", "cooper_weak", "static_rm"]) == (
    "static_rm_weak",
    "cooper_weak",
  )
  # no plain cooper: the first cooper variant next to the frozen RM (study_nostd's case)
  conds = ["rule", "static_rm", "cooper_rewrite_rmlr1x"]
  assert report.example_twins(conds) == ("static_rm", "cooper_rewrite_rmlr1x")


def test_format_examples_handles_missing_files_and_fences():
  assert "none saved" in report.format_examples(0, None, None)
  md = report.format_examples(2, [_roll(40, "q", 0.9, False, "x ``` y")], None)
  assert "seed 2" in md and "No rollouts.jsonl in the cooper run" in md
  assert "````\nx ``` y\n````" in md and "**cooper**: none saved" in md
  assert "No such rollouts" in report.format_examples(0, [_roll(40, "q", 0.9, True)], [])


def test_comparison_pairs():
  names = ["untrained", "rule", "static_rm", "cooper", "cooper_k4", "static_rm_nostd"]
  assert report.comparison_pairs(names) == [
    ("cooper", "static_rm"),
    ("cooper", "rule"),
    ("static_rm", "untrained"),
    ("rule", "untrained"),
    ("cooper_k4", "cooper"),
    ("cooper_k4", "static_rm"),
    ("static_rm_nostd", "static_rm"),
    ("static_rm_nostd", "cooper"),
  ]
  assert report.comparison_pairs(["untrained", "rule"]) == [("rule", "untrained")]
  # a co-trained variant named by its RM and its negatives is compared with that RM frozen
  names = ["untrained", "rule", "static_rm_weak", "cooper_weak_rewrite"]
  assert report.comparison_pairs(names) == [
    ("rule", "untrained"),
    ("static_rm_weak", "rule"),
    ("static_rm_weak", "untrained"),
    ("cooper_weak_rewrite", "static_rm_weak"),
    ("cooper_weak_rewrite", "rule"),
    ("cooper_weak_rewrite", "untrained"),
  ]
  assert report.example_twins(names[1:]) == ("static_rm_weak", "cooper_weak_rewrite")


def test_curves_smooth_each_seed_then_aggregate():
  runs = {"c": [[{"step": i, "x": float(i)} for i in range(1, 5)]] * 2}
  steps, mean, lo, hi = run_study.curves(runs, "x", smooth=2)["c"]
  np.testing.assert_array_equal(steps, [1, 2, 3, 4])
  np.testing.assert_allclose(mean, [1.0, 1.5, 2.5, 3.5])


def test_plots_write_files_and_skip_absent_rm_metrics(tmp_path):
  rows = _metrics(np.linspace(0.3, 0.9, 10), np.full(10, 0.5), {0: 0.5, 10: 0.4})
  runs = {"rule": [rows, rows], "static_rm": [rows]}
  report.plot_dynamics(runs, tmp_path / "d.png", "t")
  assert (tmp_path / "d.png").stat().st_size > 0
  assert report.plot_rm_stability(runs, tmp_path / "r.png", "t") == []
  assert not (tmp_path / "r.png").exists()
  auc = _metrics(np.full(10, 0.5), np.full(10, 0.5), {0: 0.5}, np.full(10, 0.7))
  keys = report.plot_rm_stability({"rule": [auc], "cooper": [auc]}, tmp_path / "r.png", "t")
  assert keys == ["rm/group_auc"] and (tmp_path / "r.png").exists()


FAKE_CHILD = """
import json, os, pathlib, sys
assert sys.argv[1:3] == ["-m", "cooper_jax.cli.study"], sys.argv  # how the study starts a run
args = sys.argv[3:]
from cooper_jax.cli import study as rs
rs.pin_from_env()  # as run_study.main does for --one
print("cpus", len(os.sched_getaffinity(0)))
out = pathlib.Path(args[args.index("--out") + 1])
cond, seed = args[args.index("--one") + 1], int(args[args.index("--one") + 2])
print("child", cond, seed)
if cond == "boom":
  sys.exit(3)
acc = [0.5, 1.0] if cond == "rule" else [0.0, 0.5]
res = {"condition": cond, "seed": seed, "accuracy": sum(acc) / 2, "per_problem_acc": acc,
       "eval": %s, "wall_s": 1.0}
(out / "runs" / f"{cond}_s{seed}").mkdir(parents=True, exist_ok=True)
(out / "runs" / f"{cond}_s{seed}" / "heldout.json").write_text(json.dumps(res))
"""


def test_run_all_resumes_runs_in_parallel_and_fails_loudly(tmp_path, monkeypatch):
  argv = ["--out", str(tmp_path / "study"), "--jobs", "2"]
  a = run_study.parse_args(argv)
  fake = tmp_path / "fake_child.py"
  fake.write_text(FAKE_CHILD % repr(run_study._eval_settings(a)))
  exe = tmp_path / "python"
  exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
  exe.chmod(0o755)
  monkeypatch.setattr(sys, "executable", str(exe))
  runs = tmp_path / "study" / "runs"
  cached = {"accuracy": 0.25, "per_problem_acc": [0.25, 0.25], "wall_s": 9.0}
  cached["eval"] = run_study._eval_settings(a)
  (runs / "rule_s0").mkdir(parents=True)
  (runs / "rule_s0" / "heldout.json").write_text(json.dumps(cached))
  (runs / "rule_s1").mkdir()
  (runs / "rule_s1" / "stale.txt").write_text("interrupted")

  done = run_study.run_all(a, argv, [("rule", 0), ("rule", 1), ("cooper", 0), ("cooper", 1)])
  assert sorted(done) == [("cooper", 0), ("cooper", 1), ("rule", 0), ("rule", 1)]
  assert done["rule", 0]["accuracy"] == 0.25  # cached, not rerun
  assert done["rule", 1]["per_problem_acc"] == [0.5, 1.0]
  assert not (runs / "rule_s1" / "stale.txt").exists()  # the interrupted run started afresh
  assert "child cooper 1" in (runs / "cooper_s1.log").read_text()
  for log in ("rule_s1", "cooper_s0", "cooper_s1"):  # parallel runs: each child on one core
    assert "cpus 1\n" in (runs / f"{log}.log").read_text()
  assert not (runs / "rule_s0.log").exists()

  with pytest.raises(SystemExit, match=r"run boom seed 0 failed \(exit 3\); log: .*boom_s0\.log"):
    run_study.run_all(a, argv, [("boom", 0)])

  a.pin = False  # --no-pin: the children keep every core
  run_study.run_all(a, argv, [("cooper", 2)])
  assert f"cpus {len(os.sched_getaffinity(0))}\n" in (runs / "cooper_s2.log").read_text()

  a.eval_samples += 1  # cached results from other eval settings are not mixed in
  with pytest.raises(SystemExit, match="other settings"):
    run_study.run_all(a, argv, [("rule", 0)])


def test_job_cores_give_parallel_jobs_one_core_each_and_launch_pins_the_child(tmp_path):
  assert run_study.job_cores(1) is None  # one job keeps every core
  cores = sorted(os.sched_getaffinity(0))
  slots = run_study.job_cores(len(cores) + 1)
  assert slots[: len(cores)] == [{c} for c in cores]  # distinct while cores last
  assert slots[-1] == {cores[0]}
  code = (
    "import os; from cooper_jax.cli import study as m; m.pin_from_env(); "
    "print(sorted(os.sched_getaffinity(0)))"
  )
  env = {run_study.PIN_ENV: "0,1,2"}  # the parent's own setting is not passed on
  with open(tmp_path / "log", "w", encoding="utf-8") as f:
    assert run_study.launch([sys.executable, "-c", code], env, f, {cores[-1]}).wait() == 0
  assert (tmp_path / "log").read_text().strip() == str([cores[-1]])


def test_child_env_single_threads_only_parallel_runs():
  env = run_study.child_env(2)
  assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]
  assert env["OMP_NUM_THREADS"] == "1"
  assert "--xla_cpu_multi_thread_eigen=false" not in run_study.child_env(1).get("XLA_FLAGS", "")


def test_report_study_writes_tables_results_and_examples(tmp_path):
  seeds, conds = [0, 1], ["rule", "static_rm", "cooper"]
  a = run_study.parse_args(["--out", str(tmp_path), "--jobs", "1"])
  rng = np.random.default_rng(0)
  done = {
    (c, s): {"per_problem_acc": rng.random(6).tolist(), "wall_s": 2.0}
    for c in ["untrained", *conds]
    for s in seeds
  }
  for c in conds:
    for s in seeds:
      wd = tmp_path / "runs" / f"{c}_s{s}"
      wd.mkdir(parents=True)
      rows = _metrics(np.linspace(0.3, 0.9, 10), np.full(10, 0.5), {0: 0.5, 10: 0.4})
      (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  rollouts = [_roll(10, "q", 0.9, False, "static says 7")]
  (tmp_path / "runs" / "static_rm_s0" / "rollouts.jsonl").write_text(json.dumps(rollouts[0]))
  res = run_study.report_study(a, seeds, conds, done, 0.0, 0.0)
  assert list(res["summaries"]) == ["untrained", *conds]
  assert (
    "cooper - static_rm" in res["seed_tests"] and "ci95" in res["seed_tests"]["rule - untrained"]
  )
  assert len(res["hacking"]) == 6 and res["timings_s"]["cooper_s1"] == 2.0
  table = (tmp_path / "table.md").read_text()
  for part in ("Paired by seed", "Paired by problem", "hacked?", "Wall time"):
    assert part in table
  assert "static says 7" in (tmp_path / "examples.md").read_text()
  assert (tmp_path / "training_dynamics.png").exists() and not (
    tmp_path / "rm_stability.png"
  ).exists()
  json.loads((tmp_path / "results.json").read_text())


def _heldout(study, cond, seed, per_problem, temperature=1.0, cfg=None):
  wd = study / "runs" / f"{cond}_s{seed}"
  wd.mkdir(parents=True)
  ev = {"samples": 4, "temperature": temperature, "top_p": 0.95, "max_new_tokens": 96}
  h = {"per_problem_acc": per_problem, "n_problems": len(per_problem), "eval": ev}
  (wd / "heldout.json").write_text(json.dumps(h))
  if cfg is not None:
    (wd / "config.json").write_text(json.dumps(cfg))


def test_pool_studies_pairs_arms_from_two_folders_by_seed(tmp_path):
  """Per-seed accuracies and differences by hand; what differs between the arms' configs is
  listed; a seed missing from an arm or a different held-out evaluation stops it."""
  pool = _load("pool_studies")
  a, b = tmp_path / "a", tmp_path / "b"
  for s, (x, y) in enumerate([([1.0, 0.5], [0.5, 0.0]), ([0.0, 0.5], [1.0, 1.0])]):
    _heldout(a, "static_rm", s, x, cfg={"rm": {"optim": {"lr": 1e-3}}, "seed": s})
    _heldout(b, "cooper", s, y, cfg={"rm": {"optim": {"lr": 6e-3}}, "seed": s})
  args = ["--out", str(tmp_path / "out"), "--seeds", "0,1"]
  res = pool.main([*args, "--arm", f"frozen={a}:static_rm", "--arm", f"co={b}:cooper"])
  assert res["summaries"]["frozen"]["seed_accuracies"] == [0.75, 0.25]
  assert res["summaries"]["co"]["seed_accuracies"] == [0.25, 1.0]
  assert res["seed_tests"]["co - frozen"]["per_seed_diff"] == [-0.5, 0.75]
  table = (tmp_path / "out" / "table.md").read_text()
  assert "rm.optim.lr=0.006" in table and "seed=" not in table
  with pytest.raises(SystemExit, match="static_rm_s2"):
    pool.main([*args[:2], "--seeds", "0,1,2", "--arm", f"frozen={a}:static_rm"])
  _heldout(b, "rule", 0, [1.0, 1.0], temperature=0.7)
  _heldout(b, "rule", 1, [1.0, 1.0], temperature=0.7)
  with pytest.raises(SystemExit, match="evaluations differ"):
    pool.main([*args, "--arm", f"frozen={a}:static_rm", "--arm", f"r={b}:rule"])


def test_a_job_pinned_to_one_core_runs_its_rm_update_in_line(monkeypatch):
  """The small task overlaps a step's RM update with the next step's sampler; a study job
  pinned to one core (job_cores) turns that off: one core would only be shared."""
  a = run_study.parse_args(["--experiment", "experiments/small_task_wide.py", "--out", "x"])
  monkeypatch.delenv(run_study.PIN_ENV, raising=False)
  assert run_study._config(a, "cooper_weak_rewrite", 0).train.overlap_rm_update is True
  monkeypatch.setenv(run_study.PIN_ENV, "1")
  assert run_study._config(a, "cooper_weak_rewrite", 0).train.overlap_rm_update is False
  monkeypatch.setenv(run_study.PIN_ENV, "0,1")
  assert run_study._config(a, "cooper_weak_rewrite", 0).train.overlap_rm_update is True
