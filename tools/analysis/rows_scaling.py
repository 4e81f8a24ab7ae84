"""Would several seeds in one compiled program make the small-task studies cheaper on this CPU?

A seed axis (params and optimizer states stacked, `vmap` over seeds) turns S runs' sampler
calls and policy passes into one call over S times the rows. That pays only where a call's
time grows less than its rows: dispatch, while-loop and per-op overheads shared. This script
measures that growth for the wide testbed's policy (experiments/small_task.py, policy=wide):
the sampler (96 new tokens, G=8, the study's rollout options) and the forward log-prob pass,
at 1, 4 and 20 prompts x G rows, interleaved, best of --reps. A ratio near the rows' ratio
means the work is compute-bound and a seed axis would gain little.

  python tools/analysis/rows_scaling.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import sharding, steps
from cooper_jax.sampling import SampleOptions, sample
from cooper_jax.weights import load_from_config
from experiments.small_task import get_config

PROMPTS = (2, 8, 40)  # x G=8 rows: a quarter of one seed's step, one seed's, five seeds'


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--reps", type=int, default=5)
  a = p.parse_args()
  c = get_config("cond=rule,policy=wide")
  cfg, params, _ = load_from_config(c.policy, "lm", 0)
  mesh = sharding.make_mesh(**c.mesh)
  eos = (cfg.eos_id,) if cfg.eos_id is not None else ()
  options = SampleOptions.from_rollout(c.rollout, eos_ids=eos, pad_id=0, mesh=mesh)
  g, width, n_new = c.rollout.group_size, 80, c.rollout.max_new_tokens
  lp_fn = steps.make_logprob_fn(cfg, mesh, params, prompt_group=g)
  rng = np.random.default_rng(0)

  def sampler(prompts):
    tok = jnp.asarray(rng.integers(5, 500, (prompts, width)), jnp.int32)
    out = sample(params, tok, jnp.ones_like(tok, bool), jax.random.key(0), cfg=cfg, options=options)
    jax.block_until_ready(out.tokens)

  def forward(prompts):
    rows = prompts * g
    batch = {
      "prompt_tokens": jnp.asarray(rng.integers(5, 500, (rows, width)), jnp.int32),
      "prompt_mask": jnp.ones((rows, width), bool),
      "response_tokens": jnp.asarray(rng.integers(5, 500, (rows, n_new)), jnp.int32),
      "response_mask": jnp.ones((rows, n_new), bool),
    }
    jax.block_until_ready(lp_fn(params, batch))

  for name, fn in (("sampler", sampler), ("forward log-probs", forward)):
    for prompts in PROMPTS:
      fn(prompts)  # compile
    best = {prompts: float("inf") for prompts in PROMPTS}
    for _ in range(a.reps):
      for prompts in PROMPTS:
        t0 = time.perf_counter()
        fn(prompts)
        best[prompts] = min(best[prompts], time.perf_counter() - t0)
    cells = ", ".join(f"{prompts * g} rows {best[prompts]:.3f} s" for prompts in PROMPTS)
    base = best[PROMPTS[1]]
    print(
      f"{name}: {cells}; time ratio {best[PROMPTS[2]] / base:.2f} for "
      f"{PROMPTS[2] // PROMPTS[1]}x the rows of one seed's step"
    )
  print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
  main()
