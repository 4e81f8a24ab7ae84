"""The sampler-vs-trainer correction (cooper_jax/sampler_is.py, config policy.loss.sampler_is)
and the bf16 sampler (config rollout.dtype): a bf16 sampler's ratio departs from 1 where a
float32 one's does not; token TIS weights, the corrected gradient and the sequence mask against
float64 numpy written from the definitions; the defaults leave the loss as it was."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from test_steps import LOSS as STEP_LOSS
from test_steps import (
  MESH8,
  _assert_same_step,
  _one_policy_step,
  _policy_metric_atol,
  _unbalanced_policy_batch,
)
from test_steps import TINY as STEP_TINY

from cooper_jax import config as config_lib
from cooper_jax import losses, sharding, steps
from cooper_jax.logprobs import response_logprobs
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.tolerance import UNIT_ROUNDOFF, float32_logprob_atol
from cooper_jax.models.transformer import forward, init_params
from cooper_jax.sampling import SampleOptions, sample

TINY = ModelConfig(
  vocab_size=97,
  d_model=48,
  n_layers=2,
  n_heads=6,
  n_kv_heads=2,
  head_dim=8,
  d_ff=96,
  qkv_bias=True,
  family="qwen2",
)


def _loss_cfg(kind="none", cap=2.0, seq_ratio="geometric", with_is=True, agg="token_mean"):
  d = dict(
    kl_coef=0.0,
    kl_kind="low_var_kl",
    clip_eps=0.2,
    clip_eps_high=None,
    dual_clip_c=3.0,
    agg=agg,
  )
  if with_is:
    d["sampler_is"] = dict(kind=kind, cap=cap, seq_ratio=seq_ratio)
  return ml_collections.ConfigDict(d)


# ------------------------------------------------------------------ the bf16 sampler's mismatch
def _sample_and_score(params, dtype: str):
  """(trainer log-probs, sampler log-probs, mask, float32 bound) of 8 rows x 12 new tokens."""
  rng = np.random.default_rng(0)
  b, p, n = 8, 6, 12
  toks = rng.integers(1, TINY.vocab_size, (b, p)).astype(np.int32)
  mask = np.ones((b, p), bool)
  mask[:3, :2] = False  # some left padding
  opts = SampleOptions(max_new_tokens=n, temperature=1.0, pad_id=0, dtype=dtype)
  out = sample(params, toks, mask, jax.random.key(1), cfg=TINY, options=opts)
  trainer = response_logprobs(TINY, params, toks, mask, out.tokens, out.mask)
  full_t = np.concatenate([toks, np.asarray(out.tokens)], 1)
  full_m = np.concatenate([mask, np.asarray(out.mask)], 1)
  scale = float(jnp.abs(forward(TINY, params, full_t, full_m)).max())
  atol = float32_logprob_atol(TINY, scale, p + n)
  m = np.asarray(out.mask)
  return np.asarray(trainer, np.float64)[m], np.asarray(out.logprobs, np.float64)[m], atol


@pytest.fixture(scope="module")
def params():
  p = init_params(TINY, jax.random.key(0))
  # Larger weights than the init's, so the logits spread as a trained model's do.
  return jax.tree.map(lambda x: 3.0 * x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), p)


def test_bf16_sampler_ratio_departs_from_one_float32_does_not(params):
  """The first update's ratio pi_trainer / pi_sampler at the sampling parameters: 1 within the
  float32 bound when the sampler computes in float32 (rollout.dtype ""), measurably not with a
  bf16 sampler (rollout.dtype "bfloat16"), whose logits carry bf16's 2^-8 relative rounding."""
  trainer, sampler, atol = _sample_and_score(params, "")
  assert np.max(np.abs(trainer - sampler)) <= atol
  trainer16, sampler16, _ = _sample_and_score(params, "bfloat16")
  d = np.abs(trainer16 - sampler16)
  # Measured (96 tokens, this CPU): bf16 mean |log ratio| 0.085, max 1.8 (a ratio of 6.1);
  # float32 sampler: max 3.6e-5 against its bound 4.7e-4.
  assert d.mean() > 1e-2 and d.mean() > 20 * atol, (d.mean(), atol)
  assert np.max(np.abs(np.exp(trainer16 - sampler16) - 1.0)) > 0.5


