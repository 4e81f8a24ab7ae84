"""Pure train steps: `policy_step` (GRPO) and `rm_step` (Bradley-Terry or BCE), plus forward-only
log-prob and reward functions, each jit-compiled over a (data, fsdp, tensor) mesh.

A train state is a plain pytree {"params", "opt_state", "step", "n_skipped"}. Every step takes
(state, batch) and returns (state, metrics) with scalar metrics; the state buffer is donated.
A non-finite loss or gradient leaves the state unchanged and increments n_skipped.
All steps come from `make_train_step`, which can accumulate gradients over micro-batches in
one jitted call (`micro_batch_size`); the policy's log-probs can run the LM head over chunks of
response positions (`logprob_chunk`, see cooper_jax.logprobs). Neither changes the result.

Policy batch (b = n_prompts * G rows, p prompt width, n response width):
  prompt_tokens/prompt_mask [b, p] (left-padded), response_tokens/response_mask [b, n]
  (the sampler's output), advantages [b], old_logp [b, n] (optional; absent = one on-policy
  update, ratio 1), ref_logp [b, n] (present iff kl_coef > 0), sampler_logp [b, n] (the
  sampler's own: the mismatch metrics and the policy.loss.sampler_is correction).
RM pair batch: pos_tokens/pos_mask/neg_tokens/neg_mask [p, l], valid [p].
RM BCE batch: tokens/mask [n, l], labels [n] (1 correct, 0 wrong), weight [n].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from cooper_jax import losses, objectives, sampler_is, sharding
from cooper_jax.logprobs import response_logprobs
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import forward

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
  """One guarded optimiser update: skipped (state kept, counter bumped) if anything is non-finite.

  The guard is a `lax.cond`, so only the branch taken runs: an elementwise select between the
  new and the old state would read params and optimiser state twice more and write them once
  more at every step (~0.4 s of a 9 s SmolLM2-135M step on a 2-core CPU)."""
  ok = jnp.isfinite(loss) & _all_finite(grads)

  def update(params, opt_state, grads):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.lax.cond(
    ok, update, lambda p, o, _: (p, o), state["params"], state["opt_state"], grads
  )
  new_state = {
    "params": params,
    "opt_state": opt_state,
    "step": state["step"] + ok.astype(jnp.int32),
    "n_skipped": state["n_skipped"] + (~ok).astype(jnp.int32),
  }
  metrics = dict(
    metrics,
    loss=loss,
    grad_norm=jnp.where(ok, optax.tree.norm(grads), 0.0),
    skipped=(~ok).astype(jnp.float32),
    n_skipped=new_state["n_skipped"],
  )
  return new_state, metrics


class Mean(NamedTuple):
  """A loss or metric that is a mean over a variable number of items of its batch:
  value = total / max(count, 1). Micro-batches combine into the whole-batch mean
  sum(value_i * max(count_i, 1)) / max(sum(count_i), 1). `count` must not depend on params."""

  value: jax.Array
  count: jax.Array


class Sum(NamedTuple):
  """A total over the batch (a count, say): micro-batches add up."""

  value: jax.Array


def _is_stat(x) -> bool:
  return isinstance(x, Mean | Sum)


def resolve(tree):
  """The plain values of a tree of Mean / Sum / plain scalars (a loss_fn's output)."""
  return jax.tree.map(lambda x: x.value if _is_stat(x) else x, tree, is_leaf=_is_stat)


def _logprobs(
  model_cfg, params, batch, chunk: int = 0, temperature: float = 1.0, group: int = 1, n_prompts=0
):
  return response_logprobs(
    model_cfg,
    params,
    batch["prompt_tokens"],
    batch["prompt_mask"],
    batch["response_tokens"],
    batch["response_mask"],
    chunk=chunk,
    temperature=temperature,
    prompt_group=group,
    prompt_index=batch.get("prompt_index"),
    n_prompts=n_prompts,
    response_segment=batch.get("response_segment"),
  )


def micro_prompt_group(prompt_group: int, k: int) -> int:
  """Rows sharing a prompt, contiguously, within each of k strided micro-batches (`_split`) of
  a batch whose groups of prompt_group rows share one: prompt_group / k where k divides it,
  else 1 (then every row runs its own prompt)."""
  return prompt_group // k if prompt_group % k == 0 else 1


# Policy metrics aggregated like the loss (by `agg`); every other ppo metric is a token mean.
_AGG_METRICS = ("pg_loss", "kl_loss", "loss")


def policy_loss_fn(
  model_cfg: ModelConfig,
  lc,
  params,
  batch,
  *,
  logprob_chunk: int = 0,
  temperature: float = 1.0,
  prompt_group: int = 1,
  n_prompts: int = 0,
):
  """(Mean loss, metrics of Mean / Sum) on `batch`, see `make_train_step`; log-probs at the
  rollout temperature (logprobs.logit_temperature); prompt_group, n_prompts and the batch's
  optional prompt_index: which rows share a prompt (logprobs.response_logprobs).

  A batch with "row_weight" [b] holds each distinct row once, weighted by how many times it
  occurred (`merge_duplicate_rows`): every token sum, mean and row count then counts a row
  weight times, so loss, gradient and metrics are the unmerged batch's up to float rounding.
  A packed batch (`policy.pack_rows`) has "response_segment" [b, n] and a weight and an
  advantage per token ([b, n]): its responses share rows (cooper_jax.pack)."""
  logp = _logprobs(model_cfg, params, batch, logprob_chunk, temperature, prompt_group, n_prompts)
  old = batch.get("old_logp")
  old = jax.lax.stop_gradient(logp) if old is None else old
  weight = batch.get("row_weight")
  resp_mask = batch["response_mask"].astype(jnp.float32)
  if weight is not None and weight.ndim == 2:
    # Packed rows (cooper_jax.pack): a weight per token, each response's own; token means
    # only (config.validate), so no row count is needed.
    resp_mask, weight = resp_mask * weight.astype(jnp.float32), None
  elif weight is not None:
    resp_mask = resp_mask * weight.astype(jnp.float32)[:, None]
  segment = batch.get("response_segment")
  full_mask, adv, is_metrics = resp_mask, batch["advantages"], {}
  is_cfg = lc.get("sampler_is")
  if is_cfg is not None and is_cfg.kind != "none":
    # Sampler-vs-trainer correction (cooper_jax.sampler_is): weighted advantages or fewer
    # tokens; the loss's denominators follow the corrected mask.
    adv, resp_mask, is_metrics = sampler_is.correct(
      is_cfg, old, batch["sampler_logp"], adv, resp_mask, segment
    )
  loss, metrics = losses.policy_loss(
    logp,
    old,
    adv,
    resp_mask,
    batch.get("ref_logp"),
    kl_coef=lc.kl_coef,
    kl_kind=lc.kl_kind,
    agg=lc.agg,
    row_weight_b=weight,
    objective=objectives.make(lc, segment),
  )
  n_tokens = jnp.sum(resp_mask)
  # token_mean divides by the tokens; the seq_mean modes by the rows (empty ones included);
  # an objective's "seq_*" metrics by the responses (objectives.response_count).
  n_rows = float(resp_mask.shape[0]) if weight is None else jnp.sum(weight)
  n_agg = n_tokens if lc.agg.replace("-", "_") == "token_mean" else n_rows
  count = lambda k: n_agg if k in _AGG_METRICS else n_tokens
  if any(k.startswith("seq_") for k in metrics):
    n_resp = objectives.response_count(resp_mask, segment)
    count = lambda k, c=count: n_resp if k.startswith("seq_") else c(k)
  metrics = {k: Mean(v, count(k)) for k, v in metrics.items()}
  metrics.update({k: Mean(*v) for k, v in is_metrics.items()})
  n_tokens = jnp.sum(full_mask)  # every response token, corrected away or not
  metrics["neg_logp_mean"] = Mean(-losses.masked_mean(logp, full_mask), n_tokens)
  if "sampler_logp" in batch:
    # The sampler's log-probs of the same tokens: at the parameters that sampled them any gap
    # is numerics (bf16 decode vs training forward, cache, kernels), and it biases the ratio.
    d = jax.lax.stop_gradient(logp) - batch["sampler_logp"]
    metrics["sampler_logp_abs_diff"] = Mean(losses.masked_mean(jnp.abs(d), full_mask), n_tokens)
    # k3 estimate of KL(sampler || trainer) from the sampler's own samples.
    metrics["sampler_kl"] = Mean(losses.masked_mean(jnp.exp(d) - 1.0 - d, full_mask), n_tokens)
  metrics["response_tokens"] = Sum(n_tokens)
  return Mean(loss, n_agg), metrics


def rm_scores(model_cfg: ModelConfig, params, tokens, mask):
  """Raw score logits [n]; the reward is sigmoid of this."""
  return forward(model_cfg, params, tokens, mask)


def rm_loss_fn(model_cfg: ModelConfig, loss_type: str, params, batch):
  """(Mean loss, metrics of Mean / Sum) on `batch`, see `make_train_step`."""
  if loss_type == "bt":
    p = batch["pos_tokens"].shape[0]
    tokens = jnp.concatenate([batch["pos_tokens"], batch["neg_tokens"]], axis=0)
    mask = jnp.concatenate([batch["pos_mask"], batch["neg_mask"]], axis=0)
    s = rm_scores(model_cfg, params, tokens, mask)
    loss, metrics = losses.bradley_terry_loss(s[:p], s[p:], batch["valid"])
    n_valid = metrics["n_valid"]
    metrics = {k: Sum(v) if k == "n_valid" else Mean(v, n_valid) for k, v in metrics.items()}
    return Mean(loss, n_valid), metrics
  if loss_type == "bce":
    s = rm_scores(model_cfg, params, batch["tokens"], batch["mask"])
    weight = batch.get("weight")
    loss, metrics = losses.bce_loss(s, batch["labels"], weight)
    # The denominators bce_loss divides by; precision's depends on the predictions.
    w = jnp.ones_like(s) if weight is None else weight.astype(jnp.float32)
    counted = lambda x: jnp.sum((x & (w > 0)).astype(jnp.float32))
    n_w = jnp.sum(w)
    counts = {
      "bce_loss": n_w,
      "accuracy": n_w,
      "precision": jax.lax.stop_gradient(counted(s > 0)),
      "recall": counted(batch["labels"] >= 0.5),
    }
    return Mean(loss, n_w), {k: Mean(v, counts[k]) for k, v in metrics.items()}
  raise ValueError(f"rm loss_type={loss_type!r}: expected 'bt' or 'bce'")


def micro_count(b: int, micro_batch_size: int, mesh: Mesh) -> int:
  """Number of micro-batches k for a batch of b rows; a ValueError names a bad size."""
  if micro_batch_size < 0:
    raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 0 (0 = whole batch)")
  if micro_batch_size in (0, b):
    return 1
  n_dev = mesh.shape["data"] * mesh.shape["fsdp"]
  if b % micro_batch_size or micro_batch_size % n_dev:
    raise ValueError(
      f"micro_batch_size={micro_batch_size} must divide the batch ({b} rows) and be a multiple"
      f" of the data x fsdp device count ({n_dev}), so every micro-batch spans every device"
    )
  return b // micro_batch_size


def _leading_dim(tree) -> int:
  sizes = {x.shape[0] for x in jax.tree.leaves(tree)}
  if len(sizes) != 1:
    raise ValueError(f"batch arrays disagree on the number of rows: {sorted(sizes)}")
  return sizes.pop()


def _split(x, k: int, mesh: Mesh):
  """[b, ...] -> [k, b/k, ...] with micro-batch j = rows j, j + k, j + 2k, ...

  Rows are sharded in contiguous blocks, so contiguous micro-batches would each live on a
  subset of the devices; strided ones take b/(k * devices) rows from every device's block.
  """
  x = jnp.moveaxis(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 1, 0)
  spec = jax.sharding.PartitionSpec(None, sharding.BATCH_AXES, *([None] * (x.ndim - 2)))
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


def _merge(x_k):
  """Inverse of `_split`."""
  return jnp.moveaxis(x_k, 0, 1).reshape(-1, *x_k.shape[2:])


def _constrain_rows(tree, mesh: Mesh):
  return jax.tree.map(
    lambda x: jax.lax.with_sharding_constraint(x, sharding.batch_sharding(mesh, x.ndim)), tree
  )


def _map_micro(fn: Callable, mesh: Mesh, micro_batch_size: int, *arrays):
  """fn(*arrays) -> [b, ...], run over micro-batches one after another (forward only)."""
  k = micro_count(_leading_dim(arrays), micro_batch_size, mesh)
  if k == 1:
    return fn(*arrays)
  xs = tuple(_split(a, k, mesh) for a in arrays)
  return _merge(jax.lax.map(lambda mb: fn(*_constrain_rows(mb, mesh)), xs))


def _stat_parts(x):
  """(numerator, count) of one micro-batch's stat; see `_stat_finish`."""
  if isinstance(x, Mean):
    count = jax.lax.stop_gradient(jnp.asarray(x.count, jnp.float32))
    return x.value * jnp.maximum(count, 1.0), count
  if isinstance(x, Sum):
    return x.value, jnp.zeros((), jnp.float32)
  return x, jnp.ones((), jnp.float32)  # a plain value: an equal-weight mean of micro-batches


def _stat_finish(kind, num, count):
  return num if isinstance(kind, Sum) else num / jnp.maximum(count, 1.0)


def _accumulated_grads(loss_fn: Callable, params, batch, k: int, mesh: Mesh, params_sh):
  """(loss, metrics, grads) of the whole batch from k micro-batches under one lax.scan."""
  xs = jax.tree.map(lambda x: _split(x, k, mesh), batch)
  mb_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), xs)
  loss_kind, metric_kinds = jax.eval_shape(loss_fn, params, mb_like)

  def parts(p, mb):
    loss, metrics = loss_fn(p, mb)
    loss_num, loss_count = _stat_parts(loss)
    return loss_num, (loss_count, jax.tree.map(_stat_parts, metrics, is_leaf=_is_stat))

  def body(carry, mb):
    g_acc, loss_acc, metrics_acc = carry
    (loss_num, (loss_count, m_parts)), g = jax.value_and_grad(parts, has_aux=True)(
      params, _constrain_rows(mb, mesh)
    )
    g_acc = jax.tree.map(lambda a, x: a + x.astype(a.dtype), g_acc, g)
    g_acc = jax.lax.with_sharding_constraint(g_acc, params_sh)
    add = lambda a, x: a + x
    return (
      g_acc,
      jax.tree.map(add, loss_acc, (loss_num, loss_count)),
      jax.tree.map(add, metrics_acc, m_parts),
    ), None

  # Gradients add up in float32 even for low-precision parameters.
  g0 = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
  zeros = lambda s: jnp.zeros(s.shape, s.dtype)
  m0 = jax.tree.map(
    lambda s: jax.tree.map(zeros, jax.eval_shape(_stat_parts, s)), metric_kinds, is_leaf=_is_stat
  )
  l0 = jax.tree.map(zeros, jax.eval_shape(_stat_parts, loss_kind))
  (g_sum, (loss_num, loss_count), m_sum), _ = jax.lax.scan(
    body, (jax.lax.with_sharding_constraint(g0, params_sh), l0, m0), xs
  )
  loss = _stat_finish(loss_kind, loss_num, loss_count)
  scale = _stat_finish(loss_kind, jnp.ones(()), loss_count)
  grads = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), g_sum, params)
  metrics = jax.tree.map(
    lambda kind, nc: _stat_finish(kind, *nc), metric_kinds, m_sum, is_leaf=_is_stat
  )
  return loss, metrics, grads


