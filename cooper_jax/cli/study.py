"""The reproduction study in one command: an untrained baseline and every condition of
experiments/small_task.py (rule, static_rm, cooper and their variants; --experiment names
another such file, e.g. small_task_wide.py), each over several seeds, on the small arithmetic
task; evaluated on its held-out split.

  cooper-study --out results/small_study            # builds what is missing
  cooper-study --out results/x --seeds 0,1,2 --steps 40 --set train.eval_every=5

Every (condition, seed) run is its own subprocess (`--one <condition> <seed>`, same args), --jobs
at a time; it trains, evaluates the final policy and writes <out>/runs/<cond>_s<seed>/heldout.json
last, so an interrupted study resumes: runs with heldout.json are kept, run dirs without one are
deleted and rerun. Each child's output goes to <out>/runs/<cond>_s<seed>.log.

Writes <out>/table.md (accuracies with seed-then-problem CIs, seed-level paired comparisons,
problem-level ones, a reward-hacking table), <out>/results.json, <out>/training_dynamics.png,
<out>/rm_stability.png, <out>/examples.md and <out>/command.txt (reporting: cooper_jax/cli/study_report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cooper_jax.cli import manifest
from cooper_jax.cli import study_report as report

ROOT = Path(__file__).resolve().parents[2]
CONDITIONS = ("rule", "static_rm", "cooper", "cooper_onpolicy", "cooper_k4", "static_rm_nostd")
curves = report.curves  # re-exported (tests, notebooks)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default="results/small_study")
  p.add_argument(
    "--workdir",
    default="experiments/assets/small_task",
    help="small-task artifacts (default: the shipped ones; another dir is built if missing)",
  )
  p.add_argument(
    "--experiment",
    default="experiments/small_task.py",
    help="the conditions' config file (experiments/small_task_wide.py: the wider testbed)",
  )
  p.add_argument("--seeds", default="0,1,2,3,4")
  p.add_argument(
    "--conditions",
    default=",".join(CONDITIONS),
    help="conditions of --experiment; the untrained baseline is always added",
  )
  p.add_argument("--jobs", type=int, default=2, help="runs (subprocesses) at a time")
  p.add_argument(
    "--pin",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="with --jobs > 1, each job on one core (job_cores); --no-pin: studies recorded "
    "before commit b9d7b04 (results/wide_study8 and earlier) ran unpinned, and only unpinned "
    "jobs replay their floats",
  )
  p.add_argument("--steps", type=int, default=None, help="override train.steps")
  p.add_argument("--eval_samples", type=int, default=4)
  p.add_argument("--eval_temperature", type=float, default=0.7)
  p.add_argument("--eval_max_new_tokens", type=int, default=96)
  p.add_argument("--sft_args", default="", help="extra args for tools/assets/sft_small_policy.py")
  # Empty: cooper_jax/cli/pretrain_rm.py's own defaults, the fully trained RM. The first recorded study
  # used a deliberately weak one: "--steps 300 --lr 1e-3 --warmup 10 --synthetic_questions 0
  # --eval_every 50" (held-out accuracy 0.748, precision 0.58, recall 0.29).
  p.add_argument("--rm_args", default="", help="args for cooper_jax/cli/pretrain_rm.py")
  p.add_argument("--set", action="append", default=[], help="config override key=value")
  p.add_argument("--one", nargs=2, metavar=("CONDITION", "SEED"), help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _run(cmd: list[str]) -> None:
  print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
  subprocess.run(cmd, cwd=ROOT, check=True)


def build_artifacts(a) -> None:
  """SFT policy, RM and held-out RM pairs, each only if missing (delete to rebuild)."""
  work = ROOT / a.workdir
  if not (work / "policy" / "config.json").exists():
    _run(
      [
        sys.executable,
        "tools/assets/sft_small_policy.py",
        "--workdir",
        str(work),
        *shlex.split(a.sft_args),
      ]
    )
  if not (work / "rm" / "config.json").exists():
    _run(
      [
        sys.executable,
        "-m",
        "cooper_jax.cli.pretrain_rm",
        "--from_policy",
        str(work / "policy"),
        "--questions",
        str(work / "data" / "rm.jsonl"),
        "--out",
        str(work / "rm"),
        *shlex.split(a.rm_args),
      ]
    )
  pairs = work / "data" / "rm_eval_pairs.jsonl"
  if not pairs.exists():
    from cooper_jax.io import write_jsonl
    from cooper_jax.tasks.arith import make_wrong_solution  # pylint: disable=import-outside-toplevel

    rows = [json.loads(l) for l in (work / "data" / "test.jsonl").read_text().splitlines() if l]
    rng = np.random.default_rng(1234)
    write_jsonl(
      pairs,
      (
        {
          "question": r["question"],
          "answer": r["answer"],
          "positive": r["solution"],
          "negative": make_wrong_solution(r, rng),
        }
        for r in rows
      ),
    )


def _config(a, mode: str, seed: int):
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel

  c = load_config(f"{ROOT}/{a.experiment}:{mode},{ROOT / a.workdir}", a.set)
  c.seed = seed
  if a.steps:
    c.train.steps = a.steps  # the optimizers' total_steps follow it
  cpus = os.environ.get(PIN_ENV, "")
  if cpus and "," not in cpus:
    # A job pinned to one core: the RM update's thread (train.overlap_rm_update) would only
    # share it with the sampler (0.674 against 0.640 s a step; docs/log.md, 2026-12-06). The same
    # numbers.
    c.train.overlap_rm_update = False
  return c


def _heldout(a):
  from cooper_jax.data import load_qa  # pylint: disable=import-outside-toplevel

  rows, _ = load_qa(str(ROOT / a.workdir / "data" / "test.jsonl"))
  return rows


def _eval(cfg, params, tokenizer, rows, a, verifier, seed):
  from cooper_jax.evaluate import evaluate_model  # pylint: disable=import-outside-toplevel

  res = evaluate_model(
    cfg,
    params,
    tokenizer,
    {"heldout": rows},
    samples=a.eval_samples,
    temperature=a.eval_temperature,
    top_p=0.95,
    max_new_tokens=a.eval_max_new_tokens,
    batch_size=64,
    seed=seed,
    verifier=verifier,
  )
  return np.asarray(res["benchmarks"]["heldout"]["per_problem_acc"], np.float64)


# ---------------------------------------------------------------------------------- one run
def _eval_settings(a) -> dict:
  return {
    "samples": a.eval_samples,
    "temperature": a.eval_temperature,
    "top_p": 0.95,
    "max_new_tokens": a.eval_max_new_tokens,
  }


def run_one(a, cond: str, seed: int) -> dict:
  """Train one (condition, seed) (`untrained`: load the SFT policy), evaluate it on the held-out
  split with `seed` as the sampling seed, write heldout.json last."""
  from cooper_jax.io import atomic_write_json  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import RuleVerifier  # pylint: disable=import-outside-toplevel

  wd = ROOT / a.out / "runs" / f"{cond}_s{seed}"
  t0 = time.perf_counter()
  with RuleVerifier(1) as verifier:
    if cond == "untrained":  # one model; its "seeds" are sampling seeds of the evaluation
      from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
      from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

      policy_dir = _config(a, "rule", seed).policy.model  # the experiment's SFT policy
      (cfg, params), tok = load_pretrained(policy_dir), load_tokenizer(policy_dir)
    else:
      from cooper_jax.train import train  # pylint: disable=import-outside-toplevel

      run = train(_config(a, cond, seed), str(wd))
      cfg, params, tok = run.policy_cfg, run.policy_state["params"], run.tokenizer
    t_train = time.perf_counter() - t0
    acc = _eval(cfg, params, tok, _heldout(a), a, verifier, seed)
  res = {
    "condition": cond,
    "seed": seed,
    "accuracy": float(acc.mean()),
    "n_problems": int(acc.size),
    "per_problem_acc": acc.tolist(),
    "eval": _eval_settings(a),
    "train_s": t_train,
    "eval_s": time.perf_counter() - t0 - t_train,
    "wall_s": time.perf_counter() - t0,
  }
  atomic_write_json(wd / "heldout.json", res)
  return res


# ---------------------------------------------------------------------------------- all runs
def child_env(jobs: int) -> dict:
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  # Every run of a study compiles the same programs (same shapes, flags and XLA version: the
  # cache key), so all but the first read them from JAX's persistent cache: on the 2-core VM a
  # 25-step small-task run went from 61 s to 34 s with identical metrics. Set
  # JAX_COMPILATION_CACHE_DIR to put it elsewhere.
  from cooper_jax.host_platform import COMPILATION_CACHE_DIR  # pylint: disable=import-outside-toplevel

  env.setdefault("JAX_COMPILATION_CACHE_DIR", COMPILATION_CACHE_DIR)
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  if jobs > 1:
    # On the 2-core dev VM a step of the tiny model is dispatch-bound: XLA's Eigen pool in each
    # of N processes only fights the others for the cores. One thread per process, N processes.
    flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    env["OMP_NUM_THREADS"] = "1"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # on a GPU the N processes share its memory
  return env


def job_cores(jobs: int) -> list[set[int]] | None:
  """The CPUs of each job slot when runs go in parallel: slot k gets one core of this process's
  affinity (round robin), and the child's verifier workers inherit it. Unpinned, each job's XLA
  runtime still starts threads for every core and the two jobs fight over both: on the 2-core
  VM, two Cooper runs side by side, pinned vs unpinned at the same hour, took 14-28% less time
  a step (docs/log.md, 2026-12-05, "study jobs pinned"). XLA compiles for the CPUs it sees, so a pinned run's
  floats differ from an unpinned one's (by ~1e-8 from step 1) and no longer depend on the
  machine's core count. None: one job, or no affinity API (not Linux)."""
  if jobs <= 1 or not hasattr(os, "sched_getaffinity"):
    return None
  cores = sorted(os.sched_getaffinity(0))
  return [{cores[k % len(cores)]} for k in range(jobs)]


