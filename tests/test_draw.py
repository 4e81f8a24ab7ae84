"""The sampler's blocked draw (sampling.draw_blocked, config rollout.blocked_draw): the
categorical distribution exactly, each row's token from its own key, and sample() with it on
one device and on the 8-device mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import sampling, sharding
from cooper_jax.config import base_config, validate
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.tolerance import UNIT_ROUNDOFF, float32_logprob_atol
from cooper_jax.models.transformer import forward, init_params
from cooper_jax.prompts import left_pad
from cooper_jax.sampling import SampleOptions, sample


def draw(*args, cfg, **options):
  """sample() with its SampleOptions fields given as keywords."""
  return sample(*args, cfg=cfg, options=SampleOptions(**options))


FILTERED = np.finfo(np.float32).min  # what _filter_logits writes


def _chi2(tokens, p) -> tuple[float, int]:
  """Pearson's statistic of the drawn tokens against probabilities p, and its degrees of
  freedom (entries with p > 0)."""
  n = len(tokens)
  counts = np.bincount(tokens, minlength=len(p))
  live = p > 0
  return float(((counts[live] - n * p[live]) ** 2 / (n * p[live])).sum()), int(live.sum()) - 1


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("block", [16, 128])
def test_blocked_draw_is_the_categorical_distribution(per_row, block):
  """20000 draws from one row of 300 logits (every 7th filtered; 300 is no multiple of the
  block, so the last block is padded): Pearson's chi-squared against the float64 softmax stays
  within 6 standard deviations of its mean (dof + 6 sqrt(2 dof)), and a filtered entry is never
  drawn. Drawing a block by its entry count instead of its mass, or a token uniformly within
  its block, puts the statistic in the thousands."""
  rng = np.random.default_rng(3)
  x = (rng.standard_normal(300) * 2).astype(np.float32)
  x[::7] = FILTERED
  x64 = np.where(x == FILTERED, -np.inf, x.astype(np.float64))
  p = np.exp(x64 - x64.max())
  p /= p.sum()
  n = 20000
  key = jax.random.key(11)
  if per_row:
    key = jax.random.split(key, n)
  tok, _ = sampling.draw_blocked(key, jnp.broadcast_to(jnp.asarray(x), (n, 300)), block)
  tok = np.asarray(tok)
  assert tok.min() >= 0 and tok.max() < 300
  assert not np.any(tok % 7 == 0)
  chi2, dof = _chi2(tok, p)
  assert chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)


def test_blocked_draw_returns_the_logsumexp():
  """The second output is logsumexp over the row (filtered entries count 0), against
  float64, within the float32 bound of a sum of v terms."""
  rng = np.random.default_rng(4)
  x = (rng.standard_normal((8, 1000)) * 4).astype(np.float32)
  x[:, ::5] = FILTERED
  _, lse = sampling.draw_blocked(jax.random.key(0), jnp.asarray(x))
  x64 = np.where(x == FILTERED, -np.inf, x.astype(np.float64))
  want = x64.max(1) + np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1))
  atol = 2 * UNIT_ROUNDOFF * (np.abs(want).max() + np.sqrt(x.shape[1]))
  np.testing.assert_allclose(np.asarray(lse), want, rtol=0, atol=atol)


def test_blocked_draw_each_rows_token_follows_its_own_key():
  """Per-row keys (how the llm_rewrite assistant draws, so that N processes batching rows
  differently draw what one process draws): rows permuted with their keys give the same
  tokens, permuted."""
  rng = np.random.default_rng(5)
  x = jnp.asarray((rng.standard_normal((32, 700)) * 3).astype(np.float32))
  keys = jax.random.split(jax.random.key(2), 32)
  order = rng.permutation(32)
  tok, _ = sampling.draw_blocked(keys, x)
  tok_perm, _ = sampling.draw_blocked(keys[order], x[order])
  np.testing.assert_array_equal(np.asarray(tok_perm), np.asarray(tok)[order])
  assert len(set(np.asarray(tok).tolist())) > 8  # the keys draw different tokens


# A tiny model with a vocabulary of five 128-entry blocks, the last one padded.
CFG = ModelConfig(
  vocab_size=600,
  d_model=32,
  n_layers=2,
  n_heads=4,
  n_kv_heads=2,
  head_dim=8,
  d_ff=64,
  rope_theta=10000.0,
  qkv_bias=False,
  tie_embeddings=True,
  family="llama",
)
PAD = 0
ROWS = [[5, 17, 33, 2, 9], [40, 41], [7, 8, 9, 10, 11, 12, 13], [300, 450, 599]]


@pytest.fixture(scope="module")
def params():
  p = init_params(CFG, jax.random.key(0))
  # larger weights than init's, so that the next-token distributions are far from uniform
  return jax.tree.map(lambda x: x * 4.0, p)


def _prompts():
  toks, mask, _ = left_pad(ROWS, PAD, pad_to_multiple=8)
  return toks, mask


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sample_with_blocked_draw_logprobs_are_the_forward_log_softmax(params, top_p):
  """sample(blocked_draw=True): each token's log-prob is the teacher-forced forward's
  log-softmax at T (before top-p filtering) within the float32 bound, on both of the draw's
  log-prob paths (no filter: from the blocks' masses; top-p: the unfiltered logsumexp); and
  the draw is not the default one (other tokens from the same key)."""
  toks, mask = _prompts()
  kw = dict(cfg=CFG, max_new_tokens=10, temperature=0.8, top_p=top_p, pad_id=PAD)
  out = draw(params, toks, mask, jax.random.key(4), blocked_draw=True, **kw)
  default = draw(params, toks, mask, jax.random.key(4), **kw)
  assert not np.array_equal(np.asarray(out.tokens), np.asarray(default.tokens))
  full_t = np.concatenate([toks, np.asarray(out.tokens)], axis=1)
  full_m = np.concatenate([mask, np.asarray(out.mask)], axis=1)
  logits = forward(CFG, params, full_t, full_m)[:, toks.shape[1] - 1 : -1] / 0.8
  logp = jax.nn.log_softmax(logits, axis=-1)
  want = np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], -1)[..., 0]
  atol = float32_logprob_atol(CFG, float(jnp.abs(logits).max()), full_t.shape[1])
  np.testing.assert_allclose(out.logprobs, want, atol=atol)


def test_sample_with_blocked_draw_on_the_mesh_draws_the_single_device_tokens(params):
  """On a (data 2, fsdp 2, tensor 2) mesh, params sharded, the blocked draw samples the
  1-device tokens (G 2 samples a prompt, per-step keys folded from one key)."""
  assert jax.device_count() >= 8, "conftest sets an 8-device CPU platform"
  toks, mask = _prompts()
  kw = dict(cfg=CFG, max_new_tokens=8, temperature=1.0, pad_id=PAD, group_size=2)
  ref = draw(params, toks, mask, jax.random.key(7), blocked_draw=True, **kw)
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  bs = sharding.batch_sharding(mesh)
  out = draw(
    sharding.shard_tree(params, mesh),
    jax.device_put(toks, bs),
    jax.device_put(mask, bs),
    jax.random.key(7),
    blocked_draw=True,
    **kw,
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.mask, ref.mask)


def test_one_pass_and_blocked_draw_together_are_refused(params):
  toks, mask = _prompts()
  with pytest.raises(ValueError, match="one_pass_draw and blocked_draw"):
    draw(
      params,
      toks,
      mask,
      jax.random.key(0),
      cfg=CFG,
      max_new_tokens=2,
      one_pass_draw=True,
      blocked_draw=True,
    )
  c = base_config()
  c.rollout.one_pass_draw = c.rollout.blocked_draw = True
  with pytest.raises(ValueError, match="config.rollout.one_pass_draw and config.rollout.blocked"):
    validate(c)
  with pytest.raises(TypeError, match="blocked_draw"):  # a typo'd value, refused at override
    c.rollout.blocked_draw = "yes"