def make_train_step(
  loss_fn: Callable,
  optimizer,
  mesh: Mesh,
  state: State,
  batch_like: dict,
  *,
  micro_batch_size: int = 0,
):
  """Jitted `step(state, batch) -> (state, metrics)`: one guarded optimiser update.

  `loss_fn(params, batch) -> (loss, metrics)` with scalar loss and a flat dict of scalar
  metrics, each either a `Mean(value, count)` (a mean over a variable number of items, e.g.
  response tokens or valid pairs), a `Sum(value)` (a total), or a plain value (a mean over
  rows). With micro_batch_size > 0 the batch is split into b / micro_batch_size strided
  micro-batches whose gradients and stats accumulate under a lax.scan (peak activation memory
  of one micro-batch); Means combine with whole-batch denominators, so loss, metrics and the
  update equal the one-shot step up to float rounding. 0 (or b) = the whole batch at once.
  (verl 0.4.1's actor and the Cooper reference's RM step instead divide each micro-batch's
  mean by the micro-batch count: their token-mean and valid-pair mean move with the split;
  docs/parity.md.)

  State shardings follow the parameter rules, batch rows are split over (data, fsdp), the
  state buffer is donated (do not reuse the state passed in).
  """
  k = micro_count(_leading_dim(batch_like), micro_batch_size, mesh)
  state_sh = sharding.tree_shardings(state, mesh)
  params_sh = sharding.tree_shardings(state["params"], mesh)

  def step(state, batch):
    params = state["params"]
    if k == 1:
      (loss, metrics), grads = jax.value_and_grad(
        lambda p: resolve(loss_fn(p, batch)), has_aux=True
      )(params)
    else:
      loss, metrics, grads = _accumulated_grads(loss_fn, params, batch, k, mesh, params_sh)
    return apply_update(state, optimizer, loss, grads, metrics)

  batch_sh = {k_: sharding.batch_sharding(mesh, len(v.shape)) for k_, v in batch_like.items()}
  return jax.jit(
    step,
    in_shardings=(state_sh, batch_sh),
    out_shardings=(state_sh, sharding.replicated(mesh)),
    donate_argnums=(0,),
  )


