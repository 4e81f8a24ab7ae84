"""policy_step / rm_step: sharded over 8 CPU devices equals the 1-device result; micro-batched
equals one-shot; chunked log-probs equal direct ones without full logits; guards work."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from run_bounds import assert_same_adam_update

from cooper_jax import logprobs, optim, sharding, steps
from cooper_jax.config import optim_config
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.tolerance import (
  UNIT_ROUNDOFF,
  float32_forward_rtol,
  float32_gradient_roundoff,
  float32_logit_atol,
  float32_logprob_atol,
  score_scale,
)
from cooper_jax.models.transformer import forward, init_params

TINY = ModelConfig(
  vocab_size=128,
  d_model=64,
  n_layers=2,
  n_heads=4,
  n_kv_heads=2,
  head_dim=16,
  d_ff=128,
  qkv_bias=True,
  family="qwen2",
)


def _optim(lr=1e-3):
  oc = optim_config(lr, warmup_steps=0)
  oc.schedule = "constant"
  return optim.make_optimizer(oc)


LOSS = ml_collections.ConfigDict(
  dict(
    kl_coef=0.001,
    kl_kind="low_var_kl",
    clip_eps=0.2,
    clip_eps_high=None,
    dual_clip_c=3.0,
    agg="token_mean",
  )
)


def _policy_batch(seed=0, b=8, p=6, n=6):
  rng = np.random.default_rng(seed)
  prompt_mask = np.ones((b, p), bool)
  prompt_mask[:, :3] = rng.random((b, 3)) > 0.5  # some left padding
  response_mask = np.ones((b, n), bool)
  response_mask[0, 4:] = False  # a short response
  return {
    "prompt_tokens": rng.integers(1, 128, (b, p)).astype(np.int32),
    "prompt_mask": prompt_mask,
    "response_tokens": rng.integers(1, 128, (b, n)).astype(np.int32),
    "response_mask": response_mask,
    # Advantages away from 0, so the loss is too and a relative tolerance means something.
    "advantages": (rng.normal(size=b) + 1.5).astype(np.float32),
    "old_logp": (rng.normal(size=(b, n)) * 0.1 - 5).astype(np.float32),
    "ref_logp": (rng.normal(size=(b, n)) * 0.1 - 5).astype(np.float32),
  }


def _step_from(state, mesh, make_step, batch):
  """One step of make_step(opt, mesh, state, batch) from `state` (a host copy: the step
  donates its input) on `mesh`."""
  state = sharding.shard_tree(jax.device_get(state), mesh)
  state, metrics = make_step(_optim(), mesh, state, batch)(state, batch)
  return jax.device_get(state), jax.device_get(metrics)


def _policy_step_maker(opt, mesh, state, batch):
  return steps.make_policy_step(TINY, LOSS, opt, mesh, state, batch)


def _assert_close_tree(a, b, rtol):
  """Relative error over the whole tree, ||a - b|| / ||a|| <= rtol (values that are sums of
  the same terms in another order: no division by a near-zero quantity in between)."""
  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(a)]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(b)]
  diff = np.sqrt(sum(np.sum((x - y) ** 2) for x, y in zip(la, lb)))
  err = diff / np.sqrt(sum(np.sum(x**2) for x in la))
  assert err <= rtol, f"relative error {err:.2e} > {rtol}"


# For TINY and this file's largest batch (16 rows; 13 tokens, the longest prompt + response:
# 7 + 6): 1.3e-4 (a sharding or micro-batching bug moves entries by O(1) of themselves).
GRAD_ROUNDOFF = float32_gradient_roundoff(TINY, rows=16, seq=13)


def _lp_atol(cfg: ModelConfig, params, batch, temperature: float = 1.0) -> float:
  """The float32 bound on a response log-prob computed two ways from the same parameters
  (cooper_jax/models/tolerance.py), at the scale of the batch's largest logit / T."""
  tokens = np.concatenate([batch["prompt_tokens"], batch["response_tokens"]], 1)
  mask = np.concatenate([batch["prompt_mask"], batch["response_mask"]], 1)
  scale = float(jnp.abs(forward(cfg, params, tokens, mask)).max()) / temperature
  return float32_logprob_atol(cfg, scale, tokens.shape[1])


