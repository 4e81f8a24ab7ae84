"""cooper_jax's policy objectives against Hugging Face TRL's own GRPO loss (a peer oracle).

The reference values were computed once by TRL's `GRPOTrainer._compute_loss` (float64, torch
autograd; no model: a stand-in `self` hands it fixed log-probs) on the inputs stored beside them
in tests/fixtures/peer_oracle_trl.npz (tools/fixtures/make_trl_oracle_fixture.py, run in a
throwaway venv; TRL version, code path and parameters per case in the .json beside it). This test
reads only the npz: neither TRL nor torch is a dependency.

cooper_jax runs through its config path (`objectives.make` on a policy.loss dict, then
`losses.policy_loss` with kl_coef 0) in float32; compared: the loss, its gradient with respect to
the per-token log-probs (jax.grad), and the clip fraction TRL logs. TRL's loss types map to
cooper_jax's aggregation modes: grpo -> seq_mean_token_mean, dapo and bnpo -> token_mean (one
process, one accumulation step: both are the batch's token mean), dr_grpo -> seq_mean_token_sum
divided by max_completion_length (TRL's constant normaliser; cooper_jax's is the row count only).
importance_sampling_level="sequence" is GSPO (grpo: `gspo`; dapo, dr_grpo: `gspo_token`, equal to
GSPO with per-response advantages); loss_type="cispo" is `cispo` with clip_eps 1 (no lower bound)
and clip_eps_high = TRL's epsilon_high - 1. ppo_clip runs with dual_clip_c=None: TRL has no dual
clip; the departure is asserted apart (test_dual_clip_is_a_departure_from_trl).

Bounds (float32, u = 2^-24), derived per token from the inputs, not measured on a machine:
  * the ratio a token's loss uses: rounding logp and old to float32 and subtracting them errs the
    log-ratio by (|logp| + |old| + |lr|) u absolutely, so exp(lr) by as much relatively; a
    sequence ratio's mean of n log-ratios adds n u max |lr| (Higham, Accuracy and Stability of
    Numerical Algorithms, eq. 4.4); exp, clip, the products and the max add ELEM_ULPS u;
  * the loss, a weighted sum of n = B T terms (the agg weights W), errs by at most
    sum_t W_t |term_t| (e_t + (n + ELEM_ULPS) u), |term_t| bounded above by |A| max(r, 1 + hi)
    (CISPO: |A| min(r, hi) |logp|);
  * a gradient entry by |g_t| (e_t + (T + ELEM_ULPS) u) (GSPO's sequence cotangent sums up to T
    terms); an entry TRL gives as 0 (padding, a clipped token) must be exactly 0 here;
  * clip fractions are counts over a count: one float32 division (u), GSPO's per-response mean a
    sum of n fractions ((n + 2) u).
Every clip decision is checked to lie far outside the ratio's error (the fixture builder's
margins), so no bound has to cover a flipped decision. Measured differences use at most a third
of their bound (`python tests/test_peer_oracle_trl.py` prints them; docs/parity.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import losses, objectives

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "peer_oracle_trl.npz"
U = 2.0**-24
ELEM_ULPS = 8  # exp (XLA's within ~2 ulp), the clip, two products, the max / where
SEQ, TOK, SUM = "seq_mean_token_mean", "token_mean", "seq_mean_token_sum"
TRL_VERSION = "1.16.0"


def _ppo(hi):
  return {"name": "ppo_clip", "clip_eps": 0.2, "clip_eps_high": hi, "dual_clip_c": None}


def _gspo(name):
  return {"name": name, name: {"clip_eps": 3e-4, "clip_eps_high": 4e-4}}


def _cispo(hi):
  return {"name": "cispo", "cispo": {"clip_eps": 1.0, "clip_eps_high": hi}}


CASES = {
  # fixture case: ((TRL loss_type, importance_sampling_level), our policy.loss, agg,
  #   TRL's loss / ours: "1" or "1/L" (L = max_completion_length), our clip metric)
  "grpo_tok": (("grpo", "token"), _ppo(None), SEQ, "1", "clipfrac"),
  "grpo_tok_high": (("grpo", "token"), _ppo(0.28), SEQ, "1", "clipfrac"),
  "bnpo_tok_high": (("bnpo", "token"), _ppo(0.28), TOK, "1", "clipfrac"),
  "dapo_tok_high": (("dapo", "token"), _ppo(0.28), TOK, "1", "clipfrac"),
  "dr_grpo_tok_high": (("dr_grpo", "token"), _ppo(0.28), SUM, "1/L", "clipfrac"),
  "gspo_grpo": (("grpo", "sequence"), _gspo("gspo"), SEQ, "1", "seq_clipfrac"),
  "gspo_dapo": (("dapo", "sequence"), _gspo("gspo_token"), TOK, "1", "seq_clipfrac"),
  "gspo_dr_grpo": (("dr_grpo", "sequence"), _gspo("gspo_token"), SUM, "1/L", "seq_clipfrac"),
  "cispo_eh1_28": (("cispo", "token"), _cispo(0.28), TOK, "1", "clipfrac"),
  "cispo_eh5": (("cispo", "token"), _cispo(4.0), TOK, "1", "clipfrac"),
}


@pytest.fixture(scope="module")
def z():
  return load()


def load():
  if not FIXTURE.exists():
    pytest.skip(f"{FIXTURE} missing (tools/fixtures/make_trl_oracle_fixture.py)")
  with np.load(FIXTURE) as f:
    zz = {k: f[k] for k in f.files}
  zz["meta"] = json.loads(str(zz.pop("meta_json")))
  return zz


def _case_inputs(z, case):
  """(logp, old, adv_b, mask) in float64, and the fixture's description of the case."""
  spec = z["meta"]["cases"][case]
  return z[f"{spec['inputs']}_logp"], z["old_logp"], z["advantages"][:, 0], z["mask"], spec