def test_sampler_dtype_empty_or_same_is_todays_sampler(params):
  """rollout.dtype "" and the policy's own dtype take the sampler's unchanged path: the same
  tokens and log-probs bit for bit."""
  toks = np.arange(1, 13, dtype=np.int32).reshape(2, 6)
  mask = np.ones((2, 6), bool)
  outs = [
    sample(
      params,
      toks,
      mask,
      jax.random.key(2),
      cfg=TINY,
      options=SampleOptions(max_new_tokens=5, pad_id=0, **kw),
    )
    for kw in ({}, {"dtype": ""}, {"dtype": "float32"})
  ]
  for o in outs[1:]:
    np.testing.assert_array_equal(o.tokens, outs[0].tokens)
    np.testing.assert_array_equal(o.logprobs, outs[0].logprobs)


# ------------------------------------------------------------- hand-computed cases (float64)
def _patched_loss(monkeypatch):
  """policy_loss_fn whose "model" returns params["logp"]: its gradient is d loss / d logp."""
  monkeypatch.setattr(steps, "_logprobs", lambda model_cfg, params, batch, *a, **k: params["logp"])

  def loss_and_grad(lc, logp, batch):
    f = lambda p: steps.resolve(steps.policy_loss_fn(None, lc, p, batch))
    (loss, metrics), g = jax.value_and_grad(f, has_aux=True)({"logp": jnp.asarray(logp)})
    return float(loss), jax.device_get(metrics), np.asarray(g["logp"], np.float64)

  return loss_and_grad


# 3 rows x 4 tokens; row 2 has 3 tokens. log(pi_trainer) and log(pi_sampler) chosen so that some
# ratios exceed the cap 2 (exp(0.9) = 2.46, exp(1.5) = 4.48) and some are below 1.
LOGP = np.log(
  np.array([[0.5, 0.2, 0.9, 0.3], [0.6, 0.1, 0.4, 0.7], [0.25, 0.8, 0.05, 0.5]], np.float64)
)
LOG_R = np.array([[0.9, -0.3, 0.0, 0.2], [1.5, 0.05, -1.2, 0.6], [0.0, 0.1, -0.1, 3.0]])
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]], bool)
ADV = np.array([1.0, -0.5, 2.0])


def _batch(**extra):
  return {
    "response_mask": MASK,
    "advantages": ADV.astype(np.float32),
    "sampler_logp": (LOGP - LOG_R).astype(np.float32),
    **extra,
  }


def test_token_tis_weights_and_gradient_against_numpy(monkeypatch):
  """Token TIS, first update (ratio 1): d loss / d logp_t = -A w_t m_t / sum(m) with
  w_t = min(pi_trainer / pi_sampler, 2): the on-policy gradient times the capped weights."""
  run = _patched_loss(monkeypatch)
  w = np.minimum(np.exp(LOG_R), 2.0)
  n = MASK.sum()
  want_on_policy = -ADV[:, None] * MASK / n
  loss0, _, g0 = run(_loss_cfg("none"), LOGP.astype(np.float32), _batch())
  loss1, m1, g1 = run(_loss_cfg("token_tis"), LOGP.astype(np.float32), _batch())
  rtol = 100 * UNIT_ROUNDOFF
  np.testing.assert_allclose(g0, want_on_policy, rtol=rtol, atol=1e-12)
  np.testing.assert_allclose(g1, want_on_policy * w, rtol=rtol, atol=1e-12)
  np.testing.assert_allclose(loss1, np.sum(-ADV[:, None] * w * MASK) / n, rtol=rtol)
  # Two real tokens above the cap (2.46, 4.48; 1.82 is not); the padded one (20.1) not counted.
  capped = (np.exp(LOG_R) > 2.0) & MASK
  assert capped.sum() == 2
  np.testing.assert_allclose(m1["is_capped_frac"], capped.sum() / n, rtol=rtol)
  np.testing.assert_allclose(m1["is_weight_mean"], w[MASK].mean(), rtol=rtol)
  np.testing.assert_allclose(m1["is_ratio_mean"], np.exp(LOG_R)[MASK].mean(), rtol=rtol)
  # The mismatch metrics are the uncorrected ones.
  np.testing.assert_allclose(m1["sampler_logp_abs_diff"], np.abs(LOG_R)[MASK].mean(), rtol=1e-5)


