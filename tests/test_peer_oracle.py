"""cooper_jax's losses against verl 0.4.1's own functions (a peer oracle), within float32 bounds.

The reference values were computed once by verl's `compute_grpo_outcome_advantage`,
`compute_policy_loss`, `kl_penalty` and `agg_loss`, by the Bradley-Terry loss lines of the
Cooper reference's recipe/cooper/dp_reward.py, and by torch's
`binary_cross_entropy_with_logits`, on the inputs stored beside them in
tests/fixtures/peer_oracle_verl.npz (tools/fixtures/make_peer_oracle_fixture.py, run in a
throwaway venv; versions in the .json beside the npz). This test reads only the npz: no peer is a
dependency.

Bounds (float32, u = 2^-24), each derived from the terms the compared quantity is made of:
  * an elementwise value made of a few roundings (an exp, a product, a division) differs by at
    most ELEM_ULPS u times the magnitude of its terms (for k3, exp(d) + |d| + 1: the value
    itself can be ~0 by cancellation);
  * a sum or mean of n terms, in any order, by at most (n - 1) u times the sum of the terms'
    magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, eq. 4.4), per side, plus
    the terms' own elementwise bound: (2 n + ELEM_ULPS) u * agg(|terms|).
Measured differences are far below (`python tests/test_peer_oracle.py` prints them; docs/parity.md
has the table). Where cooper_jax departs from the reference on purpose (docs/parity.md) the test
asserts the departure instead: the all-equal reward group (cooper_jax's advantage is exactly 0,
verl's float32 one is not), the Bradley-Terry eps, and the micro-batch split.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import losses as L

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "peer_oracle_verl.npz"
U = 2.0**-24
ELEM_ULPS = 8  # exp (XLA's and torch's: within ~2 ulp each) and 2-3 products/divisions a side
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
CLIPS = {"sym": (0.2, 0.2, 3.0), "high": (0.2, 0.28, 10.0)}
KL_KINDS = {"k1": "k1", "mse": "k2", "low_var_kl": "low_var_kl"}  # verl's name -> ours
KL_COEF = 0.001
N_MICRO = 4
BT_EPS = 1e-6  # dp_reward.py divides by valid_mask.sum() + 1e-6


@pytest.fixture(scope="module")
def z():
  with np.load(FIXTURE) as f:
    return {k: f[k] for k in f.files}


def f64(x):
  return np.asarray(x, np.float64)


def _agg_weights(mask, mode):
  """w_bt such that agg(loss) = sum(w_bt * loss_bt): the weight each token's term gets."""
  mask = f64(mask)
  b = mask.shape[0]
  if mode == "token-mean":
    return mask / mask.sum()
  if mode == "seq-mean-token-mean":
    return mask / mask.sum(-1, keepdims=True) / b
  return mask / b


def _sum_bound(terms_abs_bt, mask, mode):
  """(2 n + ELEM_ULPS) u agg(|terms|), n = the terms summed (the whole matrix)."""
  n = mask.size
  return (2 * n + ELEM_ULPS) * U * float(np.sum(_agg_weights(mask, mode) * f64(terms_abs_bt)))


def _pg_terms(logp, old, adv_b, lo, hi, c):
  """float64 per-token PPO loss magnitudes and derivative magnitudes (scales of the bounds)."""
  lr = np.clip(f64(logp) - f64(old), -20.0, 20.0)
  ratio = np.exp(lr)
  a = f64(adv_b)[:, None] * np.ones_like(ratio)
  pg1, pg2 = -a * ratio, -a * np.clip(ratio, 1 - lo, 1 + hi)
  loss = np.maximum(pg1, pg2)
  loss = np.where(a < 0, np.minimum(loss, -a * c), loss)
  inside = np.abs(f64(logp) - f64(old)) < 20.0
  return np.abs(loss), np.abs(a) * ratio * inside


def _kl_terms(logp, ref, kind):
  """float64 (value-term magnitudes, derivative-term magnitudes) of one KL estimator."""
  d = f64(ref) - f64(logp)
  if kind == "k1":
    return np.abs(d), np.ones_like(d)
  if kind == "mse":
    return 0.5 * d * d, np.abs(d)
  dc = np.clip(d, -20.0, 20.0)
  live = (np.abs(d) < 20.0) & (np.exp(dc) - dc - 1 < 10.0)
  return np.exp(dc) + np.abs(dc) + 1.0, (1.0 + np.exp(dc)) * live