def ours(z, case, lc=None, agg=None):
  """cooper_jax's (loss, metrics, d loss / d logp) on the case's inputs in float32, through the
  config path: objectives.make(policy.loss) and losses.policy_loss with kl_coef 0."""
  _, lc0, agg0, _, _ = CASES[case]
  lc, agg = dict(lc or lc0, agg=agg or agg0), agg or agg0
  logp, old, adv, mask, _ = _case_inputs(z, case)
  old32, adv32, mask32 = (jnp.asarray(x, jnp.float32) for x in (old, adv, mask))
  objective = objectives.make(lc)

  def f(lp):
    return losses.policy_loss(
      lp, old32, adv32, mask32, None, kl_coef=0.0, agg=agg, objective=objective
    )

  (loss, m), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp, jnp.float32))
  return float(loss), jax.device_get(m), np.asarray(g, np.float64)


def _scale(z, case):
  return 1.0 / z["meta"]["cases"][case]["max_completion_length"] if CASES[case][3] == "1/L" else 1.0


def _ratios(z, case):
  """float64: the ratio each token's loss uses ([B, T]), and its float32 relative error bound."""
  logp, old, _, mask, spec = _case_inputs(z, case)
  on = mask > 0
  lr = np.where(on, logp - old, 0.0)
  err = (np.abs(logp) + np.abs(old) + np.abs(lr)) * U
  if spec["importance_sampling_level"] == "sequence":
    n = on.sum(1, keepdims=True)
    err = np.where(on, err, 0).max(1, keepdims=True) + n * np.abs(lr).max(1, keepdims=True) * U
    lr = lr.sum(1, keepdims=True) / n
  shape = logp.shape
  return np.broadcast_to(np.exp(lr), shape), np.broadcast_to(err + ELEM_ULPS * U, shape)


def _agg_weights(mask, agg):
  if agg == TOK:
    return mask / mask.sum()
  if agg == SEQ:
    return mask / mask.sum(1, keepdims=True) / mask.shape[0]
  return mask / mask.shape[0]


def bounds(z, case):
  """(loss bound, gradient bound [B, T]) for the case, in the units of TRL's values."""
  logp, _, adv, mask, spec = _case_inputs(z, case)
  r, err = _ratios(z, case)
  a = np.abs(adv)[:, None]
  if spec["loss_type"] == "cispo":
    term = a * np.minimum(r, spec["epsilon_high"]) * np.abs(logp)
  else:
    term = a * np.maximum(r, 1 + spec["epsilon_high"])
  w = _agg_weights(mask, CASES[case][2]) * _scale(z, case)
  loss_b = float(np.sum(np.where(mask > 0, w * term * (err + (mask.size + ELEM_ULPS) * U), 0)))
  grad_b = np.abs(z[f"{case}_grad"]) * (err + (mask.shape[1] + ELEM_ULPS) * U)
  return loss_b, grad_b


def _assert_margins(z, case):
  """No clip decision within 100 times its ratio's error bound of the bound it meets."""
  _, _, _, mask, spec = _case_inputs(z, case)
  r, err = _ratios(z, case)
  lo, hi = spec["epsilon_low"], spec["epsilon_high"]
  for b in (hi,) if spec["loss_type"] == "cispo" else (1 - lo, 1 + hi):
    assert np.all(np.abs(r - b)[mask > 0] > 100 * err[mask > 0] * b), (case, b)