def test_token_tis_equals_on_policy_exactly_when_sampler_is_trainer(monkeypatch):
  run = _patched_loss(monkeypatch)
  lp = LOGP.astype(np.float32)
  batch = dict(_batch(), sampler_logp=lp)
  loss0, _, g0 = run(_loss_cfg("none"), lp, batch)
  loss1, m1, g1 = run(_loss_cfg("token_tis"), lp, batch)
  assert loss0 == loss1
  np.testing.assert_array_equal(g0, g1)
  assert m1["is_capped_frac"] == 0 and m1["is_weight_mean"] == 1


def test_token_tis_with_row_weights_and_old_logp(monkeypatch):
  """A merged batch (row_weight) and a later PPO update (old_logp given, ratio != 1): the
  weight is pi_old / pi_sampler, the gradient -A w rw rho m / sum(rw m) where unclipped."""
  run = _patched_loss(monkeypatch)
  rw = np.array([2.0, 1.0, 3.0])
  old = LOGP - 0.05  # rho = exp(0.05) = 1.051 < 1.2: no PPO clip
  batch = _batch(
    row_weight=rw.astype(np.float32),
    old_logp=old.astype(np.float32),
    sampler_logp=(old - LOG_R).astype(np.float32),
  )
  _, m, g = run(_loss_cfg("token_tis"), LOGP.astype(np.float32), batch)
  w = np.minimum(np.exp(LOG_R), 2.0)
  mw = MASK * rw[:, None]
  want = -ADV[:, None] * w * np.exp(0.05) * mw / mw.sum()
  np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-12)
  np.testing.assert_allclose(m["is_weight_mean"], (w * mw).sum() / mw.sum(), rtol=1e-6)


@pytest.mark.parametrize("seq_ratio", ["geometric", "product"])
def test_seq_mask_drops_exactly_the_out_of_band_sequences(monkeypatch, seq_ratio):
  """Row log-ratios (real tokens): row 0 sum 0.8, mean 0.2; row 1 sum 0.95, mean 0.2375;
  row 2 sum 0.0, mean 0.0. Geometric with cap exp(0.21): row 1 out. Product with cap exp(0.9):
  row 1 out; cap exp(0.7): rows 0 and 1 out."""
  run = _patched_loss(monkeypatch)
  log_r = LOG_R.copy()
  log_r[:] = [[0.2, 0.2, 0.2, 0.2], [0.3, 0.3, 0.3, 0.05], [0.1, -0.2, 0.1, 9.0]]
  seq = np.where(MASK, log_r, 0).sum(1)
  seq = seq / MASK.sum(1) if seq_ratio == "geometric" else seq
  cases = [np.exp(0.21)] if seq_ratio == "geometric" else [np.exp(0.9), np.exp(0.7)]
  batch = _batch(sampler_logp=(LOGP - log_r).astype(np.float32))
  for cap in cases:
    keep = np.abs(seq) <= np.log(cap)
    assert 0 < keep.sum() < 3
    km = MASK * keep[:, None]
    loss, m, g = run(_loss_cfg("seq_mask", cap, seq_ratio), LOGP.astype(np.float32), batch)
    np.testing.assert_allclose(g, -ADV[:, None] * km / km.sum(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(loss, np.sum(-ADV[:, None] * km) / km.sum(), rtol=1e-6)
    np.testing.assert_allclose(m["is_seq_masked_frac"], 1 - keep.mean(), rtol=1e-6)
    np.testing.assert_allclose(m["is_token_masked_frac"], 1 - km.sum() / MASK.sum(), rtol=1e-6)
    assert m["response_tokens"] == MASK.sum()  # every token, masked or not


def test_seq_mask_on_packed_rows_masks_one_segment(monkeypatch):
  """Packed rows: two responses share row 0 (segments 1, 2), one fills row 1; per-token
  weights and advantages. Only segment 2 of row 0 is out of band (geometric mean 0.5)."""
  run = _patched_loss(monkeypatch)
  lp = np.log(np.full((2, 4), 0.5))
  seg = np.array([[1, 1, 2, 2], [1, 1, 1, 0]], np.int32)
  mask = seg > 0
  log_r = np.array([[0.1, -0.1, 0.4, 0.6], [0.05, 0.0, -0.05, 7.0]])
  w_tok = np.array([[2.0, 2.0, 1.0, 1.0], [3.0, 3.0, 3.0, 0.0]])
  adv = np.array([[1.0, 1.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.0]])
  batch = {
    "response_mask": mask,
    "response_segment": seg,
    "row_weight": w_tok.astype(np.float32),
    "advantages": adv.astype(np.float32),
    "sampler_logp": (lp - log_r).astype(np.float32),
  }
  _, m, g = run(_loss_cfg("seq_mask", np.exp(0.3)), lp.astype(np.float32), batch)
  keep = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], float)
  km = mask * w_tok * keep
  np.testing.assert_allclose(g, -adv * km / km.sum(), rtol=1e-6, atol=1e-12)
  # Sequences weighted by their weight: 2 (kept), 1 (masked), 3 (kept).
  np.testing.assert_allclose(m["is_seq_masked_frac"], 1 / 6, rtol=1e-6)