def comparisons(z):
  """(name, ours, theirs, atol) for every compared quantity; atol elementwise or scalar."""
  out = []
  # --- GRPO advantages: groups with a spread; the all-equal ones are test_flat_groups'.
  for case in ("g4_cont", "g16_cont", "g16_bin"):
    r, mask, g = z[f"adv_{case}_rewards"], z[f"adv_{case}_mask"], int(z[f"adv_{case}_group"])
    r_ng = f64(r).reshape(-1, g)
    flat = np.repeat(r_ng.max(1) == r_ng.min(1), g)
    scale = np.repeat(np.abs(r_ng).max(1), g)
    s = np.repeat(r_ng.std(1, ddof=1), g)
    for tag, by_std in (("f32", True), ("f32_nostd", False)):
      ours = np.asarray(L.grpo_advantages(jnp.asarray(r), g, scale_by_std=by_std))
      theirs = z[f"adv_{case}_{tag}"][:, 0]  # one value a row (times a mask that is 1 there)
      a = np.abs(f64(theirs))
      # the mean of G terms: G u max|r| a side; the std's G-term sum of squares ~2 G u relative
      tol = (
        2 * U * (g * scale / (s + 1e-6) + (2 * g + 2) * a) if by_std else 2 * U * (g * scale + a)
      )
      out.append(
        (
          f"advantage {case} {'std' if by_std else 'no-std'}",
          ours[~flat],
          theirs[~flat],
          tol[~flat],
        )
      )
      # verl's [b, t] layout: the row's value on its tokens, 0 on pads
      np.testing.assert_array_equal(
        z[f"adv_{case}_{tag}"] == 0, (mask == 0) | (theirs[:, None] == 0)
      )
  # --- agg_loss of a plain matrix
  for case in ("g4", "g16"):
    mat, mask = z[f"agg_{case}_loss_mat"], z[f"pol_{case}_mask"]
    for mode in AGG_MODES:
      ours = float(L.agg_loss(jnp.asarray(mat), jnp.asarray(mask), mode))
      out.append(
        (
          f"agg_loss {case} {mode}",
          ours,
          z[f"agg_{case}_{mode}"],
          _sum_bound(np.abs(mat), mask, mode),
        )
      )
  # --- policy loss, its metrics and its gradient
  for case in ("g4", "g16"):
    p = f"pol_{case}"
    logp, old, ref, adv, mask = (z[f"{p}_{k}"] for k in ("logp", "old", "ref", "adv", "mask"))
    jl, jo, ja, jm, jr = map(jnp.asarray, (logp, old, adv, mask, ref))
    for mode in AGG_MODES:
      w = _agg_weights(mask, mode)
      for clip, (lo, hi, c) in CLIPS.items():
        k = f"{p}_{mode}_{clip}"
        kw = dict(clip_eps=lo, clip_eps_high=hi, dual_clip_c=c, agg=mode)
        (loss, m), grad = jax.value_and_grad(
          lambda x: L.ppo_clip_loss(x, jo, ja, jm, **kw), has_aux=True
        )(jl)
        terms, dterms = _pg_terms(logp, old, adv, lo, hi, c)
        name = f"policy {case} {mode} {clip}"
        out.append((f"{name} loss", float(loss), z[f"{k}_loss"], _sum_bound(terms, mask, mode)))
        out.append((f"{name} grad", np.asarray(grad), z[f"{k}_grad"], ELEM_ULPS * U * w * dterms))
        n_tok = mask.sum()
        for ours_key, theirs_key in (("clipfrac", "clipfrac"), ("clipfrac_dual", "clipfrac_lower")):
          # a count of 0/1 terms (exact in float32) over the same count: one rounding each
          out.append((f"{name} {theirs_key}", float(m[ours_key]), z[f"{k}_{theirs_key}"], 2 * U))
        lr_abs = np.abs(np.clip(f64(logp) - f64(old), -20, 20))
        out.append(
          (
            f"{name} ppo_kl",
            float(m["approx_kl"]),
            z[f"{k}_ppo_kl"],
            (2 * mask.size + 2) * U * float(np.sum(lr_abs * mask) / n_tok),
          )
        )
      # the actor loss pg + 0.001 * agg(k3), and its gradient
      kw = dict(kl_coef=KL_COEF, kl_kind="low_var_kl", clip_eps=0.2, dual_clip_c=3.0, agg=mode)
      (loss, _), grad = jax.value_and_grad(
        lambda x: L.policy_loss(x, jo, ja, jm, jr, **kw), has_aux=True
      )(jl)
      terms, dterms = _pg_terms(logp, old, adv, *CLIPS["sym"])
      kterms, kdterms = _kl_terms(logp, ref, "low_var_kl")
      name = f"actor {case} {mode}"
      out.append(
        (
          f"{name} loss",
          float(loss),
          z[f"{p}_{mode}_actor_loss"],
          _sum_bound(terms + KL_COEF * kterms, mask, mode),
        )
      )
      out.append(
        (
          f"{name} grad",
          np.asarray(grad),
          z[f"{p}_{mode}_actor_grad"],
          ELEM_ULPS * U * w * (dterms + KL_COEF * kdterms),
        )
      )
      # --- KL estimators
      for verl_kind, ours_kind in KL_KINDS.items():
        kterms, kdterms = _kl_terms(logp, ref, verl_kind)
        on = mask > 0
        tok = np.asarray(L.kl_penalty(jl, jr, ours_kind))
        if mode == AGG_MODES[0]:
          out.append(
            (
              f"kl {case} {verl_kind} per token",
              tok[on],
              z[f"kl_{case}_{verl_kind}_tok"][on],
              ELEM_ULPS * U * kterms[on],
            )
          )
        agg, grad = jax.value_and_grad(
          lambda x: L.agg_loss(L.kl_penalty(x, jr, ours_kind), jm, mode)
        )(jl)
        name = f"kl {case} {verl_kind} {mode}"
        out.append(
          (name, float(agg), z[f"kl_{case}_{verl_kind}_{mode}"], _sum_bound(kterms, mask, mode))
        )
        out.append(
          (
            f"{name} grad",
            np.asarray(grad),
            z[f"kl_{case}_{verl_kind}_{mode}_grad"],
            ELEM_ULPS * U * w * kdterms,
          )
        )
  # --- the RM's Bradley-Terry loss (one micro-batch), against dp_reward.py's lines
  pos, neg = z["bt_pos"], z["bt_neg"]
  for case in ("mixed", "all_valid", "none_valid"):
    valid = z[f"bt_{case}_valid"]
    (loss, _), (gp, gn) = jax.value_and_grad(
      lambda a, b: L.bradley_terry_loss(a, b, jnp.asarray(valid)), argnums=(0, 1), has_aux=True
    )(jnp.asarray(pos), jnp.asarray(neg))
    n = max(int(valid.sum()), 1)
    margin = f64(pos) - f64(neg)
    nll = np.logaddexp(0.0, -margin)  # -log sigmoid(m), float64
    eps_rel = BT_EPS / n + 2 * U  # the reference's + 1e-6 (and its rounding) moves the mean
    terms = (np.abs(margin) + 1.0) * valid
    atol = (2 * valid.size + ELEM_ULPS) * U * float(terms.sum()) / n + eps_rel * float(
      (nll * valid).sum()
    ) / n
    out.append((f"bt {case} loss", float(loss), z[f"bt_{case}_loss"], atol))
    gscale = valid / n  # d/dm = -sigmoid(-m) / n on valid pairs, |.| <= 1/n
    for side, ours_g in (("pos", gp), ("neg", gn)):
      out.append(
        (
          f"bt {case} grad {side}",
          np.asarray(ours_g),
          z[f"bt_{case}_grad_{side}"],
          (ELEM_ULPS * U + eps_rel) * gscale,
        )
      )
  # --- BCE on logits
  x = z["bce_logits"]
  for case, labels, mask in (
    ("hard", z["bce_hard"], None),
    ("soft", z["bce_soft"], None),
    ("masked", z["bce_hard"], z["bce_mask"]),
  ):
    m = np.ones_like(x) if mask is None else mask.astype(np.float32)
    (loss, _), grad = jax.value_and_grad(
      lambda a: L.bce_loss(a, jnp.asarray(labels), jnp.asarray(m)), has_aux=True
    )(jnp.asarray(x))
    n = m.sum()
    terms = (np.abs(f64(x)) * (1 + np.abs(f64(labels))) + 1.0) * m  # max(x,0), x y, log1p(..)
    out.append(
      (
        f"bce {case} loss",
        float(loss),
        z[f"bce_{case}_loss"],
        (2 * x.size + ELEM_ULPS) * U * float(terms.sum()) / n,
      )
    )
    # d/dx = (sigmoid(x) - y) / n: terms of magnitude <= 1 + |y|
    out.append(
      (
        f"bce {case} grad",
        np.asarray(grad),
        z[f"bce_{case}_grad"],
        ELEM_ULPS * U * (1 + np.abs(f64(labels))) * m / n,
      )
    )
  return out


