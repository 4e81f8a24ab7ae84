"""Float32 bounds for comparing two training steps taken from the same state: AdamW updates
whose gradients differ by summation order (tests/test_steps.py, tests/test_multiprocess.py,
tests/test_train.py), and the metrics rows of two runs' steps (the CLI tests).

Each compared step starts from one state (a fresh run's step 1, or a run resumed from the other
run's checkpoint), so every bound is one step's: a whole run's later steps would ride on
parameters that Adam may legitimately move apart by up to ~lr an entry a step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import ml_collections
import numpy as np

from cooper_jax.logprobs import logit_temperature
from cooper_jax.models.tolerance import (
  UNIT_ROUNDOFF,
  float32_gradient_roundoff,
  float32_logit_atol,
  float32_logprob_atol,
  logit_scale,
  score_scale,
)

B1 = 0.9  # AdamW's first-moment decay (config.optim_config)
# |Adam update| <= lr (1 - b1) / sqrt(1 - b2) = 3.17 lr a step (Kingma & Ba, sec. 2.1).
ADAM_STEP = 3.17


def first_moments(state):
  """AdamW's first moments: a decayed sum of the gradients, before Adam's normalisation."""
  flat, _ = jax.tree_util.tree_flatten_with_path(state["opt_state"])
  mu = [x for path, x in flat if any(getattr(k, "name", None) == "mu" for k in path)]
  if not mu:  # a checkpoint restored without its tree's types: plain dict keys
    mu = [x for path, x in flat if any(getattr(k, "key", None) == "mu" for k in path)]
  assert mu, "no first moments in the optimizer state"
  return [np.asarray(x, np.float64) for x in mu]


def gradients(prev, state) -> list[np.ndarray]:
  """The step's gradient recovered from the first moments, g = (mu - b1 mu_prev) / (1 - b1)
  (prev None: a fresh state, mu_prev = 0)."""
  mu = first_moments(state)
  mu_p = first_moments(prev) if prev is not None else [np.zeros_like(x) for x in mu]
  return [(x - B1 * p) / (1 - B1) for x, p in zip(mu, mu_p)]


def assert_same_adam_update(prev, a, b, lr: float, grad_roundoff: float):
  """Two train states after one AdamW step from the same state `prev` (None: a fresh one)
  whose gradients differ only by float summation order (sharded vs 1 device, micro-batched vs
  one shot, processes vs devices).

  The gradients are compared through the first moments, mu = b1 mu_prev + (1 - b1) g,
  elementwise to `grad_roundoff` (tolerance.float32_gradient_roundoff) of the largest
  (1 - b1) |g| plus the rounding of the sum (u |mu| a side): a bound from float32 error
  analysis, not one CPU's rounding (on an AVX2 EPYC the 8-device policy step's moments differ
  by up to 2.1e-5 of the largest, 1e-5 on AVX-512). Not the parameters: Adam divides by
  sqrt(v), so where a gradient is a cancellation near zero, rounding moves that entry's update
  by up to its full size; the parameters are held only to the update's own bound, ADAM_STEP lr,
  twice that between two runs.
  """
  mu_a, mu_b = first_moments(a), first_moments(b)
  mu_p = first_moments(prev) if prev is not None else [np.zeros_like(x) for x in mu_a]
  g_scale = max(float(np.abs(x - B1 * p).max()) for x, p in zip(mu_a, mu_p))
  assert g_scale > 0
  for x, y in zip(mu_a, mu_b):
    atol = grad_roundoff * g_scale + 2 * UNIT_ROUNDOFF * np.abs(x)
    worst = float(np.max(np.abs(y - x) - atol))
    assert worst <= 0, f"first moments differ by {worst:.3g} beyond the bound"
  for x, y in zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])):
    assert float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) <= 2 * ADAM_STEP * lr


def run_config(workdir) -> ml_collections.ConfigDict:
  """The config a CLI run wrote to its workdir."""
  return ml_collections.ConfigDict(json.loads((Path(workdir) / "config.json").read_text()))


def initial(c) -> dict:
  """{"policy", "rm"} -> (ModelConfig, parameters) a run of config c starts from (a random model
  from its seed, as train.py and reward_modes.py draw it)."""
  from cooper_jax.weights import load_from_config  # pylint: disable=import-outside-toplevel

  return {
    "policy": load_from_config(c.policy, "lm", c.seed)[:2],
    "rm": load_from_config(c.rm, "score", c.seed + 1)[:2],
  }


# Counts of compiled shapes and bucketed row counts: they follow a process's layout and history.
SHAPE_COUNTS = ("rm/pair_rows", "rollout/sampler_compiles", "policy/step_compiles")


def assert_same_metrics(a: dict, b: dict, atols: dict[str, float], skip=()):
  """Metrics rows a and b: keys in atols within them, all others (counts, verdicts, rewards,
  lrs) exactly equal; wall times, SHAPE_COUNTS and `skip` not compared."""
  assert a.keys() - set(skip) == b.keys() - set(skip)
  for k in a.keys() - set(skip):
    if k.startswith("time/") or k in SHAPE_COUNTS:
      continue
    if k in atols:
      assert abs(a[k] - b[k]) <= atols[k], f"{k}: {a[k]} vs {b[k]}, beyond {atols[k]:.3g}"
    else:
      assert a[k] == b[k], f"{k}: {a[k]} vs {b[k]}"


def reduction_atol(n_partials: int, magnitude: float) -> float:
  """Two sums of the same n partials in different orders: each is within gamma_{n-1}
  sum|partial| of the exact sum (Higham, Accuracy and Stability, eq. 4.4), so 2 gamma_{n-1}
  apart; a mean's weighted partials sum in magnitude to at most the mean of its summands'
  magnitudes, `magnitude`; 4 u more for the division by the count and a float64 conversion on
  each side."""
  return (2 * (n_partials - 1) + 4) * UNIT_ROUNDOFF * magnitude


# Token or pair means of nonnegative terms: the mean of their magnitudes is the mean itself,
# and the largest term at most the sum, count x mean.
_NONNEGATIVE = {
  "policy/kl_loss": "policy/response_tokens",
  "policy/neg_logp_mean": "policy/response_tokens",
  "policy/sampler_logp_abs_diff": "policy/response_tokens",
  "policy/sampler_kl": "policy/response_tokens",
  "rm_train/bt_loss": "rm_train/n_valid",
  "rm_train/loss": "rm_train/n_valid",
}


def _adv_max(c) -> float:
  """|A| <= (G - 1) / sqrt(G) for group z-scores with ddof 1 (Samuelson's inequality), 1 for
  rewards in [0, 1] centred without the std."""
  g = c.rollout.group_size
  return (g - 1) / math.sqrt(g) if c.policy.loss.scale_adv_by_std else 1.0


def _ratio_max(c) -> float:
  """The largest PPO ratio where the clipped objective still has a slope: 1 + eps_high for
  A > 0, the dual-clip c for A < 0 (its clipped branches are flat)."""
  loss = c.policy.loss
  eps_high = loss.clip_eps_high if loss.clip_eps_high is not None else loss.clip_eps
  return max(1 + eps_high, loss.dual_clip_c or 0.0)


def mean_magnitudes(c, a: dict, b: dict, rm_params=None) -> dict[str, float]:
  """For each averaged float metric of one train step's metrics rows a and b (config c;
  rm_params: the RM's parameters the step scored with, for the pair margins), a bound on the
  mean of its summands' magnitudes: the mean itself for nonnegative terms; PPO's clipped term
  at most ratio_max |A| a token; a pair's accuracy 1, its margin 2 score_scale."""
  # kl_loss is read as a mean of nonnegative, clamped terms: the k3 estimator's (k1 may be < 0)
  assert c.policy.loss.kl_kind in ("k3", "low_var_kl"), c.policy.loss.kl_kind
  pg = _ratio_max(c) * _adv_max(c)
  out = {"policy/pg_loss": pg, "rm_train/pair_acc": 1.0}
  out |= {k: max(a[k], b[k]) for k in _NONNEGATIVE if k in a}
  out["policy/loss"] = pg + c.policy.loss.kl_coef * out["policy/kl_loss"]
  if rm_params is not None:
    out["rm_train/margin_mean"] = 2 * score_scale(rm_params)
  return {k: v for k, v in out.items() if k in a}


def grad_norm_atol(prev, a_state, b_state) -> float:
  """|grad_norm_a - grad_norm_b| <= ||g_a - g_b|| (the triangle inequality), the gradients
  recovered from the moments (their own rounding 2 u |mu| / (1 - b1) a side), plus each side's
  rounding of a norm over P entries, 2 sqrt(P) u ||g|| (the random-walk model of
  tolerance.float32_forward_rtol; the worst case, P u, is 37% of the norm at the tiny model's
  3.1M entries)."""
  ga, gb = gradients(prev, a_state), gradients(prev, b_state)
  diff = math.sqrt(sum(float(np.sum((x - y) ** 2)) for x, y in zip(ga, gb)))
  norm = math.sqrt(sum(float(np.sum(x**2)) for x in ga))
  n = sum(x.size for x in ga)
  mu_norm = math.sqrt(sum(float(np.sum(x**2)) for x in first_moments(a_state)))
  return diff + 4 * UNIT_ROUNDOFF * mu_norm / (1 - B1) + 4 * math.sqrt(n) * UNIT_ROUNDOFF * norm


def assert_same_step_across_layouts(c, a, b, states, n_devices: int):
  """Metrics rows a and b of one train step taken from the same state by two process layouts
  with the same devices (2 processes x 2 devices vs 1 x 4): each device runs the same program
  on the same rows, so rollouts, rewards and per-device partials are equal, and only the
  cross-device sums differ in order. Averaged metrics agree to `reduction_atol` of their
  summands' mean magnitude, gradient norms to `grad_norm_atol`, everything else exactly. states:
  {"prev", "a", "b"} -> {"policy", "rm"} train states (prev None: a fresh run's step 1, from
  `initial(c)`); the AdamW updates are compared by `assert_same_adam_update`."""
  init = initial(c)
  prev = states["prev"] or {"policy": None, "rm": None}
  rm_params = prev["rm"]["params"] if prev["rm"] is not None else init["rm"][1]
  mags = mean_magnitudes(c, a, b, rm_params)
  atols = {k: reduction_atol(n_devices, v) for k, v in mags.items()}
  for item, key in (("policy", "policy/grad_norm"), ("rm", "rm_train/grad_norm")):
    if a.get(key) or b.get(key):  # 0: no update (the RM without pairs)
      atols[key] = grad_norm_atol(prev[item], states["a"][item], states["b"][item])
  assert_same_metrics(a, b, atols)
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  seq = a["rollout/prompt_width"] + a["policy/response_width"]
  roundoff = float32_gradient_roundoff(init["policy"][0], rows, seq)
  pa, pb = states["a"]["policy"], states["b"]["policy"]
  assert_same_adam_update(prev["policy"], pa, pb, a["policy/lr"], roundoff)
  if a.get("rm_train/updated"):
    # at most a pair per prompt, positives and negatives, at most rm.max_len tokens each
    roundoff = float32_gradient_roundoff(
      init["rm"][0], 2 * c.rollout.prompts_per_step, c.rm.max_len
    )
    ra, rb = states["a"]["rm"], states["b"]["rm"]
    assert_same_adam_update(prev["rm"], ra, rb, a["rm_train/lr"], roundoff)


def logprob_delta(c, cfg, params, max_position: int) -> float:
  """tolerance.float32_logprob_atol for policy `cfg`/`params` at the logits' bound from the
  parameters alone (tolerance.logit_scale) over the rollout temperature."""
  t = logit_temperature(c.rollout.temperature)
  return float32_logprob_atol(cfg, logit_scale(params) / t, max_position)


def score_delta(c, cfg, params) -> float:
  """How far two programs' RM scores of the same input may lie apart (the score head's bound,
  tolerance.float32_logit_atol at score_scale, positions up to rm.max_len)."""
  return float32_logit_atol(cfg, score_scale(params), c.rm.max_len)


def logprob_atols(c, a: dict, b: dict, delta: float) -> dict[str, float]:
  """Atols for the policy metrics of one step computed by two programs (response widths, merged
  rows) from the same parameters and rewards, whose response log-probs lp differ by at most
  `delta` a token (tolerance.float32_logprob_atol). Each metric is a token mean of a function
  of lp with |derivative| at most L: pg_loss ratio_max |A|; the k3 KL, e^r - r - 1 with
  r = ref - lp (ref from a third program), 2 e^R, where R <= K + 1 for a token's k3 value at
  most K (k3(-R) <= k3(R)), K at most count x mean of these nonnegative terms and the clamp
  10; neg_logp_mean and the sampler's mismatch 1 (|e^d - 1| <= 1 for d <= ln 2). Plus each
  mean's own rounding in another order: N u of its summands' mean magnitude, N tokens."""
  n = max(a["policy/response_tokens"], b["policy/response_tokens"])
  mags = mean_magnitudes(c, a, b)
  k = min(n * mags["policy/kl_loss"], 10.0)
  pg = _ratio_max(c) * _adv_max(c) * delta
  kl = 2 * math.exp(k + 1) * delta
  atols = {
    "policy/pg_loss": pg,
    "policy/kl_loss": kl,
    "policy/loss": pg + c.policy.loss.kl_coef * kl,
    "policy/neg_logp_mean": delta,
    "policy/sampler_logp_abs_diff": delta,
    "policy/sampler_kl": delta,
  }
  return {key: v + n * UNIT_ROUNDOFF * mags[key] for key, v in atols.items() if key in a}


def assert_sampler_matches_trainer(c, m: dict, cfg, params):
  """A step's sampler-vs-trainer mismatch at the sampling parameters `params` (metrics row m of
  its first update): each token's |d| = |trainer - sampler log-prob| within the log-prob bound
  delta of two programs (logprob_delta), so the mean |d| too, and each e^d - 1 - d <= d^2
  (|d| <= 1), so sampler_kl <= delta^2; plus the means' rounding, N u of their magnitude."""
  width = m["rollout/prompt_width"] + m["policy/response_width"]
  delta = logprob_delta(c, cfg, params, width)
  rounding = m["policy/response_tokens"] * UNIT_ROUNDOFF
  assert m["policy/sampler_logp_abs_diff"] <= delta * (1 + rounding), (delta, m)
  assert abs(m["policy/sampler_kl"]) <= delta**2 * (1 + rounding), (delta**2, m)
