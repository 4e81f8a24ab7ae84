"""policy_step / rm_step: sharded over 8 CPU devices equals the 1-device result; guards work."""

import jax
import ml_collections
import numpy as np
import pytest

from cooper_jax import optim, sharding, steps
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import init_params

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
  return optim.make_optimizer(
    ml_collections.ConfigDict(
      dict(
        lr=lr,
        schedule="constant",
        warmup_steps=0,
        total_steps=10,
        end_lr_frac=0.0,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        weight_decay=0.01,
        grad_clip=1.0,
      )
    )
  )


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


def _run_policy(mesh, batch):
  params = init_params(TINY, jax.random.key(0))
  opt = _optim()
  state = sharding.shard_tree(steps.init_state(params, opt), mesh)
  step = steps.make_policy_step(TINY, LOSS, opt, mesh, state, batch)
  state, metrics = step(state, batch)
  state, metrics2 = step(state, _policy_batch(seed=1))
  return jax.device_get(state), jax.device_get(metrics), jax.device_get(metrics2)


def _assert_close_tree(a, b, rtol=1e-5):
  """Relative error over the whole tree, ||a - b|| / ||a|| <= rtol.

  Not element-wise: Adam divides by sqrt(v), so an entry whose true gradient is 0 turns
  rounding noise into a full lr-sized step whose sign depends on summation order. The key
  bias is such a tensor (softmax is shift-invariant, so d loss / d k_bias = 0 exactly), and a
  sharded sum adds in another order than a 1-device one.
  """
  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(a)]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(b)]
  diff = np.sqrt(sum(np.sum((x - y) ** 2) for x, y in zip(la, lb)))
  err = diff / np.sqrt(sum(np.sum(x**2) for x in la))
  assert err <= rtol, f"relative error {err:.2e} > {rtol}"


def test_policy_step_sharded_equals_single_device():
  batch = _policy_batch()
  one = _run_policy(sharding.make_mesh(devices=jax.devices()[:1]), batch)
  eight = _run_policy(sharding.make_mesh(data=2, fsdp=2, tensor=2), batch)
  np.testing.assert_allclose(one[1]["loss"], eight[1]["loss"], rtol=1e-5)
  np.testing.assert_allclose(one[2]["loss"], eight[2]["loss"], rtol=1e-5)
  _assert_close_tree(one[0]["params"], eight[0]["params"])
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
  cfg = TINY.replace(head="score")
  batch = _rm_batch()
  results = []
  for mesh in (
    sharding.make_mesh(devices=jax.devices()[:1]),
    sharding.make_mesh(data=2, fsdp=2, tensor=2),
  ):
    params = init_params(cfg, jax.random.key(1))
    opt = _optim(1e-3)
    state = sharding.shard_tree(steps.init_state(params, opt), mesh)
    step = steps.make_rm_step(cfg, "bt", opt, mesh, state, batch)
    losses = []
    for _ in range(3):
      state, m = step(state, batch)
      losses.append(float(m["loss"]))
    results.append((jax.device_get(state), losses, m))
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
  _assert_close_tree(results[0][0]["params"], results[1][0]["params"])
  assert results[0][1][-1] < results[0][1][0]  # BT loss went down on the valid pairs
  assert float(results[0][2]["n_valid"]) == 3.0


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
  # step 0, step 5 (mid warm-up), step 60 (half-way through the decay phase)
  np.testing.assert_allclose([float(s(0)), float(s(5)), float(s(60))], want, atol=1e-6)


def test_response_logprobs_equal_full_forward_logsoftmax():
  from cooper_jax.models.transformer import forward  # pylint: disable=import-outside-toplevel

  params = init_params(TINY, jax.random.key(0))
  b = _policy_batch()
  got = steps.response_logprobs(
    TINY, params, b["prompt_tokens"], b["prompt_mask"], b["response_tokens"], b["response_mask"]
  )
  tokens = np.concatenate([b["prompt_tokens"], b["response_tokens"]], 1)
  mask = np.concatenate([b["prompt_mask"], b["response_mask"]], 1)
  logp = np.asarray(jax.nn.log_softmax(forward(TINY, params, tokens, mask), axis=-1))
  p = b["prompt_tokens"].shape[1]
  for i in range(tokens.shape[0]):
    for j in range(b["response_tokens"].shape[1]):
      want = logp[i, p + j - 1, b["response_tokens"][i, j]]
      assert abs(float(got[i, j]) - want) < 1e-5, (i, j)
