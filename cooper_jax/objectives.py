"""Policy objectives by name: what `config.policy.loss.name` selects (`OBJECTIVES`).

  ppo_clip    verl's PPO/GRPO clip loss (losses.ppo_clip_loss; the paper's, the default).
  gspo        GSPO (Zheng et al. 2025, arXiv 2507.18071): one importance ratio per response,
              s_i = exp(mean_t(logp - old_logp)), clipped per response; loss per response
              max(-A s_i, -A clip(s_i, 1 - eps, 1 + eps_high)), averaged over responses.
  gspo_token  GSPO-token (same paper, eq. 13): per token s_it = sg(s_i) * pi / sg(pi), whose
              value is s_i and whose gradient flows per token; any `agg`, packed rows too.
  cispo       CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the clipped,
              stop-gradient per-token ratio: -sg(clip(r, 1 - eps, 1 + eps_high)) * A * logp.

Each objective's hyperparameters and their defaults are its `defaults`; ppo_clip's are the flat
keys policy.loss.{clip_eps, clip_eps_high, dual_clip_c} (where they were before objectives had
names), every other's live in policy.loss.<name>.<key>. `hyperparameters` checks them when the
config is validated. A loss takes (logp_bt, old_logp_bt, adv, mask_bt, *, agg, row_weight_b,
segment_bt, **hyperparameters) and returns (loss, metrics) like losses.ppo_clip_loss; metrics
named "seq_*" are means over responses (steps.policy_loss_fn counts them so), the others token
means under mask_bt, "pg_loss" aggregated like the loss.

Where peers differ (read in verl 0.9.1 core_algos, TRL main grpo_trainer, tunix algo_core):
  * GSPO's aggregation: the paper averages the per-response loss over responses, which is
    seq_mean_token_mean; verl 0.8 forced it, verl 0.9.1 applies the configured mode (default
    token-mean, "differs from the GSPO paper" in its comment); TRL (default loss_type dapo, a
    token mean) warns that token sums weigh a response by its length and points to its
    sequence-mean loss_type="grpo" for the paper; tunix defaults to a sequence mean. Here
    `gspo` is the paper's and needs agg=seq_mean_token_mean (config.validate says so);
    `gspo_token` takes any agg (token_mean: each response's loss weighs by its length, verl
    0.9.1's default).
  * GSPO's clip range: the paper's 3e-4 / 4e-4 (Sec. 5.1), as verl's GSPO recipes. No dual clip
    (the paper has none; verl none; tunix applies its epsilon_c if set).
  * CISPO's bounds: the paper's clip(r, 1 - eps_low, 1 + eps_high), run with no lower bound
    (eps_low large) and eps_high tuned, its value not given. verl takes both offsets (its
    example: 10 and 0.2); TRL bounds the weight above only, at epsilon_high as an absolute
    bound (recommended 5, ScaleRL's). Defaults here: clip_eps = 1.0 (lower bound 0: never
    binds, as the paper's runs) and clip_eps_high = 4.0 (an upper bound of 5, ScaleRL's).
    CISPO's `pg_loss` is a surrogate (its value depends on logp itself); only its gradient is
    the objective's.

Nothing at the top imports jax: config parsing reads the tables only (as cooper_jax.optim).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

AGG_SEQ = "seq_mean_token_mean"


def _jnp():
  # Imported here, not at the top: config parsing imports this module for its tables only.
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  return jax, jnp


def per_response(x_bt, mask_bt, segment_bt=None):
  """(mean_bt, length_bt): at each token, the mean of x over its response's tokens (mask > 0)
  and that response's token count. A response is a row, or with segment_bt [b, t] (packed rows,
  cooper_jax.pack: 1, 2, ... per response of a row, 0 = padding) a segment of a row. Weights
  carried by mask_bt do not enter the mean: a merged row's tokens are one response's.

  TRAP: padded positions may hold inf/NaN; they are selected away, never multiplied by 0."""
  jax, jnp = _jnp()
  on_bt = mask_bt > 0
  x_bt = jnp.where(on_bt, x_bt, 0.0)
  ones_bt = on_bt.astype(jnp.float32)
  if segment_bt is None:
    n_b1 = jnp.sum(ones_bt, axis=-1, keepdims=True)
    mean_b1 = jnp.sum(x_bt, axis=-1, keepdims=True) / jnp.maximum(n_b1, 1.0)
    return jnp.broadcast_to(mean_b1, x_bt.shape), jnp.broadcast_to(n_b1, x_bt.shape)
  b, t = x_bt.shape
  ids_bt, n_seg = sequence_ids(mask_bt, segment_bt)
  ids = ids_bt.ravel()
  sums = jax.ops.segment_sum(x_bt.ravel(), ids, num_segments=n_seg)
  counts = jax.ops.segment_sum(ones_bt.ravel(), ids, num_segments=n_seg)
  mean_bt = (sums / jnp.maximum(counts, 1.0))[ids].reshape(b, t)
  return mean_bt, counts[ids].reshape(b, t)


def sequence_ids(mask_bt, segment_bt=None):
  """([b, n] int32 id of each position's response, number of ids): a row is one response; a
  packed row (`response_segment`, 1, 2, ... per response, 0 padding) holds several, one id per
  (row, segment): a row of n positions has at most n segments (ids 0..n). Also the responses
  of cooper_jax.sampler_is's sequence mask."""
  _, jnp = _jnp()
  b, n = mask_bt.shape
  row_bt = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], (b, n))
  if segment_bt is None:
    return row_bt, b
  return row_bt * (n + 1) + segment_bt.astype(jnp.int32), b * (n + 1)


