"""Policy objectives by name (cooper_jax/objectives.py): GSPO, GSPO-token and CISPO against
values and gradients computed by hand in float64 numpy, merged and packed rows, the default
objective bit for bit, config errors, and verl's own functions (a fixture made once by
tools/fixtures/make_objectives_oracle_fixture.py)."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from cooper_jax import config as config_lib
from cooper_jax import losses, objectives

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "peer_oracle_objectives.npz"
SEQ, TOK = "seq_mean_token_mean", "token_mean"

# ------------------------------------------------------------------ hand-computed inputs
# 5 responses in rows of 6 (lengths 6, 4, 3, 1, 5); per-token log-ratios whose per-response
# mean is M[i] exactly, scattered by +-D around it (so no token's own ratio equals s_i).
LENGTHS = np.array([6, 4, 3, 1, 5])
ADV = np.array([1.0, -2.0, 0.5, -1.0, 1.5])
M = np.array([0.08, -0.08, 0.01, -0.2, -0.03])  # mean log-ratio per response
B, T = len(LENGTHS), 6
EPS_LO, EPS_HI = 0.04, 0.06  # GSPO clip: s in [0.96, 1.06]
# s = exp(M) = [1.0833, 0.9231, 1.0101, 0.8187, 0.9704]:
#   0: above, A > 0: clipped     1: below, A < 0: clipped    2: inside
#   3: below, A < 0: clipped (1 token)     4: inside
CLIPPED = np.array([1, 1, 0, 1, 0], bool)


def _mask():
  return (np.arange(T)[None, :] < LENGTHS[:, None]).astype(np.float64)


def _log_ratio(scatter=0.3):
  """[B, T]: M[i] + zero-mean +-scatter per response; garbage at padding."""
  mask = _mask()
  d = np.where(np.arange(T)[None, :] % 2 == 0, scatter, -scatter) * mask
  d -= (d.sum(1, keepdims=True) / mask.sum(1, keepdims=True)) * mask
  return np.where(mask > 0, M[:, None] + d, 40.0)


def _inputs(scatter=0.3):
  old = -np.linspace(0.5, 3.0, B * T).reshape(B, T)
  logp = old + _log_ratio(scatter)
  return logp, old, _mask()


def _f32(*xs):
  return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def _grad(fn, logp, *args, **kw):
  """(loss, metrics, d loss / d logp) of fn(logp, *args, **kw)."""
  (loss, metrics), g = jax.value_and_grad(lambda lp: fn(lp, *args, **kw), has_aux=True)(logp)
  return float(loss), jax.device_get(metrics), np.asarray(g)


def close(a, b, tol=2e-6):
  np.testing.assert_allclose(
    np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol
  )


# ------------------------------------------------------------------ GSPO by hand
def _gspo_by_hand(agg):
  """Sequence ratio s_i = exp(M_i); loss_i = max(-A s, -A clip(s)); d loss_i / d logp_it =
  -A_i s_i / |y_i| where unclipped, 0 where clipped. Then aggregated by hand."""
  s = np.exp(M)
  loss_i = np.maximum(-ADV * s, -ADV * np.clip(s, 1 - EPS_LO, 1 + EPS_HI))
  assert ((-ADV * np.clip(s, 1 - EPS_LO, 1 + EPS_HI) > -ADV * s) == CLIPPED).all()
  dl_ds = np.where(CLIPPED, 0.0, -ADV)
  mask = _mask()
  n = LENGTHS.astype(np.float64)
  if agg == SEQ:  # (1/B) sum_i loss_i
    loss = loss_i.mean()
    grad = (dl_ds * s / n / B)[:, None] * mask
  else:  # token_mean: sum_i |y_i| loss_i / N; d/dlogp_it = |y_i| * dl/ds s / |y_i| / N
    loss = (n * loss_i).sum() / n.sum()
    grad = (dl_ds * s / n.sum())[:, None] * mask
  return loss, grad


@pytest.mark.parametrize("name,agg", [("gspo", SEQ), ("gspo_token", SEQ), ("gspo_token", TOK)])
def test_gspo_values_and_gradients_by_hand(name, agg):
  logp, old, mask = _f32(*_inputs())
  want_loss, want_grad = _gspo_by_hand(agg)
  fn = objectives.OBJECTIVES[name].loss
  loss, m, g = _grad(
    fn,
    logp,
    old,
    jnp.asarray(ADV, jnp.float32),
    mask,
    agg=agg,
    clip_eps=EPS_LO,
    clip_eps_high=EPS_HI,
  )
  close(loss, want_loss)
  close(g, want_grad)
  assert np.all(g[mask == 0] == 0)
  n = LENGTHS.sum()
  close(m["clipfrac"], (LENGTHS * CLIPPED).sum() / n)  # tokens of clipped responses
  close(m["seq_clipfrac"], CLIPPED.mean())
  close(m["ratio_mean"], (LENGTHS * np.exp(M)).sum() / n)
  close(m["seq_ratio_mean"], np.exp(M).mean())
  close(m["approx_kl"], -(LENGTHS * M).sum() / n)


def test_gspo_is_not_a_token_level_ratio():
  """The same inputs through ppo_clip_loss (a ratio per token, same clip range, no dual clip):
  other clip decisions, another loss and gradient. The hand-computed GSPO test above would fail
  for a token-level ratio."""
  logp, old, mask = _f32(*_inputs())
  adv = jnp.asarray(ADV, jnp.float32)
  ppo, _, g_ppo = _grad(
    losses.ppo_clip_loss,
    logp,
    old,
    adv,
    mask,
    clip_eps=EPS_LO,
    clip_eps_high=EPS_HI,
    dual_clip_c=None,
    agg=SEQ,
  )
  want_loss, want_grad = _gspo_by_hand(SEQ)
  assert abs(ppo - want_loss) > 1e-2
  assert np.abs(g_ppo - want_grad).max() > 1e-2
  # Zero scatter: every token's ratio is its response's, and the two agree in value.
  logp0, old0, mask0 = _f32(*_inputs(scatter=0.0))
  ppo0, _, _ = _grad(
    losses.ppo_clip_loss,
    logp0,
    old0,
    adv,
    mask0,
    clip_eps=EPS_LO,
    clip_eps_high=EPS_HI,
    dual_clip_c=None,
    agg=SEQ,
  )
  close(ppo0, want_loss)


def test_gspo_token_gradient_is_per_token_with_token_advantages():
  """With an advantage that varies within a response GSPO-token's gradient at token t is
  -A_t s_i / |y_i| / B (seq mean, unclipped); the sequence form's mixes the response's A's.
  Clip range wide: nothing clips."""
  logp, old, mask = _f32(*_inputs())
  adv_bt = np.where(np.arange(T) % 2 == 0, 1.5, -0.5)[None, :] * np.linspace(1.0, 2.0, B)[:, None]
  s = np.exp(M)[:, None]
  want_tok = -adv_bt * s / LENGTHS[:, None] / B * _mask()
  # sequence form: d/dlogp_it (1/B)(1/|y|) sum_u -A_u s = -(mean_u A_u) s / |y| / B
  a_mean = (adv_bt * _mask()).sum(1, keepdims=True) / LENGTHS[:, None]
  want_seq = -a_mean * s / LENGTHS[:, None] / B * _mask()
  kw = dict(agg=SEQ, clip_eps=0.5, clip_eps_high=0.5)
  adv = jnp.asarray(adv_bt, jnp.float32)
  _, _, g_tok = _grad(objectives.gspo_token_loss, logp, old, adv, mask, **kw)
  _, _, g_seq = _grad(objectives.gspo_loss, logp, old, adv, mask, **kw)
  close(g_tok, want_tok)
  close(g_seq, want_seq)
  assert np.abs(want_tok - want_seq).max() > 1e-2


# ------------------------------------------------------------------ CISPO by hand
def test_cispo_values_and_gradients_by_hand():
  """loss = -(1/N) sum_t w_t A_t logp_t with w = clip(r, 1 - eps, 1 + eps_high) held constant:
  d loss / d logp_t = -w_t A_t / N, also where r is clipped (on both sides here)."""
  logp64, old64, mask = _inputs(scatter=0.3)
  r = np.exp(logp64 - old64)
  w = np.clip(r, 0.8, 1.28)
  on = mask > 0
  assert (r[on] < 0.8).any() and (r[on] > 1.28).any() and ((r[on] > 0.8) & (r[on] < 1.28)).any()
  a = ADV[:, None] * mask
  n = mask.sum()
  want_loss = -(w * a * logp64)[on].sum() / n
  want_grad = -w * a / n * mask
  logp, old, mask32 = _f32(logp64, old64, mask)
  loss, m, g = _grad(
    objectives.cispo_loss,
    logp,
    old,
    jnp.asarray(ADV, jnp.float32),
    mask32,
    agg=TOK,
    clip_eps=0.2,
    clip_eps_high=0.28,
  )
  close(loss, want_loss, 1e-5)
  close(g, want_grad)
  close(m["clipfrac"], (w != r)[on].mean())
  close(m["ratio_mean"], r[on].mean(), 1e-5)
  close(m["is_weight_mean"], w[on].mean(), 1e-5)


def test_cispo_on_policy_gradient_is_ppo_clip_gradient():
  """At ratio 1 (old = logp) both gradients are -A / N per token; the values differ."""
  logp, _, mask = _f32(*_inputs())
  adv = jnp.asarray(ADV, jnp.float32)
  old = jax.lax.stop_gradient(logp)
  _, _, g_c = _grad(objectives.cispo_loss, logp, old, adv, mask, agg=TOK)
  _, _, g_p = _grad(losses.ppo_clip_loss, logp, old, adv, mask, agg=TOK)
  close(g_c, g_p, 1e-7)
  close(g_c, -ADV[:, None] * _mask() / _mask().sum())


# ------------------------------------------------------------------ merged and packed rows
def _loss_cfg(name, agg, **hp):
  lc = config_lib.base_config().policy.loss
  lc.name, lc.agg = name, agg
  for k, v in hp.items():
    lc[name][k] = v
  return lc


CASES = [("gspo", SEQ), ("gspo_token", SEQ), ("gspo_token", TOK), ("cispo", TOK), ("cispo", SEQ)]
CASES += [("ppo_clip", TOK), ("ppo_clip", SEQ)]


@pytest.mark.parametrize("name,agg", CASES)
def test_merged_row_equals_its_duplicates(name, agg):
  """Rows 0 and 3 of a batch are the same response: merged into one row of weight 2 (its
  mask scaled by 2, row_weight 2, as steps.policy_loss_fn does), loss, gradient and metrics
  equal the unmerged batch's."""
  logp, old, mask = _inputs()
  logp[3], old[3], mask[3] = logp[0], old[0], mask[0]
  adv = ADV.copy()
  adv[3] = adv[0]
  ref = np.full((B, T), -1.0)
  hp = {"clip_eps": EPS_LO, "clip_eps_high": EPS_HI} if name.startswith("gspo") else {}
  lc = _loss_cfg(name, agg, **hp)
  fn = lambda lp, o, a, m, r, w: losses.policy_loss(
    lp, o, a, m, r, kl_coef=0.001, agg=agg, row_weight_b=w, objective=objectives.make(lc)
  )
  full = _grad(fn, *_f32(logp, old, adv, mask, ref), None)
  keep = np.array([0, 1, 2, 4])
  w = np.array([2.0, 1.0, 1.0, 1.0])
  merged = _grad(fn, *_f32(logp[keep], old[keep], adv[keep], mask[keep] * w[:, None], ref[keep], w))
  close(merged[0], full[0], 1e-6)
  g_full = full[2]
  close(merged[2], np.stack([g_full[0] + g_full[3], g_full[1], g_full[2], g_full[4]]), 1e-6)
  assert set(merged[1]) == set(full[1])
  for k in full[1]:
    close(merged[1][k], full[1][k], 1e-6)
  if name == "gspo":
    assert full[1]["seq_clipfrac"] > 0 and full[1]["clipfrac"] > 0