def comparisons(z, case):
  """[(quantity, ours, TRL's, bound)] for one case."""
  logp, old, adv, mask, spec = _case_inputs(z, case)
  loss, m, g = ours(z, case)
  s = _scale(z, case)
  loss_b, grad_b = bounds(z, case)
  metric = CASES[case][4]
  if spec["loss_type"] == "cispo":
    # TRL counts r > epsilon_high at A > 0 only; ours every clipped weight: add the others.
    r = np.exp(logp - old)
    extra = np.sum((r > spec["epsilon_high"]) & (adv[:, None] <= 0) & (mask > 0)) / mask.sum()
    theirs_clip = float(z[f"{case}_m_cispo_clip_ratio"]) + extra
    clip_b = 2 * U * theirs_clip
  else:
    theirs_clip = float(z[f"{case}_m_clip_ratio_region_mean"])
    n = mask.size if metric == "seq_clipfrac" else 0
    clip_b = (n + 2) * U * theirs_clip
  return [
    ("loss", loss * s, float(z[f"{case}_loss"]), loss_b),
    ("grad", g * s, z[f"{case}_grad"], grad_b),
    (f"clip ({metric})", float(m[metric]), theirs_clip, clip_b),
  ]


def test_fixture_is_the_trl_run_this_test_maps():
  zz = load()
  meta = zz["meta"]
  assert meta["versions"]["trl"] == TRL_VERSION
  assert sorted(meta["cases"]) == sorted(CASES)
  for case, ((loss_type, level), *_) in CASES.items():
    spec = meta["cases"][case]
    assert (spec["loss_type"], spec["importance_sampling_level"]) == (loss_type, level), case
  # Padding holds garbage that both sides must select away: TRL's gradient there is exactly 0.
  pad = zz["mask"] == 0
  assert np.all(zz["tok_logp"][pad] - zz["old_logp"][pad] > 20)
  assert all(np.all(zz[f"{c}_grad"][pad] == 0) for c in CASES)
  # The CISPO clip-metric difference is exercised: a token with A < 0 above TRL's bound 5.
  r = np.exp(zz["tok_logp"] - zz["old_logp"])
  assert np.any((r > 5) & (zz["advantages"] < 0) & ~pad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_trl_oracle(z, case):
  _assert_margins(z, case)
  for q, got, want, bound in comparisons(z, case):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    assert np.all(diff <= bound), (case, q, float(diff.max()), float(np.max(bound)))
    if q == "grad":  # what TRL does not move, ours must not move either, exactly
      assert np.all(got[want == 0] == 0), (case, "grad zeros")
      assert np.any(want != 0), case


def test_dual_clip_is_a_departure_from_trl(z):
  """cooper_jax's ppo_clip default (dual clip at c = 3 for A < 0) caps the tokens with A < 0 and
  r > 3 (two planted) at -3 A: the loss moves by exactly sum W (3 - r) (-A) over them and their
  gradient is 0; TRL, with no dual clip, keeps -A r. Elsewhere the two agree within the bounds."""
  case = "grpo_tok_high"
  logp, old, adv, mask, _ = _case_inputs(z, case)
  r = np.exp(logp - old)
  hit = (r > 3) & (adv[:, None] < 0) & (mask > 0)
  assert hit.sum() == 2
  loss, _, g = ours(z, case, lc=dict(CASES[case][1], dual_clip_c=3.0))
  w = _agg_weights(mask, SEQ)
  moved = float(np.sum(np.where(hit, w * (3 - r) * -adv[:, None], 0.0)))
  loss_b, grad_b = bounds(z, case)
  assert moved < -10 * loss_b
  assert abs(loss - (float(z[f"{case}_loss"]) + moved)) <= loss_b + 4 * U * abs(moved)
  assert np.all(g[hit] == 0) and np.all(z[f"{case}_grad"][hit] != 0)
  assert np.all(np.abs(g - z[f"{case}_grad"])[~hit] <= grad_b[~hit])


def report(z) -> list[tuple[str, str, float, float, float]]:
  """(case, quantity, max |diff|, max |diff| / the quantity's largest |value|, max diff / bound)."""
  rows = []
  for case in CASES:
    for q, got, want, bound in comparisons(z, case):
      got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
      diff = np.abs(got - want)
      frac = np.where(bound > 0, diff / np.where(bound > 0, bound, 1), 0)
      rows.append((case, q, diff.max(), diff.max() / np.abs(want).max(), frac.max()))
  return rows


if __name__ == "__main__":
  print("| case | quantity | max abs diff | max rel diff | diff / bound |\n|---|---|---|---|---|")
  for row in report(load()):
    print("| {} | {} | {:.1e} | {:.1e} | {:.2f} |".format(*row))
