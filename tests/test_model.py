"""The decoder and the compiled sampler on tiny random models (no weights needed)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cooper_jax import sampling, sharding
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.tolerance import (
  UNIT_ROUNDOFF,
  float32_forward_rtol,
  float32_logit_atol,
  float32_logprob_atol,
  score_scale,
)
from cooper_jax.models.transformer import attend, forward, init_params, split_layers
from cooper_jax.prompts import left_pad
from cooper_jax.sampling import SampleOptions, sample


def draw(*args, cfg, **options):
  """sample() with its SampleOptions fields given as keywords."""
  return sample(*args, cfg=cfg, options=SampleOptions(**options))


def _lower(*args, cfg, **options):
  """sample.lower() likewise."""
  return sample.lower(*args, cfg=cfg, options=SampleOptions(**options))


TINY = ModelConfig(
  vocab_size=97,
  d_model=48,
  n_layers=2,
  n_heads=6,
  n_kv_heads=2,
  head_dim=8,
  d_ff=96,
  rope_theta=10000.0,
  qkv_bias=True,
  tie_embeddings=False,
  family="qwen2",
)
PAD = 0
# Bounds on two float32 computations of the same values in another summation order (padding,
# chunks, caches, layouts) come from cooper_jax/models/tolerance.py, scaled by the reference's
# largest logit: float32 error analysis, not one CPU's rounding.


@pytest.fixture(scope="module")
def params():
  p = init_params(TINY, jax.random.key(0))
  # Non-zero biases and norm scales, so a mapping error would show.
  return jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), p)


def _left_pad(rows, width):
  toks, mask, _ = left_pad(rows, PAD, pad_to_multiple=width)  # one width for every row
  return toks, mask


ROWS = [[5, 17, 33, 2, 9], [40, 41], [7, 8, 9, 10, 11, 12, 13]]


def test_left_padding_does_not_change_logits(params):
  toks, mask = _left_pad(ROWS, 9)
  batched = forward(TINY, params, toks, mask)
  for i, r in enumerate(ROWS):
    alone = forward(TINY, params, jnp.array([r]), jnp.ones((1, len(r)), bool))[0]
    atol = float32_logit_atol(TINY, float(jnp.abs(alone).max()), 9)
    np.testing.assert_allclose(batched[i, 9 - len(r) :], alone, atol=atol)


def _teacher_forced(params, toks, mask, out):
  """Full forward over prompt + sampled tokens; causal, so position t equals a step-t forward."""
  full_t = np.concatenate([toks, np.asarray(out.tokens)], axis=1)
  full_m = np.concatenate([mask, np.asarray(out.mask)], axis=1)
  p = toks.shape[1]
  return forward(TINY, params, full_t, full_m)[:, p - 1 : -1]


def _logprob_atol(params, toks, mask, out) -> float:
  """The float32 bound on two computations of `out`'s log-probs (tolerance.py), at the scale
  of the teacher-forced logits and the longest position."""
  logits = _teacher_forced(params, toks, mask, out)
  return float32_logprob_atol(TINY, float(jnp.abs(logits).max()), toks.shape[1] + logits.shape[1])


def test_greedy_equals_stepwise_argmax_and_logprobs_match(params):
  toks, mask = _left_pad(ROWS, 8)
  out = draw(
    params, toks, mask, jax.random.key(3), cfg=TINY, max_new_tokens=7, temperature=0.0, pad_id=PAD
  )
  assert bool(np.all(out.mask))
  logits = _teacher_forced(params, toks, mask, out)
  np.testing.assert_array_equal(out.tokens, np.argmax(logits, axis=-1))
  want = np.take_along_axis(
    np.asarray(jax.nn.log_softmax(logits)), np.asarray(out.tokens)[..., None], -1
  )
  atol = float32_logprob_atol(TINY, float(jnp.abs(logits).max()), toks.shape[1] + 7)
  np.testing.assert_allclose(out.logprobs, want[..., 0], atol=atol)
  # And one row step by step, each step a separate full forward of the growing sequence.
  seq = list(ROWS[1])
  for j in range(7):
    step_logits = forward(
      TINY,
      params,
      jnp.array([seq + [PAD] * (j == 0)]),
      jnp.array([[True] * len(seq) + [False] * (j == 0)]),
    )
    nxt = int(jnp.argmax(step_logits[0, len(seq) - 1]))
    assert nxt == int(out.tokens[1, j])
    seq.append(nxt)


def test_sampled_logprobs_equal_full_forward_logsoftmax(params):
  toks, mask = _left_pad(ROWS, 8)
  out = draw(
    params, toks, mask, jax.random.key(4), cfg=TINY, max_new_tokens=7, temperature=1.0, pad_id=PAD
  )
  logp = jax.nn.log_softmax(_teacher_forced(params, toks, mask, out), axis=-1)
  want = np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.logprobs, want, atol=_logprob_atol(params, toks, mask, out))


def test_sampling_is_deterministic_per_key(params):
  toks, mask = _left_pad(ROWS, 8)
  kw = dict(cfg=TINY, max_new_tokens=12, temperature=1.0, top_p=0.95, pad_id=PAD)
  a = draw(params, toks, mask, jax.random.key(5), **kw)
  b = draw(params, toks, mask, jax.random.key(5), **kw)
  c = draw(params, toks, mask, jax.random.key(6), **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


@pytest.mark.parametrize("grow", [True, False], ids=["grown", "sliced"])
@pytest.mark.parametrize("segments", [2, 5, 13])
def test_cache_segments_do_not_change_the_samples(params, segments, grow):
  """Decoding in segments that attend over the filled part only (the cache grown between
  them, or allocated whole and sliced) gives the samples of one segment over the whole
  cache: same tokens, logprobs to float summation order; 13 > 12 steps: one step each."""
  toks, mask = _left_pad(ROWS, 8)
  kw = dict(cfg=TINY, max_new_tokens=12, temperature=1.0, top_p=0.95, pad_id=PAD)
  one = draw(params, toks, mask, jax.random.key(7), cache_segments=1, **kw)
  seg = draw(params, toks, mask, jax.random.key(7), cache_segments=segments, grow_cache=grow, **kw)
  np.testing.assert_array_equal(seg.tokens, one.tokens)
  np.testing.assert_array_equal(seg.mask, one.mask)
  np.testing.assert_allclose(
    seg.logprobs, one.logprobs, atol=_logprob_atol(params, toks, mask, one)
  )


def test_group_sampling_prefills_once_and_matches_the_repeated_batch(params):
  # G samples per prompt from one prefill must be the samples of the G-times-repeated batch
  # (same rng): the cache is copied after the prefill, nothing else changes.
  g = 4
  toks, mask = _left_pad(ROWS, 8)
  kw = dict(cfg=TINY, max_new_tokens=10, temperature=1.0, top_p=0.95, pad_id=PAD)
  rep = draw(params, np.repeat(toks, g, 0), np.repeat(mask, g, 0), jax.random.key(3), **kw)
  grp = draw(params, toks, mask, jax.random.key(3), group_size=g, **kw)
  np.testing.assert_array_equal(grp.tokens, rep.tokens)
  np.testing.assert_array_equal(grp.mask, rep.mask)
  atol = _logprob_atol(params, np.repeat(toks, g, 0), np.repeat(mask, g, 0), rep)
  np.testing.assert_allclose(grp.logprobs, rep.logprobs, atol=atol)
  assert grp.tokens.shape == (len(ROWS) * g, 10)
  # The G samples of one prompt differ (they are samples, not copies).
  assert len({tuple(r) for r in np.asarray(grp.tokens[:g]).tolist()}) > 1


@pytest.mark.parametrize("segments,grow", [(3, True), (3, False)])
def test_shared_prompt_decode_draws_the_copied_prompts_samples(params, segments, grow):
  """A prompt's cache read once by its G rows (KVCache.prompt_k) instead of copied to each:
  the samples of the copied-cache sampler with the same rng (left-padded prompts of three
  lengths, EOS on), logprobs equal up to float32 summation order."""
  g = 4
  toks, mask = _left_pad(ROWS, 8)
  kw = dict(cfg=TINY, max_new_tokens=12, temperature=1.0, top_p=0.95, pad_id=PAD, eos_ids=(3,))
  kw.update(group_size=g, cache_segments=segments, grow_cache=grow)
  copied = draw(params, toks, mask, jax.random.key(11), **kw)
  shared = draw(params, toks, mask, jax.random.key(11), shared_prompt=True, **kw)
  np.testing.assert_array_equal(shared.tokens, copied.tokens)
  np.testing.assert_array_equal(shared.mask, copied.mask)
  atol = _logprob_atol(params, np.repeat(toks, g, 0), np.repeat(mask, g, 0), copied)
  np.testing.assert_allclose(shared.logprobs, copied.logprobs, atol=atol)
  assert not np.asarray(copied.mask).all()  # some rows stopped early: EOS handled alike
  state, _ = sampling.prefill(
    params, toks, mask, cfg=TINY, max_new_tokens=12, group_size=g, shared_prompt=True
  )
  assert state.cache.prompt_k[0].shape[0] == len(ROWS)  # one copy per prompt
  assert state.cache.k[0].shape[2] == 12  # the rows' own slots only


def test_top_k_one_is_greedy(params):
  toks, mask = _left_pad(ROWS, 8)
  greedy = draw(
    params, toks, mask, jax.random.key(0), cfg=TINY, max_new_tokens=6, temperature=0.0, pad_id=PAD
  )
  k1 = draw(
    params,
    toks,
    mask,
    jax.random.key(9),
    cfg=TINY,
    max_new_tokens=6,
    temperature=0.8,
    top_k=1,
    pad_id=PAD,
  )
  np.testing.assert_array_equal(greedy.tokens, k1.tokens)


def test_stop_at_eos_masks_the_rest(params):
  toks, mask = _left_pad(ROWS, 8)
  free = draw(
    params, toks, mask, jax.random.key(0), cfg=TINY, max_new_tokens=8, temperature=0.0, pad_id=PAD
  )
  eos = int(free.tokens[0, 2])  # row 0 emits this at step 2 (maybe earlier on other rows)
  out = draw(
    params,
    toks,
    mask,
    jax.random.key(0),
    cfg=TINY,
    max_new_tokens=8,
    temperature=0.0,
    eos_ids=(eos,),
    pad_id=PAD,
  )
  for i in range(len(ROWS)):
    row = list(np.asarray(free.tokens[i]))
    stop = row.index(eos) if eos in row else 8
    np.testing.assert_array_equal(out.mask[i], np.arange(8) <= stop)
    np.testing.assert_array_equal(out.tokens[i, : stop + 1], free.tokens[i, : stop + 1])
    assert np.all(np.asarray(out.tokens[i, stop + 1 :]) == PAD)
    assert np.all(np.asarray(out.logprobs[i, stop + 1 :]) == 0.0)


def test_top_p_keeps_only_the_nucleus():
  from cooper_jax.sampling import _filter_logits  # pylint: disable=import-outside-toplevel

  probs = np.array([[0.5, 0.3, 0.15, 0.05]])
  filtered = np.asarray(_filter_logits(jnp.log(probs), 0.7, 0))
  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: the nucleus is the first two tokens.
  # Kept logits pass through unchanged: float32 log of a float32-cast probability, a few u
  # relative (|log p| >= 0.36 here, so the cast's u relative in p is < 3 u in log p).
  np.testing.assert_allclose(filtered[0, :2], np.log(probs[0, :2]), rtol=8 * UNIT_ROUNDOFF)
  assert (filtered[0, 2:] < -1e30).all()
  top2 = np.asarray(_filter_logits(jnp.log(probs), 1.0, 2))
  assert (top2[0, :2] > -1e30).all() and (top2[0, 2:] < -1e30).all()


def _full_sort_top_p(scaled, top_p):
  """Reference nucleus filter: sort the whole vocabulary (numpy, float64)."""
  out = np.array(scaled, np.float64)
  for row in out:
    order = np.argsort(-row, kind="stable")
    probs = np.exp(row[order] - row[order].max())
    probs /= probs.sum()
    keep = (np.cumsum(probs) - probs) < top_p
    row[row < row[order][keep].min()] = -np.inf
  return out


@pytest.mark.parametrize("temperature_scale", [0.1, 3.0])
def test_top_p_candidates_equal_a_full_sort(monkeypatch, temperature_scale):
  from cooper_jax import sampling  # pylint: disable=import-outside-toplevel

  # Peaked logits: the nucleus lies inside the 8 candidates. Flat ones: it does not, and the
  # filter must fall back to sorting everything. Both must match the full-sort reference.
  monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 8)
  rng = np.random.default_rng(0)
  scaled = (rng.standard_normal((6, 300)) / temperature_scale).astype(np.float32)
  for top_p in (0.5, 0.9, 0.95):
    got = np.asarray(sampling._filter_logits(jnp.asarray(scaled), top_p, 0))
    want = _full_sort_top_p(scaled, top_p)
    np.testing.assert_array_equal(got < -1e30, np.isinf(want))
    np.testing.assert_array_equal(got[got > -1e30], scaled[got > -1e30])
  kept = (np.asarray(sampling._filter_logits(jnp.asarray(scaled), 0.95, 0)) > -1e30).sum(1)
  assert (kept > 8).any() if temperature_scale == 3.0 else (kept <= 8).all()


def test_token_logprob_is_log_softmax_at_the_token():
  rng = np.random.default_rng(3)
  x = (rng.standard_normal((4, 1000)) * 5).astype(np.float32)
  tok = rng.integers(0, 1000, 4)
  # by hand, in float64: x - log(sum(exp(x)))
  want = x.astype(np.float64)[np.arange(4), tok] - np.log(np.exp(x.astype(np.float64)).sum(1))
  got = sampling._token_logprob(jnp.asarray(x), jnp.asarray(tok, jnp.int32))  # pylint: disable=protected-access
  # One float32 log-softmax against float64: its max term (|x| u), the sum of 1000
  # exponentials (sqrt(1000) u, random walk) and the subtraction (|want| u), 2x for safety.
  atol = 2 * UNIT_ROUNDOFF * (np.abs(x).max() + np.sqrt(x.shape[1]) + np.abs(want).max())
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=atol)


def test_first_argmax_is_numpys_argmax_with_ties_and_nans():
  x = np.array(
    [[1.0, 3.0, 3.0, -np.inf], [-np.inf, -np.inf, 2.0, 2.0], [0.0, np.nan, 5.0, np.nan]],
    np.float32,
  )
  got = np.asarray(sampling.first_argmax(jnp.asarray(x)))
  np.testing.assert_array_equal(got, [1, 2, 1])  # first maximum; first NaN
  np.testing.assert_array_equal(got, np.argmax(x, axis=-1))


@pytest.mark.parametrize("per_row", [False, True])
def test_draws_are_jax_random_categoricals(per_row):
  """The sampler's Gumbel-max draw picks the token jax.random.categorical picks from the same
  key(s) (every recorded run's rollouts stay the same), filtered entries (-inf) never."""
  rng = np.random.default_rng(5)
  x = (rng.standard_normal((64, 5000)) * 3).astype(np.float32)
  x[:, ::7] = np.finfo(np.float32).min  # what _filter_logits writes
  x = jnp.asarray(x)
  for seed in range(5):
    key = jax.random.key(seed)
    if per_row:
      key = jax.random.split(key, x.shape[0])
      want = jax.vmap(jax.random.categorical)(key, x)
    else:
      want = jax.random.categorical(key, x)
    score = sampling._gumbel_noise(key, x) + x  # pylint: disable=protected-access
    got = sampling.first_argmax(score)
    one_pass, _ = sampling.draw_one_pass(x, score)  # rollout.one_pass_draw's token
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(one_pass), np.asarray(want))
    assert not np.any(np.asarray(got) % 7 == 0)


