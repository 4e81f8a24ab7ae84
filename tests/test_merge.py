"""Merged duplicate rows (config policy.merge_duplicate_rows, cooper_jax/merge.py): the policy
step and the reference pass on each distinct row once, weighted by its count, equal the full
batch's up to float rounding; and which rows merge."""

import jax
import numpy as np
import pytest
from test_steps import (
  LOSS,
  MESH8,
  TINY,
  _assert_same_step,
  _grouped_policy_batch,
  _lp_atol,
  _one_policy_step,
  _policy_metric_atol,
)
from test_train import SMALL, _small

from cooper_jax import merge, sharding, steps
from cooper_jax.models.tolerance import float32_logit_atol, score_scale
from cooper_jax.models.transformer import init_params

LP_KEYS = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask")


def test_merge_rows_groups_equal_prompt_tokens_and_extra():
  tokens = np.array(
    [
      [5, 6, 7, 0],  # row 0
      [5, 6, 7, 9],  # same first 3 tokens (what follows the length is padding): merges with 0
      [5, 6, 7, 0],  # same tokens, other prompt: its own row
      [5, 6, 0, 0],  # shorter: its own row
      [5, 6, 7, 0],  # row 0 again, but another advantage below
    ]
  )
  lengths = np.array([3, 3, 3, 2, 3])
  prompt = np.array([0, 0, 1, 0, 0])
  m = merge.merge_rows(prompt, tokens, lengths)
  assert m.distinct == 3
  np.testing.assert_array_equal(m.index[:3], [0, 2, 3])
  np.testing.assert_array_equal(m.weight[:3], [3, 1, 1])
  np.testing.assert_array_equal(m.inverse, [0, 0, 1, 2, 0])
  # Padded toward ROW_MULTIPLE rows, never past the original count (5): 2 rows at weight 0.
  assert len(m.index) == 5 and m.weight.sum() == 5 and m.weight[3:].tolist() == [0, 0]
  m = merge.merge_rows(prompt, tokens, lengths, extra=np.array([1.0, 1.0, 1.0, 1.0, -1.0]))
  assert m.distinct == 4 and m.weight[:4].tolist() == [2, 1, 1, 1]
  # 40 rows of 20 distinct: 32 rows (a multiple of 16), 12 of them padding at weight 0.
  big = np.repeat(np.arange(20), 2)[:, None] * np.ones((1, 3), int)
  m = merge.merge_rows(np.zeros(40, int), big, np.full(40, 3), n_devices=8)
  assert m.distinct == 20 and len(m.index) == 32
  assert m.weight.sum() == 40 and (m.weight[20:] == 0).all() and (m.index[20:] == 0).all()
  # Every original row is its merged row.
  np.testing.assert_array_equal(big[m.index[m.inverse]], big)
  with pytest.raises(ValueError, match="3 lengths"):
    merge.merge_rows(np.zeros(4, int), np.zeros((4, 2), int), np.zeros(3, int))


def _merged(batch, group):
  """The batch with its duplicate rows merged (host arrays), as train.py builds it."""
  lengths = batch["response_mask"].sum(1)
  prompt_of = np.arange(len(lengths)) // group
  m = merge.merge_rows(prompt_of, batch["response_tokens"], lengths, extra=batch["advantages"])
  out = {k: v[m.index] for k, v in batch.items()}
  out["prompt_index"] = prompt_of[m.index].astype(np.int32)
  out["row_weight"] = m.weight
  return out, m


def _with_duplicates(n_prompts=4, group=4):
  """A GRPO batch in which prompt 0's rows 1-3 repeat row 0 and prompt 2's row 9 repeats row 8
  (same tokens, advantage, old and reference log-probs: what a repeated sample gets)."""
  batch = _grouped_policy_batch(n_prompts=n_prompts, group=group)
  for src, dst in ((0, 1), (0, 2), (0, 3), (8, 9)):
    for k in ("response_tokens", "response_mask", "advantages", "old_logp", "ref_logp"):
      batch[k][dst] = batch[k][src]
  return batch


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_merged_policy_step_equals_full_batch(agg):
  batch = _with_duplicates()
  merged, m = _merged(batch, group=4)
  assert m.distinct == 12 and len(m.index) == 16  # 16 rows of 12 distinct: padded back to 16
  mesh = sharding.make_mesh(**MESH8)
  loss = LOSS.copy_and_resolve_references()
  loss.agg = agg
  full = _one_policy_step(batch, loss, mesh, prompt_group=4)
  got = _one_policy_step(merged, loss, mesh, n_prompts=4)
  _assert_same_step(
    full, got, _policy_metric_atol(init_params(TINY, jax.random.key(0)), batch, loss)
  )
  # Teeth: the same rows without their weights (each distinct row once) is another step.
  unweighted = dict(merged, row_weight=(m.weight > 0).astype(np.float32))
  other = _one_policy_step(unweighted, loss, mesh, n_prompts=4)
  assert abs(other[1]["pg_loss"] - full[1]["pg_loss"]) > 1e-3 * abs(full[1]["pg_loss"])