def response_count(mask_bt, segment_bt=None):
  """How many responses (with a token) mask_bt holds, a merged row counting its weight: the
  denominator of the "seq_*" metrics. Independent of the parameters."""
  _, jnp = _jnp()
  mask_bt = mask_bt.astype(jnp.float32)
  _, len_bt = per_response(mask_bt, mask_bt, segment_bt)
  return jnp.sum(jnp.where(mask_bt > 0, mask_bt / jnp.maximum(len_bt, 1.0), 0.0))


def _response_mean(x_bt, mask_bt, len_bt):
  """Mean over responses of a per-response value x (equal at its tokens), weights counted."""
  _, jnp = _jnp()
  w_bt = jnp.where(mask_bt > 0, mask_bt / jnp.maximum(len_bt, 1.0), 0.0)
  return jnp.sum(jnp.where(mask_bt > 0, x_bt * w_bt, 0.0)) / jnp.maximum(jnp.sum(w_bt), 1.0)


def _inputs(logp_bt, old_logp_bt, adv, mask_bt):
  jax, jnp = _jnp()
  logp_bt = logp_bt.astype(jnp.float32)
  old_logp_bt = jax.lax.stop_gradient(old_logp_bt.astype(jnp.float32))
  adv_bt = jax.lax.stop_gradient(jnp.asarray(adv, jnp.float32))
  adv_bt = jnp.broadcast_to(adv_bt[:, None] if adv_bt.ndim == 1 else adv_bt, logp_bt.shape)
  return logp_bt, old_logp_bt, adv_bt, mask_bt.astype(jnp.float32)