def test_one_pass_draw_ties_nans_and_logprob():
  """draw_one_pass: jnp.argmax's token (first maximum, first NaN) and the token's log-softmax
  against float64, on rows with ties, -inf and NaN scores."""
  score = np.array(
    [[1.0, 3.0, 3.0, -np.inf], [-np.inf, -np.inf, 2.0, 2.0], [0.0, np.nan, 5.0, np.nan]],
    np.float32,
  )
  x = np.array([[0.5, -1.0, 2.0, 30.0], [-4.0, 1.0, 0.0, 3.0], [7.0, -7.0, 0.25, 1.0]], np.float32)
  tok, logp = sampling.draw_one_pass(jnp.asarray(x), jnp.asarray(score))
  np.testing.assert_array_equal(np.asarray(tok), np.argmax(score, axis=-1))  # [1, 2, 1]
  x64 = x.astype(np.float64)
  want = x64[np.arange(3), [1, 2, 1]] - np.log(np.exp(x64).sum(1))
  atol = 2 * UNIT_ROUNDOFF * (np.abs(x).max() + np.sqrt(x.shape[1]) + np.abs(want).max())
  np.testing.assert_allclose(np.asarray(logp), want, rtol=0, atol=atol)
  # 64 rows x 5000 entries (a tree of partial results, rescaled sums): same as the two-pass
  rng = np.random.default_rng(2)
  x = jnp.asarray((rng.standard_normal((64, 5000)) * 4).astype(np.float32))
  score = x + jnp.asarray(rng.gumbel(size=(64, 5000)).astype(np.float32))
  tok, logp = sampling.draw_one_pass(x, score)
  np.testing.assert_array_equal(np.asarray(tok), np.asarray(sampling.first_argmax(score)))
  want = sampling._token_logprob(x, tok)  # pylint: disable=protected-access
  atol = 2 * UNIT_ROUNDOFF * (float(jnp.abs(x).max()) + np.sqrt(5000) + float(jnp.abs(want).max()))
  np.testing.assert_allclose(np.asarray(logp), np.asarray(want), rtol=0, atol=2 * atol)