def test_defaults_reproduce_todays_loss_bit_for_bit(monkeypatch):
  """base_config's policy.loss (sampler_is kind "none") gives the loss, gradient and metrics of
  a loss config without the key (today's), and the loss is losses.policy_loss's, bit for bit."""
  run = _patched_loss(monkeypatch)
  lc = config_lib.base_config().policy.loss
  lc.kl_coef = 0.0
  old = ml_collections.ConfigDict({k: v for k, v in lc.items() if k != "sampler_is"})
  lp = LOGP.astype(np.float32)
  loss_a, m_a, g_a = run(lc, lp, _batch())
  loss_b, m_b, g_b = run(old, lp, _batch())
  assert loss_a == loss_b and set(m_a) == set(m_b)
  np.testing.assert_array_equal(g_a, g_b)
  for k in m_a:
    assert m_a[k] == m_b[k], k
  want, _ = losses.policy_loss(
    jnp.asarray(lp), jnp.asarray(lp), ADV.astype(np.float32), MASK, kl_coef=0.0
  )
  assert loss_a == float(want)


# ------------------------------------------------------------------------------ config checks
@pytest.mark.parametrize(
  "key,value,words",
  [
    ("rollout.dtype", "bf16", ["rollout.dtype", "bfloat16"]),
    ("policy.loss.sampler_is.kind", "tis", ["sampler_is.kind", "token_tis", "seq_mask"]),
    ("policy.loss.sampler_is.cap", 1.0, ["sampler_is.cap", "> 1"]),
    ("policy.loss.sampler_is.seq_ratio", "geo", ["sampler_is.seq_ratio", "geometric"]),
  ],
)
def test_config_typos_are_named(key, value, words):
  c = config_lib.base_config()
  node = c
  *parents, last = key.split(".")
  for part in parents:
    node = node[part]
  node[last] = value
  with pytest.raises(ValueError) as e:
    config_lib.validate(c)
  for w in words:
    assert w in str(e.value), (w, str(e.value))


def test_token_tis_with_sequence_level_gspo_is_refused():
  """token_tis makes the advantage per token; gspo takes one constant within a response."""
  c = config_lib.base_config()
  c.policy.loss.name, c.policy.loss.agg = "gspo", "seq_mean_token_mean"
  c.policy.loss.sampler_is.kind = "token_tis"
  with pytest.raises(ValueError, match="gspo_token"):
    config_lib.validate(c)
  c.policy.loss.sampler_is.kind = "seq_mask"  # a mask keeps advantages constant per response
  config_lib.validate(c)
  c.policy.loss.name, c.policy.loss.sampler_is.kind = "gspo_token", "token_tis"
  config_lib.validate(c)