def _policy_metric_atol(params, batch, loss_cfg=LOSS, cfg=TINY) -> float:
  """How far a policy step's metrics may move when every response log-prob lp moves by up to
  d (_lp_atol) between two computations from the same parameters: each metric is a token mean
  of a function of lp whose |derivative| is at most L: pg_loss rho |A| (rho = exp(lp - old);
  the clipped branches are flat), kl_loss (low_var_kl) e^|r| + 1 with r = ref - lp, approx_kl
  |lp - old|, ratio_mean rho, neg_logp_mean 1; loss = pg_loss + kl_coef kl_loss. So L d, L the
  largest over the batch. (Rounding of the sums themselves: GRAD_ROUNDOFF relative, below.)"""
  args = [batch[k] for k in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")]
  m = batch["response_mask"]
  lp = np.asarray(logprobs.response_logprobs(cfg, params, *args), np.float64)[m]
  old = batch["old_logp"][m] if "old_logp" in batch else lp
  rho, r = np.exp(lp - old), batch["ref_logp"][m] - lp
  adv = np.abs(batch["advantages"]).max()
  kl = np.exp(np.abs(r).max()) + 1
  lip = max(rho.max() * adv + loss_cfg.kl_coef * kl, kl, np.abs(lp - old).max(), rho.max(), 1.0)
  return lip * _lp_atol(cfg, params, batch)


def _rm_metric_atol(cfg: ModelConfig, params, batch) -> float:
  """How far an RM step's metrics may move when every score moves by up to d (the float32
  bound at the score head's scale, tolerance.py): the BT loss (softplus of a score
  difference) by 2 d, a (weighted) BCE mean and mean scores by d. So 2 d."""
  tokens = batch.get("pos_tokens", batch.get("tokens"))
  return 2 * float32_logit_atol(cfg, score_scale(params), tokens.shape[1])


def test_policy_step_sharded_equals_single_device():
  """Two steps; each runs on 1 and on 8 devices from the 1-device state before it."""
  one_dev = sharding.make_mesh(devices=jax.devices()[:1])
  eight_dev = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  state = jax.device_get(steps.init_state(init_params(TINY, jax.random.key(0)), _optim()))
  prev = None
  for batch in (_policy_batch(), _policy_batch(seed=1)):
    one = _step_from(state, one_dev, _policy_step_maker, batch)
    eight = _step_from(state, eight_dev, _policy_step_maker, batch)
    _assert_same_step(one, eight, _policy_metric_atol(state["params"], batch), prev=prev)
    prev, state = one[0], one[0]
  assert int(one[0]["step"]) == 2 and int(eight[0]["step"]) == 2
  # The update really moved the parameters.
  p0 = init_params(TINY, jax.random.key(0))
  assert (
    float(
      np.max(
        np.abs(
          one[0]["params"]["layers"]["mlp"]["up"]["kernel"] - p0["layers"]["mlp"]["up"]["kernel"]
        )
      )
    )
    > 1e-4
  )


def _rm_batch(seed=0, p=4, l=10):
  rng = np.random.default_rng(seed)
  mk = lambda: rng.integers(1, 128, (p, l)).astype(np.int32)
  mask = np.ones((p, l), bool)
  mask[1, :4] = False
  return {
    "pos_tokens": mk(),
    "pos_mask": mask,
    "neg_tokens": mk(),
    "neg_mask": mask.copy(),
    "valid": np.array([1, 1, 0, 1], np.float32),
  }


def test_rm_step_sharded_equals_single_device_and_learns():
  """Three steps; each runs on 1 and on 8 devices from the 1-device state before it."""
  cfg = TINY.replace(head="score")
  batch = _rm_batch()
  make = lambda opt, mesh, state, b: steps.make_rm_step(cfg, "bt", opt, mesh, state, b)
  one_dev = sharding.make_mesh(devices=jax.devices()[:1])
  eight_dev = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  state = jax.device_get(steps.init_state(init_params(cfg, jax.random.key(1)), _optim()))
  prev, losses = None, []
  for _ in range(3):
    one = _step_from(state, one_dev, make, batch)
    eight = _step_from(state, eight_dev, make, batch)
    _assert_same_step(one, eight, _rm_metric_atol(cfg, state["params"], batch), prev=prev)
    losses.append(float(one[1]["loss"]))
    prev, state = one[0], one[0]
  assert losses[-1] < losses[0]  # BT loss went down on the valid pairs
  assert float(one[1]["n_valid"]) == 3.0


def test_nonfinite_loss_skips_update_and_counts():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  batch = _policy_batch()
  batch["advantages"][0] = np.nan
  params = init_params(TINY, jax.random.key(0))
  opt = _optim()
  state = steps.init_state(params, opt)
  before = jax.device_get(state["params"])
  step = steps.make_policy_step(TINY, LOSS, opt, mesh, state, batch)
  state, m = step(state, batch)
  assert float(m["skipped"]) == 1.0 and int(state["n_skipped"]) == 1 and int(state["step"]) == 0
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["params"]), before)