@pytest.mark.parametrize("name", ["gspo_token", "cispo", "ppo_clip"])
def test_packed_segments_equal_rows_of_their_own(name):
  """Responses 1 and 2 (4 and 3 tokens) packed back to back in one row of 8 with
  response_segment 1, 2: token_mean loss, gradient and metrics equal the unpacked batch's; the
  sequence ratio is each segment's own (the packed row's mean would be another)."""
  logp, old, mask = _inputs()
  pad = lambda x, v: np.concatenate([x, np.full((B, 2), v)], axis=1)  # rows of 8
  logp, old, mask = pad(logp, 40.0), pad(old, -1.0), pad(mask, 0.0)
  adv_bt = np.repeat(ADV[:, None], T + 2, axis=1)
  seg = (mask > 0).astype(np.int32)
  # Packed: row 1 holds response 1 (4 tokens) then response 2 (3 tokens).
  p = {k: x.copy() for k, x in dict(logp=logp, old=old, mask=mask, adv=adv_bt, seg=seg).items()}
  for k, x in (("logp", logp), ("old", old), ("mask", mask), ("adv", adv_bt)):
    p[k][1, 4:7] = x[2, :3]
  p["seg"][1, 4:7] = 2
  keep = [0, 1, 3, 4]  # row 2 is now in row 1
  p = {k: x[keep] for k, x in p.items()}
  hp = {"clip_eps": EPS_LO, "clip_eps_high": EPS_HI} if name.startswith("gspo") else {}
  lc = _loss_cfg(name, TOK, **hp)

  def run(lp, o, a, m, s):
    obj = objectives.make(lc, None if s is None else jnp.asarray(s))
    return obj(lp, o, a, m, agg=TOK)

  full = _grad(run, *_f32(logp, old, adv_bt, mask), None)
  packed = _grad(run, *_f32(p["logp"], p["old"], p["adv"], p["mask"]), p["seg"])
  close(packed[0], full[0], 1e-6)
  g = full[2]
  g_packed = g[keep].copy()
  g_packed[1, 4:7] = g[2, :3]
  close(packed[2], g_packed, 1e-6)
  for k in full[1]:
    close(packed[1][k], full[1][k], 1e-6)
  if name == "gspo_token":  # the row's mean log-ratio would be another ratio
    one_seg = _grad(run, *_f32(p["logp"], p["old"], p["adv"], p["mask"]), (p["mask"] > 0) * 1)
    assert abs(one_seg[0] - full[0]) > 1e-3


