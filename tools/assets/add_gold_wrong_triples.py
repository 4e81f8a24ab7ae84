"""Add a gold and a one-slip wrong solution of every TRAINING question to an RM triples file.

For the wide testbed's rm_competent/ (experiments/assets/small_task/README.md): BCE on the
policy's hybrid-labelled rollouts alone left the RM at held-out AUC 0.85 with its training loss
still falling (memorising rollouts, not comparing answers); minimal pairs of the same question
(gold vs arith.make_wrong_solution, the answer changed by one slip) teach the comparison. The
held-out questions of cooper_jax/cli/pretrain_rm.py's split (split_by_question, same --seed and
--heldout_frac) get none, so its held-out set stays the policy's rollouts only. The new rows are
labelled like the rollouts (annotate.hybrid_label: math-verify and the chain check, kept where
they agree; the counts are printed) and carry source gold / wrong_solution, which pretrain_rm
only ever trains on.

  python tools/assets/add_gold_wrong_triples.py --triples runs/rmc/rm_competent_triples.jsonl \\
      --questions experiments/assets/small_task/data/rm_competent_questions.jsonl \\
      --out runs/rmc/rm_competent_triples_gold_wrong.jsonl
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--triples", required=True, help="pretrain_rm's triples (policy rollouts)")
  p.add_argument("--questions", required=True, help="the arith rows the rollouts answer")
  p.add_argument("--out", required=True, help="the triples plus the new rows (JSONL)")
  p.add_argument("--heldout_frac", type=float, default=0.2, help="as pretrain_rm's")
  p.add_argument("--seed", type=int, default=0, help="as pretrain_rm's")
  return p.parse_args(argv)


def main(argv=None) -> None:
  from cooper_jax.cli.annotate import hybrid_label  # pylint: disable=import-outside-toplevel
  from cooper_jax.cli.pretrain_rm import split_by_question  # pylint: disable=import-outside-toplevel
  from cooper_jax.io import read_completions, write_jsonl  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import RuleVerifier  # pylint: disable=import-outside-toplevel
  from cooper_jax.tasks.arith import make_wrong_solution  # pylint: disable=import-outside-toplevel

  a = parse_args(argv)
  triples = read_completions(a.triples, require_label=True)
  with open(a.questions, encoding="utf-8") as f:
    rows = {r["question"]: r for r in map(json.loads, filter(str.strip, f))}
  train, held = split_by_question(triples, a.heldout_frac, a.seed)
  questions = sorted({t["question"] for t in train} - {t["question"] for t in held})
  rng = np.random.default_rng([a.seed, 5])
  new = []
  for q in questions:
    r = rows[q]
    base = {"question": q, "reference": str(r["answer"])}
    new.append({**base, "id": f"{r['id']}-gold", "completion": r["solution"], "source": "gold"})
    new.append(
      {
        **base,
        "id": f"{r['id']}-wrong",
        "completion": make_wrong_solution(r, rng),
        "source": "wrong_solution",
      }
    )
  with RuleVerifier(1) as v:
    verdict = v.verify([t["completion"] for t in new], [t["reference"] for t in new])
  for t, correct in zip(new, verdict.correct):
    t["label"] = int(correct)
  kept, _, stats = hybrid_label(new, [rows[t["question"]]["solution"] for t in new])
  write_jsonl(a.out, triples + kept)
  print(f"{len(questions)} training questions: hybrid label {stats}; wrote {a.out}")


if __name__ == "__main__":
  main()