def test_kl_coef_requires_ref_logp_consistently():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  batch = _policy_batch()
  del batch["ref_logp"]
  params = init_params(TINY, jax.random.key(0))
  opt = _optim()
  with pytest.raises(ValueError, match="ref_logp"):
    steps.make_policy_step(TINY, LOSS, opt, mesh, steps.init_state(params, opt), batch)


@pytest.mark.parametrize("name", optim.SCHEDULES)
def test_schedules_by_name(name):
  oc = ml_collections.ConfigDict(
    dict(lr=1.0, schedule=name, warmup_steps=10, total_steps=110, end_lr_frac=0.0)
  )
  s = optim.make_schedule(oc)
  want = {
    "constant": (1.0, 1.0, 1.0),
    "linear_warmup": (0.0, 0.5, 1.0),
    "warmup_cosine": (0.0, 0.5, 0.5),
    "warmup_linear_decay": (0.0, 0.5, 0.5),
  }[name]
  # step 0, step 5 (mid warm-up), step 60 (half-way through the decay phase); float32 values
  # of O(1): a few roundings (the cosine's argument near pi / 2: ~2 u), 8 u allowed.
  got = [float(s(0)), float(s(5)), float(s(60))]
  np.testing.assert_allclose(got, want, rtol=0, atol=8 * UNIT_ROUNDOFF)


@pytest.mark.parametrize("temperature,divide_by", [(1.0, 1.0), (0.7, 0.7), (0.0, 1.0)])
def test_response_logprobs_equal_full_forward_logsoftmax(temperature, divide_by):
  """log softmax(logits / T) at the response tokens, by hand in float64: the distribution the
  sampler draws from at T (greedy, T = 0, reads the raw logits)."""

  params = init_params(TINY, jax.random.key(0))
  b = _policy_batch()
  got = steps.response_logprobs(
    TINY,
    params,
    b["prompt_tokens"],
    b["prompt_mask"],
    b["response_tokens"],
    b["response_mask"],
    temperature=temperature,
  )
  tokens = np.concatenate([b["prompt_tokens"], b["response_tokens"]], 1)
  mask = np.concatenate([b["prompt_mask"], b["response_mask"]], 1)
  z = np.asarray(forward(TINY, params, tokens, mask), np.float64) / divide_by
  logp = (
    z
    - np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1, keepdims=True))
    - z.max(-1, keepdims=True)
  )
  p = b["prompt_tokens"].shape[1]
  # The same float32 forward on both sides, then log-softmax in float32 against float64:
  # the log-softmax's own rounding (tolerance.py's term for it), one side only.
  v = TINY.vocab_size
  atol = 2 * UNIT_ROUNDOFF * (np.abs(z).max() + np.sqrt(v) + np.abs(logp).max())
  for i in range(tokens.shape[0]):
    for j in range(b["response_tokens"].shape[1]):
      want = logp[i, p + j - 1, b["response_tokens"][i, j]]
      assert abs(float(got[i, j]) - want) < atol, (i, j)


# ------------------------------------------------------------------ micro-batches and chunks
MESH8 = dict(data=2, fsdp=2, tensor=2)  # 4 devices hold batch rows