def test_merged_reference_logprobs_equal_full_batch_rows():
  batch = _with_duplicates(n_prompts=4, group=8)
  merged, m = _merged(batch, group=8)
  mesh = sharding.make_mesh(**MESH8)
  params = init_params(TINY, jax.random.key(0))
  want = np.asarray(
    steps.make_logprob_fn(TINY, mesh, params)(params, {k: batch[k] for k in LP_KEYS})
  )
  fn = steps.make_logprob_fn(TINY, mesh, params, n_prompts=4)
  got = np.asarray(fn(params, {k: merged[k] for k in (*LP_KEYS, "prompt_index")}))
  rows = m.inverse  # original row i's log-probs are merged row inverse[i]'s
  mask = batch["response_mask"]
  atol = _lp_atol(TINY, params, batch)
  np.testing.assert_allclose(got[rows][mask], want[mask], rtol=0, atol=atol)
  # Teeth: a row pointed at another prompt (the last distinct row, of prompt 3, at prompt 0;
  # each prompt's tokens come from its first row) gets other log-probs.
  r = m.distinct - 1
  wrong = {k: merged[k] for k in (*LP_KEYS, "prompt_index")}
  assert wrong["prompt_index"][r] == 3
  wrong["prompt_index"] = wrong["prompt_index"].copy()
  wrong["prompt_index"][r] = 0
  bad = np.asarray(fn(params, wrong))
  mr = merged["response_mask"][r]
  assert np.abs(bad[r][mr] - got[r][mr]).max() > 1e-3


def test_merged_batches_need_whole_batch_steps():
  batch = _with_duplicates()
  merged, _ = _merged(batch, group=4)
  mesh = sharding.make_mesh(**MESH8)
  with pytest.raises(ValueError, match="one micro-batch"):
    _one_policy_step(merged, LOSS, mesh, n_prompts=4, micro_batch_size=8)


def test_merged_run_trains_as_the_full_batch(tmp_path):
  """The small task's cooper run (reference pass, RM reward, rm_step) with merged rows: the
  same rollouts and the same policy metrics as without, step by step, and fewer rows."""
  over = ("--config.rollout.group_size=8", "--config.policy.pack_rows=False")
  full = _small(tmp_path / "full", "cooper", *over, "--config.policy.merge_duplicate_rows=False")
  merged = _small(tmp_path / "merged", "cooper", *over, "--config.policy.merge_duplicate_rows=True")
  assert any(r["policy/distinct_rows"] < 32 for r in merged)  # the SFT policy repeats itself
  for a, b in zip(full, merged):
    assert b["policy/rows"] % 16 == 0 and b["policy/distinct_rows"] <= b["policy/rows"] <= 32
    assert a["rule/acc"] == b["rule/acc"] and a["reward/mean"] == b["reward/mean"]
    assert b["policy/response_tokens"] == a["policy/response_tokens"]  # weights x tokens
    # The pg loss is a mean of -A * ratio terms that cancel (group-centred A, |A| <= 7 / sqrt(8)
    # = 2.5 at G = 8), each ratio exp(logp - old) moved by the float32 rounding of log-probs
    # computed in another batch shape (~1e-6 of |logp| <= ~10): up to ~2.5e-5 a term. A merge
    # bug (a weight lost, a row's prompt wrong) moves the loss by its own size (~4e-3 here).
    for k in ("policy/loss", "policy/pg_loss"):
      assert b[k] == pytest.approx(a[k], rel=0, abs=5e-5), k
    # kl_loss is a token mean of low_var_kl(r), r = ref - logp, whose derivative |1 - e^r| is
    # about |r| + r^2 with mean |r| <= sqrt(2 kl) (kl ~ r^2 / 2): the same ~1e-5 a log-prob,
    # twice, times that.
    kl = a["policy/kl_loss"]
    assert b["policy/kl_loss"] == pytest.approx(kl, rel=0, abs=2e-5 * (np.sqrt(2 * kl) + 2 * kl))


def test_merge_needs_whole_batch_updates():
  from cooper_jax.config import load_config, validate  # pylint: disable=import-outside-toplevel

  c = load_config(
    f"{SMALL}:cooper", ["policy.merge_duplicate_rows=True", "policy.micro_batch_size=8"]
  )
  with pytest.raises(ValueError, match="config.policy.micro_batch_size=8 must be 0"):
    validate(c)


def test_rm_scores_each_distinct_row_once():
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel
  from cooper_jax.reward_modes import StaticRMReward  # pylint: disable=import-outside-toplevel

  mesh = sharding.make_mesh(**MESH8)
  texts = ["2 + 3 = 5. \\boxed{5}", "2 + 3 = 6. \\boxed{6}", "\\boxed{5}"]
  rows = [0, 0, 1, 0, 2, 1, 0, 0] * 3  # 24 rows of 3 distinct texts
  q, a, t = ["What is 2 + 3?"] * 24, ["5"] * 24, [texts[i] for i in rows]
  plain = load_config(f"{SMALL}:static_rm", ["rm.merge_duplicate_rows=False"])
  want, cut = StaticRMReward(plain, mesh).score(q, a, t)
  rm = StaticRMReward(load_config(f"{SMALL}:static_rm", ["rm.merge_duplicate_rows=True"]), mesh)
  shapes = []
  fn = rm.reward_fn
  rm.reward_fn = lambda p, tok, mask: shapes.append(tok.shape) or fn(p, tok, mask)
  got, got_cut = rm.score(q, a, t)
  assert shapes[0][0] == 16  # 3 distinct rows, padded to 16 (not 24)
  # reward = sigmoid(score), slope <= 1/4: the scores' float32 bound (tolerance.py) over 4.
  atol = float32_logit_atol(rm.cfg, score_scale(rm.state["params"]), plain.rm.max_len) / 4
  np.testing.assert_allclose(got, want, rtol=0, atol=atol)
  assert got_cut == cut
  assert len({round(float(x), 4) for x in want}) == 3  # teeth: three different rewards
