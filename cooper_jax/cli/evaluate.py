"""`cooper-evaluate`: held-out pass@1 of a run or a model over k samples, with bootstrap CIs
(Table 3 shape; the library is cooper_jax.evaluate).

  python -m cooper_jax.evaluate --checkpoint runs/x [--step 25] [--benchmarks ...] [--limit N]
  python -m cooper_jax.evaluate --checkpoint runs/x/checkpoints/25      (a step folder)
  python -m cooper_jax.evaluate --model smollm2-135m-instruct --limit 30
  python -m cooper_jax.evaluate --checkpoint runs/x --preset paper      (on an accelerator)

--preset quick (the default) is sized for a CPU: 1 greedy sample x 256 new tokens, batches of
16 rollouts. --preset paper is the paper's Table 3 setting: 8 samples at temperature 0.7,
top-p 0.95, 1024 new tokens, batches of 64. A flag given explicitly overrides its preset value.
--out defaults to <run>/eval/step_<N> for a checkpoint, eval/<model> for a model.
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path

import jax

from cooper_jax.data import load_qa
from cooper_jax.evaluate import (
  evaluate_model,
  format_table,
  load_eval_model,
  resolve_checkpoint,
  write_outputs,
)
from cooper_jax.prompts import INSTRUCTION_SUFFIX
from cooper_jax.rewards.verify import RuleVerifier

logger = logging.getLogger("cooper_jax.evaluate")

DEFAULT_BENCHMARKS = "gsm8k/test,svamp/test,math500/test,olympiadbench/test,odyssey_math/test"

# The CLI's flag sets. "quick" finishes in minutes on the CPU models (with --limit on the large
# benchmarks); "paper" is Table 3's setting (8 samples x 1024 tokens, for accelerators).
PRESETS = {
  "quick": dict(samples=1, temperature=0.0, top_p=1.0, max_new_tokens=256, batch_size=16),
  "paper": dict(samples=8, temperature=0.7, top_p=0.95, max_new_tokens=1024, batch_size=64),
}


def default_out(model: str | None, checkpoint: str | None, step: int | None = None) -> Path:
  """Where the CLI writes without --out: <run>/eval/step_<N> for a checkpoint (step resolved
  as --step / a step folder / the newest), else eval/<model, path separators as _>."""
  if checkpoint is not None:
    run_dir, _, step = resolve_checkpoint(checkpoint, step)
    return run_dir / "eval" / f"step_{step}"
  return Path("eval") / re.sub(r"[^A-Za-z0-9_.-]+", "_", str(model).strip("./")).strip("_")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(
    prog="python -m cooper_jax.evaluate",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", help="HF dir, .gguf, or 'smollm2-135m-instruct'")
  src.add_argument("--checkpoint", help="a cooper_jax training checkpoint directory")
  p.add_argument("--tokenizer", help="tokenizer source (default: the model's)")
  p.add_argument(
    "--benchmarks",
    default=DEFAULT_BENCHMARKS,
    help="comma-separated registry names, local files, or datasets as NAME:SPLIT / "
    "NAME:SUBSET:SPLIT (a hub name or a local datasets folder)",
  )
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  p.add_argument("--limit", type=int, default=None, help="first N problems per benchmark")
  p.add_argument(
    "--preset",
    choices=sorted(PRESETS),
    default="quick",
    help="flag set: quick (default; CPU-sized: 1 greedy sample x 256 tokens, batch 16) or "
    "paper (Table 3: 8 samples, T 0.7, top-p 0.95, 1024 tokens, batch 64); flags override it",
  )
  # None = the preset's value (PRESETS)
  p.add_argument("--samples", type=int, default=None, help="samples per problem")
  p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
  p.add_argument("--top_p", type=float, default=None)
  p.add_argument("--max_new_tokens", type=int, default=None)
  p.add_argument("--batch_size", type=int, default=None, help="rollouts per sampler call")
  p.add_argument("--pad_multiple", type=int, default=64)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--suffix", default=INSTRUCTION_SUFFIX, help="appended to each question")
  p.add_argument("--no_chat", action="store_true", help="raw prompts, no chat template")
  p.add_argument("--deadline_s", type=float, default=5.0, help="verifier deadline per item")
  p.add_argument("--workers", type=int, default=None, help="verifier processes")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
  p.add_argument("--label", default=None, help="row label in table.md")
  p.add_argument(
    "--out", default=None, help="output folder (default: <run>/eval/step_<N>, or eval/<model>)"
  )
  a = p.parse_args(argv)
  for k, v in PRESETS[a.preset].items():
    if getattr(a, k) is None:
      setattr(a, k, v)
  if a.model is not None and a.step is not None:
    p.error("--step selects a checkpoint step: it needs --checkpoint, not --model")
  # force: an import (absl, via orbax) has already put a handler on the root logger, which
  # would otherwise keep this one out and every INFO line (progress included) unseen; INFO
  # from cooper_jax only (Orbax logs ~40 INFO lines per checkpoint read)
  logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", force=True)
  logging.getLogger("cooper_jax").setLevel(logging.INFO)
  step = None  # resolved first: a wrong --checkpoint / --step fails before anything loads
  if a.checkpoint is not None:
    run_dir, _, step = resolve_checkpoint(a.checkpoint, a.step)
    out = Path(a.out) if a.out else run_dir / "eval" / f"step_{step}"
  else:
    out = Path(a.out) if a.out else default_out(a.model, None)
  logger.info(
    "preset %s: %d sample(s) x %d new tokens, temperature %g, top-p %g, batch %d; writing %s",
    a.preset,
    a.samples,
    a.max_new_tokens,
    a.temperature,
    a.top_p,
    a.batch_size,
    out,
  )

  t0 = time.perf_counter()
  benchmarks = {}
  for name in [b.strip() for b in a.benchmarks.split(",") if b.strip()]:
    rows, report = load_qa(name, limit=a.limit)
    benchmarks[name] = rows
    logger.info(
      "%s: %d problems from %s (skipped %d)", name, len(rows), report.location, report.skipped
    )
  cfg, params, tokenizer = load_eval_model(a.model, a.checkpoint, a.tokenizer, a.dtype, step)
  with RuleVerifier(a.workers) as verifier:
    results = evaluate_model(
      cfg,
      params,
      tokenizer,
      benchmarks,
      samples=a.samples,
      temperature=a.temperature,
      top_p=a.top_p,
      max_new_tokens=a.max_new_tokens,
      batch_size=a.batch_size,
      seed=a.seed,
      verifier=verifier,
      suffix=a.suffix,
      pad_multiple=a.pad_multiple,
      deadline_s=a.deadline_s,
      chat=not a.no_chat,
    )
  results["config"].update(
    model=a.model,
    checkpoint=a.checkpoint,
    step=step,
    preset=a.preset,
    tokenizer=a.tokenizer,
    benchmarks=list(benchmarks),
    limit=a.limit,
    dtype=cfg.dtype,
    devices=[str(d) for d in jax.devices()],
  )
  results["totals"]["script_wall_s"] = time.perf_counter() - t0
  label = a.label or a.model or f"{a.checkpoint} step {step}"
  paths = write_outputs(results, out, label)
  print(format_table(results, label))
  for name, b in results["benchmarks"].items():
    tp = b["throughput"]
    print(
      f"{name}: {b['n_problems']} problems x {b['samples']}, verifier {b['counts']}, "
      f"restarts {b['worker_restarts']}, mean len {b['mean_response_tokens']:.1f} tok, "
      f"truncated {100 * b['truncated_fraction']:.1f}%, "
      f"{(tp['tokens_per_s'] or 0):.1f} new tok/s, compile {tp['compile_s']:.1f}s, "
      f"sampling {tp['sample_s']:.1f}s, verify {tp['verify_s']:.1f}s"
    )
  t = results["totals"]
  print(
    f"total: {(t['tokens_per_s'] or 0):.1f} new tok/s, compile {t['compile_s']:.1f}s, "
    f"eval wall {t['wall_s']:.1f}s, script wall {t['script_wall_s']:.1f}s"
  )
  print("wrote " + ", ".join(paths.values()))
  return results


def cli() -> int:
  """Console-script entry point (pyproject.toml): exit status 0 once main returns."""
  main()
  return 0


if __name__ == "__main__":
  main()