def _unbalanced_policy_batch(b=16, n=6):
  """Even rows have 1-token responses, odd rows full ones: strided micro-batches then hold
  very different token counts, so averaging per-micro-batch token means would be wrong."""
  batch = _policy_batch(seed=3, b=b, n=n)
  batch["response_mask"][:] = True
  batch["response_mask"][0::2, 1:] = False
  return batch


def _one_policy_step(batch, loss_cfg, mesh, cfg=TINY, **kw):
  params = init_params(TINY, jax.random.key(0))
  opt = _optim()
  state = sharding.shard_tree(steps.init_state(params, opt), mesh)
  step = steps.make_policy_step(cfg, loss_cfg, opt, mesh, state, batch, **kw)
  state, metrics = step(state, batch)
  return jax.device_get(state), jax.device_get(metrics)


def _assert_same_step(one, other, atol: float, prev=None, lr=1e-3):
  """Two (state, metrics) after the same step from the same state `prev` (None: a fresh one),
  computed in another order: every metric within atol (its derived bound from the log-probs'
  or scores' float32 error) + GRAD_ROUNDOFF of itself (the rounding of its sums; the gradient
  norm's path), and the same Adam update."""
  assert set(one[1]) == set(other[1])
  for k in one[1]:
    np.testing.assert_allclose(other[1][k], one[1][k], rtol=GRAD_ROUNDOFF, atol=atol, err_msg=k)
  assert_same_adam_update(prev, one[0], other[0], lr, GRAD_ROUNDOFF)
  assert int(other[0]["step"]) == int(one[0]["step"])


@pytest.mark.parametrize(
  "k,agg", [(2, "token_mean"), (4, "token_mean"), (2, "seq_mean_token_mean")]
)
def test_policy_step_micro_batches_equal_one_shot(k, agg):
  batch = _unbalanced_policy_batch()
  assert "old_logp" in batch and "ref_logp" in batch
  loss_cfg = ml_collections.ConfigDict(dict(LOSS.to_dict(), agg=agg))
  mesh = sharding.make_mesh(**MESH8)
  one = _one_policy_step(batch, loss_cfg, mesh)
  micro = _one_policy_step(batch, loss_cfg, mesh, micro_batch_size=16 // k, logprob_chunk=4)
  params = init_params(TINY, jax.random.key(0))
  _assert_same_step(one, micro, _policy_metric_atol(params, batch, loss_cfg))
  assert float(micro[1]["response_tokens"]) == batch["response_mask"].sum()
  if agg == "token_mean":
    # The test has teeth: a plain average of the micro-batch losses is far from the loss.
    mb_losses = [
      float(
        steps.resolve(
          steps.policy_loss_fn(TINY, loss_cfg, params, {key: v[j::k] for key, v in batch.items()})[
            0
          ]
        )
      )
      for j in range(k)
    ]
    assert abs(np.mean(mb_losses) - float(one[1]["loss"])) > 1e-2 * abs(float(one[1]["loss"]))


def _rm_step_batch(loss_type, rng):
  if loss_type == "bt":
    batch = _rm_batch(seed=2, p=8)
    batch["pos_mask"] = np.ones((8, 10), bool)
    batch["neg_mask"] = np.ones((8, 10), bool)
    # 4 valid pairs among the even rows, 1 among the odd ones (the two micro-batches at k=2).
    batch["valid"] = np.array([1, 0, 1, 1, 1, 0, 1, 0], np.float32)
    return batch
  return {
    "tokens": rng.integers(1, 128, (8, 10)).astype(np.int32),
    "mask": np.ones((8, 10), bool),
    "labels": np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32),
    "weight": np.array([1.0, 0.5, 2.0, 0.25, 1.0, 0.0, 1.0, 0.3], np.float32),
  }