@pytest.mark.parametrize("group_size,shared", [(1, False), (4, True)])
def test_one_pass_draw_samples_what_the_two_pass_draw_samples(params, group_size, shared):
  """sample(one_pass_draw=True) (config rollout.one_pass_draw): the same tokens and mask as the
  default draw with the same key, log-probs equal up to float32 rounding (top-p filtering on,
  EOS on, shared prompts and segments as paper.py decodes)."""
  toks, mask = _left_pad(ROWS, 8)
  kw = dict(cfg=TINY, max_new_tokens=12, temperature=0.7, top_p=0.95, pad_id=PAD, eos_ids=(3,))
  kw.update(group_size=group_size, shared_prompt=shared, cache_segments=3, grow_cache=False)
  two = draw(params, toks, mask, jax.random.key(12), **kw)
  one = draw(params, toks, mask, jax.random.key(12), one_pass_draw=True, **kw)
  np.testing.assert_array_equal(one.tokens, two.tokens)
  np.testing.assert_array_equal(one.mask, two.mask)
  g = group_size
  atol = _logprob_atol(params, np.repeat(toks, g, 0), np.repeat(mask, g, 0), two)
  np.testing.assert_allclose(one.logprobs, two.logprobs, atol=atol / 0.7)  # logits / T


@pytest.mark.parametrize("decode_weights", ["sharded", "replicated", "mlp_split"])
def test_sampler_on_sharded_params_matches_single_device(params, decode_weights):
  """Each decode layout (config rollout.decode_weights) on a (data 2, fsdp 2, tensor 2) mesh
  draws the 1-device tokens, log-probs to float32 summation order. mlp_split splits the MLP
  kernels' 96 hidden columns over all 8 devices (12 each)."""
  assert jax.device_count() >= 8, "conftest sets an 8-device CPU platform"
  toks, mask = _left_pad(ROWS + [[3, 4, 5]], 8)
  kw = dict(cfg=TINY, max_new_tokens=6, temperature=1.0, pad_id=PAD)
  ref = draw(params, toks, mask, jax.random.key(7), **kw)
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  sp = sharding.shard_tree(params, mesh)
  assert sp["layers"]["mlp"]["up"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(
    None, "fsdp", "tensor"
  )
  bs = sharding.batch_sharding(mesh)
  ws = sharding.decode_weights(mesh, decode_weights)
  assert (ws is None) == (decode_weights == "sharded")
  if decode_weights == "mlp_split":
    placed = ws.weight_shardings(split_layers(sp, TINY.jnp_dtype))["layers"][1]["mlp"]
    all8 = ("data", "fsdp", "tensor")
    assert placed["up"]["kernel"].spec == jax.sharding.PartitionSpec(None, all8)
    assert placed["down"]["kernel"].spec == jax.sharding.PartitionSpec(all8, None)
    assert ws.columns(TINY.d_ff).spec == jax.sharding.PartitionSpec(None, all8)
  out = draw(
    sp,
    jax.device_put(toks, bs),
    jax.device_put(mask, bs),
    jax.random.key(7),
    weights_sharding=ws,
    **kw,
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(
    out.logprobs, ref.logprobs, atol=_logprob_atol(params, toks, mask, ref)
  )


def test_mlp_split_assistant_is_stored_in_its_decode_layout(params):
  """pairs.assistant_decode_weights=mlp_split: the frozen assistant's MLP kernels are stored
  split by their hidden columns (sharding.decode_tree_shardings), everything else as
  PARAM_RULES, so its sampler calls reshard no weight; it draws the 1-device tokens."""
  toks, mask = _left_pad(ROWS + [[3, 4, 5]], 8)
  kw = dict(cfg=TINY, max_new_tokens=6, temperature=1.0, pad_id=PAD)
  ref = draw(params, toks, mask, jax.random.key(7), **kw)
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  P = jax.sharding.PartitionSpec
  all8 = ("data", "fsdp", "tensor")
  base = sharding.tree_shardings(params, mesh)
  assert sharding.decode_tree_shardings(params, mesh, "sharded") == base
  sh = sharding.decode_tree_shardings(params, mesh, "mlp_split")
  mlp = sh["layers"]["mlp"]
  assert (mlp["gate"]["kernel"].spec, mlp["up"]["kernel"].spec) == (P(None, None, all8),) * 2
  assert mlp["down"]["kernel"].spec == P(None, all8, None)
  assert sh["layers"]["attn"] == base["layers"]["attn"] and sh["embed"] == base["embed"]
  placed = jax.device_put(params, sh)
  bs = sharding.batch_sharding(mesh)
  args = (placed, jax.device_put(toks, bs), jax.device_put(mask, bs), jax.random.key(7))
  ws = sharding.decode_weights(mesh, "mlp_split")
  out = draw(*args, weights_sharding=ws, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  # The compiled sampler moves no MLP kernel (d 48 x d_ff 96) between devices.
  hlo = _lower(*args, weights_sharding=ws, **kw).compile().as_text()
  moved = [
    line
    for line in hlo.split("\n")
    if re.search(r"(all-gather|all-to-all|collective-permute)(-start)?\(", line)
    and re.search(r"\[(48,96|96,48|2,48,96|2,96,48)\]", line)
  ]
  assert moved == []
  # ... where the params in their training layout (fsdp over d) reshard it once per call.
  sp = sharding.shard_tree(params, mesh)
  hlo = _lower(sp, *args[1:], weights_sharding=ws, **kw).compile().as_text()
  assert re.search(r"(all-gather|all-to-all|collective-permute)(-start)?\(", hlo)


@pytest.mark.parametrize("prompts", [4, 2], ids=["prompts_split", "prompts_replicated"])
def test_shared_prompt_decode_on_8_devices_matches_single_device(params, prompts):
  """The shared prompt's cache on a (data 2, fsdp 2, tensor 2) mesh, its prompts split over
  the batch devices (4) or replicated (2, as train.py places prompts that do not divide), G=2:
  the 1-device samples, logprobs to float32 summation order."""
  toks, mask = _left_pad((ROWS + [[3, 4, 5]])[:prompts], 8)
  kw = dict(cfg=TINY, max_new_tokens=6, temperature=1.0, pad_id=PAD, group_size=2)
  ref = draw(params, toks, mask, jax.random.key(7), shared_prompt=True, **kw)
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  sh = sharding.batch_sharding(mesh) if prompts == 4 else sharding.replicated(mesh)
  put = lambda x: jax.device_put(x, sh)
  sp = sharding.shard_tree(params, mesh)
  out = draw(sp, put(toks), put(mask), jax.random.key(7), shared_prompt=True, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  atol = _logprob_atol(params, np.repeat(toks, 2, 0), np.repeat(mask, 2, 0), ref)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=atol)


def test_score_head_reads_last_real_token(params):
  cfg = TINY.replace(head="score")
  rm = init_params(cfg, jax.random.key(11))
  row = [5, 17, 33, 2, 9]
  left, lmask = _left_pad([row], 8)
  right = np.full((1, 8), PAD, np.int32)
  right[0, :5] = row
  rmask = right != PAD
  s_left = forward(cfg, rm, left, lmask)
  s_right = forward(cfg, rm, right, rmask)
  s_alone = forward(cfg, rm, jnp.array([row]), jnp.ones((1, 5), bool))
  atol = float32_logit_atol(cfg, score_scale(rm), 8)
  np.testing.assert_allclose(s_left, s_alone, atol=atol)
  np.testing.assert_allclose(s_right, s_alone, atol=atol)
  assert s_alone.shape == (1,)


@pytest.mark.parametrize("policy", ["projections", "full"])
def test_remat_changes_nothing_numerically(params, policy):
  toks, mask = _left_pad(ROWS, 8)

  def loss(p, cfg):
    return jnp.mean(forward(cfg, p, toks, mask) ** 2)

  g0 = jax.grad(loss)(params, TINY.replace(remat="none"))
  g1 = jax.grad(loss)(params, TINY.replace(remat=policy))
  # The same sums, maybe fused and ordered otherwise: a backward pass's relative error
  # (tolerance.py), over the whole gradient (a leaf may be small by cancellation).
  diff = optax.tree.norm(jax.tree.map(jnp.subtract, g0, g1))
  assert diff <= 2 * float32_forward_rtol(TINY, 8) * optax.tree.norm(g0)


def test_remat_policy_names_checked():
  with pytest.raises(ValueError, match="remat must be one of"):
    TINY.replace(remat="True")
  # Checkpoint metadata from before the policies stored a bool.
  assert TINY.replace(remat=True).remat == "full" and TINY.replace(remat=False).remat == "none"


def test_bf16_compute_close_to_fp32(params):
  toks, mask = _left_pad(ROWS, 8)
  f32 = forward(TINY, params, toks, mask)
  bf16 = forward(TINY.replace(dtype="bfloat16"), params, toks, mask)
  assert bf16.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(f32 - bf16) * mask[..., None])) < 0.1


def test_attention_in_chunks_of_rows_equals_one_piece():
  """attend(chunk_bytes): rows in chunks of about chunk_bytes of float32 scores, the row count
  cut to a divisor of the batch; every row's output and gradient as in one piece."""
  b, k, g, t, s, e = 6, 2, 3, 4, 5, 8
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((b, k, g * t, e), np.float32))
  kv = [jnp.asarray(rng.standard_normal((b, k, s, e), np.float32)) for _ in range(2)]
  ok = jnp.asarray(rng.random((b, t, s)) < 0.7).at[:, :, 0].set(True)
  row_bytes = 4 * k * g * t * s

  def loss(q, chunk):
    out = attend(q, *kv, ok, g, jnp.float32, chunk)
    return jnp.sum(out * jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape) / out.size)

  want, want_g = attend(q, *kv, ok, g, jnp.float32), jax.grad(loss)(q, 0)
  # The same sums, maybe in another order (a dot kernel may block a smaller batch otherwise):
  # float32 rounding of sums over e + s terms, a few eps each, relative to the largest value.
  tol = lambda x: 4 * (e + s) * np.finfo(np.float32).eps * float(jnp.abs(x).max())
  # 4 rows a chunk asked: 6 rows run as 2 chunks of 3; 1 byte: 6 chunks of 1 row.
  for chunk in (4 * row_bytes, 1):
    np.testing.assert_allclose(attend(q, *kv, ok, g, jnp.float32, chunk), want, atol=tol(want))
    np.testing.assert_allclose(jax.grad(loss)(q, chunk), want_g, atol=tol(want_g))
  # Teeth: a masked slot opened changes the rows that see it.
  ok2 = ok.at[2, :, 1].set(~ok[2, :, 1])
  moved = np.abs(np.asarray(attend(q, *kv, ok2, g, jnp.float32, 1) - want)).max(axis=(1, 2, 3))
  assert moved[2] > 1e-3 and np.all(moved[[0, 1, 3, 4, 5]] == 0)


