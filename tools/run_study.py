"""The reproduction study in one command: untrained baseline, rule, static_rm and cooper, each
over several seeds, on the small arithmetic task; evaluated on its held-out split.

  python tools/run_study.py --out results/small_study            # builds what is missing
  python tools/run_study.py --out results/x --seeds 0,1,2 --steps 40 --set train.eval_every=5

Writes <out>/table.md (Table-3 style, CIs, paired tests), <out>/results.json,
<out>/training_dynamics.png, <out>/rm_stability.png and <out>/command.txt. Per-run metrics and
checkpoints stay in <out>/runs/<condition>_s<seed>/.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("rule", "static_rm", "cooper")


# ---------------------------------------------------------------------------------- figures
COLORS = {"rule": "C0", "static_rm": "C1", "cooper": "C2", "untrained": "C7"}


def curves(runs: dict[str, list[list[dict]]], key: str):
  """{condition: (steps, mean, lo, hi)} of a metric over seeds (steps where every seed has it)."""
  out = {}
  for cond, seeds in runs.items():
    per_seed = [{r["step"]: r[key] for r in rows if key in r} for rows in seeds]
    common = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not common:
      continue
    vals = np.array([[s[t] for t in common] for s in per_seed], np.float64)
    out[cond] = (np.array(common), vals.mean(0), vals.min(0), vals.max(0))
  return out


def plot_dynamics(runs: dict[str, list[list[dict]]], path, title: str) -> None:
  """Two panels as the paper's training-dynamics figure: training reward, held-out accuracy."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  panels = [
    ("reward/mean", "training reward (what the policy optimises)"),
    ("rule/acc", "rule-verified accuracy of training rollouts"),
    ("eval/acc", "held-out accuracy (greedy)"),
  ]
  for ax, (key, label) in zip(axes, panels):
    for cond, (x, mean, lo, hi) in curves(runs, key).items():
      ax.plot(x, mean, label=cond, color=COLORS.get(cond))
      ax.fill_between(x, lo, hi, alpha=0.2, color=COLORS.get(cond))
    ax.set_title(label, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.suptitle(title + " (line: mean over seeds; band: min-max)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_rm_stability(runs: dict[str, list[list[dict]]], path, title: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, ax = plt.subplots(figsize=(6, 4))
  for cond, (x, mean, lo, hi) in curves(runs, "eval/rm_pair_acc").items():
    ax.plot(x, mean, label=cond, color=COLORS.get(cond))
    ax.fill_between(x, lo, hi, alpha=0.2, color=COLORS.get(cond))
  ax.set_xlabel("step")
  ax.set_ylabel("RM held-out pair accuracy")
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default="results/small_study")
  p.add_argument("--workdir", default="runs/small_task", help="small-task artifacts")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--conditions", default=",".join(CONDITIONS))
  p.add_argument("--steps", type=int, default=None, help="override train.steps")
  p.add_argument("--eval_samples", type=int, default=4)
  p.add_argument("--eval_temperature", type=float, default=0.7)
  p.add_argument("--eval_max_new_tokens", type=int, default=96)
  p.add_argument("--sft_args", default="", help="extra args for tools/sft_small_policy.py")
  # The RM of the recorded study: a short BCE run on the SFT policy's own labelled rollouts,
  # which gave held-out accuracy 0.748, precision 0.58, recall 0.29 (a weak RM on purpose).
  p.add_argument(
    "--rm_args",
    default="--steps 300 --lr 1e-3 --warmup 10 --synthetic_questions 0 --eval_every 50",
    help="args for tools/pretrain_rm.py",
  )
  p.add_argument("--set", action="append", default=[], help="config override key=value")
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
        "tools/sft_small_policy.py",
        "--workdir",
        str(work),
        *shlex.split(a.sft_args),
      ]
    )
  if not (work / "rm" / "config.json").exists():
    _run(
      [
        sys.executable,
        "tools/pretrain_rm.py",
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

  c = load_config(f"{ROOT}/experiments/small_task.py:{mode},{ROOT / a.workdir}", a.set)
  c.seed = seed
  if a.steps:
    c.train.steps = a.steps  # the optimizers' total_steps follow it
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


def main(argv=None) -> dict:
  a = parse_args(argv)
  t0 = time.perf_counter()
  out = ROOT / a.out
  out.mkdir(parents=True, exist_ok=True)
  (out / "command.txt").write_text("python " + " ".join(shlex.quote(x) for x in sys.argv) + "\n")
  build_artifacts(a)
  t_build = time.perf_counter() - t0

  from cooper_jax import stats  # pylint: disable=import-outside-toplevel
  from cooper_jax.io import atomic_write, atomic_write_json  # pylint: disable=import-outside-toplevel
  from cooper_jax.metrics import read_metrics  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import RuleVerifier  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.train import train  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  seeds = [int(s) for s in a.seeds.split(",")]
  conditions = [c for c in a.conditions.split(",") if c]
  rows = _heldout(a)
  per_problem: dict[str, list[np.ndarray]] = {}
  curves: dict[str, list[list[dict]]] = {}
  timings = {}
  with RuleVerifier(1) as verifier:
    policy_dir = str(ROOT / a.workdir / "policy")
    cfg, params = load_pretrained(policy_dir)
    tok = load_tokenizer(policy_dir)
    # The untrained policy is one model; its "seeds" are sampling seeds of the evaluation.
    per_problem["untrained"] = [_eval(cfg, params, tok, rows, a, verifier, s) for s in seeds]
    for mode in conditions:
      for seed in seeds:
        wd = out / "runs" / f"{mode}_s{seed}"
        t = time.perf_counter()
        run = train(_config(a, mode, seed), str(wd))
        timings[f"{mode}_s{seed}"] = time.perf_counter() - t
        acc = _eval(
          run.policy_cfg, run.policy_state["params"], run.tokenizer, rows, a, verifier, seed
        )
        per_problem.setdefault(mode, []).append(acc)
        curves.setdefault(mode, []).append(read_metrics(wd))
        print(
          f"{mode} seed {seed}: held-out {acc.mean():.3f} ({timings[f'{mode}_s{seed}']:.0f}s)",
          flush=True,
        )

  summaries = {k: stats.condition_summary(v) for k, v in per_problem.items()}
  tests, seed_tests = {}, {}
  for other in ("rule", "static_rm", "untrained"):
    if "cooper" in summaries and other in summaries:
      name = f"cooper - {other}"
      tests[name] = stats.paired_test(
        np.asarray(summaries["cooper"]["per_problem"]), np.asarray(summaries[other]["per_problem"])
      )
      if len(seeds) > 1:
        seed_tests[name] = stats.seed_paired_test(
          summaries["cooper"]["seed_accuracies"], summaries[other]["seed_accuracies"]
        )
  table = stats.format_study_table(
    summaries, tests, len(rows), len(seeds), a.eval_samples, seed_tests
  )
  plot_dynamics(curves, out / "training_dynamics.png", "small arithmetic task")
  plot_rm_stability(
    curves, out / "rm_stability.png", "RM pair accuracy on held-out (correct, wrong) solutions"
  )
  wall = time.perf_counter() - t0
  result = {
    "summaries": summaries,
    "tests": tests,
    "seed_tests": seed_tests,
    "seeds": seeds,
    "conditions": conditions,
    "eval": {
      "samples": a.eval_samples,
      "temperature": a.eval_temperature,
      "top_p": 0.95,
      "max_new_tokens": a.eval_max_new_tokens,
      "n_problems": len(rows),
    },
    "timings_s": timings,
    "build_s": t_build,
    "wall_s": wall,
    "final_train_metrics": {k: [r[-1] for r in v] for k, v in curves.items()},
  }
  atomic_write_json(out / "results.json", result)
  atomic_write(out / "table.md", lambda f: f.write(table + f"\nWall time {wall / 60:.1f} min.\n"))
  print(table)
  print(
    f"wrote {out}/table.md, results.json, training_dynamics.png, rm_stability.png "
    f"({wall / 60:.1f} min)"
  )
  return result


if __name__ == "__main__":
  main()
