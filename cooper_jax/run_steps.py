"""A run's jitted steps, built from its config in one place.

`train.Run`, `reward_modes` and the ahead-of-time tool (`cooper_jax.aot.functions`) all build
the policy step, the log-prob pass, the RM's reward pass and the RM step through these
functions, so an AOT estimate describes the step that trains: the same micro-batching, the
same prompt sharing, the same merged or packed batch layout (`PolicyLayout`).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from cooper_jax import optim, steps
from cooper_jax.config import logprob_micro_batch_size


@dataclasses.dataclass(frozen=True)
class PolicyLayout:
  """How the policy batches (the policy step's and the reference pass's) hold their rows.

  group: rollouts per prompt (rollout.group_size), consecutive in the rollout batch.
  prompt_group: rows per shared prompt forward (G with policy.share_prompt; 1 when off, or when
    the batch is merged, whose rows say their prompt by index instead).
  merge: identical rows run once, weighted by their count (policy.merge_duplicate_rows: the
    batch carries row_weight; cooper_jax.merge).
  n_prompts: > 0 when a merged batch also shares prompts (share_prompt): it carries
    prompt_index [b], each of the n_prompts prompts run once.
  packed: the merged batch's responses share rows (policy.pack_rows; cooper_jax.pack)."""

  group: int
  prompt_group: int
  merge: bool
  n_prompts: int
  packed: bool

  @classmethod
  def of(cls, c) -> PolicyLayout:
    group = c.rollout.group_size
    merge = bool(c.policy.merge_duplicate_rows)
    n_prompts = c.rollout.prompts_per_step if merge and c.policy.share_prompt else 0
    prompt_group = group if c.policy.share_prompt and not merge else 1
    return cls(group, prompt_group, merge, n_prompts, bool(c.policy.pack_rows))

  def shared_prompt_rows(self) -> int:
    """Rows that one prompt forward serves in a whole-batch pass (the cost model's group)."""
    return self.group if self.prompt_group > 1 or self.n_prompts else 1


def policy_updates(c, rows: int) -> tuple[int, int]:
  """(rows per update, updates per step): policy.ppo_epochs passes over mini-batches of
  policy.ppo_mini_batch_size rows (0 = one update on the whole batch)."""
  mini = c.policy.ppo_mini_batch_size or rows
  return mini, c.policy.ppo_epochs * (rows // mini)


def old_logp_in_batch(c, n_updates: int) -> bool:
  """Whether a policy batch carries old_logp, the ratio's denominator: with several updates a
  step (later ones are off-policy), or with rollouts sampled ahead (rollout.off_policy_steps)
  and no sampler correction (the ratio is then against the sampler's log-probs). A single
  on-policy update, or a sampler-corrected one, takes sg(logp) itself."""
  if n_updates > 1:
    return True
  return c.rollout.off_policy_steps > 0 and c.policy.loss.sampler_is.kind == "none"


def logprob_fn(c, layout: PolicyLayout, model_cfg, mesh, params):
  """The forward-only pass of the response log-probs (the reference's, under a KL term)."""
  return steps.make_logprob_fn(
    model_cfg,
    mesh,
    params,
    micro_batch_size=logprob_micro_batch_size(c),
    logprob_chunk=c.policy.logprob_chunk,
    temperature=c.rollout.temperature,
    prompt_group=layout.prompt_group,
    n_prompts=layout.n_prompts,
    packed=layout.packed,
  )


def policy_step(c, layout: PolicyLayout, model_cfg, optimizer, mesh, state, batch_like, *, whole):
  """`policy_step(state, batch)` for batches shaped like batch_like. whole: the batch is the
  step's whole rollout batch (groups intact); mini-batches of random rows share no prompt."""
  return steps.make_policy_step(
    model_cfg,
    c.policy.loss,
    optimizer,
    mesh,
    state,
    batch_like,
    micro_batch_size=c.policy.micro_batch_size,
    logprob_chunk=c.policy.logprob_chunk,
    temperature=c.rollout.temperature,
    prompt_group=layout.prompt_group if whole else 1,
    n_prompts=layout.n_prompts,
  )


def policy_batch_shapes(
  layout: PolicyLayout, rows: int, prompt_len: int, response_len: int, *, kl: bool, old_logp: bool
) -> tuple[dict, dict]:
  """{key: (shape, dtype)} of the reference pass's batch and of one policy update's batch as
  train builds them, for `rows` rollout rows with none merged away (the largest a merged or
  packed batch gets: cooper_jax.merge.MergedStep)."""
  i32, f32 = jnp.int32, jnp.float32
  ref = {
    "prompt_tokens": ((rows, prompt_len), i32),
    "prompt_mask": ((rows, prompt_len), bool),
    "response_tokens": ((rows, response_len), i32),
    "response_mask": ((rows, response_len), bool),
  }
  if layout.n_prompts:
    ref["prompt_index"] = ((rows,), i32)
  if layout.packed:
    ref["response_segment"] = ((rows, response_len), i32)
  pol = dict(ref)
  per_row = (rows, response_len) if layout.packed else (rows,)  # packed: a value per token
  pol["advantages"] = (per_row, f32)
  if layout.merge:
    pol["row_weight"] = (per_row, f32)
  pol["sampler_logp"] = ((rows, response_len), f32)
  if kl:
    pol["ref_logp"] = ((rows, response_len), f32)
  if old_logp:
    pol["old_logp"] = ((rows, response_len), f32)
  return ref, pol


def rm_optimizer(c, trains_rm: bool):
  """The co-trained RM's optimizer (rm.optim); a frozen RM gets none (no moments to hold)."""
  return optim.make_optimizer(c.rm.optim, c.train.steps) if trains_rm else optim.frozen()


def reward_fn(c, model_cfg, mesh, params):
  """sigmoid(score) of the RM over micro-batches of rm.score_micro_batch_size rows."""
  return steps.make_reward_fn(model_cfg, mesh, params, micro_batch_size=c.rm.score_micro_batch_size)


def rm_step(c, model_cfg, optimizer, mesh, state, batch_like):
  """Cooper's RM update: Bradley-Terry on (positive, negative) pairs, rm.micro_batch_size pairs
  per micro-batch."""
  return steps.make_rm_step(
    model_cfg, "bt", optimizer, mesh, state, batch_like, micro_batch_size=c.rm.micro_batch_size
  )