@pytest.mark.parametrize("loss_type", ["bt", "bce"])
def test_rm_step_micro_batches_equal_one_shot(loss_type):
  cfg = TINY.replace(head="score")
  batch = _rm_step_batch(loss_type, np.random.default_rng(4))
  mesh = sharding.make_mesh(**MESH8)
  results = []
  for mbs in (0, 4):
    params = init_params(cfg, jax.random.key(1))
    # A non-zero score head, so scores (and precision / recall) are not all at 0.
    params["score"]["kernel"] = jax.random.normal(
      jax.random.key(2), params["score"]["kernel"].shape
    )
    atol = _rm_metric_atol(cfg, jax.device_get(params), batch)  # before the step donates them
    opt = _optim(1e-3)
    state = sharding.shard_tree(steps.init_state(params, opt), mesh)
    step = steps.make_rm_step(cfg, loss_type, opt, mesh, state, batch, micro_batch_size=mbs)
    state, m = step(state, batch)
    results.append((jax.device_get(state), jax.device_get(m)))
  _assert_same_step(*results, atol)
  if loss_type == "bt":
    assert float(results[1][1]["n_valid"]) == 5.0


def test_bad_micro_batch_size_is_named():
  mesh = sharding.make_mesh(**MESH8)
  batch = _unbalanced_policy_batch()
  params = init_params(TINY, jax.random.key(0))
  opt = _optim()
  state = steps.init_state(params, opt)
  # 6 does not divide 16 rows; 2 does, but 2 rows cannot span the 4 batch devices.
  for mbs in (6, 2, -1):
    with pytest.raises(ValueError, match=f"micro_batch_size={mbs}"):
      steps.make_policy_step(TINY, LOSS, opt, mesh, state, batch, micro_batch_size=mbs)
  fn = steps.make_logprob_fn(TINY, mesh, params, micro_batch_size=6)
  with pytest.raises(ValueError, match="micro_batch_size=6"):
    fn(
      params,
      {k: batch[k] for k in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")},
    )


def test_nonfinite_loss_in_one_micro_batch_skips_update():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  batch = _policy_batch()
  batch["advantages"][3] = np.nan
  params = init_params(TINY, jax.random.key(0))
  opt = _optim()
  state = steps.init_state(params, opt)
  before = jax.device_get(state["params"])
  step = steps.make_policy_step(TINY, LOSS, opt, mesh, state, batch, micro_batch_size=2)
  state, m = step(state, batch)
  assert float(m["skipped"]) == 1.0 and int(state["n_skipped"]) == 1 and int(state["step"]) == 0
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["params"]), before)


@pytest.mark.parametrize("tie", [False, True])
def test_chunked_logprobs_and_grads_equal_direct(tie):
  cfg = TINY.replace(tie_embeddings=tie)
  params = init_params(cfg, jax.random.key(5))
  b = _policy_batch(seed=5)
  args = (b["prompt_tokens"], b["prompt_mask"], b["response_tokens"], b["response_mask"])
  w = np.random.default_rng(5).normal(size=b["response_tokens"].shape).astype(np.float32)

  def weighted(p, chunk):
    return jnp.sum(w * logprobs.response_logprobs(cfg, p, *args, chunk=chunk))

  want = np.asarray(logprobs.response_logprobs(cfg, params, *args))
  want_grad = jax.grad(weighted)(params, 0)
  for chunk in (2, 4):  # 4 does not divide the 6 response positions: padded
    got = np.asarray(logprobs.response_logprobs(cfg, params, *args, chunk=chunk))
    np.testing.assert_allclose(got, want, rtol=0, atol=_lp_atol(cfg, params, b))
    # The gradient of the same sum, another order: a backward pass's relative error.
    _assert_close_tree(
      want_grad, jax.grad(weighted)(params, chunk), 2 * float32_forward_rtol(cfg, 12)
    )


def test_chunked_micro_batched_logprob_and_reward_fns_equal_plain():
  mesh = sharding.make_mesh(**MESH8)
  batch = _unbalanced_policy_batch()
  params = sharding.shard_tree(init_params(TINY, jax.random.key(0)), mesh)
  keys = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")
  lp_batch = {k: batch[k] for k in keys}
  want = np.asarray(steps.make_logprob_fn(TINY, mesh, params)(params, lp_batch))
  fn = steps.make_logprob_fn(TINY, mesh, params, micro_batch_size=4, logprob_chunk=4)
  atol = _lp_atol(TINY, jax.device_get(params), batch)
  np.testing.assert_allclose(np.asarray(fn(params, lp_batch)), want, rtol=0, atol=atol)

  cfg = TINY.replace(head="score")
  rm_params = sharding.shard_tree(init_params(cfg, jax.random.key(1)), mesh)
  rm_params["score"]["kernel"] = rm_params["score"]["kernel"] + 0.5
  tokens = np.concatenate([batch["prompt_tokens"], batch["response_tokens"]], 1)
  mask = np.concatenate([batch["prompt_mask"], batch["response_mask"]], 1)
  want_r = np.asarray(steps.make_reward_fn(cfg, mesh, rm_params)(rm_params, tokens, mask))
  got_r = steps.make_reward_fn(cfg, mesh, rm_params, micro_batch_size=4)(rm_params, tokens, mask)
  atol = float32_logit_atol(cfg, score_scale(rm_params), tokens.shape[1])
  np.testing.assert_allclose(np.asarray(got_r), want_r, rtol=0, atol=atol)
  assert np.std(want_r) > 1e-3  # rows really differ, so a row mix-up would show


