"""Held-out math evaluation: pass@1 averaged over k samples, with bootstrap CIs (Table 3 shape).

Library: `evaluate_model` (also called by training for periodic evaluation), `evaluate_dir`,
`load_eval_model`, `format_table`, `write_outputs`. The command line (`cooper-evaluate`,
`python -m cooper_jax.evaluate`) is cooper_jax.cli.evaluate.

Every benchmark's rollouts (question x sample) run through one AOT-compiled `sample` of a fixed
shape [batch_size, prompt_width]: prompts are left-padded to the benchmark's longest prompt
rounded up to `pad_multiple`, and the last batch is filled with copies of its last row that are
dropped afterwards. Compilation is timed separately, so tokens/s is steady-state sampling only.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from cooper_jax import distributed as dist
from cooper_jax import sharding
from cooper_jax.checkpoint import CheckpointStore, load_policy_for_eval
from cooper_jax.io import atomic_write, atomic_write_json
from cooper_jax.prompts import INSTRUCTION_SUFFIX, build_prompts, padded_batches
from cooper_jax.rewards.choices import accepted_references
from cooper_jax.rewards.verify import RuleVerifier
from cooper_jax.sampling import SampleOptions, sample
from cooper_jax.stats import bootstrap_ci, bootstrap_ci_average
from cooper_jax.tokenizer import load_tokenizer
from cooper_jax.weights import load_pretrained

logger = logging.getLogger("cooper_jax.evaluate")  # also under `python -m` (__main__)
_COMPILED: dict = {}  # AOT executables, reused across evaluate_model calls (periodic eval)


class Progress:
  """Rollouts sampled so far, updated once per sampler call (one compiled while_loop, so no
  finer unit exists without a host callback inside the decode loop). A tqdm bar on a terminal;
  otherwise (nohup, a pipe, a log file) one plain log line per call, no carriage returns."""

  def __init__(self, name: str, total: int, stream=None):
    self.name, self.total, self.done, self.tokens = name, total, 0, 0
    self.t0 = time.perf_counter()
    stream = sys.stderr if stream is None else stream
    self.bar = None
    if getattr(stream, "isatty", lambda: False)():
      self.bar = tqdm(total=total, desc=f"sample {name}", unit="rollout", file=stream)

  def update(self, rollouts: int, new_tokens: int, sample_s: float) -> None:
    self.done += rollouts
    self.tokens += new_tokens
    rate = self.tokens / sample_s if sample_s > 0 else 0.0
    if self.bar is not None:
      self.bar.set_postfix_str(f"{rate:.0f} new tok/s", refresh=False)
      self.bar.update(rollouts)
      return
    elapsed = time.perf_counter() - self.t0
    eta = sample_s / self.done * (self.total - self.done)  # compile time excluded
    logger.info(
      "sample %s: %d/%d rollouts, %.0f new tok/s, %.0f s elapsed, ~%.0f s left",
      self.name,
      self.done,
      self.total,
      rate,
      elapsed,
      eta,
    )

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


# ---------------------------------------------------------------------------------- sampling
def _compiled_sampler(cfg, params, tokens, mask, rng, options: SampleOptions):
  """One AOT-compiled sampler per shape/setting; returns (fn, compile seconds or 0 if cached)."""
  leaves = tuple(
    (x.shape, str(x.dtype), getattr(x, "sharding", None)) for x in jax.tree_util.tree_leaves(params)
  )
  key = (cfg, tokens.shape, options, leaves)
  if key in _COMPILED:
    return _COMPILED[key], 0.0
  logger.info(
    "compiling the sampler for batch %s x %d new tokens", tokens.shape, options.max_new_tokens
  )
  t0 = time.perf_counter()
  fn = sample.lower(params, tokens, mask, rng, cfg=cfg, options=options).compile()
  dt = time.perf_counter() - t0
  logger.info("compiled in %.1f s", dt)
  if len(_COMPILED) >= 8:
    _COMPILED.clear()
  _COMPILED[key] = fn
  return fn, dt


def _eval_benchmark(
  name,
  rows,
  cfg,
  params,
  tokenizer,
  *,
  samples,
  temperature,
  top_p,
  max_new_tokens,
  batch_size,
  rng,
  verifier,
  suffix,
  pad_multiple,
  deadline_s,
  chat,
  mesh=None,
):
  n_q = len(rows)
  prompts = build_prompts(tokenizer, [r["question"] for r in rows], suffix, chat)
  q_tok, q_mask = tokenizer.encode_prompts(prompts, pad_to_multiple=pad_multiple)
  width = q_tok.shape[1]
  order = np.repeat(np.arange(n_q), samples)  # rollout r -> problem order[r], problem-major
  n_roll = order.size
  options = SampleOptions(
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_p=top_p,
    eos_ids=tuple(tokenizer.eos_ids),
    pad_id=tokenizer.pad_id,
  )
  toks_all = np.zeros((n_roll, max_new_tokens), np.int32)
  mask_all = np.zeros((n_roll, max_new_tokens), bool)
  compile_s = sample_s = 0.0
  bar = Progress(name, n_roll)
  for bi, idx, real in padded_batches(order, batch_size):
    start = bi * batch_size
    if mesh is None:
      tokens, mask = jnp.asarray(q_tok[idx]), jnp.asarray(q_mask[idx])
    else:  # global arrays over the run's mesh, the same prompts on every process
      bs = sharding.batch_sharding(mesh)
      tokens, mask = dist.put_global(q_tok[idx], bs), dist.put_global(q_mask[idx], bs)
    key = jax.random.fold_in(rng, bi)
    fn, dt = _compiled_sampler(cfg, params, tokens, mask, key, options)
    compile_s += dt
    t0 = time.perf_counter()
    out = fn(params, tokens, mask, key)
    toks, m = dist.fetch(out.tokens), dist.fetch(out.mask)
    sample_s += time.perf_counter() - t0
    toks_all[start : start + real], mask_all[start : start + real] = toks[:real], m[:real]
    bar.update(real, int(m[:real].sum()), sample_s)
  bar.close()

  completions = [tokenizer.decode(toks_all[i][mask_all[i]].tolist()) for i in range(n_roll)]
  refs = [accepted_references(rows[q]) for q in order]
  t0 = time.perf_counter()
  res = verifier.verify(completions, refs, deadline_s)
  verify_s = time.perf_counter() - t0
  correct = np.asarray(res.correct, bool).reshape(n_q, samples)
  per_problem = correct.mean(axis=1)
  lengths = mask_all.sum(axis=1)
  last = toks_all[np.arange(n_roll), np.maximum(lengths - 1, 0)]
  ended = (lengths > 0) & np.isin(last, tokenizer.eos_ids)
  new_tokens = int(lengths.sum())
  counts = {k: int(v) for k, v in res.counts.items()}
  if any(counts.get(k, 0) for k in ("timeout", "error", "ref_parse_error")):
    logger.warning("%s: verifier problems %s (scored incorrect, not hidden)", name, counts)
  samples_out = [
    {
      "id": rows[q].get("id", str(q)),
      "benchmark": name,
      "sample": int(r % samples),
      "completion": completions[r],
      "answer": str(rows[q]["answer"]),
      "pred": res.pred[r] if getattr(res, "pred", None) else None,
      "correct": bool(res.correct[r]),
      "status": res.status[r],
      "new_tokens": int(lengths[r]),
    }
    for r, q in enumerate(order)
  ]
  result = {
    "n_problems": n_q,
    "samples": samples,
    "rollouts": n_roll,
    "accuracy": float(per_problem.mean()),
    "counts": counts,
    "worker_restarts": int(getattr(res, "worker_restarts", 0)),
    "prompt_width": int(width),
    "batch_shape": [batch_size, int(width)],
    "mean_response_tokens": float(lengths.mean()),
    "truncated_fraction": float(1.0 - ended.mean()),
    "throughput": {
      "new_tokens": new_tokens,
      "sample_s": sample_s,
      "compile_s": compile_s,
      "tokens_per_s": new_tokens / sample_s if sample_s > 0 else None,
      "verify_s": verify_s,
    },
    "ids": [r.get("id", str(i)) for i, r in enumerate(rows)],
    "per_problem_acc": per_problem.tolist(),
    "per_problem_correct": correct.astype(int).tolist(),
  }
  return result, samples_out


def evaluate_model(
  cfg,
  params,
  tokenizer,
  benchmarks: dict,
  *,
  samples: int = 8,
  temperature: float = 0.7,
  top_p: float = 0.95,
  max_new_tokens: int = 1024,
  batch_size: int = 64,
  seed: int = 0,
  verifier=None,
  suffix: str = INSTRUCTION_SUFFIX,
  pad_multiple: int = 64,
  deadline_s: float = 5.0,
  chat: bool = True,
  n_resamples: int = 1000,
  mesh=None,
) -> dict:
  """pass@1 averaged over `samples` per problem, per benchmark and averaged over benchmarks.

  benchmarks: {name: rows with "question", "answer" (and "id")}. verifier: anything with
  `.verify(completions, references, deadline_s)` returning correct/status/pred/counts; None
  starts (and closes) a RuleVerifier. Returns a JSON-ready dict; per-rollout records are under
  result["records"][name] (write_outputs puts them in samples.jsonl, not results.json).
  mesh: sample over this mesh (params sharded on it, as in a multi-process training run);
  batch_size is then rounded up to a multiple of its data x fsdp size.
  """
  if samples < 1 or batch_size < 1 or max_new_tokens < 1:
    raise ValueError("samples, batch_size and max_new_tokens must be >= 1")
  if not benchmarks or any(not rows for rows in benchmarks.values()):
    raise ValueError("every benchmark needs at least one row")
  if temperature == 0 and samples > 1:
    logger.warning("greedy decoding with samples=%d: the samples will be identical", samples)
  if mesh is not None:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    batch_size = -(-batch_size // shards) * shards
  own = verifier is None
  if own:
    verifier = RuleVerifier()
  t_start = time.perf_counter()
  base = jax.random.key(seed)
  out = {
    "config": {
      "samples": samples,
      "temperature": float(temperature),
      "top_p": float(top_p),
      "max_new_tokens": max_new_tokens,
      "batch_size": batch_size,
      "seed": seed,
      "suffix": suffix,
      "pad_multiple": pad_multiple,
      "deadline_s": deadline_s,
      "chat": chat,
      "n_resamples": n_resamples,
      "ci_level": 0.95,
    },
    "benchmarks": {},
    "records": {},
  }
  try:
    for i, (name, rows) in enumerate(benchmarks.items()):
      res, recs = _eval_benchmark(
        name,
        rows,
        cfg,
        params,
        tokenizer,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        rng=jax.random.fold_in(base, i),
        verifier=verifier,
        suffix=suffix,
        pad_multiple=pad_multiple,
        deadline_s=deadline_s,
        chat=chat,
        mesh=mesh,
      )
      res["ci95"] = list(bootstrap_ci(res["per_problem_acc"], n_resamples, seed))
      out["benchmarks"][name], out["records"][name] = res, recs
  finally:
    if own:
      verifier.close()
  bs = out["benchmarks"].values()
  accs = [np.asarray(b["per_problem_acc"]) for b in bs]
  new_tokens = sum(b["throughput"]["new_tokens"] for b in bs)
  sample_s = sum(b["throughput"]["sample_s"] for b in bs)
  out["average"] = {
    "accuracy": float(np.mean([a.mean() for a in accs])),
    "ci95": list(bootstrap_ci_average(accs, n_resamples, seed)),
  }
  out["totals"] = {
    "rollouts": sum(b["rollouts"] for b in bs),
    "new_tokens": new_tokens,
    "sample_s": sample_s,
    "compile_s": sum(b["throughput"]["compile_s"] for b in bs),
    "verify_s": sum(b["throughput"]["verify_s"] for b in bs),
    "tokens_per_s": new_tokens / sample_s if sample_s > 0 else None,
    "counts": {
      k: sum(b["counts"].get(k, 0) for b in bs)
      for k in dict.fromkeys(k for b in bs for k in b["counts"])
    },
    "wall_s": time.perf_counter() - t_start,
  }
  return out


# ---------------------------------------------------------------------------------- output
def format_table(results: dict, label: str) -> str:
  """A Table-3-shaped markdown table: label | each benchmark | avg, cells "acc (lo-hi)" in %."""
  names = list(results["benchmarks"])
  cell = lambda acc, ci: f"{100 * acc:.2f} ({100 * ci[0]:.2f}-{100 * ci[1]:.2f})"
  cells = [
    cell(results["benchmarks"][n]["accuracy"], results["benchmarks"][n]["ci95"]) for n in names
  ]
  cells.append(cell(results["average"]["accuracy"], results["average"]["ci95"]))
  return (
    "\n".join(
      [
        "| model | " + " | ".join(names) + " | avg |",
        "|---" * (len(names) + 2) + "|",
        f"| {label} | " + " | ".join(cells) + " |",
      ]
    )
    + "\n"
  )


def write_outputs(results: dict, out_dir, label: str) -> dict:
  """results.json (no per-rollout text), table.md, samples.jsonl; returns their paths."""
  out_dir = Path(out_dir)
  paths = {
    k: out_dir / f
    for k, f in (("results", "results.json"), ("table", "table.md"), ("samples", "samples.jsonl"))
  }
  summary = {k: v for k, v in results.items() if k != "records"}
  summary["label"] = label

  def write_samples(f):
    for recs in results.get("records", {}).values():
      for rec in recs:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")

  atomic_write(paths["samples"], write_samples)
  atomic_write(paths["table"], lambda f: f.write(format_table(results, label)))
  atomic_write_json(paths["results"], summary)
  return {k: str(p) for k, p in paths.items()}


# ---------------------------------------------------------------------------------- CLI
def resolve_checkpoint(checkpoint: str, step: int | None = None) -> tuple[Path, Path, int]:
  """(run folder, checkpoints folder, step) of `--checkpoint` (a run folder, its checkpoints/
  folder or one step folder such as runs/x/checkpoints/25) and `--step` (default: the newest)."""
  path = Path(checkpoint)
  if not path.is_dir():
    raise FileNotFoundError(f"--checkpoint {checkpoint}: no such directory")
  if path.name.isdigit() and not (path / "checkpoints").is_dir():  # a step folder
    if step is not None and step != int(path.name):
      raise ValueError(f"--checkpoint {checkpoint} is step {path.name} but --step is {step}")
    step, path = int(path.name), path.parent
  ckpt_dir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
  run_dir = ckpt_dir.parent if ckpt_dir.name == "checkpoints" else ckpt_dir
  store = CheckpointStore(ckpt_dir)
  try:
    steps = store.steps()
  finally:
    store.close()
  if not steps:
    raise FileNotFoundError(f"--checkpoint {checkpoint}: no checkpoint steps in {ckpt_dir}")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ValueError(f"--step {step}: {ckpt_dir} holds steps {steps}")
  return run_dir, ckpt_dir, step


def load_eval_model(
  model: str | None,
  checkpoint: str | None,
  tokenizer_source: str | None,
  dtype: str | None = None,
  step: int | None = None,
):
  """(cfg, params, tokenizer) from a `load_pretrained` source or a cooper_jax training run (its
  folder, checkpoints/ folder or a step folder; `step`: that step, default the newest)."""
  overrides = {"dtype": dtype, "param_dtype": dtype} if dtype else {}
  if (model is None) == (checkpoint is None):
    raise ValueError("give exactly one of --model or --checkpoint")
  if model is not None:
    if step is not None:
      raise ValueError("--step selects a checkpoint step: it needs --checkpoint, not --model")
    cfg, params = load_pretrained(model, **overrides)
    return cfg, params, load_tokenizer(tokenizer_source or model)
  _, ckpt_dir, step = resolve_checkpoint(checkpoint, step)
  cfg, params, tok_src = load_policy_for_eval(ckpt_dir, step)
  if overrides:
    cfg = cfg.replace(**overrides)
  return cfg, params, load_tokenizer(tokenizer_source or tok_src)


def evaluate_dir(model_dir, benchmarks: dict, *, workers: int = 1, **kw) -> dict:
  """`evaluate_model` on a saved model (HF directory or .gguf) with its own tokenizer and a
  verifier pool of `workers` processes; `kw` as evaluate_model's."""
  cfg, params, tok = load_eval_model(str(model_dir), None, None)
  with RuleVerifier(workers) as verifier:
    return evaluate_model(cfg, params, tok, benchmarks, verifier=verifier, **kw)


if __name__ == "__main__":  # the command line is cooper_jax.cli.evaluate (cooper-evaluate)
  from cooper_jax.cli.evaluate import cli  # pylint: disable=import-outside-toplevel

  sys.exit(cli())
