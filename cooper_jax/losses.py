"""Losses for Cooper (arXiv 2508.05613): GRPO policy loss and reward-model losses.

All functions are pure jnp and jit-friendly; string / Python-number options are static.
Shape suffixes: b = batch of responses (n_prompts * G), t = response tokens, v = vocab,
p = preference pairs.  `mask_bt` is 1.0 on real response tokens and 0.0 on padding.

Conventions follow verl (the paper's training framework, core_algos.py):
  * GRPO advantage (r - mean_group) / (std_group + 1e-6), torch-style unbiased std.
  * PPO clipped ratio with dual clip (c=3) for negative advantages.
  * "token_mean" aggregation: one global mean over every unmasked token of the batch.
  * KL loss "low_var_kl" (k3) = exp(d) - d - 1, d = ref - logp, clamped to [-10, 10].
Numerical traps handled here are marked "TRAP:".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from cooper_jax.stats import precision_recall

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def masked_mean(x, mask, axis=None):
  """sum(x * mask) / sum(mask) over `axis` (all axes by default); 0 where the mask is empty.

  TRAP: padded positions may hold inf/NaN (e.g. a log-prob of a pad target); x * 0 would
  still be NaN, so we select with jnp.where instead of multiplying.  An all-zero mask gives
  0 (denominator clamped at 1), not NaN -- the same as verl's `/ (mask.sum() + 1e-8)` for
  binary masks.
  """
  mask = mask.astype(jnp.float32)
  total = jnp.sum(jnp.where(mask > 0, x * mask, 0.0), axis=axis)
  return total / jnp.maximum(jnp.sum(mask, axis=axis), 1.0)


def agg_loss(loss_bt, mask_bt, agg: str = "token_mean", row_weight_b=None):
  """Reduce a per-token loss matrix to a scalar, as verl's `agg_loss`.

  token_mean:          sum(loss * mask) / sum(mask) over the whole batch (paper setting;
                       long responses weigh more, every token counts equally). Split into
                       micro-batches (steps.Mean) it stays the whole batch's mean; verl 0.4.1
                       averages each micro-batch and divides by their count, so its loss moves
                       with the split (docs/parity.md).
  seq_mean_token_mean: mean over the B rows of each row's token mean (original GRPO).
  seq_mean_token_sum:  mean over the B rows of each row's token sum (Dr.GRPO-style).
  Both seq modes average over all B rows like verl's torch.mean; a row with no tokens
  contributes 0 (verl would produce NaN for it in seq_mean_token_mean).
  row_weight_b [B]: row i stands for row_weight_b[i] identical rows (a merged batch), and
  mask_bt is already scaled by it; the seq modes then divide by sum(row_weight_b), not B.
  """
  agg = agg.replace("-", "_")
  mask_bt = mask_bt.astype(jnp.float32)
  if agg == "token_mean":
    return masked_mean(loss_bt, mask_bt)
  row_sum_b = jnp.sum(jnp.where(mask_bt > 0, loss_bt * mask_bt, 0.0), axis=-1)
  if agg == "seq_mean_token_sum":
    return jnp.mean(row_sum_b) if row_weight_b is None else jnp.sum(row_sum_b) / _rows(row_weight_b)
  if agg == "seq_mean_token_mean":
    row_mean_b = row_sum_b / jnp.maximum(jnp.sum(mask_bt, axis=-1), 1.0)
    if row_weight_b is None:
      return jnp.mean(row_mean_b)
    return jnp.sum(row_mean_b * row_weight_b) / _rows(row_weight_b)
  raise ValueError(f"unknown agg {agg!r}; expected one of {AGG_MODES}")


def _rows(row_weight_b):
  return jnp.maximum(jnp.sum(jnp.asarray(row_weight_b, jnp.float32)), 1.0)


def grpo_advantages(
  rewards_b,
  group_size: int,
  *,
  scale_by_std: bool = True,
  eps: float = 1e-6,
  unbiased_std: bool = True,
):
  """Group-relative advantages; rewards_b is laid out as consecutive groups of size G.

  A_i = (r_i - mean_g) / (std_g + eps), std with ddof=1 (torch.std default, as the code).
  scale_by_std=False gives Dr.GRPO: A_i = r_i - mean_g.
  A group whose rewards are all equal (max == min) gets A = 0 exactly, whatever G and the
  float rounding of its mean; it carries no gradient.
  Group of size 1: advantage 0 by definition (no baseline to compare to).  NOTE verl
  instead uses mean=0, std=1 there (A = r); we deliberately avoid that reward leak, and
  ddof=1 would otherwise give 0/0 = NaN.
  Advantages are constants for the policy update: wrapped in stop_gradient.
  """
  rewards_b = jnp.asarray(rewards_b, jnp.float32)
  (b,) = rewards_b.shape
  if group_size < 1 or b % group_size != 0:
    raise ValueError(f"batch {b} is not a multiple of group_size {group_size}")
  if group_size == 1:
    return jnp.zeros_like(rewards_b)
  r_ng = rewards_b.reshape(b // group_size, group_size)
  centred_ng = r_ng - jnp.mean(r_ng, axis=1, keepdims=True)
  if scale_by_std:
    std_n1 = jnp.std(r_ng, axis=1, keepdims=True, ddof=1 if unbiased_std else 0)
    centred_ng = centred_ng / (std_n1 + eps)
  # The float32 mean of G equal values can be one ulp off them: the std is then ~1e-7 and
  # delta / (std + eps) reaches |A| ~0.1-0.2. Equality is tested on the rewards themselves.
  flat_n1 = jnp.max(r_ng, axis=1, keepdims=True) == jnp.min(r_ng, axis=1, keepdims=True)
  centred_ng = jnp.where(flat_n1, 0.0, centred_ng)
  return jax.lax.stop_gradient(centred_ng.reshape(b))


def ppo_clip_loss(
  logp_bt,
  old_logp_bt,
  adv_b,
  mask_bt,
  *,
  clip_eps: float = 0.2,
  clip_eps_high: float | None = None,
  dual_clip_c: float | None = 3.0,
  agg: str = "token_mean",
  row_weight_b=None,
):
  """verl's vanilla PPO/GRPO policy loss. Returns (loss, metrics).

  adv_b is one advantage per response ([B]) broadcast to every token; a per-token [B, T]
  array is accepted too.  clip_eps_high=None means symmetric clipping (DAPO clip-higher
  otherwise).  dual_clip_c=None disables the dual clip.  row_weight_b: see `agg_loss` (the
  token metrics are means under mask_bt, which carries the weights).
  """
  logp_bt = logp_bt.astype(jnp.float32)
  old_logp_bt = jax.lax.stop_gradient(old_logp_bt.astype(jnp.float32))
  adv_bt = jax.lax.stop_gradient(jnp.asarray(adv_b, jnp.float32))
  if adv_bt.ndim == 1:
    adv_bt = adv_bt[:, None]
  adv_bt = jnp.broadcast_to(adv_bt, logp_bt.shape)
  mask_bt = mask_bt.astype(jnp.float32)
  eps_high = clip_eps if clip_eps_high is None else clip_eps_high

  # TRAP: exp of an unclamped log-ratio overflows (pads, or a stale old_logp); verl clamps
  # to [-20, 20] first.  Inside the clamp the gradient is unchanged.
  log_ratio_bt = jnp.clip(logp_bt - old_logp_bt, -20.0, 20.0)
  ratio_bt = jnp.exp(log_ratio_bt)

  pg1_bt = -adv_bt * ratio_bt
  pg2_bt = -adv_bt * jnp.clip(ratio_bt, 1.0 - clip_eps, 1.0 + eps_high)
  # max = pessimistic bound; where pg2 wins the loss is constant in logp -> zero gradient.
  clipped_bt = jnp.maximum(pg1_bt, pg2_bt)
  if dual_clip_c is not None:
    # Dual clip (Ye et al. 2020): for A < 0 the max above is unbounded as ratio -> inf;
    # cap it at -A * c (c > 1).  Applied only where A < 0, as verl does.
    pg3_bt = -adv_bt * dual_clip_c
    dual_bt = jnp.minimum(clipped_bt, pg3_bt)
    loss_bt = jnp.where(adv_bt < 0, dual_bt, clipped_bt)
    dual_hit_bt = ((clipped_bt > pg3_bt) & (adv_bt < 0)).astype(jnp.float32)
  else:
    loss_bt = clipped_bt
    dual_hit_bt = jnp.zeros_like(loss_bt)

  loss = agg_loss(loss_bt, mask_bt, agg, row_weight_b)
  sg = jax.lax.stop_gradient
  metrics = {
    "pg_loss": sg(loss),
    "clipfrac": sg(masked_mean((pg2_bt > pg1_bt).astype(jnp.float32), mask_bt)),
    "clipfrac_dual": sg(masked_mean(dual_hit_bt, mask_bt)),
    # verl's ppo_kl: mean(old - logp) of the clamped log-ratio, over unmasked tokens.
    "approx_kl": sg(masked_mean(-log_ratio_bt, mask_bt)),
    "ratio_mean": sg(masked_mean(ratio_bt, mask_bt)),
  }
  return loss, metrics


def kl_penalty(logp_bt, ref_logp_bt, kind: str = "low_var_kl"):
  """Per-token KL(pi || pi_ref) estimate on sampled tokens (Schulman's k1/k2/k3).

  k1 = logp - ref (unbiased, high variance, can be negative);
  k2 = 0.5 * (logp - ref)^2;
  k3 / low_var_kl = exp(d) - d - 1 with d = ref - logp (>= 0, unbiased), clamped to
  [-10, 10] as verl does (the paper's setting, coefficient 0.001).
  """
  logp_bt = logp_bt.astype(jnp.float32)
  ref_logp_bt = jax.lax.stop_gradient(ref_logp_bt.astype(jnp.float32))
  if kind == "k1":
    return logp_bt - ref_logp_bt
  if kind == "k2":
    return 0.5 * jnp.square(logp_bt - ref_logp_bt)
  if kind in ("k3", "low_var_kl"):
    # TRAP: clamping only the output is not enough for gradients: for d > ~88 exp(d) is
    # inf in float32 and the clamp's zero cotangent times inf gives NaN.  Clamp d to
    # [-20, 20] first (verl 0.4.1 does the same); the output clamp then binds at 10.
    d_bt = jnp.clip(ref_logp_bt - logp_bt, -20.0, 20.0)
    return jnp.clip(jnp.exp(d_bt) - d_bt - 1.0, -10.0, 10.0)
  raise ValueError(f"unknown kl kind {kind!r}; expected one of {KL_KINDS}")


def policy_loss(
  logp_bt,
  old_logp_bt,
  adv_b,
  mask_bt,
  ref_logp_bt=None,
  *,
  kl_coef: float = 0.001,
  kl_kind: str = "low_var_kl",
  clip_eps: float = 0.2,
  clip_eps_high: float | None = None,
  dual_clip_c: float | None = 3.0,
  agg: str = "token_mean",
  row_weight_b=None,
  objective=None,
):
  """GRPO actor loss = pg_loss + kl_coef * agg(kl_penalty), as verl's use_kl_loss path.

  kl_coef must be a Python number (static).  With kl_coef == 0 the caller may skip the
  reference forward pass and pass ref_logp_bt=None.  The KL term uses the same `agg` mode
  as the pg term, as in verl.  row_weight_b: see `agg_loss`.  objective: the pg term,
  `(logp, old, adv, mask, *, agg, row_weight_b) -> (loss, metrics)` (objectives.make: GSPO,
  CISPO, ...); None = `ppo_clip_loss` with the clip arguments.  Returns (loss, metrics).
  """
  if objective is None:
    objective = functools.partial(
      ppo_clip_loss, clip_eps=clip_eps, clip_eps_high=clip_eps_high, dual_clip_c=dual_clip_c
    )
  loss, metrics = objective(
    logp_bt, old_logp_bt, adv_b, mask_bt, agg=agg, row_weight_b=row_weight_b
  )
  if ref_logp_bt is None:
    assert kl_coef == 0, "ref_logp_bt is None but kl_coef != 0"
    return loss, metrics
  kl_loss = agg_loss(kl_penalty(logp_bt, ref_logp_bt, kl_kind), mask_bt, agg, row_weight_b)
  metrics = dict(metrics, kl_loss=jax.lax.stop_gradient(kl_loss))
  loss = loss + kl_coef * kl_loss
  metrics["loss"] = jax.lax.stop_gradient(loss)
  return loss, metrics


def bradley_terry_loss(score_pos_p, score_neg_p, valid_p):
  """Cooper's RM loss: mean over valid pairs of -log sigmoid(s_pos - s_neg) (raw logits).

  Pairs are dropped when a prompt had no correct rollout or the assistant LLM failed to
  produce a verified-wrong negative, so valid_p can be all False: then loss = 0 and the
  gradient is exactly 0 (where-select + denominator clamped at 1), not NaN.
  Over micro-batches it stays the mean over all valid pairs (steps.Mean). The reference
  (recipe/cooper/dp_reward.py) divides each micro-batch's sum by its valid.sum() + 1e-6 and
  then by the micro-batch count, so a micro-batch with one valid pair weighs as much as a full
  one, and one with none still counts in the divisor (docs/parity.md).
  TRAP: log(sigmoid(m)) underflows to -inf for m << 0; jax.nn.log_sigmoid is stable.
  """
  margin_p = score_pos_p.astype(jnp.float32) - score_neg_p.astype(jnp.float32)
  valid_p = valid_p.astype(bool)
  n_valid = jnp.sum(valid_p.astype(jnp.float32))
  denom = jnp.maximum(n_valid, 1.0)
  nll_p = -jax.nn.log_sigmoid(margin_p)
  loss = jnp.sum(jnp.where(valid_p, nll_p, 0.0)) / denom
  sg = jax.lax.stop_gradient
  metrics = {
    "bt_loss": sg(loss),
    "pair_acc": sg(jnp.sum((valid_p & (margin_p > 0)).astype(jnp.float32)) / denom),
    "n_valid": n_valid,
    "margin_mean": sg(jnp.sum(jnp.where(valid_p, margin_p, 0.0)) / denom),
  }
  return loss, metrics


def bce_loss(logits_b, labels_b, mask_b=None):
  """RM pretraining loss: sigmoid BCE on logits, averaged over mask_b. Returns (loss, metrics).

  TRAP: never compute log(sigmoid(x)) directly (saturates at |x| ~ 17 in float32); optax
  uses the stable max(x, 0) - x*y + log1p(exp(-|x|)) form.
  Metrics at threshold 0 on the logit (= probability 0.5); labels >= 0.5 count as positive.
  """
  logits_b = logits_b.astype(jnp.float32)
  labels_b = labels_b.astype(jnp.float32)
  mask_b = jnp.ones_like(logits_b) if mask_b is None else mask_b.astype(jnp.float32)
  loss = masked_mean(optax.sigmoid_binary_cross_entropy(logits_b, labels_b), mask_b)
  m = mask_b > 0
  pred = logits_b > 0
  true = labels_b >= 0.5
  precision, recall = precision_recall(pred & m, true & m)  # 0 where undefined
  sg = jax.lax.stop_gradient
  metrics = {
    "bce_loss": sg(loss),
    "accuracy": masked_mean((pred == true).astype(jnp.float32), mask_b),
    "precision": precision,
    "recall": recall,
  }
  return loss, metrics
