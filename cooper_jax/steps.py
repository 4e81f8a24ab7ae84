"""Pure train steps: `policy_step` (GRPO) and `rm_step` (Bradley-Terry or BCE), plus forward-only
log-prob and reward functions, each jit-compiled over a (data, fsdp, tensor) mesh.

A train state is a plain pytree {"params", "opt_state", "step", "n_skipped"}. Every step takes
(state, batch) and returns (state, metrics) with scalar metrics; the state buffer is donated.
A non-finite loss or gradient leaves the state unchanged and increments n_skipped.

Policy batch (b = n_prompts * G rows, p prompt width, n response width):
  prompt_tokens/prompt_mask [b, p] (left-padded), response_tokens/response_mask [b, n]
  (the sampler's output), advantages [b], old_logp [b, n] (optional; absent = one on-policy
  update, ratio 1), ref_logp [b, n] (present iff kl_coef > 0).
RM pair batch: pos_tokens/pos_mask/neg_tokens/neg_mask [p, l], valid [p].
RM BCE batch: tokens/mask [n, l], labels [n] (1 correct, 0 wrong), weight [n].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from cooper_jax import losses, sharding
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import Transformer, forward, positions_from_mask

State = dict[str, Any]


def init_state(params, optimizer: optax.GradientTransformation) -> State:
  return {
    "params": params,
    "opt_state": optimizer.init(params),
    "step": jnp.zeros((), jnp.int32),
    "n_skipped": jnp.zeros((), jnp.int32),
  }


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def apply_update(state: State, optimizer, loss, grads, metrics) -> tuple[State, dict]:
  """One guarded optimiser update: skipped (state kept, counter bumped) if anything is non-finite."""
  ok = jnp.isfinite(loss) & _all_finite(grads)
  safe_grads = jax.tree.map(lambda g: jnp.where(ok, g, jnp.zeros_like(g)), grads)
  updates, opt_state = optimizer.update(safe_grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
  new_state = {
    "params": keep(params, state["params"]),
    "opt_state": keep(opt_state, state["opt_state"]),
    "step": state["step"] + ok.astype(jnp.int32),
    "n_skipped": state["n_skipped"] + (~ok).astype(jnp.int32),
  }
  metrics = dict(
    metrics,
    loss=loss,
    grad_norm=optax.tree.norm(safe_grads),
    skipped=(~ok).astype(jnp.float32),
    n_skipped=new_state["n_skipped"],
  )
  return new_state, metrics


def response_logprobs(
  model_cfg: ModelConfig, params, prompt_tokens, prompt_mask, response_tokens, response_mask
):
  """log p(response token | everything before it): [b, n], float32.

  The LM head runs only on the n positions that predict response tokens, not on the prompt:
  with a 49k-152k vocabulary that head (and its [b, t, v] logits) is a large share of the
  step's FLOPs and memory.
  """
  model = Transformer(model_cfg)
  tokens = jnp.concatenate([prompt_tokens, response_tokens], axis=1)
  mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(bool)
  h_btd, _ = model.apply(
    {"params": params}, tokens, positions_from_mask(mask), mask, method=Transformer.hidden
  )
  p, n = prompt_tokens.shape[1], response_tokens.shape[1]
  logits_bnv = model.apply(
    {"params": params}, h_btd[:, p - 1 : p + n - 1], method=Transformer.logits
  )
  return losses.token_logprobs(logits_bnv, response_tokens)


def _logprobs(model_cfg, params, batch):
  return response_logprobs(
    model_cfg,
    params,
    batch["prompt_tokens"],
    batch["prompt_mask"],
    batch["response_tokens"],
    batch["response_mask"],
  )


def policy_loss_fn(model_cfg: ModelConfig, lc, params, batch):
  logp = _logprobs(model_cfg, params, batch)
  old = batch.get("old_logp")
  old = jax.lax.stop_gradient(logp) if old is None else old
  resp_mask = batch["response_mask"].astype(jnp.float32)
  loss, metrics = losses.policy_loss(
    logp,
    old,
    batch["advantages"],
    resp_mask,
    batch.get("ref_logp"),
    kl_coef=lc.kl_coef,
    kl_kind=lc.kl_kind,
    clip_eps=lc.clip_eps,
    clip_eps_high=lc.get("clip_eps_high"),
    dual_clip_c=lc.dual_clip_c,
    agg=lc.agg,
  )
  metrics = dict(
    metrics, neg_logp_mean=-losses.masked_mean(logp, resp_mask), response_tokens=jnp.sum(resp_mask)
  )
  return loss, metrics


def rm_scores(model_cfg: ModelConfig, params, tokens, mask):
  """Raw score logits [n]; the reward is sigmoid of this."""
  return forward(model_cfg, params, tokens, mask)


def rm_loss_fn(model_cfg: ModelConfig, loss_type: str, params, batch):
  if loss_type == "bt":
    p = batch["pos_tokens"].shape[0]
    tokens = jnp.concatenate([batch["pos_tokens"], batch["neg_tokens"]], axis=0)
    mask = jnp.concatenate([batch["pos_mask"], batch["neg_mask"]], axis=0)
    s = rm_scores(model_cfg, params, tokens, mask)
    return losses.bradley_terry_loss(s[:p], s[p:], batch["valid"])
  if loss_type == "bce":
    s = rm_scores(model_cfg, params, batch["tokens"], batch["mask"])
    return losses.bce_loss(s, batch["labels"], batch.get("weight"))
  raise ValueError(f"rm loss_type={loss_type!r}: expected 'bt' or 'bce'")


def _batch_shardings(mesh: Mesh, batch_shapes: dict):
  return {k: sharding.batch_sharding(mesh, len(v.shape)) for k, v in batch_shapes.items()}


def _jit_step(fn: Callable, mesh: Mesh, state: State, batch_like: dict):
  """jit with explicit shardings: state by the parameter rules, batch over (data, fsdp)."""
  state_sh = sharding.tree_shardings(state, mesh)
  batch_sh = _batch_shardings(mesh, batch_like)
  return jax.jit(
    fn,
    in_shardings=(state_sh, batch_sh),
    out_shardings=(state_sh, sharding.replicated(mesh)),
    donate_argnums=(0,),
  )


def make_policy_step(
  model_cfg: ModelConfig, loss_cfg, optimizer, mesh: Mesh, state: State, batch_like: dict
):
  """Returns jitted `policy_step(state, batch) -> (state, metrics)` for batches shaped like
  `batch_like` (the set of keys fixes whether old_logp/ref_logp are used)."""
  if (loss_cfg.kl_coef > 0) != ("ref_logp" in batch_like):
    raise ValueError("policy batch must carry ref_logp exactly when kl_coef > 0")

  def policy_step(state, batch):
    (loss, metrics), grads = jax.value_and_grad(
      lambda p: policy_loss_fn(model_cfg, loss_cfg, p, batch), has_aux=True
    )(state["params"])
    return apply_update(state, optimizer, loss, grads, metrics)

  return _jit_step(policy_step, mesh, state, batch_like)


def make_rm_step(
  model_cfg: ModelConfig, loss_type: str, optimizer, mesh: Mesh, state: State, batch_like: dict
):
  """Returns jitted `rm_step(state, batch) -> (state, metrics)` (loss_type 'bt' or 'bce')."""

  def rm_step(state, batch):
    (loss, metrics), grads = jax.value_and_grad(
      lambda p: rm_loss_fn(model_cfg, loss_type, p, batch), has_aux=True
    )(state["params"])
    return apply_update(state, optimizer, loss, grads, metrics)

  return _jit_step(rm_step, mesh, state, batch_like)


def make_logprob_fn(model_cfg: ModelConfig, mesh: Mesh, params):
  """Jitted forward-only `(params, batch) -> logp [b, n]` of the response tokens (old or
  reference log-probs); `batch` carries the four prompt/response arrays."""
  keys = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")
  return jax.jit(
    lambda p, b: _logprobs(model_cfg, p, b),
    in_shardings=(
      sharding.tree_shardings(params, mesh),
      {k: sharding.batch_sharding(mesh) for k in keys},
    ),
    out_shardings=sharding.batch_sharding(mesh),
  )


def make_reward_fn(model_cfg: ModelConfig, mesh: Mesh, params):
  """Jitted `(params, tokens, mask) -> sigmoid(score) [n]`, the RM reward in (0, 1)."""
  return jax.jit(
    lambda p, t, m: jax.nn.sigmoid(rm_scores(model_cfg, p, t, m)),
    in_shardings=(
      sharding.tree_shardings(params, mesh),
      sharding.batch_sharding(mesh),
      sharding.batch_sharding(mesh),
    ),
    out_shardings=sharding.batch_sharding(mesh, 1),
  )
