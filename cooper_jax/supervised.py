"""The one supervised training loop: SFT of the small policy and RM pretraining both run it.

tools/assets/sft_small_policy.py and cooper_jax/cli/pretrain_rm.py differ only in what a batch is and which
jitted step consumes it; the loop around them (epoch-shuffled row order, a compile per batch
width, periodic metrics with an optional held-out evaluation, a progress line) lives here once.

  opt = optim.make_optimizer(adamw_warmup_cosine(lr, warmup_steps, total_steps))
  state, log, seconds = train_supervised(
    state, n_rows=len(rows), steps=n, batch_size=b, rng=np.random.default_rng([seed, k]),
    encode=lambda idx: {...}, make_step=lambda state, batch: jitted_step, describe=fmt, log_every=100)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from cooper_jax.config import optim_config

Batch = Mapping[str, Any]
Step = Callable[[Any, Batch], tuple[Any, Mapping[str, Any]]]


def adamw_warmup_cosine(
  lr: float, warmup_steps: int, total_steps: int
) -> ml_collections.ConfigDict:
  """optim.make_optimizer config: AdamW (b2 0.95, wd 0.01), clip 1.0, cosine down to 0.1 * lr.

  The small-task pretraining recipe shared by SFT and RM pretraining; RL optimisers come from
  the experiment configs instead.
  """
  oc = optim_config(lr, warmup_steps, "adamw", b2=0.95)
  oc.update(schedule="warmup_cosine", total_steps=total_steps, end_lr_frac=0.1)
  return oc


def epoch_order(rng: np.random.Generator, n_rows: int, steps: int, batch_size: int) -> np.ndarray:
  """Row indices for `steps` batches: whole permutations of range(n_rows), one per epoch.

  Every row is seen once per epoch. At least one permutation is drawn even for steps == 0, so a
  caller's later draws from the same rng do not depend on whether it trained.
  """
  if n_rows < 1 or batch_size < 1:
    raise ValueError(f"need n_rows >= 1 and batch_size >= 1, got {n_rows} and {batch_size}")
  epochs = -(-max(steps, 1) * batch_size // n_rows)
  return np.concatenate([rng.permutation(n_rows) for _ in range(epochs)])


def train_supervised(
  state,
  *,
  n_rows: int,
  steps: int,
  batch_size: int,
  rng: np.random.Generator,
  encode: Callable[[np.ndarray], Batch],
  make_step: Callable[[Any, Batch], Step],
  describe: Callable[[dict], str],
  log_every: int,
  eval_every: int = 0,
  evaluate: Callable[[Any], dict] | None = None,
) -> tuple[Any, list[dict], float]:
  """Runs `steps` updates over epoch-shuffled rows; returns (state, log, seconds).

  encode(idx) turns a batch of row indices (taken in order from `epoch_order`) into the
  step's batch dict; its "tokens" [b, t] array's width t keys a cache of make_step(state,
  batch) results, so each width is compiled once (callers pad widths to a multiple to keep
  that set small). Metrics are fetched from the device only on logged steps (every `log_every`, every
  `eval_every`, and the last), since each fetch waits for the step to finish. A logged entry
  is the step's metrics as floats plus step and elapsed_s; on `eval_every` steps other than
  the last, evaluate(state)'s items are added too (the last step is left to the caller, which
  evaluates the final parameters anyway). Each entry is printed as "step s/steps " +
  describe(entry).
  """
  if eval_every and evaluate is None:
    raise ValueError("eval_every needs an evaluate function")
  order = epoch_order(rng, n_rows, steps, batch_size)
  step_fns: dict[int, Step] = {}
  log: list[dict] = []
  t0 = time.perf_counter()
  for i in range(steps):
    batch = encode(order[i * batch_size : (i + 1) * batch_size])
    width = batch["tokens"].shape[1]
    if width not in step_fns:
      step_fns[width] = make_step(state, batch)  # the live state: earlier ones were donated
    state, m = step_fns[width](state, batch)
    s, last = i + 1, i + 1 == steps
    on_eval = bool(eval_every) and s % eval_every == 0
    if s % log_every == 0 or last or on_eval:
      m = {k: float(v) for k, v in jax.device_get(m).items()}
      m.update(step=s, elapsed_s=time.perf_counter() - t0)
      if on_eval and not last:
        m.update(evaluate(state))
      log.append(m)
      print(f"step {s}/{steps} {describe(m)}", flush=True)
  return state, log, time.perf_counter() - t0