def make_policy_step(
  model_cfg: ModelConfig,
  loss_cfg,
  optimizer,
  mesh: Mesh,
  state: State,
  batch_like: dict,
  *,
  micro_batch_size: int = 0,
  logprob_chunk: int = 0,
  temperature: float = 1.0,
  prompt_group: int = 1,
  n_prompts: int = 0,
):
  """Returns jitted `policy_step(state, batch) -> (state, metrics)` for batches shaped like
  `batch_like` (the set of keys fixes whether old_logp/ref_logp are used). micro_batch_size:
  rows per gradient-accumulation micro-batch; logprob_chunk: response positions per LM-head
  chunk (see cooper_jax.logprobs); 0 = off for both. Neither changes the result.
  temperature: the rollout's (`rollout.temperature`); log-probs, hence the PPO ratio and the
  KL, are taken under softmax(logits / T), the distribution the sampler drew from.
  prompt_group = G: the batch's rows come in groups of G that share a prompt (GRPO's order),
  so each prompt runs once per group (per micro-batch: `micro_prompt_group`); 1 = no sharing.
  n_prompts > 0: batches carry prompt_index [b] (row i answers prompt prompt_index[i] of
  n_prompts; any rows per prompt) and row_weight [b]: a batch whose duplicate rows were
  merged (`merge_duplicate_rows`), each prompt run once; whole-batch steps only."""
  if (loss_cfg.kl_coef > 0) != ("ref_logp" in batch_like):
    raise ValueError("policy batch must carry ref_logp exactly when kl_coef > 0")
  k = micro_count(_leading_dim(batch_like), micro_batch_size, mesh)
  if n_prompts and k > 1:
    raise ValueError("a merged batch (n_prompts > 0) runs as one micro-batch")
  group = micro_prompt_group(prompt_group, k)
  return make_train_step(
    lambda p, b: policy_loss_fn(
      model_cfg,
      loss_cfg,
      p,
      b,
      logprob_chunk=logprob_chunk,
      temperature=temperature,
      prompt_group=group,
      n_prompts=n_prompts,
    ),
    optimizer,
    mesh,
    state,
    batch_like,
    micro_batch_size=micro_batch_size,
  )


