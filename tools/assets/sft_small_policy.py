"""Builds the small task's policy: tokenizer, data splits, and a tiny Llama trained by SFT.

For the CPU-sized Cooper study: a randomly initialised ~0.23M-parameter Llama is fine-tuned on
arithmetic word problems (cooper_jax.tasks.arith) where a fraction `--wrong_frac` of the
worked solutions are deliberately wrong (one arithmetic slip, carried through). The policy
then imitates a mix of right and wrong reasoning and starts at moderate accuracy, leaving RL
room to improve it (or, with a hackable reward, to make it worse).

Writes, under --workdir (default runs/small_task):
  tokenizer/                      HF tokenizer dir (built if absent, or with --rebuild_tokenizer)
  data/{sft,rm,train,test}.jsonl  disjoint splits (fixed by --data_seed, not by --seed)
  policy/ (or --out)              HF LlamaForCausalLM dir with the tokenizer, + sft_report.json

Then reloads the policy from disk with the normal loaders and reports pass@1 on the test
split through cooper_jax.evaluate.evaluate_model.

  python tools/assets/sft_small_policy.py --workdir runs/small_task

Why these defaults (d_model 64, batch 16, 2000 steps, lr 4e-3): on a busy 2-core CPU a
d_model 128 model ran ~2 s per batch of 32 and after 150 steps had learned the format but not
the sums (3% held-out); what the model lacks is arithmetic, which needs many updates, so a
smaller model taking many small steps reaches ~20-25% held-out pass@1 (T=1) in ~6 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--workdir", default="runs/small_task")
  p.add_argument("--out", default=None, help="policy dir (default WORKDIR/policy)")
  p.add_argument("--tokenizer", default=None, help="tokenizer dir (default WORKDIR/tokenizer)")
  p.add_argument("--rebuild_tokenizer", action="store_true")
  p.add_argument("--data_seed", type=int, default=0, help="fixes the data splits")
  p.add_argument("--difficulties", default="1,2,3")
  p.add_argument("--n_sft", type=int, default=16000)
  p.add_argument("--n_rm", type=int, default=1000)
  p.add_argument("--n_train", type=int, default=2000)
  p.add_argument("--n_test", type=int, default=200)
  p.add_argument("--seed", type=int, default=0, help="model init, batch order, wrong solutions")
  p.add_argument("--wrong_frac", type=float, default=0.4)
  p.add_argument("--d_model", type=int, default=64)
  p.add_argument("--n_layers", type=int, default=4)
  p.add_argument("--n_heads", type=int, default=4)
  p.add_argument("--n_kv_heads", type=int, default=2)
  p.add_argument("--d_ff", type=int, default=None, help="default 3 * d_model")
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--lr", type=float, default=4e-3)
  p.add_argument("--warmup", type=int, default=20)
  p.add_argument("--max_len", type=int, default=192)
  p.add_argument("--eval_samples", type=int, default=4)
  p.add_argument("--eval_temperature", type=float, default=1.0)
  p.add_argument("--eval_max_new_tokens", type=int, default=96)
  p.add_argument("--log_every", type=int, default=100)
  a = p.parse_args(argv)
  if not 0.0 <= a.wrong_frac <= 1.0:
    p.error(f"--wrong_frac must be in [0, 1], got {a.wrong_frac}")
  if a.steps < 1 or a.batch < 1:
    p.error("--steps and --batch must be >= 1")
  if a.d_model % a.n_heads:
    p.error(f"--d_model {a.d_model} is not a multiple of --n_heads {a.n_heads}")
  a.difficulties = tuple(int(d) for d in a.difficulties.split(",") if d.strip())
  return a


def make_splits(data_dir: Path, a) -> dict[str, list[dict]]:
  """Disjoint splits (no question shared). Deterministic, so rewriting them is harmless."""
  from cooper_jax.tasks.arith import write_split  # pylint: disable=import-outside-toplevel

  splits, seen = {}, set()
  # Test first: it must stay the same when the other splits' sizes change.
  for i, (name, n) in enumerate(
    [("test", a.n_test), ("sft", a.n_sft), ("rm", a.n_rm), ("train", a.n_train)]
  ):
    rows = write_split(
      data_dir / f"{name}.jsonl",
      n,
      seed=a.data_seed * 100 + i,
      difficulties=a.difficulties,
      exclude_questions=seen,
    )
    seen.update(r["question"] for r in rows)
    splits[name] = rows
  return splits


def sft_examples(rows, wrong_frac: float, seed: int):
  """(questions, responses, is_wrong): exactly round(wrong_frac * n) rows get a wrong solution."""
  from cooper_jax.tasks.arith import make_wrong_solution  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng([seed, 1])
  wrong = np.zeros(len(rows), bool)
  wrong[rng.permutation(len(rows))[: int(round(wrong_frac * len(rows)))]] = True
  responses = [make_wrong_solution(r, rng) if w else r["solution"] for r, w in zip(rows, wrong)]
  return [r["question"] for r in rows], responses, wrong


def small_config(tok, a):
  from cooper_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel

  return ModelConfig(
    vocab_size=tok.vocab_size,
    d_model=a.d_model,
    n_layers=a.n_layers,
    n_heads=a.n_heads,
    n_kv_heads=a.n_kv_heads,
    head_dim=a.d_model // a.n_heads,
    d_ff=a.d_ff or 3 * a.d_model,
    rms_eps=1e-5,
    tie_embeddings=True,
    family="llama",
    max_seq_len=512,
    bos_id=tok.bos_id,
    eos_id=tok.eos_id,
    pad_id=tok.pad_id,
  )


def train(cfg, tok, questions, responses, a):
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax.models.transformer import init_params  # pylint: disable=import-outside-toplevel
  from cooper_jax.prompts import build_prompts  # pylint: disable=import-outside-toplevel
  from cooper_jax.sft import train_sft  # pylint: disable=import-outside-toplevel

  # Jitted init: eager Flax init runs the scanned layers op by op (slow on a busy CPU).
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(a.seed))
  return train_sft(
    cfg,
    tok,
    params,
    # The same prompt the evaluator and the RL trainer render (chat template + instruction).
    build_prompts(tok, questions),
    responses,
    n_steps=a.steps,
    batch_size=a.batch,
    lr=a.lr,
    warmup=a.warmup,
    max_len=a.max_len,
    rng=np.random.default_rng([a.seed, 2]),
    log_every=a.log_every,
  )


def evaluate_policy(policy_dir: Path, test_rows, a) -> dict:
  from cooper_jax.evaluate import evaluate_dir  # pylint: disable=import-outside-toplevel

  # Reload from disk on purpose: the study loads it this way, so test that path.
  res = evaluate_dir(
    policy_dir,
    {"arith_test": test_rows},
    samples=a.eval_samples,
    temperature=a.eval_temperature,
    top_p=1.0,
    max_new_tokens=a.eval_max_new_tokens,
    batch_size=128,
    seed=a.seed,
  )
  b = res["benchmarks"]["arith_test"]
  acc = np.asarray(b["per_problem_acc"])
  diff = np.asarray([r["difficulty"] for r in test_rows])
  return {
    "accuracy": b["accuracy"],
    "ci95": b.get("ci95"),
    "by_difficulty": {int(d): float(acc[diff == d].mean()) for d in np.unique(diff)},
    "counts": b["counts"],
    "mean_response_tokens": b["mean_response_tokens"],
    "truncated_fraction": b["truncated_fraction"],
    "samples": a.eval_samples,
    "temperature": a.eval_temperature,
    "throughput": b["throughput"],
  }


def main(argv=None) -> dict:
  a = parse_args(argv)
  t_start = time.perf_counter()
  from cooper_jax.io import atomic_write_json  # pylint: disable=import-outside-toplevel
  from cooper_jax.tasks.small_tokenizer import build_small_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import save_hf_dir  # pylint: disable=import-outside-toplevel

  work = Path(a.workdir)
  tok_dir = Path(a.tokenizer or work / "tokenizer")
  out = Path(a.out or work / "policy")
  if a.rebuild_tokenizer or not (tok_dir / "tokenizer.json").is_file():
    build_small_tokenizer(tok_dir)
    print(f"built tokenizer {tok_dir}")
  tok = load_tokenizer(tok_dir)
  splits = make_splits(work / "data", a)
  print("splits: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
  questions, responses, wrong = sft_examples(splits["sft"], a.wrong_frac, a.seed)
  cfg = small_config(tok, a)
  print(
    f"model: {cfg.num_params():,} params, vocab {cfg.vocab_size}; SFT on {len(questions)} "
    f"rows, {wrong.mean():.1%} wrong solutions",
    flush=True,
  )

  params, log, train_s = train(cfg, tok, questions, responses, a)
  save_hf_dir(cfg, params, out, tokenizer=tok)
  print(f"saved {out} (train {train_s:.0f}s)", flush=True)

  t0 = time.perf_counter()
  ev = evaluate_policy(out, splits["test"], a)
  eval_s = time.perf_counter() - t0
  report = {
    "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(a).items()},
    "n_params": cfg.num_params(),
    "vocab_size": cfg.vocab_size,
    "sft_rows": len(questions),
    "wrong_fraction": float(wrong.mean()),
    "train_log": log,
    "train_s": train_s,
    "eval_s": eval_s,
    "eval": ev,
    "wall_s": time.perf_counter() - t_start,
  }
  atomic_write_json(out / "sft_report.json", report)
  print(
    f"held-out pass@1 ({a.eval_samples} samples, T={a.eval_temperature}): "
    f"{ev['accuracy']:.3f} by difficulty {ev['by_difficulty']}; verifier {ev['counts']}; "
    f"mean len {ev['mean_response_tokens']:.1f}; eval {eval_s:.0f}s; "
    f"wall {report['wall_s']:.0f}s",
    flush=True,
  )
  return report


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