def _gspo(
  logp_bt,
  old_logp_bt,
  adv,
  mask_bt,
  *,
  agg: str,
  row_weight_b=None,
  segment_bt=None,
  clip_eps: float,
  clip_eps_high: float,
  token_level: bool,
):
  jax, jnp = _jnp()
  from cooper_jax.losses import agg_loss, masked_mean  # pylint: disable=import-outside-toplevel

  sg = jax.lax.stop_gradient
  logp_bt, old_logp_bt, adv_bt, mask_bt = _inputs(logp_bt, old_logp_bt, adv, mask_bt)
  log_ratio_bt = logp_bt - old_logp_bt
  # log s_i at each of its tokens; the gradient flows through the mean (1/|y_i| per token).
  seq_log_ratio_bt, len_bt = per_response(log_ratio_bt, mask_bt, segment_bt)
  # TRAP: exp overflows for a stale old_logp; clamp as ppo_clip_loss does (verl's GSPO clamps
  # at 10 above only). Inside the clamp the gradient is unchanged.
  seq_log_ratio_bt = jnp.clip(seq_log_ratio_bt, -20.0, 20.0)
  if token_level:
    # GSPO-token: value s_i, gradient s_i * d logp_t (the paper's eq. 13-14).
    seq_log_ratio_bt = sg(seq_log_ratio_bt) + logp_bt - sg(logp_bt)
  ratio_bt = jnp.exp(seq_log_ratio_bt)
  pg1_bt = -adv_bt * ratio_bt
  pg2_bt = -adv_bt * jnp.clip(ratio_bt, 1.0 - clip_eps, 1.0 + clip_eps_high)
  loss_bt = jnp.maximum(pg1_bt, pg2_bt)
  loss = agg_loss(loss_bt, mask_bt, agg, row_weight_b)
  clipped_bt = (pg2_bt > pg1_bt).astype(jnp.float32)
  ratio_sg_bt = sg(ratio_bt)
  metrics = {
    "pg_loss": sg(loss),
    # Share of tokens whose loss is clipped (what the GSPO paper's Fig. 4 counts; ppo_clip's
    # clipfrac), and share of responses (each response clips whole).
    "clipfrac": masked_mean(clipped_bt, mask_bt),
    "seq_clipfrac": _response_mean(clipped_bt, mask_bt, len_bt),
    "approx_kl": sg(masked_mean(-jnp.clip(log_ratio_bt, -20.0, 20.0), mask_bt)),
    # The ratio each token's loss used (s_i), as ppo_clip's ratio_mean; and per response.
    "ratio_mean": masked_mean(ratio_sg_bt, mask_bt),
    "seq_ratio_mean": _response_mean(ratio_sg_bt, mask_bt, len_bt),
  }
  return loss, metrics


def gspo_loss(
  logp_bt,
  old_logp_bt,
  adv,
  mask_bt,
  *,
  agg=AGG_SEQ,
  row_weight_b=None,
  segment_bt=None,
  clip_eps=3e-4,
  clip_eps_high=4e-4,
):
  """GSPO: sequence ratio s_i = exp(mean of the response's log-ratios), its gradient through
  the mean; loss_i = max(-A s_i, -A clip(s_i, 1 - clip_eps, 1 + clip_eps_high)), broadcast to
  the response's tokens and aggregated by `agg` (the paper: seq_mean_token_mean = the mean of
  loss_i over responses). adv: [b] or [b, t] (constant within a response). row_weight_b and
  mask_bt: as losses.agg_loss; segment_bt: packed rows (`per_response`). Returns (loss,
  metrics)."""
  return _gspo(
    logp_bt,
    old_logp_bt,
    adv,
    mask_bt,
    agg=agg,
    row_weight_b=row_weight_b,
    segment_bt=segment_bt,
    clip_eps=clip_eps,
    clip_eps_high=clip_eps_high,
    token_level=False,
  )


def gspo_token_loss(
  logp_bt,
  old_logp_bt,
  adv,
  mask_bt,
  *,
  agg="token_mean",
  row_weight_b=None,
  segment_bt=None,
  clip_eps=3e-4,
  clip_eps_high=4e-4,
):
  """GSPO-token: per-token ratio sg(s_i) * exp(logp - sg(logp)) (value s_i, gradient per token)
  in the clipped loss, aggregated by `agg`. With an advantage constant within each response it
  equals `gspo_loss` under the same agg, value and gradient. Returns (loss, metrics)."""
  return _gspo(
    logp_bt,
    old_logp_bt,
    adv,
    mask_bt,
    agg=agg,
    row_weight_b=row_weight_b,
    segment_bt=segment_bt,
    clip_eps=clip_eps,
    clip_eps_high=clip_eps_high,
    token_level=True,
  )