def test_chunked_attention_forward_equals_one_piece(params):
  """The no-cache path (prefill, the RM's forward) with attention in one-row chunks."""
  toks, mask = _left_pad(ROWS, 8)
  want = forward(TINY, params, toks, mask)
  got = forward(TINY.replace(attn_chunk_bytes=1), params, toks, mask)
  np.testing.assert_allclose(
    got, want, atol=float32_logit_atol(TINY, float(jnp.abs(want).max()), 8)
  )
  with pytest.raises(ValueError, match="attn_chunk_bytes"):
    TINY.replace(attn_chunk_bytes=-1)


def test_sample_options_from_rollout_reads_every_setting():
  """SampleOptions.from_rollout: each rollout key lands in its field (non-default values), the
  tokenizer's ids as given, an override wins, a shared prompt needs a group; equal options are
  one jit key (values canonicalised), and a bad name or layout fails naming it."""
  from cooper_jax import sharding  # pylint: disable=import-outside-toplevel
  from cooper_jax.config import base_config  # pylint: disable=import-outside-toplevel

  ro = base_config().rollout
  ro.update(
    max_new_tokens=77,
    temperature=0.6,
    top_p=0.8,
    top_k=9,
    group_size=5,
    cache_segments=3,
    grow_cache=False,
    shared_prompt_decode=True,
    one_pass_draw=True,
    decode_weights="replicated",
    dtype="bfloat16",
  )
  mesh = sharding.make_mesh(data=2, fsdp=1, tensor=1, devices=jax.devices()[:2])
  o = SampleOptions.from_rollout(ro, eos_ids=[4, 2], pad_id=1, mesh=mesh)
  assert (o.max_new_tokens, o.temperature, o.top_p, o.top_k) == (77, 0.6, 0.8, 9)
  assert (o.group_size, o.cache_segments, o.grow_cache) == (5, 3, False)
  assert (o.shared_prompt, o.one_pass_draw, o.blocked_draw) == (True, True, False)
  assert (o.eos_ids, o.pad_id) == ((4, 2), 1)
  assert o.weights_sharding == sharding.replicated(mesh)
  assert o.dtype == "bfloat16"
  ev = SampleOptions.from_rollout(ro, eos_ids=(4, 2), pad_id=1, mesh=mesh, group_size=1)
  assert ev.group_size == 1 and not ev.shared_prompt  # no group, nothing to share
  assert hash(o) == hash(o.replace(temperature=0.6)) and o == o.replace(top_p=0.8)
  assert SampleOptions(max_new_tokens=3, temperature=1) == SampleOptions(max_new_tokens=3)
  with pytest.raises(TypeError, match="unknown fields \\['top_q'\\]"):
    SampleOptions.from_rollout(ro, eos_ids=(), pad_id=0, mesh=mesh, top_q=0.5)
  with pytest.raises(ValueError, match="decode_weights='replicated' needs a mesh"):
    SampleOptions.from_rollout(ro, eos_ids=(), pad_id=0)
  with pytest.raises(ValueError, match="one_pass_draw and blocked_draw"):
    o.replace(blocked_draw=True)
  with pytest.raises(ValueError, match="dtype='bf16'"):
    o.replace(dtype="bf16")
