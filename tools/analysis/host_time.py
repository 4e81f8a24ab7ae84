"""The host's share of a paper-sized training step, measured on this machine: what a step does
on the CPU between the sampler's output and the updates, for 64 prompts x 16 rollouts.

  python tools/analysis/host_time.py [--rollouts 1024] [--tokens 1024] [--workers 1] [--scale_to 8]

Responses: MATH500 reference solutions (each ends in its \\boxed answer) with filler reasoning
appended up to --tokens tokens, so the verifier parses paper-length texts; references their
answers, a quarter of them swapped for another problem's (wrong rollouts). Timed, each once
after a warm-up on 32 rows:
  decode      the response ids to text (the embedded SmolLM2 tokenizer, a stand-in for the
              paper's Qwen2.5 tokenizer: both byte-level BPE);
  verify      the rule verifier (math-verify, cooper_jax.rewards.verify) with --workers
              processes, and the seconds per rollout per worker;
  rm inputs   the RM's inputs, question + reference + response, encoded to rm.max_len 2048.
The per-step host time with `--scale_to` verifier workers (config verifier.workers, 0: min(8,
cpus // 2), 8 on a TPU VM host) assumes verification scales with workers (independent items,
one process each) and the rest does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cooper_jax.io import read_jsonl  # noqa: E402
from cooper_jax.prompts import encode_rm_inputs  # noqa: E402
from cooper_jax.rewards.verify import RuleVerifier  # noqa: E402
from cooper_jax.tokenizer import load_tokenizer  # noqa: E402

FILLER = " Let us check each step of this computation once more carefully before we conclude."


def responses(tok, n: int, tokens: int) -> tuple[list[list[int]], list[str], list[str]]:
  """n (response ids, question, reference) from MATH500, each response `tokens` long."""
  rows = [r for _, r in read_jsonl(ROOT / "data" / "math500" / "test.jsonl")]
  ids, questions, refs = [], [], []
  filler = tok.encode(FILLER)
  for i in range(n):
    r = rows[i % len(rows)]
    body = tok.encode(r["solution"])
    pad = (filler * (tokens // len(filler) + 1))[: max(0, tokens - len(body))]
    ids.append((pad + body)[:tokens] if len(body) < tokens else body[-tokens:])
    questions.append(r["question"])
    wrong = i % 4 == 3
    refs.append(rows[(i + 7) % len(rows)]["answer"] if wrong else r["answer"])
  return ids, questions, refs


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--rollouts", type=int, default=1024)
  ap.add_argument("--tokens", type=int, default=1024)
  ap.add_argument("--workers", type=int, default=1)
  ap.add_argument("--scale_to", type=int, default=8)
  a = ap.parse_args(argv)
  tok = load_tokenizer("smollm2-135m-instruct")
  ids, questions, refs = responses(tok, a.rollouts, a.tokens)
  verifier = RuleVerifier(a.workers)
  try:
    warm = [tok.decode(x) for x in ids[:32]]
    verifier.verify(warm, refs[:32])
    t = time.perf_counter()
    texts = [tok.decode(x) for x in ids]
    decode_s = time.perf_counter() - t
    t = time.perf_counter()
    result = verifier.verify(texts, refs)
    verify_s = time.perf_counter() - t
    t = time.perf_counter()
    encode_rm_inputs(tok, questions, refs, texts, 2048, pad_to_multiple=128)
    rm_s = time.perf_counter() - t
  finally:
    verifier.close()
  per_item = verify_s * a.workers / a.rollouts
  host_s = decode_s + rm_s + per_item * a.rollouts / a.scale_to
  out = {
    "rollouts": a.rollouts,
    "tokens": a.tokens,
    "decode_s": decode_s,
    "verify_s": verify_s,
    "verify_workers": a.workers,
    "verify_s_per_rollout_per_worker": per_item,
    "rm_inputs_s": rm_s,
    "correct": int(result.correct.sum()),
    "statuses": result.counts,
    f"host_s_at_{a.scale_to}_workers": host_s,
  }
  print(
    f"{a.rollouts} rollouts of {a.tokens} tokens: decode {decode_s:.2f} s, verify {verify_s:.2f} s "
    f"with {a.workers} worker(s) ({1e3 * per_item:.1f} ms a rollout a worker; "
    f"{int(result.correct.sum())} right), RM inputs {rm_s:.2f} s; a step's host time with "
    f"{a.scale_to} verifier workers: {host_s:.2f} s"
  )
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