def test_chunked_logprob_grad_never_holds_full_logits():
  """Compiled temporaries of d/dparams sum(w * logp): unchunked above one f32 [b, n, v] array,
  chunked well below it."""
  cfg = TINY.replace(vocab_size=8192, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1)
  params = init_params(cfg, jax.random.key(0))
  bsz, p, n, v = 4, 8, 128, cfg.vocab_size
  rng = np.random.default_rng(0)
  args = (
    rng.integers(1, v, (bsz, p)).astype(np.int32),
    np.ones((bsz, p), bool),
    rng.integers(1, v, (bsz, n)).astype(np.int32),
    np.ones((bsz, n), bool),
  )
  w = rng.normal(size=(bsz, n)).astype(np.float32)
  full_logits = bsz * n * v * 4  # 16 MiB

  def temp_bytes(chunk):
    f = lambda prm: jnp.sum(w * logprobs.response_logprobs(cfg, prm, *args, chunk=chunk))
    return jax.jit(jax.grad(f)).lower(params).compile().memory_analysis().temp_size_in_bytes

  assert temp_bytes(0) > full_logits
  assert temp_bytes(8) < 0.5 * full_logits


def test_make_train_step_plain_mean_and_sum_stats():
  """A loss_fn with plain (per-row mean) and Sum stats: micro-batched equals one-shot."""
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  rng = np.random.default_rng(7)
  batch = {
    "x": rng.normal(size=(8, 3)).astype(np.float32),
    "y": rng.normal(size=8).astype(np.float32),
  }

  def loss_fn(params, b):
    err = b["x"] @ params["w"] - b["y"]
    return jnp.mean(err**2), {
      "abs_err": jnp.mean(jnp.abs(err)),
      "y_sum": steps.Sum(jnp.sum(b["y"])),
    }

  out = []
  for mbs in (0, 2):
    opt = _optim(1e-2)
    state = steps.init_state({"w": jnp.ones(3)}, opt)
    step = steps.make_train_step(loss_fn, opt, mesh, state, batch, micro_batch_size=mbs)
    state, m = step(state, batch)
    out.append((jax.device_get(state), jax.device_get(m)))
  # Sums of 8 rows of 3-term dot products, in two orders: gamma_(3 + 8) of the terms' absolute
  # sum (Higham, Lemma 3.1), twice, for the largest such sum among the metrics.
  x, y = np.abs(batch["x"]), np.abs(batch["y"])
  terms = x.sum(1) + y  # |x_i . w| + |y_i| at w = 1
  atol = 2 * 11 * UNIT_ROUNDOFF * max(y.sum(), np.mean(terms**2), np.mean(terms))
  _assert_same_step(*out, atol, lr=1e-2)
  np.testing.assert_allclose(out[1][1]["y_sum"], batch["y"].sum(), rtol=0, atol=atol)


# ------------------------------------------------------------------ shared prompts (GRPO groups)
def _grouped_policy_batch(n_prompts=4, group=4, p=7, n=6, seed=5):
  """A GRPO-shaped batch: each prompt's row repeated `group` times, then different responses
  of varied lengths (one of a single token)."""
  batch = _policy_batch(seed=seed, b=n_prompts * group, p=p, n=n)
  for key in ("prompt_tokens", "prompt_mask"):
    batch[key] = np.repeat(batch[key][::group], group, axis=0)
  batch["prompt_mask"][:, -1] = True  # left padding: every prompt ends with a real token
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, n + 1, n_prompts * group)
  lengths[1] = 1
  batch["response_mask"] = np.arange(n)[None] < lengths[:, None]
  return batch


