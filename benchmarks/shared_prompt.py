"""The sampler with each prompt's cache copied to its G rows vs read once by them
(`sample(..., shared_prompt=True)`, config rollout.shared_prompt_decode), side by side in one
run, alternating, on the small task's wide policy and its held-out prompts.

  python benchmarks/shared_prompt.py [--runs 3] [--prompt_pad 16,128]

Per setting: prompts x G rows, max_new_tokens new tokens with EOS off (every row decodes
every step), one compiled call per side timed `--calls` times per run; prints each run's
seconds per call for both sides and their ratio (copied / shared: > 1 means shared is faster),
and checks first that the two sides drew the same tokens. --prompt_pad pads the prompts to a
multiple of that many tokens (the small task pads to 16; 128 shows a longer prompt's share).
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
from cooper_jax.prompts import build_prompts  # noqa: E402
from cooper_jax.sampling import SampleOptions, sample  # noqa: E402
from cooper_jax.tokenizer import load_tokenizer  # noqa: E402
from cooper_jax.weights import load_pretrained  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "experiments" / "assets" / "small_task"


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default=str(ASSETS / "policy_wide"))
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--max_new_tokens", type=int, default=96)
  ap.add_argument("--prompt_pad", default="16,128", help="comma list of prompt pad multiples")
  ap.add_argument("--runs", type=int, default=3)
  ap.add_argument("--calls", type=int, default=5)
  return ap.parse_args(argv)


def main(argv=None) -> list[dict]:
  a = parse_args(argv)
  (cfg, params), tok = load_pretrained(a.model), load_tokenizer(a.model)
  rows = [r for _, r in read_jsonl(ASSETS / "data" / "test.jsonl")][: a.prompts]
  texts = build_prompts(tok, [r["question"] for r in rows], base_config().data.prompt_suffix)
  rng = jax.random.key(0)
  print(
    f"{jax.devices()[0].device_kind}; {a.prompts} prompts x G={a.group}, {a.max_new_tokens} new"
  )
  out = []
  for pad in (int(x) for x in a.prompt_pad.split(",")):
    ids, mask = tok.encode_prompts(texts, pad_to_multiple=pad)
    opts = SampleOptions(max_new_tokens=a.max_new_tokens, group_size=a.group, pad_id=tok.pad_id)
    fns = {
      s: sample.lower(
        params, ids, mask, rng, cfg=cfg, options=opts.replace(shared_prompt=s)
      ).compile()
      for s in (False, True)
    }
    got = {s: fn(params, ids, mask, rng) for s, fn in fns.items()}
    same = bool(np.array_equal(np.asarray(got[False].tokens), np.asarray(got[True].tokens)))
    runs = []
    for _ in range(a.runs):
      secs = {}
      for s, fn in fns.items():
        t = []
        for _ in range(a.calls):
          t0 = time.perf_counter()
          jax.block_until_ready(fn(params, ids, mask, rng))
          t.append(time.perf_counter() - t0)
        secs[s] = statistics.median(t)
      runs.append(secs)
      print(
        f"prompt width {ids.shape[1]}: copied {secs[False]:.4f} s, shared {secs[True]:.4f} s a "
        f"call, ratio {secs[False] / secs[True]:.2f}x"
      )
    out.append({"prompt_width": ids.shape[1], "same_tokens": same, "runs": runs})
    print(
      f"prompt width {ids.shape[1]}: same tokens {same}; worst ratio "
      f"{min(r[False] / r[True] for r in runs):.2f}x"
    )
  return out


if __name__ == "__main__":
  main()