# ------------------------------------------------------------------- micro-batches, 8 devices
@pytest.mark.parametrize("kind", ["token_tis", "seq_mask"])
def test_corrected_policy_step_micro_batches_equal_one_shot(kind):
  """The corrected loss's counts (capped tokens, masked responses, the kept tokens that the
  token mean divides by) combine over strided micro-batches into the whole batch's."""
  batch = _unbalanced_policy_batch()
  # Rows 0, 5, 10, 15 run 0.5 nats ahead of the sampler (ratio 1.65 a token); the others 0.1.
  gap = np.where(np.arange(16) % 5 == 0, 0.5, 0.1)[:, None]
  batch["sampler_logp"] = (batch["old_logp"] - gap).astype(np.float32)
  loss_cfg = ml_collections.ConfigDict(
    dict(STEP_LOSS.to_dict(), sampler_is=dict(kind=kind, cap=1.3, seq_ratio="geometric"))
  )
  mesh = sharding.make_mesh(**MESH8)
  one = _one_policy_step(batch, loss_cfg, mesh)
  micro = _one_policy_step(batch, loss_cfg, mesh, micro_batch_size=8)
  params = init_params(STEP_TINY, jax.random.key(0))
  # TIS weights up to the cap scale the policy-gradient terms, hence their float32 bound.
  scaled = dict(batch, advantages=batch["advantages"] * 1.3)
  _assert_same_step(one, micro, _policy_metric_atol(params, scaled, loss_cfg))
  m = micro[1]
  real = batch["response_mask"]
  rows = real.sum(1) * (np.arange(16) % 5 == 0)
  if kind == "token_tis":
    np.testing.assert_allclose(m["is_capped_frac"], rows.sum() / real.sum(), rtol=1e-6)
  else:
    np.testing.assert_allclose(m["is_seq_masked_frac"], 4 / 16, rtol=1e-6)
    np.testing.assert_allclose(m["is_token_masked_frac"], rows.sum() / real.sum(), rtol=1e-6)


@pytest.mark.parametrize("kind", ["token_tis", "seq_mask"])
def test_corrected_packed_step_equals_full_batch(kind):
  """Merged and packed rows (responses sharing rows, weights per token): the corrected step
  equals the full batch's. The sampler runs 0.5 nats behind the trainer on 5 responses (ratio
  1.65: capped at 1.3, or the response masked) and equal to it elsewhere, so no response sits
  near the band's edge; some packed row holds responses of both kinds."""
  from test_merge import _with_duplicates  # pylint: disable=import-outside-toplevel
  from test_pack import LP_KEYS, _packed_merger  # pylint: disable=import-outside-toplevel

  batch = _with_duplicates()
  mesh = sharding.make_mesh(**MESH8)
  params = init_params(STEP_TINY, jax.random.key(0))
  trainer = steps.make_logprob_fn(STEP_TINY, mesh, params)(params, {k: batch[k] for k in LP_KEYS})
  behind = np.isin(np.arange(16), [5, 7, 10, 12, 14])  # no duplicated row (0-3, 8-9)
  gap = np.where(behind, 0.5, 0.0)[:, None]
  batch["sampler_logp"] = (np.asarray(trainer) - gap).astype(np.float32)
  del batch["old_logp"]  # one on-policy update, as train.py's
  merger = _packed_merger(batch, 4, mesh)
  ref = merger.ref
  ref_logp = merger.ref_packed.gather(batch["ref_logp"][ref.index[: ref.distinct]])
  packed = merger.policy_batch(
    batch["advantages"],
    jax.device_put(batch["sampler_logp"]),
    jax.device_put(ref_logp.astype(np.float32)),
  )
  seg = np.asarray(packed["response_segment"])
  lp_fn = steps.make_logprob_fn(STEP_TINY, mesh, params, n_prompts=4, packed=True)
  lp = lp_fn(params, {k: packed[k] for k in (*LP_KEYS, "prompt_index", "response_segment")})
  off = (np.asarray(lp) - np.asarray(packed["sampler_logp"]) > 0.25) & (seg > 0)
  assert any(off[r].any() and (~off[r] & (seg[r] > 0)).any() for r in range(len(seg)))
  loss_cfg = ml_collections.ConfigDict(
    dict(STEP_LOSS.to_dict(), sampler_is=dict(kind=kind, cap=1.3, seq_ratio="geometric"))
  )
  full = _one_policy_step(batch, loss_cfg, mesh, prompt_group=4)
  got = _one_policy_step(packed, loss_cfg, mesh, n_prompts=4)
  scaled = dict(batch, advantages=batch["advantages"] * 1.3, old_logp=np.asarray(trainer))
  _assert_same_step(full, got, _policy_metric_atol(params, scaled, loss_cfg))
  key = "is_capped_frac" if kind == "token_tis" else "is_seq_masked_frac"
  real = batch["response_mask"]
  want = real[behind].sum() / real.sum() if kind == "token_tis" else behind.sum() / 16
  np.testing.assert_allclose(got[1][key], want, rtol=1e-6)
