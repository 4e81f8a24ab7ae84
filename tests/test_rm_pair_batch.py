"""Cooper's RM pair batch: valid pairs first, rows bucketed, and the RM update unchanged."""

import jax
import numpy as np
import pytest
from conftest import TINY_CONFIG
from mp_pair_batch_worker import all_prompts_rows, pairs_of
from test_steps import _rm_metric_atol

from cooper_jax import sharding, steps
from cooper_jax.config import load_config
from cooper_jax.models.tolerance import float32_gradient_roundoff
from cooper_jax.reward_modes import CooperReward, pair_rows


@pytest.mark.parametrize(
  "k_max, n_local, unit, rows",
  [
    (0, 8, 1, 1),  # a process with no pair still joins the step with one padding row
    (1, 8, 1, 1),
    (3, 8, 1, 4),
    (5, 8, 1, 8),
    (8, 8, 1, 8),
    (3, 8, 2, 4),
    (5, 8, 2, 8),
    (1, 8, 4, 4),
    (3, 6, 2, 4),
    (5, 6, 2, 6),  # 2 x 4 = 8 would pass the 6 prompts: capped
  ],
)
def test_pair_rows(k_max, n_local, unit, rows):
  assert pair_rows(k_max, n_local, unit) == rows


def test_pair_rows_refuses_a_unit_that_does_not_divide_the_prompts():
  with pytest.raises(ValueError, match="unit 3 must divide this process's 8 prompts"):
    pair_rows(2, 8, 3)


def test_compacted_pairs_give_the_all_prompts_update():
  c = load_config(TINY_CONFIG)
  mesh = sharding.make_mesh(data=4, fsdp=1, tensor=1, devices=jax.devices()[:4])
  rm = CooperReward(c, mesh, verifier=None)
  valid = [False, True, False, False, True, False, False, False]
  pairs = pairs_of(range(8), valid)
  rb, n_cut = rm._pair_batch(pairs, 8, np.arange(8))  # pylint: disable=protected-access
  # 2 valid pairs, 4 row shards: one row per shard, the valid ones first.
  assert n_cut == 0
  np.testing.assert_array_equal(np.asarray(rb["valid"]), [1, 1, 0, 0])
  text = rm.tokenizer.decode(np.asarray(rb["pos_tokens"])[1][np.asarray(rb["pos_mask"])[1] > 0])
  assert "4 + 4 = 8" in text  # prompt 4's pair is the second row

  full = all_prompts_rows(rm, pairs)
  results = []
  for batch in (full, rb):
    state = jax.tree.map(lambda x: x.copy(), rm.state)  # rm_step donates its state
    step = steps.make_rm_step(rm.cfg, "bt", rm.opt, mesh, state, batch)
    state, m = step(state, batch)
    results.append((jax.device_get(state["params"]), jax.device_get(m)))
  (p_full, m_full), (p_comp, m_comp) = results
  assert float(m_full["n_valid"]) == float(m_comp["n_valid"]) == 2.0
  # The same scores in other rows: the BT loss within its scores' float32 bound (test_steps).
  atol = _rm_metric_atol(rm.cfg, jax.device_get(rm.state["params"]), full)
  np.testing.assert_allclose(float(m_comp["loss"]), float(m_full["loss"]), rtol=0, atol=atol)
  # Compare the gradients, not the parameters after AdamW: a first Adam step moves a parameter
  # by lr * g / (|g| + eps), so where |g| is near eps float32 rounding of g moves the update by a
  # visible fraction of lr, on one CPU and not the next. The two batches hold the same valid
  # pairs in other rows (and other padding rows, which contribute exact zeros): their
  # gradients differ only by summation order, within the worst-case float32 bound of a gradient
  # entry's longest path (tolerance.float32_gradient_roundoff: the model's contractions forward and
  # backward plus the sum over rows x positions) of the largest entry.
  grads = []
  for batch in (full, rb):
    loss = lambda p, b=batch: steps.rm_loss_fn(rm.cfg, "bt", p, b)[0].value
    grads.append(jax.device_get(jax.jit(jax.grad(loss))(rm.state["params"])))
  g_scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads[0]))
  assert g_scale > 0
  rows, width = full["pos_tokens"].shape
  bound = float32_gradient_roundoff(rm.cfg, rows=2 * rows, seq=width) * g_scale
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=bound), *grads)
  # After the step the parameters agree to within the step itself (|update| <= lr (1 + wd |p|)).
  lr = c.rm.optim.lr
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=2.1 * lr), p_full, p_comp)
  # and the update did something (the comparison is not between two unchanged states)
  moved = jax.tree.leaves(
    jax.tree.map(lambda a, b: np.abs(a - b).max(), p_full, rm.state["params"])
  )
  assert max(float(x) for x in moved) > 0
