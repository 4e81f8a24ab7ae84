"""Compile experiments/paper.py's six configs (qwen, llama x rule, static_rm, cooper) for one
TPU topology in one process and write one JSON line per (config, function) plus a text table.

  python results/aot/paper_summary.py v5e:2x4 > results/aot/paper_v5e-2x4.jsonl

The three reward modes of one policy share the sampler, ref-logprob and policy_step programs
(same lowered text); aot.compile_iteration's cache compiles each program once per topology and
each config's resident total is computed with that config's own resident state.
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cooper_jax import aot  # noqa: E402
from experiments.paper import get_config  # noqa: E402


def main():
  topology = sys.argv[1]
  variants = sys.argv[2:] or [
    f"{p},{m}" for p in ("qwen", "llama") for m in ("cooper", "static_rm", "rule")
  ]
  cache = {}
  for v in variants:
    t0 = time.perf_counter()
    report = aot.compile_iteration(get_config(v), topology, cache=cache)
    resident = sum(report.persistent.values()) / aot.GIB
    for r in report.results:
      row = dict(config=f"paper.py:{v}", mesh=report.mesh, state_gib=resident, **r.row())
      print(json.dumps(row), flush=True)
    print(f"{v} on {topology}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
  main()