def make_rm_step(
  model_cfg: ModelConfig,
  loss_type: str,
  optimizer,
  mesh: Mesh,
  state: State,
  batch_like: dict,
  *,
  micro_batch_size: int = 0,
):
  """Returns jitted `rm_step(state, batch) -> (state, metrics)` (loss_type 'bt' or 'bce');
  micro_batch_size counts pairs for 'bt', rows for 'bce' (0 = whole batch)."""
  if loss_type not in ("bt", "bce"):
    raise ValueError(f"rm loss_type={loss_type!r}: expected 'bt' or 'bce'")
  return make_train_step(
    lambda p, b: rm_loss_fn(model_cfg, loss_type, p, b),
    optimizer,
    mesh,
    state,
    batch_like,
    micro_batch_size=micro_batch_size,
  )


def make_logprob_fn(
  model_cfg: ModelConfig,
  mesh: Mesh,
  params,
  *,
  micro_batch_size: int = 0,
  logprob_chunk: int = 0,
  temperature: float = 1.0,
  prompt_group: int = 1,
  n_prompts: int = 0,
  packed: bool = False,
):
  """Jitted forward-only `(params, batch) -> logp [b, n]` of the response tokens (old or
  reference log-probs) at the rollout temperature, as in `make_policy_step`; `batch` carries
  the four prompt/response arrays (and prompt_index with n_prompts > 0; response_segment when
  packed: cooper_jax.pack). Micro-batches run one after another, so peak memory is one
  micro-batch's forward. prompt_group, n_prompts: which rows share a prompt, as in
  `make_policy_step`."""
  if packed and not n_prompts:
    raise ValueError("packed rows need n_prompts > 0 (an indexed, merged batch)")
  keys = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")
  keys += ("prompt_index",) if n_prompts else ()
  keys += ("response_segment",) if packed else ()

  def logprob_fn(params, batch):
    k = micro_count(_leading_dim(batch), micro_batch_size, mesh)
    if n_prompts and k > 1:
      raise ValueError("a merged batch (n_prompts > 0) runs as one micro-batch")
    group = micro_prompt_group(prompt_group, k)
    one = lambda *arrays: _logprobs(
      model_cfg, params, dict(zip(keys, arrays)), logprob_chunk, temperature, group, n_prompts
    )
    return _map_micro(one, mesh, micro_batch_size, *(batch[k] for k in keys))

  return jax.jit(
    logprob_fn,
    in_shardings=(
      sharding.tree_shardings(params, mesh),
      {k: sharding.batch_sharding(mesh, 1 if k == "prompt_index" else 2) for k in keys},
    ),
    out_shardings=sharding.batch_sharding(mesh),
  )


def make_reward_fn(model_cfg: ModelConfig, mesh: Mesh, params, *, micro_batch_size: int = 0):
  """Jitted `(params, tokens, mask) -> sigmoid(score) [n]`, the RM reward in (0, 1), over
  micro-batches of micro_batch_size rows run one after another (0 = all at once)."""

  def reward_fn(params, tokens, mask):
    score = lambda t, m: jax.nn.sigmoid(rm_scores(model_cfg, params, t, m))
    return _map_micro(score, mesh, micro_batch_size, tokens, mask)

  return jax.jit(
    reward_fn,
    in_shardings=(
      sharding.tree_shardings(params, mesh),
      sharding.batch_sharding(mesh),
      sharding.batch_sharding(mesh),
    ),
    out_shardings=sharding.batch_sharding(mesh, 1),
  )