def test_response_count_counts_weights_and_segments():
  mask = np.array([[2, 2, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
  assert float(objectives.response_count(jnp.asarray(mask))) == 3.0  # 2 + 1, empty row: 0
  seg = np.array([[1, 1, 0, 0], [1, 2, 2, 3], [0, 0, 0, 0]], np.int32)
  assert float(objectives.response_count(jnp.asarray(mask), jnp.asarray(seg))) == 5.0


# ------------------------------------------------------------------ default: today's loss
def test_default_name_is_todays_loss_bit_for_bit():
  """policy.loss.name unset or "ppo_clip": the objective losses.policy_loss gets is
  ppo_clip_loss with the flat keys, and the loss, gradient and metrics are today's exactly
  (the call before objectives had names: ppo_clip_loss + kl_coef * agg(kl))."""
  logp, old, mask = _f32(*_inputs())
  ref = logp - 0.3
  adv = jnp.asarray(ADV, jnp.float32)
  lc = config_lib.base_config().policy.loss
  assert lc.name == "ppo_clip"
  lc.clip_eps_high = 0.28

  def today(lp):
    pg, m = losses.ppo_clip_loss(
      lp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28, dual_clip_c=3.0, agg=TOK
    )
    kl = losses.agg_loss(losses.kl_penalty(lp, ref, "low_var_kl"), mask, TOK)
    return pg + 0.001 * kl, m

  def now(lp, lc):
    return losses.policy_loss(
      lp, old, adv, mask, ref, kl_coef=0.001, agg=TOK, objective=objectives.make(lc)
    )

  want = jax.value_and_grad(today, has_aux=True)(logp)
  for cfg in (lc, ml_collections.ConfigDict({k: v for k, v in lc.items() if k != "name"})):
    got = jax.value_and_grad(lambda lp: now(lp, cfg), has_aux=True)(logp)
    assert np.array_equal(got[0][0], want[0][0])
    assert np.array_equal(got[1], want[1])
    for k, v in want[0][1].items():
      assert np.array_equal(got[0][1][k], v), k


# ------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
  "overrides,needle",
  [
    ({"name": "gpso"}, r"policy\.loss\.name='gpso': expected one of cispo, gspo, gspo_token"),
    ({"name": "gspo"}, r"policy\.loss\.agg=seq_mean_token_mean"),
    ({"name": "cispo", "cispo.eps_high": 2.0}, r"policy\.loss\.cispo\.eps_high: not a hyperpar"),
    ({"clip_ratio": 0.2}, r"policy\.loss\.clip_ratio: not a policy\.loss key"),
    ({"name": "gspo_token", "clip_eps": 0.1}, r"policy\.loss\.clip_eps=0\.1 is ppo_clip's"),
    ({"gspo.clip_eps": 1e-3}, r"policy\.loss\.gspo\.clip_eps=0\.001 is gspo's"),
    ({"name": "cispo", "cispo.clip_eps_high": -1.0}, r"cispo\.clip_eps_high must be > 0"),
    ({"name": "gspo_token", "gspo_token.clip_eps": "x"}, r"gspo_token\.clip_eps must be a num"),
    ({"name": "gspo", "agg": SEQ, "pack": True}, r"config\.policy\.pack_rows cannot run"),
  ],
)
def test_config_errors_name_the_key(overrides, needle):
  c = config_lib.base_config()
  c.unlock()
  for key, value in overrides.items():
    if key == "pack":
      c.policy.pack_rows = c.policy.merge_duplicate_rows = True
      continue
    node = c.policy.loss
    *path, last = key.split(".")
    for part in path:
      node = node[part]
    with c.ignore_type():  # a wrong type must reach validate, as from an experiment file
      node[last] = value
  with pytest.raises(ValueError, match=needle):
    config_lib.validate(c, n_devices=1)


@pytest.mark.parametrize("name,agg", [("gspo", SEQ), ("gspo_token", TOK), ("cispo", TOK)])
def test_each_objective_validates_with_its_defaults(name, agg):
  c = config_lib.base_config()
  c.policy.loss.name, c.policy.loss.agg = name, agg
  config_lib.validate(c, n_devices=1)
  hp = objectives.hyperparameters(c.policy.loss)
  assert hp == dict(objectives.OBJECTIVES[name].defaults)
  if name == "gspo_token":  # packable
    c.policy.pack_rows = c.policy.merge_duplicate_rows = True
    config_lib.validate(c, n_devices=1)


# ------------------------------------------------------------------ peer oracle (verl)
def _oracle():
  if not FIXTURE.exists():
    pytest.skip(f"{FIXTURE} missing (tools/fixtures/make_objectives_oracle_fixture.py)")
  z = np.load(FIXTURE)
  return z, json.loads(str(z["meta_json"]))


ORACLE = {
  # fixture case: (our objective, agg, hyperparameters)
  "gspo_seq": ("gspo", SEQ, dict(clip_eps=3e-4, clip_eps_high=4e-4)),
  "gspo_tok": ("gspo_token", TOK, dict(clip_eps=3e-4, clip_eps_high=4e-4)),
  "cispo_tok": ("cispo", TOK, dict(clip_eps=0.2, clip_eps_high=0.28)),
  "cispo_verl_example": ("cispo", TOK, dict(clip_eps=10.0, clip_eps_high=0.2)),
}


@pytest.mark.parametrize("case", sorted(ORACLE))
def test_matches_verl_oracle(case):
  """verl 0.9.1's compute_policy_loss_{gspo,cispo} (float64) vs ours (float32 inputs): the
  log-probs' float32 rounding (|logp| < 5: 2.4e-7 each, 4.8e-7 on a log-ratio) moves a ratio by
  ~5e-7 relative and CISPO's loss (which multiplies logp) by ~1e-6 of its size; every clip
  decision is > 1e-5 from its bound here. verl's clip fraction counts tokens, as ours."""
  z, meta = _oracle()
  assert meta["versions"]["verl"] == "0.9.1"
  name, agg, hp = ORACLE[case]
  assert meta["cases"][case]["loss_agg_mode"].replace("-", "_") == agg
  which = meta["cases"][case]["inputs"]
  logp64, old64, mask, adv = z[f"{which}_logp"], z["old_logp"], z["mask"], z["advantages"]
  lr = (logp64 - old64)[mask > 0]
  if name == "cispo":
    r, lo, hi = np.exp(lr), 1 - hp["clip_eps"], 1 + hp["clip_eps_high"]
    assert np.min(np.abs(r - hi)) > 1e-5 and np.min(np.abs(r - lo)) > 1e-5
  fn = objectives.OBJECTIVES[name].loss
  loss, m, g = _grad(fn, *_f32(logp64, old64, adv, mask), agg=agg, **hp)
  got = {"loss": loss, "grad": g, "clipfrac": m["clipfrac"], "ppo_kl": m["approx_kl"]}
  report = []
  for q, ours in got.items():
    want = np.asarray(z[f"{case}_{q}"], np.float64)
    diff = np.abs(np.asarray(ours, np.float64) - want)
    rel = diff / np.maximum(np.abs(want), 1e-30)
    report.append(f"{q}: max abs {diff.max():.2e} rel {rel.max():.2e}")
    scale = np.abs(want).max()
    assert diff.max() <= 2e-6 * max(scale, 1.0), (case, q, diff.max())
  print(f"{case} vs verl {meta['versions']['verl']}: " + "; ".join(report))


# ------------------------------------------------------------------ micro-batched policy step
@pytest.mark.parametrize(
  "name,agg,k", [("gspo", SEQ, 2), ("gspo_token", TOK, 4), ("cispo", TOK, 2), ("cispo", TOK, 4)]
)
def test_policy_step_micro_batches_equal_one_shot(name, agg, k):
  """A policy step on the TINY model in k strided micro-batches equals the one-shot step:
  loss, metrics (the seq_* ones counted per response) and the update, within the bound
  test_steps derives for ppo_clip; CISPO's loss, -w A lp, moves by w |A| (1 + |lp|) per unit of
  lp, so its bound is scaled by 1 + max |lp|. Token means: the micro-batches' plain average is
  far from the loss (the batch's even rows hold 1 token, its odd ones 6)."""
  from test_steps import (  # the policy-step fixtures of tests/test_steps.py
    LOSS,
    MESH8,
    TINY,
    _assert_same_step,
    _one_policy_step,
    _policy_metric_atol,
    _unbalanced_policy_batch,
  )

  from cooper_jax import logprobs, sharding, steps
  from cooper_jax.models.transformer import init_params

  batch = _unbalanced_policy_batch()
  loss_cfg = ml_collections.ConfigDict(dict(LOSS.to_dict(), name=name, agg=agg))
  mesh = sharding.make_mesh(**MESH8)
  one = _one_policy_step(batch, loss_cfg, mesh)
  micro = _one_policy_step(batch, loss_cfg, mesh, micro_batch_size=16 // k)
  params = init_params(TINY, jax.random.key(0))
  atol = _policy_metric_atol(params, batch, loss_cfg)
  if name == "cispo":
    args = [batch[x] for x in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")]
    lp = np.asarray(logprobs.response_logprobs(TINY, params, *args))[batch["response_mask"]]
    atol *= 1 + np.abs(lp).max()
  _assert_same_step(one, micro, atol)
  expected = {"gspo": "seq_clipfrac", "gspo_token": "seq_ratio_mean", "cispo": "is_weight_mean"}
  assert expected[name] in one[1]
  if agg == TOK:
    mb = [
      float(
        steps.resolve(
          steps.policy_loss_fn(TINY, loss_cfg, params, {key: v[j::k] for key, v in batch.items()})[
            0
          ]
        )
      )
      for j in range(k)
    ]
    assert abs(np.mean(mb) - float(one[1]["loss"])) > 1e-2 * abs(float(one[1]["loss"]))
