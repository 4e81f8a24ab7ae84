"""How close the sampler's decode step comes to what this CPU allows (issue 19, item 2).

Two floors for one decode step (every row makes one token, attending to a cache of `ctx`
positions), each measured on this CPU in the same run as the step itself:

  bandwidth  the bytes the step must read, divided by this CPU's streaming read bandwidth
             (best of a jax reduction and numpy reductions on 1 and 2 threads over a 1 GiB
             float32 array, far above the caches): fp32 weights (the issue's floor), and
             weights + the KV cache it attends to;
  compute    the step's model FLOPs divided by this CPU's 2048-cube float32 matmul rate.

The step's time is measured, not modelled: (one sampler call of N new tokens - one of 1) / (N - 1),
each the best of `reps` calls, both compiled ahead of time for the same prompts. The fraction
of a floor is floor / measured (1.0 = at the floor). Which floor is higher says what bounds the
step: if compute's is, more rows per step cannot raise tokens/s much; if bandwidth's is, rows
are nearly free (the weights are read once per step for all of them).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness

GiB = 1 << 30


def read_bandwidth(nbytes: int = GiB, reps: int = 5) -> dict:
  """Streaming read bytes/s: the best of three readers over the same float32 array."""
  x = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
  xj = jnp.asarray(x)
  jsum = jax.jit(jnp.sum).lower(xj).compile()
  jax.block_until_ready(jsum(xj))
  halves = np.array_split(x, 2)
  pool = concurrent.futures.ThreadPoolExecutor(2)

  def np2():  # numpy's reductions release the GIL, so two threads read two halves at once
    return sum(pool.map(np.sum, halves))

  readers = {
    "jax_sum": lambda: jax.block_until_ready(jsum(xj)),
    "numpy_sum_1_thread": lambda: np.sum(x),
    "numpy_sum_2_threads": np2,
  }
  out = {}
  try:
    for name, fn in readers.items():
      fn()
      out[name] = x.nbytes / min(harness.time_calls(fn, reps))
  finally:
    pool.shutdown()
  best = max(out, key=out.get)
  return {"bytes_per_s": out[best], "reader": best, "all": out, "nbytes": int(x.nbytes)}


def decode_bytes(cfg, batch: int, ctx: float, itemsize: int = 4) -> dict:
  """Bytes one decode step must read: every weight once (the embedding table once as the tied
  LM head, plus `batch` looked-up rows; untied: the head too), and each row's KV cache over
  `ctx` positions in every layer."""
  table = cfg.vocab_size * cfg.d_model
  looked_up = table if cfg.tie_embeddings else batch * cfg.d_model
  weights = (cfg.num_params() - table + looked_up) * itemsize  # an untied head stays in
  cache = 2.0 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * ctx * batch * itemsize
  return {"weights": float(weights), "cache": float(cache)}


def decode_step_seconds(make_sampler: Callable, new_tokens: int, reps: int) -> dict:
  """(best call at `new_tokens` - best call at 1 new token) / (new_tokens - 1)."""
  long_s = min(make_sampler(new_tokens).measure(reps))
  short_s = min(make_sampler(1).measure(reps))
  return {
    "step_s": (long_s - short_s) / (new_tokens - 1),
    "call_s": long_s,
    "prefill_and_first_s": short_s,
  }


def decode_floor_section(
  report: harness.Report,
  cfg,
  params,
  prompts: Callable,
  batches,
  new_tokens: int,
  peak: Callable,
  runs: int,
  reps: int,
  target_batch: int = 16,
  target: float = 0.5,
  bandwidth: Callable = read_bandwidth,
):
  """One figure per batch: the measured decode step against its weight-bandwidth floor, with
  the weights + cache and compute floors in each run's detail."""
  from benchmarks.sections import OurSampler, sample_flops  # pylint: disable=import-outside-toplevel

  for b in batches:
    tokens, mask, pad_id = prompts(b)
    lens = mask.sum(axis=1)
    ctx = float(np.mean(lens)) + (new_tokens + 1) / 2.0  # mean cache length over the steps
    fig = report.figure(
      key=f"decode_floor_b{b}",
      label=f"decode step at batch {b}: measured vs fp32-weight bandwidth floor",
      unit="steps/s",
      ours_label="measured",
      peer_label="bandwidth floor",
      target=target if b == target_batch else None,
    )
    fig.notes.append(
      "ratio = floor seconds / measured seconds (1.0 = at the floor); detail: weights+cache "
      "floor and compute floor (model FLOPs / matmul rate), both as fractions too"
    )
    samplers = {}

    def make(n, tokens=tokens, mask=mask, pad_id=pad_id, samplers=samplers):
      if n not in samplers:
        samplers[n] = OurSampler(cfg, params, tokens, mask, n, pad_id)
      return samplers[n]

    flops = sample_flops(cfg, lens, new_tokens)["decode"] / new_tokens  # mean decode step
    nbytes = decode_bytes(cfg, b, ctx)
    for _ in range(runs):
      load = harness.load1()
      bw = bandwidth()
      pk = peak()
      t0 = time.perf_counter()
      step = decode_step_seconds(make, new_tokens, reps)
      floor_w = nbytes["weights"] / bw["bytes_per_s"]
      floor_wc = (nbytes["weights"] + nbytes["cache"]) / bw["bytes_per_s"]
      floor_c = flops / pk["flops_per_s"]
      fig.add_run(
        1.0 / step["step_s"],
        1.0 / floor_w,
        load,
        read_gb_per_s=bw["bytes_per_s"] / 1e9,
        reader=bw["reader"],
        weight_mb=nbytes["weights"] / 1e6,
        cache_mb=nbytes["cache"] / 1e6,
        step_ms=step["step_s"] * 1e3,
        floor_weights_ms=floor_w * 1e3,
        floor_weights_cache_ms=floor_wc * 1e3,
        floor_compute_ms=floor_c * 1e3,
        frac_weights_cache=floor_wc / step["step_s"],
        frac_compute=floor_c / step["step_s"],
        matmul_gflops=pk["flops_per_s"] / 1e9,
        tokens_per_s=b / step["step_s"],
        seconds=time.perf_counter() - t0,
      )
      r = fig.runs[-1]
      print(
        f"    batch {b}: step {r['step_ms']:.1f} ms; floors: weights {r['floor_weights_ms']:.1f}, "
        f"weights+cache {r['floor_weights_cache_ms']:.1f}, compute {r['floor_compute_ms']:.1f} ms "
        f"(read {r['read_gb_per_s']:.1f} GB/s by {r['reader']}, matmul "
        f"{r['matmul_gflops']:.0f} GFLOP/s)",
        flush=True,
      )
