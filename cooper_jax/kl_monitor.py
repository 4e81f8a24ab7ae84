"""How far the policy has moved from where it started: KL(pi_t || pi_0) estimated at each
evaluation on a fixed set of held-out prompts (config train.eval_kl_prompts, off at 0).

The x-axis of a reward-model overoptimization curve (Gao et al. 2022, "Scaling laws for reward
model overoptimization": gold and proxy reward against sqrt(KL) from the initial policy). A
training run's own KL term (policy.loss.kl_coef) is per token, against a reference that may be
off, and absent at coefficient 0; this monitor is the same for every condition of a study:

  KL(pi_t || pi_0) = E_{y ~ pi_t}[ sum_t log pi_t(y_t | .) - log pi_0(y_t | .) ]

estimated from `eval_kl_samples` samples per prompt of the first `eval_kl_prompts` evaluation
prompts, drawn at the rollout temperature with a key of its own (fold_in(key(seed + 1), step):
the training's draws are untouched), both log-probs from the trainer's log-prob function at
that temperature (logprobs.response_logprobs), so the numerics of the two passes are alike.
Logged: eval/kl_init (nats per response, the sequence KL; a Monte-Carlo estimate, which can
come out slightly negative near 0), eval/kl_init_token (per response token) and
eval/kl_init_sqrt (sqrt of max(kl_init, 0)). The initial parameters are the KL term's
reference when the run has one, else a copy kept for the monitor.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import distributed as dist
from cooper_jax import sharding
from cooper_jax.logprobs import response_logprobs
from cooper_jax.prompts import build_prompts
from cooper_jax.sampling import SampleOptions, sample


def enabled(c) -> bool:
  return c.train.eval_kl_prompts > 0


def validate(c) -> None:
  for key in ("eval_kl_prompts", "eval_kl_samples"):
    v = c.train[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
      raise ValueError(f"config.train.{key} must be an int >= 0, got {v!r}")
  if enabled(c) and c.train.eval_kl_samples < 1:
    raise ValueError("config.train.eval_kl_samples must be >= 1 when eval_kl_prompts > 0")


class KLMonitor:
  """KL(pi_t || pi_0) on fixed prompts (see the module doc); holds pi_0 and the prompts."""

  def __init__(self, run, init_params):
    c = run.c
    rows = run.eval_rows[: c.train.eval_kl_prompts]
    self.run, self.init_params, self.samples = run, init_params, c.train.eval_kl_samples
    prompts = build_prompts(run.tokenizer, [r["question"] for r in rows], c.data.prompt_suffix)
    tok, mask = run.tokenizer.encode_prompts(
      prompts, max_len=c.rollout.max_prompt_len, pad_to_multiple=c.rollout.prompt_pad_multiple
    )
    # A monitor's batch is small: every device holds all of it (no divisibility to meet).
    rep = sharding.replicated(run.mesh)
    self.tok, self.mask = dist.put_global(tok, rep), dist.put_global(mask, rep)
    rows = lambda x: dist.put_global(np.repeat(x, self.samples, axis=0), rep)
    self.tok_rows, self.mask_rows = rows(tok), rows(mask)
    self.options = SampleOptions.from_rollout(
      c.rollout,
      eos_ids=run.tokenizer.eos_ids,
      pad_id=run.tokenizer.pad_id,
      mesh=run.mesh,
      group_size=self.samples,
    )
    self.logprobs = jax.jit(
      functools.partial(response_logprobs, run.policy_cfg, temperature=c.rollout.temperature)
    )

  def __call__(self, params, step: int) -> dict:
    key = jax.random.fold_in(jax.random.key(self.run.c.seed + 1), step)
    out = sample(params, self.tok, self.mask, key, cfg=self.run.policy_cfg, options=self.options)
    args = (self.tok_rows, self.mask_rows, out.tokens, out.mask)
    now, init = self.logprobs(params, *args), self.logprobs(self.init_params, *args)
    return kl_metrics(now, init, out.mask)


@jax.jit
def _sums(now_bt, init_bt, mask_bt):
  d_bt = jnp.where(mask_bt, now_bt.astype(jnp.float32) - init_bt.astype(jnp.float32), 0.0)
  return jnp.sum(d_bt), jnp.sum(mask_bt.astype(jnp.float32)), mask_bt.shape[0]


def kl_metrics(now_bt, init_bt, mask_bt) -> dict:
  """eval/kl_init (per response), eval/kl_init_token, eval/kl_init_sqrt from the two policies'
  log-probs [b, n] of the same sampled tokens (mask [b, n])."""
  total, tokens, rows = (float(x) for x in _sums(now_bt, init_bt, mask_bt))
  seq = total / max(rows, 1.0)
  return {
    "eval/kl_init": seq,
    "eval/kl_init_token": total / max(tokens, 1.0),
    "eval/kl_init_sqrt": float(np.sqrt(max(seq, 0.0))),
  }
