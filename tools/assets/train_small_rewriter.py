"""The small task's assistant for `pairs.negatives=llm_rewrite`: the task's tokenizer and backbone
trained to rewrite a correct solution into a plausible wrong one of the same length.

The paper's assistant is an instruction-following 7B model prompted to rewrite a correct
solution with wrong reasoning. The small task's 529-word vocabulary has no instructions, so
this assistant learns the rewrite from examples instead, with the `plain` prompt format
(`rewards.rewrite.rewrite_chat_prompt`: the question and the correct solution as the user turn):
the target is a one-slip wrong solution (`tasks.arith.make_wrong_solution`: an off-by-one, a
dropped ten, swapped digits or a misread operand on a random line of the chain, carried through
to the end). It starts from the SFT policy's weights (the arithmetic and the format are known).

  python tools/assets/train_small_rewriter.py --init experiments/assets/small_task/policy \\
      --exclude experiments/assets/small_task/data --out runs/rewriter

writes OUT (an HF dir with the tokenizer) and OUT/rewriter_report.json: on held-out questions,
sampled at T=0.7 as the training loop samples it, the share of rewrites that parse, whose
answer differs from the reference (what math-verify then accepts), whose first wrong line is
not the last one (errors anywhere in the chain), and the length ratio to the positive.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--init", required=True, help="the small-task policy dir (weights, tokenizer)")
  p.add_argument("--exclude", required=True, help="data dir whose train/test questions to avoid")
  p.add_argument("--out", required=True)
  p.add_argument("--n_rows", type=int, default=8000)
  p.add_argument("--n_eval", type=int, default=200)
  p.add_argument("--steps", type=int, default=1500)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--warmup", type=int, default=20)
  p.add_argument("--max_len", type=int, default=256)
  p.add_argument("--temperature", type=float, default=0.7)
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def rewrite_rows(a) -> tuple[list[dict], list[dict]]:
  """(training rows, held-out rows): fresh problems, none of --exclude's questions."""
  from cooper_jax.tasks.arith import generate_rows  # pylint: disable=import-outside-toplevel

  exclude = set()
  for name in ("train.jsonl", "test.jsonl"):
    path = Path(a.exclude) / name
    if not path.exists():
      raise FileNotFoundError(f"--exclude: {path} not found")
    exclude |= {json.loads(l)["question"] for l in path.read_text().splitlines() if l.strip()}
  rows = generate_rows(a.n_rows + a.n_eval, seed=1000 + a.seed, exclude_questions=exclude)
  return rows[: a.n_rows], rows[a.n_rows :]


def rewrite_quality(rewrites: list[str], rows: list[dict]) -> dict:
  """What the training loop needs of a rewrite, measured against the positive it came from."""
  from cooper_jax.tasks.arith import boxed_answer, parse_solution  # pylint: disable=import-outside-toplevel

  parsed = differs = not_last = 0
  ratios = []
  for text, r in zip(rewrites, rows):
    gold = parse_solution(r["solution"])
    try:
      lines = parse_solution(text)
    except ValueError:
      continue
    parsed += 1
    answer = boxed_answer(text)
    if answer is not None and answer != int(r["answer"]):
      differs += 1
      wrong = [i for i, (g, x) in enumerate(zip(gold, lines)) if g != x]
      if wrong and wrong[0] < len(gold) - 1:
        not_last += 1
    ratios.append(len(text) / len(r["solution"]))
  n = len(rows)
  return {
    "n": n,
    "parsed": parsed / n,
    "answer_differs": differs / n,
    "first_error_before_last_line": not_last / max(differs, 1),
    "length_ratio_mean": float(np.mean(ratios)) if ratios else float("nan"),
  }


def main(argv=None) -> dict:
  a = parse_args(argv)
  t0 = time.perf_counter()
  from cooper_jax.io import atomic_write_json  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.rewrite import LLMRewriteNegatives, rewrite_chat_prompt  # pylint: disable=import-outside-toplevel
  from cooper_jax.sft import train_sft  # pylint: disable=import-outside-toplevel
  from cooper_jax.tasks.arith import make_wrong_solution  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained, save_hf_dir  # pylint: disable=import-outside-toplevel

  tok = load_tokenizer(a.init)
  cfg, params = load_pretrained(a.init)
  train_rows, eval_rows = rewrite_rows(a)
  rng = np.random.default_rng([a.seed, 21])
  prompts = [rewrite_chat_prompt(tok, r["question"], r["solution"], "plain") for r in train_rows]
  targets = [make_wrong_solution(r, rng) for r in train_rows]
  print(f"{len(prompts)} rewrite examples; held-out {len(eval_rows)}", flush=True)

  params, log, train_s = train_sft(
    cfg,
    tok,
    params,
    prompts,
    targets,
    n_steps=a.steps,
    batch_size=a.batch,
    lr=a.lr,
    warmup=a.warmup,
    max_len=a.max_len,
    rng=np.random.default_rng([a.seed, 22]),
  )
  out = Path(a.out)
  save_hf_dir(cfg, params, out, tokenizer=tok)

  # Held-out quality, sampled through the generator the training loop uses.
  gen = LLMRewriteNegatives(
    cfg, params, tok, temperature=a.temperature, max_new_tokens=96, prompt_format="plain"
  )
  rewrites = []
  for s in range(0, len(eval_rows), 64):
    chunk = eval_rows[s : s + 64]
    rewrites += gen.generate([r["question"] for r in chunk], [r["solution"] for r in chunk], 0, rng)
  quality = rewrite_quality(rewrites, eval_rows)
  report = {
    "args": vars(a),
    "n_train": len(prompts),
    "train_log": log,
    "train_s": train_s,
    "heldout": quality,
    "examples": [
      {"question": r["question"], "positive": r["solution"], "rewrite": t}
      for r, t in zip(eval_rows[:5], rewrites[:5])
    ],
    "wall_s": time.perf_counter() - t0,
  }
  atomic_write_json(out / "rewriter_report.json", report)
  print(f"saved {out}; held-out rewrites: {quality}; wall {report['wall_s']:.0f}s", flush=True)
  return report


if __name__ == "__main__":
  main()