def cispo_loss(
  logp_bt,
  old_logp_bt,
  adv,
  mask_bt,
  *,
  agg="token_mean",
  row_weight_b=None,
  segment_bt=None,
  clip_eps=1.0,
  clip_eps_high=4.0,
):
  """CISPO: per token -sg(clip(r, 1 - clip_eps, 1 + clip_eps_high)) * A * logp, aggregated by
  `agg` (the paper: token_mean). Every token keeps a gradient -w A d logp; the clip bounds its
  weight only. segment_bt is unused (per-token). Returns (loss, metrics)."""
  del segment_bt
  jax, jnp = _jnp()
  from cooper_jax.losses import agg_loss, masked_mean  # pylint: disable=import-outside-toplevel

  sg = jax.lax.stop_gradient
  logp_bt, old_logp_bt, adv_bt, mask_bt = _inputs(logp_bt, old_logp_bt, adv, mask_bt)
  log_ratio_bt = jnp.clip(logp_bt - old_logp_bt, -20.0, 20.0)  # TRAP: as ppo_clip_loss
  ratio_bt = sg(jnp.exp(log_ratio_bt))
  weight_bt = jnp.clip(ratio_bt, 1.0 - clip_eps, 1.0 + clip_eps_high)
  loss_bt = -weight_bt * adv_bt * logp_bt
  loss = agg_loss(loss_bt, mask_bt, agg, row_weight_b)
  metrics = {
    "pg_loss": sg(loss),
    "clipfrac": masked_mean((weight_bt != ratio_bt).astype(jnp.float32), mask_bt),
    "approx_kl": masked_mean(-sg(log_ratio_bt), mask_bt),
    "ratio_mean": masked_mean(ratio_bt, mask_bt),
    "is_weight_mean": masked_mean(weight_bt, mask_bt),
  }
  return loss, metrics


def _ppo_clip(
  logp_bt,
  old_logp_bt,
  adv,
  mask_bt,
  *,
  agg="token_mean",
  row_weight_b=None,
  segment_bt=None,
  clip_eps=0.2,
  clip_eps_high=None,
  dual_clip_c=3.0,
):
  """losses.ppo_clip_loss; per token, so packed segments change nothing."""
  del segment_bt
  from cooper_jax.losses import ppo_clip_loss  # pylint: disable=import-outside-toplevel

  return ppo_clip_loss(
    logp_bt,
    old_logp_bt,
    adv,
    mask_bt,
    clip_eps=clip_eps,
    clip_eps_high=clip_eps_high,
    dual_clip_c=dual_clip_c,
    agg=agg,
    row_weight_b=row_weight_b,
  )


class Objective(NamedTuple):
  loss: Callable[..., tuple[Any, dict]]
  defaults: Mapping[str, Any]  # every hyperparameter, its default and so its type
  aggs: tuple[str, ...] | None  # the agg modes it is defined for (None: any)
  note: str


OBJECTIVES: dict[str, Objective] = {
  "ppo_clip": Objective(
    _ppo_clip,
    dict(clip_eps=0.2, clip_eps_high=None, dual_clip_c=3.0),
    None,
    "verl's PPO/GRPO clip, dual clip for A < 0 (losses.ppo_clip_loss); keys flat in policy.loss",
  ),
  "gspo": Objective(
    gspo_loss,
    dict(clip_eps=3e-4, clip_eps_high=4e-4),
    (AGG_SEQ,),
    "sequence-level ratio and clip, mean over responses (GSPO paper)",
  ),
  "gspo_token": Objective(
    gspo_token_loss,
    dict(clip_eps=3e-4, clip_eps_high=4e-4),
    None,
    "GSPO-token: the sequence ratio's value, per-token gradient; any agg, packed rows",
  ),
  "cispo": Objective(
    cispo_loss,
    dict(clip_eps=1.0, clip_eps_high=4.0),
    None,
    "REINFORCE x sg(clipped ratio) (MiniMax-M1); clip_eps >= 1: no lower bound",
  ),
}
FLAT = "ppo_clip"  # its hyperparameters are policy.loss's own keys, not a sub-dict
# policy.loss's keys shared by every objective.
SHARED = ("name", "kl_coef", "kl_kind", "agg", "scale_adv_by_std", "sampler_is")
_RANGES = {
  "clip_eps": (lambda v: v > 0, "> 0"),
  "clip_eps_high": (lambda v: v is None or v > 0, "> 0"),
  "dual_clip_c": (lambda v: v is None or v > 1, "> 1 (or None: off)"),
}


