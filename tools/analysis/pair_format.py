"""A format cue in the RM's pairs: per block of steps, the share of accepted pairs whose
positive and whose negative state their answer in a closed, non-empty \\boxed{...}, and the
share of pairs that this format alone separates (one has a boxed answer, the other not:
math-verify then falls back to the text's last number, so an answer-less rollout can be a
rule-verified positive). A co-trained RM can learn such a cue
instead of the answer's correctness (docs/parity.md, "the texts the RM compares").

  python tools/analysis/pair_format.py results/overopt_competent_cooper/runs/*rmlr1x_s0 \
      [--block 20]

Reads each run folder's pairs.jsonl (written by every Cooper run); prints one table per run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cooper_jax.rewards.verify import boxed_answer


def block_shares(pairs: list[dict], block: int) -> list[dict]:
  """Per block (steps k*block+1 .. (k+1)*block): accepted pairs, and the shares of them whose
  positive / negative has a boxed answer and that this alone separates."""
  out = {}
  for p in pairs:
    if not p.get("accepted"):
      continue
    k = (int(p["step"]) - 1) // block
    b = out.setdefault(k, {"pairs": 0, "pos_boxed": 0, "neg_boxed": 0, "separated": 0})
    pos, neg = boxed_answer(p["positive"]), boxed_answer(p["negative"])
    b["pairs"] += 1
    b["pos_boxed"] += pos
    b["neg_boxed"] += neg
    b["separated"] += pos != neg
  return [
    {
      "end_step": (k + 1) * block,
      "pairs": b["pairs"],
      **{key: b[key] / b["pairs"] for key in ("pos_boxed", "neg_boxed", "separated")},
    }
    for k, b in sorted(out.items())
  ]


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("runs", nargs="+")
  ap.add_argument("--block", type=int, default=20)
  a = ap.parse_args(argv)
  result = {}
  for run in a.runs:
    path = Path(run) / "pairs.jsonl"
    if not path.exists():
      raise FileNotFoundError(f"{path}: no pairs.jsonl (not a Cooper run, or not started)")
    pairs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = block_shares(pairs, a.block)
    result[run] = rows
    print(
      f"\n{run}\n| steps to | pairs | positive: boxed answer | negative: boxed answer | format separates |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
      print(
        f"| {r['end_step']} | {r['pairs']} | {r['pos_boxed']:.2f} | {r['neg_boxed']:.2f} | "
        f"{r['separated']:.2f} |"
      )
  return result


if __name__ == "__main__":
  main()
