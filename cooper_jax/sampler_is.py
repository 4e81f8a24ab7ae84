"""Correction of the policy loss for the sampler-vs-trainer mismatch (config
`policy.loss.sampler_is`).

The sampler's log-probs of its own tokens (`sampler_logp`) and the trainer's at the same
parameters (`old_logp`: the trainer's log-probs at the sampling parameters; in a single
on-policy update sg(logp) itself) differ by numerics: a bf16 sampler (`rollout.dtype`), another
kernel, a KV cache. The tokens were drawn from pi_sampler, the gradient is the trainer's, so the
policy gradient is off-policy by the ratio r_t = pi_old(y_t) / pi_sampler(y_t).

kind:
  "none":      no correction (the mismatch is only measured: policy/sampler_logp_abs_diff,
               policy/sampler_kl).
  "token_tis": truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
               secretly brings you off-policy RL training"): each token's policy-gradient term
               times sg(min(r_t, cap)). The KL term is not weighted (verl's rollout_is does the
               same). Applied as a per-token factor on the advantage: for a weight w > 0 the
               PPO terms -A w ratio, -A w clip(ratio) and the dual clip -A w c are w times the
               unweighted ones, so max/min pick the same branch and the loss term is w times
               the unweighted one (also the clip metrics stay the same).
  "seq_mask":  masked importance sampling at the sequence level (verl's rollout_is, mode
               "mask", level "geometric" or "sequence"): a response whose sequence ratio lies
               outside [1/cap, cap] leaves the loss (its tokens leave the token-mean's
               denominator too; the seq_mean modes still divide by every row, a masked one
               adding 0); the kept ones are not reweighted. seq_ratio "geometric": the
               ratio's geometric mean over the response's tokens, exp(mean_t log r_t), which
               does not grow with length (verl recommends caps of ~1.0002-1.001 there);
               "product": prod_t r_t, the exact sequence ratio (caps of ~2-10).

Works on merged rows (the mask carries the row weights) and packed rows (a sequence is one
`response_segment` of its row). Every metric is a (value, count) pair for steps.Mean.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cooper_jax.config import SAMPLER_IS_KINDS as KINDS
from cooper_jax.objectives import sequence_ids


def log_ratio(old_logp_bt, sampler_logp_bt):
  """log(pi_old / pi_sampler) per token, constant for the gradient.
  TRAP: padding may hold anything (the sampler writes 0, the trainer a pad token's log-prob);
  the clamp keeps exp finite there, and every use is masked."""
  d_bt = old_logp_bt.astype(jnp.float32) - sampler_logp_bt.astype(jnp.float32)
  return jax.lax.stop_gradient(jnp.clip(d_bt, -20.0, 20.0))


def _mean(x_bt, mask_bt):
  n = jnp.sum(mask_bt)
  return jnp.sum(jnp.where(mask_bt > 0, x_bt * mask_bt, 0.0)) / jnp.maximum(n, 1.0), n


def token_tis(log_r_bt, adv_bt, mask_bt, cap: float):
  """(advantages times sg(min(r, cap)), metrics)."""
  r_bt = jnp.exp(log_r_bt)
  w_bt = jnp.minimum(r_bt, cap)
  metrics = {
    "is_ratio_mean": _mean(r_bt, mask_bt),
    "is_weight_mean": _mean(w_bt, mask_bt),
    "is_capped_frac": _mean((r_bt > cap).astype(jnp.float32), mask_bt),
  }
  return adv_bt * w_bt, metrics


def seq_mask(log_r_bt, mask_bt, cap: float, seq_ratio: str, segment_bt=None):
  """(mask with the out-of-band responses zeroed, metrics). mask_bt may carry weights (merged
  or packed rows): a response's weight is its tokens' (all equal)."""
  ids_bt, n_ids = sequence_ids(mask_bt, segment_bt)
  real_bt = (mask_bt > 0).astype(jnp.float32)
  total = lambda x_bt: jax.ops.segment_sum(x_bt.reshape(-1), ids_bt.reshape(-1), n_ids)
  log_sum_s = total(jnp.where(mask_bt > 0, log_r_bt, 0.0))
  len_s = total(real_bt)
  log_seq_s = log_sum_s / jnp.maximum(len_s, 1.0) if seq_ratio == "geometric" else log_sum_s
  bound = jnp.log(jnp.float32(cap))
  keep_s = (jnp.abs(log_seq_s) <= bound) | (len_s == 0)
  keep_bt = keep_s[ids_bt].astype(jnp.float32)
  weight_s = total(jnp.where(mask_bt > 0, mask_bt, 0.0)) / jnp.maximum(len_s, 1.0)
  n_seq = jnp.sum(weight_s)
  seq_mean = lambda x_s: jnp.sum(weight_s * x_s) / jnp.maximum(n_seq, 1.0)
  metrics = {
    "is_ratio_mean": _mean(jnp.exp(log_r_bt), mask_bt),
    "is_seq_ratio_mean": (seq_mean(jnp.exp(jnp.clip(log_seq_s, -20.0, 20.0))), n_seq),
    "is_seq_masked_frac": (seq_mean(1.0 - keep_s.astype(jnp.float32)), n_seq),
    "is_token_masked_frac": _mean(1.0 - keep_bt, mask_bt),
  }
  return mask_bt * keep_bt, metrics


def correct(cfg, old_logp_bt, sampler_logp_bt, adv, mask_bt, segment_bt=None):
  """(advantages, mask, metrics) of the corrected loss; advantages come back per token [b, n]
  under token_tis, as given otherwise. cfg: config policy.loss.sampler_is."""
  log_r_bt = log_ratio(old_logp_bt, sampler_logp_bt)
  if cfg.kind == "token_tis":
    adv_bt = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, mask_bt.shape)
    adv_bt, metrics = token_tis(log_r_bt, adv_bt.astype(jnp.float32), mask_bt, float(cfg.cap))
    return adv_bt, mask_bt, metrics
  if cfg.kind == "seq_mask":
    mask_bt, metrics = seq_mask(log_r_bt, mask_bt, float(cfg.cap), cfg.seq_ratio, segment_bt)
    return adv, mask_bt, metrics
  raise ValueError(f"sampler_is kind={cfg.kind!r}: expected one of {KINDS[1:]} here")
