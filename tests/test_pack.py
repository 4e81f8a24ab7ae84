"""Packed rows (config policy.pack_rows, cooper_jax/pack.py): responses to one prompt share rows;
the reference pass and the policy step on them equal the full batch's up to float32 rounding."""

import jax
import numpy as np
import pytest
from test_merge import _with_duplicates
from test_steps import (
  LOSS,
  MESH8,
  TINY,
  _assert_same_step,
  _lp_atol,
  _one_policy_step,
  _policy_metric_atol,
)
from test_train import SMALL, _small

from cooper_jax import merge, pack, sharding, steps
from cooper_jax.models.transformer import init_params

LP_KEYS = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")


def test_pack_rows_first_fit_decreasing_within_prompts():
  # Prompt 0: lengths 3, 5, 2 into rows of 8: 5 then 3 fill row 0, 2 opens row 1; prompt 1's 4
  # never joins prompt 0's row 1 (rows hold one prompt); the empty response holds nothing.
  p = pack.pack_rows(np.array([0, 0, 0, 1, 1]), np.array([3, 5, 2, 4, 0]), 8)
  assert p.rows == 3 and len(p.prompt) == pack.ROW_MULTIPLE
  np.testing.assert_array_equal(p.prompt[:3], [0, 0, 1])
  np.testing.assert_array_equal(p.src_row[0], [1] * 5 + [0] * 3)
  np.testing.assert_array_equal(p.src_col[0], [0, 1, 2, 3, 4, 0, 1, 2])
  np.testing.assert_array_equal(p.segment[0], [1] * 5 + [2] * 3)
  np.testing.assert_array_equal(p.src_row[1], [2, 2] + [-1] * 6)
  np.testing.assert_array_equal(p.segment[2], [1] * 4 + [0] * 4)
  assert (p.segment[3:] == 0).all() and (p.prompt[3:] == 0).all()
  # Per-token values land where their tokens do; flat indices address the [n, w] original.
  x = np.arange(5 * 8).reshape(5, 8)
  np.testing.assert_array_equal(p.gather(x)[0], [8, 9, 10, 11, 12, 0, 1, 2])
  np.testing.assert_array_equal(p.flat_index(np.array([4, 3, 2, 1, 0]))[2, :4], [8, 9, 10, 11])
  with pytest.raises(ValueError, match="not in 0..4"):
    pack.pack_rows(np.zeros(2, int), np.array([3, 5]), 4)


def _packed_merger(batch, group, mesh):
  lengths = batch["response_mask"].sum(1)
  return merge.MergedStep(
    mesh,
    group,
    len(lengths) // group,
    batch["prompt_tokens"],
    batch["prompt_mask"],
    batch["response_tokens"],
    lengths,
    pack=True,
  )


def test_packed_reference_logprobs_equal_full_batch_rows():
  batch = _with_duplicates(n_prompts=4, group=8)
  mesh = sharding.make_mesh(**MESH8)
  params = init_params(TINY, jax.random.key(0))
  want = np.asarray(
    steps.make_logprob_fn(TINY, mesh, params)(params, {k: batch[k] for k in LP_KEYS})
  )
  merger = _packed_merger(batch, 8, mesh)
  packed = merger.ref_packed
  ref_batch = merger.ref_batch()
  assert packed.rows < merger.ref.distinct  # responses of 1-6 tokens, rows of 6: shared rows
  assert (packed.segment.max(1)[: packed.rows] > 1).any()
  fn = steps.make_logprob_fn(TINY, mesh, params, n_prompts=4, packed=True)
  got = np.asarray(fn(params, ref_batch))
  ok = packed.valid
  orig = merger.ref.index[packed.src_row[ok]]
  atol = _lp_atol(TINY, params, batch)
  np.testing.assert_allclose(got[ok], want[orig, packed.src_col[ok]], rtol=0, atol=atol)
  # Teeth: one segment per row (each later response sees the earlier ones, at shifted
  # positions, and predicts its first token from their last) gives other log-probs.
  joined = dict(ref_batch, response_segment=np.where(ok, 1, 0).astype(np.int32))
  bad = np.asarray(fn(params, joined))
  later = ok & (packed.segment > 1)
  assert np.abs(bad[later] - got[later]).max() > 1e-3