def _diffs(ours, theirs, atol):
  """max |diff|, max |diff| / max |reference| (normwise: an entry near 0 by cancellation has
  no meaningful relative error of its own), max |diff| / bound."""
  d = np.abs(f64(ours) - f64(theirs))
  scale = float(np.abs(f64(theirs)).max(initial=0.0))
  a = np.broadcast_to(f64(atol), d.shape)
  used = np.where(a > 0, d / np.where(a > 0, a, 1.0), np.where(d > 0, np.inf, 0.0))
  dmax = float(d.max(initial=0.0))
  return dmax, dmax / scale if scale > 0 else 0.0, float(used.max(initial=0.0))


def test_fixture_matches_cooper_jax(z):
  bad = []
  for name, ours, theirs, atol in comparisons(z):
    d = np.abs(f64(ours) - f64(theirs))
    if not np.all(d <= atol):
      worst = int(np.argmax(d - atol)) if np.ndim(d) else 0
      bad.append(
        f"{name}: |diff| {np.ravel(d)[worst]:.3g} > bound {np.ravel(np.broadcast_to(atol, np.shape(d)))[worst]:.3g}"
      )
  assert not bad, "\n".join(bad)


def test_flat_groups(z):
  """An all-equal reward group: cooper_jax's advantage is exactly 0 (any G, any float value);
  verl's float32 mean of G equal values can be an ulp off them, and the deviation divided by a
  ~1e-7 std makes |A| ~ 0.1 (verl in float64 is ~0, and cooper_jax's 0 is the exact value)."""
  worst_f32 = 0.0
  for case in ("g4_cont", "g16_cont", "g16_bin"):
    r, g = z[f"adv_{case}_rewards"], int(z[f"adv_{case}_group"])
    r_ng = r.reshape(-1, g)
    flat = np.repeat(r_ng.max(1) == r_ng.min(1), g)
    assert flat.any()
    ours = np.asarray(L.grpo_advantages(jnp.asarray(r), g))
    assert np.all(ours[flat] == 0.0)
    assert np.all(np.abs(z[f"adv_{case}_f64"][flat, 0]) < 1e-9)
    worst_f32 = max(worst_f32, float(np.abs(z[f"adv_{case}_f32"][flat, 0]).max()))
  # the weakness is present in the stored verl float32 values (G=16, rewards 0.7 and 0.1)
  assert worst_f32 > 1e-2


