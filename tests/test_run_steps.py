"""cooper_jax/run_steps.py: train and the AOT tool build the policy step from one layout, so the
batch the AOT tool lowers has the keys, shapes and dtypes of the batch train feeds the step."""

import jax
import numpy as np
import pytest

from cooper_jax import merge, run_steps, sharding
from cooper_jax.aot.functions import build_functions
from experiments.small_task import get_config as small_task_config

P, W, N_PROMPTS, G = 6, 8, 4, 4  # prompt width, response width, prompts, rollouts per prompt


def _described(batch: dict) -> dict:
  return {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}


def _expected(shapes: dict) -> dict:
  return {k: (tuple(s), np.dtype(d)) for k, (s, d) in shapes.items()}


@pytest.mark.parametrize("pack", [False, True])
def test_batch_shapes_are_those_merge_builds(pack):
  """A rollout batch with no duplicate row and every response at full width (so packing puts
  one response per row): MergedStep's reference and policy batches, as train builds them, have
  exactly the keys, shapes and dtypes policy_batch_shapes gives the AOT tool."""
  c = small_task_config("cooper")
  c.rollout.prompts_per_step, c.rollout.group_size = N_PROMPTS, G
  c.policy.merge_duplicate_rows, c.policy.pack_rows = True, pack
  layout = run_steps.PolicyLayout.of(c)
  assert (layout.merge, layout.n_prompts, layout.packed, layout.prompt_group) == (
    True,
    N_PROMPTS,
    pack,
    1,
  )
  rows = N_PROMPTS * G
  rng = np.random.default_rng(0)
  tok = rng.integers(1, 50, (rows, P))
  mask = np.ones((rows, P), bool)
  resp = rng.integers(1, 50, (rows, W))  # distinct rows (with overwhelming probability)
  resp_len = np.full(rows, W)
  mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
  merger = merge.MergedStep(mesh, G, layout.n_prompts, tok, mask, resp, resp_len, pack=pack)
  ref = merger.ref_batch()
  adv = rng.standard_normal(rows).astype(np.float32)
  sampler_logp = jax.numpy.asarray(-rng.random((rows, W)), jax.numpy.float32)
  ref_logp = jax.numpy.asarray(-rng.random((rows, W)), jax.numpy.float32)
  pol = merger.policy_batch(adv, sampler_logp, ref_logp)
  want_ref, want_pol = run_steps.policy_batch_shapes(layout, rows, P, W, kl=True, old_logp=False)
  assert _described(ref) == _expected(want_ref)
  assert _described(pol) == _expected(want_pol)


def test_aot_lowers_the_small_task_step_train_runs():
  """experiments/small_task.py merges duplicate rows and packs them: the AOT tool's policy
  step takes the prompt-indexed, packed batch (per-token advantages and weights), not the
  plain one (which it used to lower whatever the config said)."""
  c = small_task_config("cooper")
  assert c.policy.merge_duplicate_rows and c.policy.pack_rows
  mesh = sharding.make_mesh(**c.mesh, devices=jax.devices()[:1])
  fns = {f.name: f for f in build_functions(c, mesh)[0]}
  lowered = fns["policy_step"].lower()
  batch_info = lowered.args_info[0][1]
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  n = c.rollout.max_new_tokens
  assert {"prompt_index", "response_segment", "row_weight"} <= set(batch_info)
  assert tuple(batch_info["advantages"].shape) == (rows, n)  # one advantage per token
  assert tuple(batch_info["row_weight"].shape) == (rows, n)
