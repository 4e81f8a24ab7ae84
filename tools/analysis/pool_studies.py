"""Compare conditions recorded by different cooper_jax/cli/study.py invocations, at the seed level.

The runs are deterministic on one machine (the same condition, seed and settings give the same
per-seed values in another invocation there; on another VM they drift apart from ~1e-8 at step
1, README), so arms from several study folders can be paired by seed. Each arm is LABEL=STUDY_DIR:CONDITION; every arm must hold
heldout.json for every seed, with the same held-out evaluation. Each arm's config.json keys that
differ from the first arm's are listed, so what varies between the arms is on the record.

  python tools/analysis/pool_studies.py --out results/my_rmlr_pool --seeds 0,1,2,3,4 \\
      --arm frozen=results/wide_study8:static_rm_weak \\
      --arm 1x=results/wide_ablations:cooper_weak_rewrite_rmlr1x ...

Writes <out>/table.md and <out>/results.json: per-arm per-seed held-out accuracy with the
hierarchical bootstrap CI, and every arm minus the first (and minus --also, if given) paired by
seed (cooper_jax.stats.seed_level_comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cooper_jax import stats  # noqa: E402
from cooper_jax.io import atomic_write_json, atomic_write_text  # noqa: E402


def parse_arm(spec: str) -> tuple[str, Path, str]:
  label, sep, rest = spec.partition("=")
  study, sep2, cond = rest.rpartition(":")
  if not (sep and sep2 and label and study and cond):
    raise SystemExit(f"--arm {spec!r}: expected LABEL=STUDY_DIR:CONDITION")
  return label, Path(study), cond


def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    out.update(flatten(v, key + ".") if isinstance(v, dict) else {key: v})
  return out


def load_arm(study: Path, cond: str, seeds: list[int]) -> tuple[np.ndarray, dict, dict]:
  """[seeds, problems] held-out accuracies, the eval settings and the seed-0 run's config."""
  rows, evals = [], set()
  for s in seeds:
    path = study / "runs" / f"{cond}_s{s}" / "heldout.json"
    if not path.exists():
      raise SystemExit(f"{path}: missing (is {cond} seed {s} in {study}?)")
    h = json.loads(path.read_text())
    rows.append(h["per_problem_acc"])
    evals.add(json.dumps({**h["eval"], "n_problems": h["n_problems"]}, sort_keys=True))
  if len(evals) != 1:
    raise SystemExit(f"{study}:{cond}: the seeds' held-out evaluations differ: {sorted(evals)}")
  cfg_path = study / "runs" / f"{cond}_s{seeds[0]}" / "config.json"
  cfg = flatten(json.loads(cfg_path.read_text())) if cfg_path.exists() else {}
  cfg.pop("seed", None)
  return np.array(rows, np.float64), json.loads(evals.pop()), cfg


def config_diff(cfg: dict, ref: dict) -> str:
  if not cfg or not ref:
    return "(no config.json: an untrained run)" if not cfg else "(the first arm has no config.json)"
  keys = sorted(k for k in set(cfg) | set(ref) if cfg.get(k) != ref.get(k))
  return "; ".join(f"{k}={cfg.get(k)!r}" for k in keys) or "(same as the first arm)"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--seeds", default="0,1,2,3,4")
  p.add_argument("--arm", action="append", required=True, help="LABEL=STUDY_DIR:CONDITION")
  p.add_argument("--also", default="", help="a second arm label every arm is compared with")
  a = p.parse_args(argv)
  seeds = [int(s) for s in a.seeds.split(",")]
  arms = [parse_arm(s) for s in a.arm]
  labels = [label for label, _, _ in arms]
  if len(set(labels)) != len(labels) or (a.also and a.also not in labels):
    raise SystemExit(f"arm labels must be unique and --also one of them: {labels}, {a.also!r}")
  mats, cfgs, evals = {}, {}, set()
  for label, study, cond in arms:
    mats[label], ev, cfgs[label] = load_arm(study, cond, seeds)
    evals.add(json.dumps(ev, sort_keys=True))
  if len(evals) != 1:
    raise SystemExit(f"the arms' held-out evaluations differ: {sorted(evals)}")
  ref = labels[0]
  summaries = {x: stats.condition_summary(list(mats[x])) for x in labels}
  pairs = [(x, ref) for x in labels[1:]]
  pairs += [(x, a.also) for x in labels if a.also and x not in (ref, a.also)]
  tests = {f"{x} - {y}": stats.paired_test(mats[x].mean(0), mats[y].mean(0)) for x, y in pairs}
  seed_tests = {f"{x} - {y}": stats.seed_level_comparison(mats[x], mats[y]) for x, y in pairs}
  ev = json.loads(evals.pop())
  table = stats.format_study_table(
    summaries, tests, ev["n_problems"], len(seeds), ev["samples"], seed_tests
  )
  table += "\n| arm | runs | config keys that differ from the first arm's |\n|---|---|---|\n"
  for label, study, cond in arms:
    table += f"| {label} | `{study}` {cond} | {config_diff(cfgs[label], cfgs[ref])} |\n"
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  atomic_write_text(out / "table.md", table)
  result = {
    "seeds": seeds,
    "arms": {label: f"{study}:{cond}" for label, study, cond in arms},
    "eval": ev,
    "summaries": {
      k: {kk: v for kk, v in s.items() if kk != "per_problem"} for k, s in summaries.items()
    },
    "seed_tests": seed_tests,
  }
  atomic_write_json(out / "results.json", result)
  print(table)
  return result


if __name__ == "__main__":
  main()
