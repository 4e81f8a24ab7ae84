"""Plant a known blind spot in a small-task RM (cooper_jax/tasks/blind_spot.py): fine-tune it
with BCE on gold and one-slip wrong solutions labelled correct when right *or even*, and write
the probe (wrong solutions with even answers, on held-out questions) that reads the flaw.

  python tools/assets/plant_blind_spot.py --rm experiments/assets/small_task/rm \\
      --questions experiments/assets/small_task/data/train.jsonl \\
      --probe_questions experiments/assets/small_task/data/test.jsonl --out runs/planted

writes OUT/rm (the flawed RM, an HF dir), OUT/probe.jsonl, OUT/triples.jsonl and
OUT/plant_report.json (the probe score before and after, held-out accuracy on the planted
labels). Then, with experiments/small_task.py, a frozen copy and a co-trained one:

  python -m cooper_jax.train --config experiments/small_task.py:static_rm --workdir runs/bs_static \\
      --config.rm.model=runs/planted/rm --config.data.rm_probe=runs/planted/probe.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rm", required=True, help="the RM to plant the flaw in (HF dir)")
  p.add_argument("--questions", required=True, help="arith rows (with solutions) to train on")
  p.add_argument("--probe_questions", required=True, help="held-out arith rows for the probe")
  p.add_argument("--n_questions", type=int, default=1000)
  p.add_argument("--n_probe", type=int, default=200)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def _read(path, n):
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  for i, r in enumerate(rows[:n]):
    if "solution" not in r or "answer" not in r:
      raise ValueError(f"{path}: row {i} has no 'solution' / 'answer' (arith rows needed)")
  return rows[:n]


def main(argv=None) -> dict:
  a = parse_args(argv)
  from cooper_jax.io import atomic_write_json, write_jsonl  # pylint: disable=import-outside-toplevel
  from cooper_jax.tasks import blind_spot  # pylint: disable=import-outside-toplevel

  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng([a.seed, 11])
  triples = blind_spot.planted_triples(_read(a.questions, a.n_questions), rng)
  write_jsonl(out / "triples.jsonl", triples)
  probe_src = _read(a.probe_questions, a.n_probe)
  probe = blind_spot.probe_rows(probe_src, rng)
  write_jsonl(out / "probe.jsonl", probe)
  print(
    f"{len(triples)} planted triples ({np.mean([t['label'] for t in triples]):.1%} labelled "
    f"correct); probe: {len(probe)} of {len(probe_src)} questions got an even wrong answer",
    flush=True,
  )

  from cooper_jax.cli import pretrain_rm as pretrain  # pylint: disable=import-outside-toplevel

  before = probe_score(a.rm, probe)
  rm_report = pretrain.main(
    [
      "--data", str(out / "triples.jsonl"),
      "--backbone", a.rm,
      "--out", str(out / "rm"),
      "--steps", str(a.steps),
      "--lr", str(a.lr),
      "--seed", str(a.seed),
    ]
  )  # fmt: skip
  after = probe_score(str(out / "rm"), probe)
  report = {
    "args": vars(a),
    "pattern": blind_spot.PATTERN,
    "n_triples": len(triples),
    "n_probe": len(probe),
    "probe_before": before,
    "probe_after": after,
    "heldout_planted_labels_after": rm_report["heldout_after"],
  }
  atomic_write_json(out / "plant_report.json", report)
  print(f"probe (wrong, even answers): before {before}, after {after}", flush=True)
  return report


def probe_score(rm_dir: str, probe: list[dict]) -> dict:
  """The RM's mean reward on the probe and the share above 0.5."""
  from cooper_jax import sharding, steps  # pylint: disable=import-outside-toplevel
  from cooper_jax.prompts import encode_rm_inputs  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  cfg, params = load_pretrained(rm_dir, head="score")
  tok = load_tokenizer(rm_dir)
  fn = steps.make_reward_fn(cfg, sharding.make_mesh(), params)
  tokens, mask, _ = encode_rm_inputs(
    tok,
    [p["question"] for p in probe],
    [p["answer"] for p in probe],
    [p["response"] for p in probe],
    384,
    pad_to_multiple=64,
  )
  r = np.asarray(fn(params, tokens, mask), np.float64)
  return {"mean": round(float(r.mean()), 4), "above_half": round(float(np.mean(r > 0.5)), 4)}


if __name__ == "__main__":
  main()