def test_micro_batch_departure(z):
  """verl (and the Cooper reference's RM step) average each micro-batch and divide by their
  count: under token-mean, and for the RM's mean over valid pairs, the loss moves with the
  split. cooper_jax takes the whole batch's mean (steps.Mean), which equals verl's
  one-micro-batch value; with equal-size micro-batches the seq-mean modes do not move."""
  for case in ("g4", "g16"):
    for mode in AGG_MODES:
      one = float(z[f"pol_{case}_{mode}_actor_loss"])
      split = float(z[f"pol_{case}_{mode}_actor_loss_micro{N_MICRO}"])
      if mode == "token-mean":
        assert abs(split - one) > 1e-4 * abs(one)
      else:
        assert abs(split - one) <= 1e-6 * abs(one) + 1e-7
  one, split = float(z["bt_mixed_loss"]), float(z[f"bt_mixed_loss_micro{N_MICRO}"])
  assert abs(split - one) > 1e-3 * abs(one)
  ours = float(
    L.bradley_terry_loss(
      jnp.asarray(z["bt_pos"]), jnp.asarray(z["bt_neg"]), jnp.asarray(z["bt_mixed_valid"])
    )[0]
  )
  assert abs(ours - one) < 1e-5 * abs(one)


def report(z) -> list[tuple[str, float, float, float]]:
  """(quantity, max |diff|, max relative diff, max diff / bound) per compared quantity."""
  return [(name, *_diffs(ours, theirs, atol)) for name, ours, theirs, atol in comparisons(z)]


_CASES = {
  "g4",
  "g16",
  "g4_cont",
  "g16_cont",
  "g16_bin",
  "sym",
  "high",
  "mixed",
  "all_valid",
  "none_valid",
  "hard",
  "soft",
  "masked",
  "pos",
  "neg",
}


def summary(rows):
  """The rows merged over cases (G, clip setting, valid-pair pattern, label kind): the max."""
  merged: dict[str, list[float]] = {}
  for name, *vals in rows:
    key = " ".join(w for w in name.split() if w not in _CASES)
    merged[key] = [max(a, b) for a, b in zip(merged.get(key, vals), vals)]
  return [(k, *v) for k, v in merged.items()]


if __name__ == "__main__":
  with np.load(FIXTURE) as f:
    zz = {k: f[k] for k in f.files}
  rows = report(zz)
  print("| quantity | max abs diff | max rel diff | diff / bound |\n|---|---|---|---|")
  for name, a, r, b in rows if "--all" in sys.argv else summary(rows):
    print(f"| {name} | {a:.1e} | {r:.1e} | {b:.2f} |")