@pytest.mark.parametrize("split_advantage", [False, True])
def test_packed_policy_step_equals_full_batch(split_advantage):
  batch = _with_duplicates()
  if split_advantage:  # rows 0 and 3 repeat each other but differ in advantage: the policy
    batch["advantages"][3] = -batch["advantages"][0]  # merge differs from the reference's
  batch["sampler_logp"] = batch.pop("old_logp")  # as train.py's single on-policy update
  mesh = sharding.make_mesh(**MESH8)
  merger = _packed_merger(batch, 4, mesh)
  ref = merger.ref
  ref_logp = merger.ref_packed.gather(batch["ref_logp"][ref.index[: ref.distinct]])
  packed = merger.policy_batch(
    batch["advantages"],
    jax.device_put(batch["sampler_logp"]),
    jax.device_put(ref_logp.astype(np.float32)),
  )
  assert (np.asarray(packed["response_segment"]).max(1) > 1).any()  # rows shared
  assert (merger.distinct > ref.distinct) == split_advantage
  full = _one_policy_step(batch, LOSS, mesh, prompt_group=4)
  got = _one_policy_step(packed, LOSS, mesh, n_prompts=4)
  params = init_params(TINY, jax.random.key(0))
  _assert_same_step(
    full, got, _policy_metric_atol(params, dict(batch, old_logp=batch["sampler_logp"]))
  )
  # Teeth: each distinct response once (its count lost) is another step.
  unweighted = dict(packed, row_weight=np.asarray(packed["response_mask"], np.float32))
  other = _one_policy_step(unweighted, LOSS, mesh, n_prompts=4)
  assert abs(other[1]["pg_loss"] - full[1]["pg_loss"]) > 1e-3 * abs(full[1]["pg_loss"])


def test_packed_run_trains_as_the_merged_one(tmp_path):
  """The small task's cooper run with packed rows: the same rollouts and, within float32
  rounding of log-probs computed in another layout, the same policy metrics, step by step."""
  over = ("--config.rollout.group_size=8", "--config.policy.merge_duplicate_rows=True")
  merged = _small(tmp_path / "merged", "cooper", *over, "--config.policy.pack_rows=False")
  packed = _small(tmp_path / "packed", "cooper", *over, "--config.policy.pack_rows=True")
  assert all(b["policy/token_fill"] > a["policy/token_fill"] for a, b in zip(merged, packed))
  for a, b in zip(merged, packed):
    assert a["rule/acc"] == b["rule/acc"] and a["reward/mean"] == b["reward/mean"]
    assert b["policy/response_tokens"] == a["policy/response_tokens"]
    # As test_merge.py's merged-vs-full run: ~2.5e-5 a pg term, a packing bug moves the loss by
    # its own size.
    for k in ("policy/loss", "policy/pg_loss"):
      assert b[k] == pytest.approx(a[k], rel=0, abs=5e-5), k


def test_pack_rows_needs_merged_token_mean_batches():
  from cooper_jax.config import load_config, validate  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match="merge_duplicate_rows=True"):
    validate(
      load_config(f"{SMALL}:cooper", ["policy.pack_rows=True", "policy.merge_duplicate_rows=False"])
    )
  c = load_config(
    f"{SMALL}:cooper",
    [
      "policy.pack_rows=True",
      "policy.merge_duplicate_rows=True",
      "policy.loss.agg=seq_mean_token_mean",
    ],
  )
  with pytest.raises(ValueError, match="agg='token_mean'"):
    validate(c)
