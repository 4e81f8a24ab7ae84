"""The sampler in the policy's float32 vs in bf16 (config rollout.dtype), side by side in one
run, alternating, on the small task's wide policy and its held-out prompts: seconds per call,
and the mismatch of each sampler's log-probs with the float32 trainer's (what
policy.loss.sampler_is corrects).

  python benchmarks/sampler_dtype.py [--runs 3] [--cap 2.0] [--seq_cap 1.01]

Timing: prompts x G rows, max_new_tokens new tokens with EOS off (every row decodes every
step), one compiled call per side timed `--calls` times per run (median). Mismatch: one call
per side with EOS on, its tokens scored by the trainer's log-prob function
(logprobs.response_logprobs, float32): mean |log ratio|, the k3 KL(sampler || trainer), the
largest ratio, the share of tokens token TIS would cap at --cap, the share of responses the
geometric sequence mask would drop at --seq_cap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cooper_jax.config import base_config  # noqa: E402
from cooper_jax.io import read_jsonl  # noqa: E402
from cooper_jax.logprobs import response_logprobs  # noqa: E402
from cooper_jax.prompts import build_prompts  # noqa: E402
from cooper_jax.sampling import SampleOptions, sample  # noqa: E402
from cooper_jax.tokenizer import load_tokenizer  # noqa: E402
from cooper_jax.weights import load_pretrained  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "experiments" / "assets" / "small_task"
SIDES = ("", "bfloat16")  # rollout.dtype: the policy's (float32), bf16


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default=str(ASSETS / "policy_wide"))
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--max_new_tokens", type=int, default=96)
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--calls", type=int, default=5)
  ap.add_argument("--cap", type=float, default=2.0)
  ap.add_argument("--seq_cap", type=float, default=1.01)
  return ap.parse_args(argv)


def mismatch(cfg, params, ids, mask, out, cap: float, seq_cap: float) -> dict:
  """The sampler's log-probs of its tokens against the float32 trainer's."""
  g = out.tokens.shape[0] // ids.shape[0]
  rep = lambda x: np.repeat(np.asarray(x), g, axis=0)
  trainer = response_logprobs(cfg, params, rep(ids), rep(mask), out.tokens, out.mask)
  m = np.asarray(out.mask)
  d = np.where(m, np.asarray(trainer, np.float64) - np.asarray(out.logprobs, np.float64), 0.0)
  geo = d.sum(1) / np.maximum(m.sum(1), 1)
  return {
    "tokens": int(m.sum()),
    "abs_diff": float(np.abs(d)[m].mean()),
    "kl_k3": float((np.exp(d) - 1 - d)[m].mean()),
    "max_ratio": float(np.exp(d[m]).max()),
    "capped_frac": float((np.exp(d[m]) > cap).mean()),
    "seq_masked_frac": float((np.abs(geo) > np.log(seq_cap)).mean()),
  }


def main(argv=None) -> dict:
  a = parse_args(argv)
  (cfg, params), tok = load_pretrained(a.model), load_tokenizer(a.model)
  rows = [r for _, r in read_jsonl(ASSETS / "data" / "test.jsonl")][: a.prompts]
  texts = build_prompts(tok, [r["question"] for r in rows], base_config().data.prompt_suffix)
  ids, mask = tok.encode_prompts(texts, pad_to_multiple=16)
  rng = jax.random.key(0)
  print(
    f"{jax.devices()[0].device_kind}; policy {cfg.dtype}; {a.prompts} prompts x G={a.group}, "
    f"{a.max_new_tokens} new"
  )
  base = SampleOptions(max_new_tokens=a.max_new_tokens, group_size=a.group, pad_id=tok.pad_id)
  result = {"mismatch": {}, "runs": []}
  for dt in SIDES:
    opts = base.replace(dtype=dt, eos_ids=tuple(tok.eos_ids))
    out = sample(params, ids, mask, rng, cfg=cfg, options=opts)
    result["mismatch"][dt or cfg.dtype] = m = mismatch(
      cfg, params, ids, mask, out, a.cap, a.seq_cap
    )
    print(f"sampler {dt or cfg.dtype}: {m}")
  fns = {
    dt: sample.lower(params, ids, mask, rng, cfg=cfg, options=base.replace(dtype=dt)).compile()
    for dt in SIDES
  }
  for _ in range(a.runs):
    secs = {}
    for dt, fn in fns.items():
      t = []
      for _ in range(a.calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, ids, mask, rng))
        t.append(time.perf_counter() - t0)
      secs[dt or cfg.dtype] = statistics.median(t)
    result["runs"].append(secs)
    f32, bf16 = secs[cfg.dtype], secs["bfloat16"]
    print(f"{cfg.dtype} {f32:.4f} s, bfloat16 {bf16:.4f} s a call; bf16 / f32 {bf16 / f32:.2f}")
  return result


if __name__ == "__main__":
  main()