def test_shared_prompt_logprobs_equal_per_row_ones():
  batch = _grouped_policy_batch()
  args = [batch[k] for k in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")]
  params = init_params(TINY, jax.random.key(0))
  want = np.asarray(logprobs.response_logprobs(TINY, params, *args, temperature=0.7))
  got = np.asarray(logprobs.response_logprobs(TINY, params, *args, temperature=0.7, prompt_group=4))
  m = batch["response_mask"]
  atol = _lp_atol(TINY, params, batch, temperature=0.7)
  np.testing.assert_allclose(got[m], want[m], rtol=0, atol=atol)
  # Teeth: rows whose prompts are not copies of their group's first row get other log-probs.
  wrong = batch["prompt_tokens"].copy()
  wrong[1] = (wrong[1] + 1) % 128
  bad = np.asarray(logprobs.response_logprobs(TINY, params, wrong, *args[1:], prompt_group=4))
  direct = np.asarray(logprobs.response_logprobs(TINY, params, wrong, *args[1:]))
  assert np.abs(bad[1][m[1]] - direct[1][m[1]]).max() > 1e-3
  with pytest.raises(ValueError, match="prompt_group=3"):
    logprobs.response_logprobs(TINY, params, *args, prompt_group=3)


@pytest.mark.parametrize("micro", [0, 8])  # one-shot (group 4); 2 micro-batches (group 2 each)
def test_policy_step_with_shared_prompts_equals_per_row(micro):
  batch = _grouped_policy_batch()
  mesh = sharding.make_mesh(**MESH8)
  kw = dict(micro_batch_size=micro)
  one = _one_policy_step(batch, LOSS, mesh, **kw)
  shared = _one_policy_step(batch, LOSS, mesh, prompt_group=4, **kw)
  params = init_params(TINY, jax.random.key(0))
  _assert_same_step(one, shared, _policy_metric_atol(params, batch))
  assert steps.micro_prompt_group(4, {0: 1, 8: 2}[micro]) == {0: 4, 8: 2}[micro]
  assert steps.micro_prompt_group(4, 4) == 1 and steps.micro_prompt_group(4, 3) == 1
  lp = {k: batch[k] for k in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")}
  params = init_params(TINY, jax.random.key(0))
  want = np.asarray(steps.make_logprob_fn(TINY, mesh, params, **kw)(params, lp))
  got = np.asarray(steps.make_logprob_fn(TINY, mesh, params, prompt_group=4, **kw)(params, lp))
  m = batch["response_mask"]
  np.testing.assert_allclose(got[m], want[m], rtol=0, atol=_lp_atol(TINY, params, batch))


def test_chunked_attention_on_8_devices_equals_one_device_in_one_piece():
  """ModelConfig.attn_chunk_bytes (attention in chunks of rows; here one row a chunk, 16
  chunks over the 4 devices that hold rows) changes neither the policy step (shared prompts:
  the cache path) nor the reference log-probs: each row's attention is computed as it is
  in one piece, and a chunk's rows stay spread over the devices."""
  batch = _grouped_policy_batch()
  one_dev = sharding.make_mesh(devices=jax.devices()[:1])
  mesh = sharding.make_mesh(**MESH8)
  chunked = TINY.replace(attn_chunk_bytes=1)
  want = _one_policy_step(batch, LOSS, one_dev, prompt_group=4)
  got = _one_policy_step(batch, LOSS, mesh, cfg=chunked, prompt_group=4)
  lp = {k: batch[k] for k in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")}
  params = init_params(TINY, jax.random.key(0))
  _assert_same_step(want, got, _policy_metric_atol(params, batch))
  ref = np.asarray(steps.make_logprob_fn(TINY, one_dev, params)(params, lp))
  out = np.asarray(steps.make_logprob_fn(chunked, mesh, params)(params, lp))  # no-cache path
  m = batch["response_mask"]
  np.testing.assert_allclose(out[m], ref[m], rtol=0, atol=_lp_atol(TINY, params, batch))