PIN_ENV = "COOPER_JAX_STUDY_CPUS"  # the CPUs a study child pins itself to, e.g. "1"


def launch(cmd: list[str], env: dict, log, cpus: set[int] | None) -> subprocess.Popen:
  """`cmd` with stdout and stderr to `log`; with `cpus`, the child is told (PIN_ENV) to pin
  itself before it starts jax (`pin_from_env`), not pinned between fork and exec: a parent
  with threads (a notebook that imported jax) could deadlock there."""
  env = dict(env)
  env.pop(PIN_ENV, None)
  if cpus is not None:
    env[PIN_ENV] = ",".join(str(c) for c in sorted(cpus))
  return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def pin_from_env() -> None:
  """Pins this process (and the processes it starts) to the CPUs PIN_ENV names, if any."""
  cpus = os.environ.get(PIN_ENV)
  if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def _log_tail(path: Path, n: int = 30) -> str:
  return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def run_all(a, argv: list[str], runs: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
  """heldout.json of every (condition, seed): cached ones read, the rest run as subprocesses,
  a.jobs at a time. A failed child stops the study (the others are terminated) naming its log."""
  runs_dir = ROOT / a.out / "runs"
  runs_dir.mkdir(parents=True, exist_ok=True)
  done, todo = {}, []
  for cond, seed in runs:
    wd = runs_dir / f"{cond}_s{seed}"
    if (wd / "heldout.json").exists():
      done[cond, seed] = json.loads((wd / "heldout.json").read_text())
      if done[cond, seed]["eval"] != _eval_settings(a):
        raise SystemExit(f"{wd}/heldout.json was evaluated with other settings; use another --out")
      print(f"{cond} seed {seed}: held-out {done[cond, seed]['accuracy']:.3f} (cached)")
      continue
    if wd.exists():
      shutil.rmtree(wd)  # an interrupted run: start it again
    todo.append((cond, seed))
  env, running, slots = child_env(a.jobs), {}, job_cores(a.jobs) if a.pin else None
  try:
    while todo or running:
      while todo and len(running) < max(1, a.jobs):
        cond, seed = todo.pop(0)
        busy = {slot for *_, slot in running.values()}
        slot = min(set(range(max(1, a.jobs))) - busy)
        log = runs_dir / f"{cond}_s{seed}.log"
        cmd = [sys.executable, "-m", "cooper_jax.cli.study", *argv, "--one", cond, str(seed)]
        f = open(log, "w", encoding="utf-8")  # pylint: disable=consider-using-with
        f.write("+ " + shlex.join(cmd) + "\n")
        f.flush()
        p = launch(cmd, env, f, None if slots is None else slots[slot])
        running[cond, seed] = (p, f, log, slot)
      time.sleep(0.5)
      for key, (p, f, log, _) in list(running.items()):
        if p.poll() is None:
          continue
        f.close()
        del running[key]
        heldout = runs_dir / f"{key[0]}_s{key[1]}" / "heldout.json"
        if p.returncode != 0 or not heldout.exists():
          raise SystemExit(
            f"{_log_tail(log)}\n\nrun {key[0]} seed {key[1]} failed (exit {p.returncode}"
            f"{'' if p.returncode else ', no heldout.json'}); log: {log}"
          )
        done[key] = json.loads(heldout.read_text())
        print(
          f"{key[0]} seed {key[1]}: held-out {done[key]['accuracy']:.3f} "
          f"({done[key]['wall_s']:.0f}s)",
          flush=True,
        )
  finally:
    for p, f, *_ in running.values():  # interrupted or another run failed: stop the rest
      p.terminate()
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
      f.close()
  return done


# ---------------------------------------------------------------------------------- report
def report_study(a, seeds, conditions, done, t0, t_build) -> dict:
  from cooper_jax import stats  # pylint: disable=import-outside-toplevel
  from cooper_jax.io import (  # pylint: disable=import-outside-toplevel
    atomic_write_json,
    atomic_write_text,
  )
  from cooper_jax.metrics import read_metrics  # pylint: disable=import-outside-toplevel

  out = ROOT / a.out
  names = ["untrained", *conditions]
  mats = {c: np.array([done[c, s]["per_problem_acc"] for s in seeds]) for c in names}
  summaries = {c: stats.condition_summary(list(mats[c])) for c in names}
  tests, seed_tests = {}, {}
  for x, y in report.comparison_pairs(names):
    name = f"{x} - {y}"
    tests[name] = stats.paired_test(mats[x].mean(0), mats[y].mean(0))
    if len(seeds) > 1:
      seed_tests[name] = stats.seed_level_comparison(mats[x], mats[y])
  n_problems = mats["untrained"].shape[1]
  table = stats.format_study_table(
    summaries, tests, n_problems, len(seeds), a.eval_samples, seed_tests
  )
  wd = {(c, s): out / "runs" / f"{c}_s{s}" for c in conditions for s in seeds}
  metrics = {c: {s: read_metrics(wd[c, s]) for s in seeds} for c in conditions}
  hacking = report.hacking_table(metrics)
  table += "\n" + report.format_hacking_table(hacking)
  table += "\n" + report.format_greedy_table(metrics, report.comparison_pairs(names))
  by_cond = {c: list(v.values()) for c, v in metrics.items()}
  report.plot_dynamics(by_cond, out / "training_dynamics.png", "small arithmetic task")
  rm_keys = report.plot_rm_stability(by_cond, out / "rm_stability.png", "RM stability")
  s0 = seeds[0]
  st, co = report.example_twins(conditions)
  static = report.read_rollouts(wd[st, s0]) if (st, s0) in wd else None
  coop = report.read_rollouts(wd[co, s0]) if (co, s0) in wd else None
  atomic_write_text(out / "examples.md", report.format_examples(s0, static, coop, names=(st, co)))
  timings = {f"{c}_s{s}": done[c, s]["wall_s"] for c in names for s in seeds}
  wall = time.perf_counter() - t0
  table += (
    f"\nWall time {wall / 60:.1f} min (this invocation; runs summed: "
    f"{sum(timings.values()) / 60:.1f} min, --jobs {a.jobs}).\n"
  )
  result = {
    "summaries": summaries,
    "tests": tests,
    "seed_tests": seed_tests,
    "hacking": hacking,
    "seeds": seeds,
    "conditions": names,
    "eval": {**_eval_settings(a), "n_problems": n_problems},
    "rm_stability_panels": rm_keys,
    "timings_s": timings,
    "build_s": t_build,
    "wall_s": wall,
    "final_train_metrics": {c: [(m[s] or [None])[-1] for s in seeds] for c, m in metrics.items()},
  }
  atomic_write_json(out / "results.json", result)
  atomic_write_text(out / "table.md", table)
  manifest.write(out, seeds=seeds, code_commit=_code_commit(), host=manifest.machine())
  print(table)
  print(
    f"wrote {out}/table.md, results.json, examples.md, the figures and manifest.json "
    f"({wall / 60:.1f} min); per-run files in {out}/runs/ (git-ignored)"
  )
  return result


def _code_commit() -> str | None:
  """HEAD, with "+dirty" when tracked files differ from it (the study ran uncommitted code)."""
  try:
    head = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
  except (OSError, subprocess.CalledProcessError):
    return None
  return head + ("+dirty" if dirty else "")


def main(argv=None) -> dict | None:
  argv = list(sys.argv[1:] if argv is None else argv)
  a = parse_args(argv)
  if a.one:
    pin_from_env()  # before run_one imports jax
    run_one(a, a.one[0], int(a.one[1]))
    return None
  t0 = time.perf_counter()
  out = ROOT / a.out
  out.mkdir(parents=True, exist_ok=True)
  (out / "command.txt").write_text(f"cooper-study {shlex.join(argv)}\n")
  build_artifacts(a)
  t_build = time.perf_counter() - t0
  seeds = [int(s) for s in a.seeds.split(",")]
  conditions = [c for c in a.conditions.split(",") if c and c != "untrained"]
  # Seed by seed, each seed's costliest condition first (conditions are listed cheapest
  # first: rule, frozen RM, co-trained RM), the untrained evaluations (seconds each) last so
  # that the last runs to finish are short ones. Seed-major, the runs side by side are of
  # different conditions and seeds, and meet a new compiled shape at different times: a
  # shape is compiled by one and read from the persistent cache by the other, where two runs
  # of one condition started together compile each shape twice (the two hacked Cooper runs of
  # results/wide_packed: ~300 s of compiles each). An interrupted study leaves whole seeds.
  done = run_all(
    a,
    argv,
    [(c, s) for s in seeds for c in reversed(conditions)] + [("untrained", s) for s in seeds],
  )
  return report_study(a, seeds, conditions, done, t0, t_build)


def cli() -> int:
  """Console-script entry point (pyproject.toml): exit status 0 once main returns."""
  main()
  return 0


if __name__ == "__main__":
  main()