def _given(lc, name: str) -> dict:
  if name == FLAT:
    return {k: lc.get(k, v) for k, v in OBJECTIVES[FLAT].defaults.items()}
  return dict(lc.get(name) or {})


def hyperparameters(lc, where: str = "config.policy.loss") -> dict[str, Any]:
  """The hyperparameters of the objective `lc.name` names (policy.loss): its defaults updated
  by what the config sets. ValueError naming the key for: an unknown name (listing the known
  ones); a key of policy.loss that is neither shared, nor ppo_clip's, nor an objective's
  sub-dict; a key of a sub-dict that is not that objective's; a value of the wrong type or out
  of range; another objective's hyperparameter set away from its default (it would be
  ignored); an agg the objective is not defined for."""
  known = ", ".join(sorted(OBJECTIVES))
  name = lc.get("name", FLAT)
  if name not in OBJECTIVES:
    raise ValueError(f"{where}.name={name!r}: expected one of {known}")
  flat = tuple(OBJECTIVES[FLAT].defaults)
  stray = sorted(set(lc.keys()) - set(SHARED) - set(flat) - set(OBJECTIVES))
  if stray:
    raise ValueError(
      f"{where}.{stray[0]}: not a policy.loss key (shared: {', '.join(SHARED)}; ppo_clip's: "
      f"{', '.join(flat)}; another objective's go in {where}.<name>.<key>, <name> one of {known})"
    )
  for other in sorted(OBJECTIVES):
    defaults, given = OBJECTIVES[other].defaults, _given(lc, other)
    for key, value in sorted(given.items()):
      path = f"{where}.{key}" if other == FLAT else f"{where}.{other}.{key}"
      if key not in defaults:
        raise ValueError(
          f"{path}: not a hyperparameter of {other} (its hyperparameters: "
          f"{', '.join(sorted(defaults))})"
        )
      if other != name and value != defaults[key]:
        raise ValueError(
          f"{path}={value!r} is {other}'s but {where}.name={name!r}: set {where}.name={other} "
          f"to use it, or leave it at its default {defaults[key]!r}"
        )
  hp = {**OBJECTIVES[name].defaults, **_given(lc, name)}
  for key, value in hp.items():
    path = f"{where}.{key}" if name == FLAT else f"{where}.{name}.{key}"
    nullable = OBJECTIVES[name].defaults[key] is None or key == "dual_clip_c"
    if not (value is None and nullable):
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path} must be a number, got {value!r}")
    check, says = _RANGES.get(key, (lambda v: True, ""))
    if not check(value):
      raise ValueError(f"{path} must be {says}, got {value!r}")
  aggs = OBJECTIVES[name].aggs
  agg = str(lc.get("agg", "token_mean")).replace("-", "_")
  if aggs is not None and agg not in aggs:
    raise ValueError(
      f"{where}.name={name!r} is defined with {where}.agg in {aggs} (got {agg!r}): set "
      f"{where}.agg={aggs[0]}" + (", or name=gspo_token for any agg" if name == "gspo" else "")
    )
  return {k: None if v is None else float(v) for k, v in hp.items()}


def make(lc, segment_bt=None) -> Callable[..., tuple[Any, dict]]:
  """The objective policy.loss (`lc`) selects, with its hyperparameters and the batch's packed
  segments bound: (logp_bt, old_logp_bt, adv, mask_bt, *, agg, row_weight_b) -> (loss,
  metrics), as losses.policy_loss calls it."""
  name = lc.get("name", FLAT)
  hp = hyperparameters(lc)
  loss = OBJECTIVES[name].loss

  def objective(logp_bt, old_logp_bt, adv, mask_bt, *, agg, row_weight_b=None):
    return loss(
      logp_bt,
      old_logp_bt,
      adv,
      mask_bt,
      agg=agg,
      row_weight_b=row_weight_b,
      segment_bt=segment_bt,
      **hp,
    )

  return objective
