"""DAPO's dynamic sampling and overlong handling (cooper_jax/dynamic_sampling.py, overlong.py):
flat groups dropped and replaced, counts exact on a hand-made reward sequence, the bound on
batches honoured (padding at weight 0), the soft overlong penalty's values by hand, and a
filtered row's zero gradient."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import dynamic_sampling, merge, overlong, sharding, steps
from cooper_jax.config import base_config, validate
from cooper_jax.data import PromptIterator
from cooper_jax.models.transformer import init_params
from cooper_jax.sampling import SampleOutput

P, G, WIDTH = 2, 2, 5

# Question q's rollouts: (rule verdicts, rewards). q1 is flat in an RM's reward with one
# rule-correct rollout (a "flat" drop that had a positive).
RULE = {0: [1, 1], 1: [0, 0], 2: [1, 0], 3: [0, 0], 4: [0, 1], 5: [1, 0], 6: [1, 1], 7: [0, 0]}
RM = {q: [0.9, 0.2] for q in RULE} | {1: [0.5, 0.5], 0: [0.7, 0.7], 3: [0.1, 0.1]}
RM_RULE = dict(RULE) | {1: [1, 0]}


class _Fake:
  """What draw() uses of a Run: rollouts whose tokens name (question, rollout), a verifier and
  a reward source that read the hand-made tables."""

  def __init__(self, max_batches, rule=RULE, rm=None, **ds):
    self.c = base_config()
    self.c.rollout.prompts_per_step, self.c.rollout.group_size = P, G
    self.c.rollout.max_new_tokens = WIDTH
    self.c.rollout.dynamic_sampling.update(enable=True, max_batches=max_batches, **ds)
    self.group, self.rule, self.rm = G, rule, rm
    self.mesh = sharding.make_mesh(data=-1)
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(8)]
    self.iterator = PromptIterator(rows, shuffle=False)
    self.tokenizer = types.SimpleNamespace(
      pad_id=0, decode=lambda ids: f"{ids[0] - 1}:{ids[1] - 1}"
    )
    self.verifier = types.SimpleNamespace(verify=self._verify)
    self.reward = types.SimpleNamespace(rewards=self._rewards)
    self.rollout_keys = []

  def finish_rm_update(self):
    pass

  def rollout(self, rows, key):
    self.rollout_keys.append(np.asarray(jax.random.key_data(key)).tolist())
    q = np.repeat([int(r["answer"]) for r in rows], G)
    tok = np.zeros((len(q), WIDTH), np.int32)
    tok[:, 0], tok[:, 1] = q + 1, np.tile(np.arange(G), len(rows)) + 1
    mask = np.zeros((len(q), WIDTH), bool)
    mask[:, :2] = True
    mask[q == 3, :] = True  # q3's responses fill max_new_tokens
    prompt = np.tile(q[:, None], (1, 3)).astype(np.int32)
    out = SampleOutput(jnp.asarray(tok), jnp.asarray(tok * 0.5, jnp.float32), jnp.asarray(mask))
    return prompt, np.ones_like(prompt, bool), out

  def _verify(self, texts, refs, deadline_s):
    del refs, deadline_s
    ok = [bool(self.rule[int(a)][int(b)]) for a, b in (t.split(":") for t in texts)]
    return types.SimpleNamespace(correct=ok, counts={"ok": len(ok)})

  def _rewards(self, ro):
    table = self.rule if self.rm is None else self.rm
    r = [table[int(a)][int(b)] for a, b in (t.split(":") for t in ro.texts)]
    return np.asarray(r, np.float32), {"rm/reward_mean": float(np.mean(r)), "rm/n": len(r)}


def _questions(drawn):
  return [int(r["answer"]) for r in drawn.rows]


def test_flat_groups_are_dropped_and_replaced_until_the_batch_is_full():
  run = _Fake(max_batches=8)
  d = dynamic_sampling.draw(run, jax.random.key(0))
  # batch 1: q0 all right, q1 all wrong; batch 2: q2 kept, q3 all wrong; batch 3: q4, q5 kept
  assert _questions(d) == [2, 4]
  m = d.metrics
  assert m["sampling/batches_drawn"] == 3 and m["sampling/groups_drawn"] == 6
  assert m["sampling/dropped_all_correct"] == 1 and m["sampling/dropped_all_wrong"] == 2
  assert m["sampling/dropped_flat"] == 0 and m["sampling/dropped_with_positive"] == 1
  assert m["sampling/kept_surplus"] == 1 and m["sampling/padded_groups"] == 0
  assert m["sampling/informative_frac"] == pytest.approx(3 / 6)
  assert m["sampling/kept_no_positive"] == 0
  # the policy batch's rows, rewards and sampler output are those of q2 and q4, in order
  assert d.ro.texts == ["2:0", "2:1", "4:0", "4:1"]
  np.testing.assert_array_equal(d.rewards, [1, 0, 0, 1])
  np.testing.assert_array_equal(np.asarray(d.out.tokens)[:, 0], [3, 3, 5, 5])
  np.testing.assert_array_equal(d.tok[:, 0], [2, 2, 4, 4])
  np.testing.assert_array_equal(d.row_weight, np.ones(P * G))
  # counts summed, means averaged over the 3 batches; the kept batch's own accuracy
  assert m["verify/ok"] == 12 and m["rm/n"] == 12
  assert m["rule/acc"] == pytest.approx(np.mean([RULE[q] for q in range(6)]))
  assert m["sampling/kept_rule_acc"] == 0.5
  # the iterator moved by whole batches; each batch sampled with its own key, the first the
  # unfiltered step's fold_in(rng, 0)
  assert run.iterator.state_dict()["index"] == 6
  first = np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.key(0), 0))).tolist()
  assert run.rollout_keys[0] == first and len({str(k) for k in run.rollout_keys}) == 3


def test_the_bound_on_batches_pads_with_flat_groups_at_weight_zero():
  run = _Fake(max_batches=2)
  d = dynamic_sampling.draw(run, jax.random.key(0))
  assert _questions(d) == [2, 0]  # the one kept group, then the first flat one drawn
  assert d.metrics["sampling/batches_drawn"] == 2
  assert d.metrics["sampling/padded_groups"] == 1
  assert d.metrics["sampling/informative_frac"] == pytest.approx(1 / 4)
  np.testing.assert_array_equal(d.row_weight, [1, 1, 0, 0])
  assert run.iterator.state_dict()["index"] == 4
  # with overlong filtering too, a cut response's weight is 0 as well (q2: none cut)
  m = {}
  w = dynamic_sampling.row_weight(run.c, np.asarray([2, 2, 2, 2]), d, m)
  np.testing.assert_array_equal(w, [1, 1, 0, 0])
  assert "policy/overlong_masked_rows" not in m  # filtering off
  run.c.rollout.overlong.filter = True
  w = dynamic_sampling.row_weight(run.c, np.asarray([2, 2, 2, WIDTH]), d, m)
  np.testing.assert_array_equal(w, [1, 1, 0, 0])
  assert m["policy/overlong_masked_rows"] == 1
  # every weight 1: no weights at all (the unweighted step)
  assert dynamic_sampling.row_weight(run.c, np.asarray([2, 2, 2, 2]), None, m) is None


def test_rm_reward_flatness_decides_and_rule_verdicts_name_the_drop():
  """An RM's reward: q0 (all rule-right) and q3 (all wrong) flat in the RM score, q1 flat with
  one rule-correct rollout; metric "rule" drops by the verdicts instead."""
  d = dynamic_sampling.draw(_Fake(max_batches=8, rule=RM_RULE, rm=RM), jax.random.key(1))
  assert _questions(d) == [2, 4]
  m = d.metrics
  assert (m["sampling/dropped_all_correct"], m["sampling/dropped_all_wrong"]) == (1, 1)
  assert m["sampling/dropped_flat"] == 1 and m["sampling/dropped_with_positive"] == 2
  # min_std drops near-flat groups too: every RM group here has std 0.35 or 0
  d = dynamic_sampling.draw(
    _Fake(max_batches=3, rule=RM_RULE, rm=RM, min_std=0.4), jax.random.key(1)
  )
  assert d.metrics["sampling/padded_groups"] == 2 and d.metrics["sampling/batches_drawn"] == 3
  d = dynamic_sampling.draw(
    _Fake(max_batches=8, rule=RM_RULE, rm=RM, metric="rule"), jax.random.key(1)
  )
  assert _questions(d) == [1, 2]  # q1's verdicts differ though its RM scores do not
  assert d.metrics["sampling/dropped_flat"] == 0


def test_kept_groups_without_a_positive_are_counted():
  rule = dict(RULE) | {2: [0, 0]}
  rm = {q: [0.9, 0.2] for q in RULE}  # every group informative to the RM
  d = dynamic_sampling.draw(_Fake(max_batches=8, rule=rule, rm=rm), jax.random.key(2))
  assert _questions(d) == [0, 1] and d.metrics["sampling/kept_no_positive"] == 1
  assert d.metrics["sampling/batches_drawn"] == 1


def test_flat_groups_test_the_values_themselves():
  v = np.asarray([0.1] * 3 + [0.1, 0.1, 0.1 + 1e-6], np.float32)
  np.testing.assert_array_equal(dynamic_sampling.flat_groups(v, 3), [True, False])
  np.testing.assert_array_equal(dynamic_sampling.flat_groups(v, 3, min_std=1e-3), [True, True])


def _overlong_config(buffer=16, max_len=0, factor=1.0, filt=False):
  c = base_config()
  c.rollout.max_new_tokens = 64
  c.rollout.overlong.update(
    penalty_buffer=buffer, penalty_max_len=max_len, penalty_factor=factor, filter=filt
  )
  validate(c)
  return c


def test_overlong_penalty_by_hand():
  """DAPO eq. 13, L_max 64, L_cache 16: 0 up to 48, linear to -1 at 64."""
  c = _overlong_config()
  got = overlong.penalty(np.asarray([10, 48, 49, 56, 64]), c)
  np.testing.assert_allclose(got, [0, 0, -1 / 16, -0.5, -1], rtol=1e-6)
  c = _overlong_config(max_len=60, factor=0.5)  # L_max below max_new_tokens: -factor beyond
  np.testing.assert_allclose(overlong.penalty([44, 52, 60, 64], c), [0, -0.25, -0.5, -0.5])
  np.testing.assert_array_equal(overlong.penalty([64], _overlong_config(buffer=0)), [0])
  with pytest.raises(ValueError, match="penalty_buffer"):
    _overlong_config(buffer=65)


def test_overlong_filter_gives_a_cut_row_no_gradient():
  """A row cut at max_new_tokens gets weight 0: the policy loss's gradient is the same
  whatever that row holds, and equals the gradient of the batch without it."""
  from test_steps import LOSS, TINY, _policy_batch  # pylint: disable=import-outside-toplevel

  c = _overlong_config(filt=True)
  resp_len = np.asarray([10, 64, 20, 30, 5, 64, 7, 9])
  m = {}
  w = dynamic_sampling.row_weight(c, resp_len, None, m)
  np.testing.assert_array_equal(w, [1, 0, 1, 1, 1, 0, 1, 1])
  assert m["policy/overlong_masked_rows"] == 2
  params = init_params(TINY, jax.random.key(3))
  batch = dict(_policy_batch(seed=3), row_weight=w)

  def grad(b):
    fn = lambda p: steps.resolve(steps.policy_loss_fn(TINY, LOSS, p, b)[0])
    return jax.grad(fn)(params)

  g = grad(batch)
  other = dict(batch)
  rng = np.random.default_rng(9)
  for k in ("response_tokens", "advantages", "old_logp", "ref_logp"):
    x = np.array(batch[k])
    x[[1, 5]] = rng.permutation(x[[1, 5]].ravel()).reshape(x[[1, 5]].shape)
    x[[1, 5]] = x[[1, 5]] % 127 + 1 if k == "response_tokens" else x[[1, 5]] * 3 + 1
    other[k] = x.astype(batch[k].dtype)
  jax.tree.map(np.testing.assert_array_equal, g, grad(other))
  keep = np.flatnonzero(w)
  without = {k: np.asarray(v)[keep] for k, v in batch.items() if k != "row_weight"}
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g, grad(without)
  )
  assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(g))


def test_merged_rows_weigh_the_sum_of_their_rows():
  tokens = np.asarray([[1, 2], [1, 2], [3, 4], [1, 2]])
  m = merge.merge_rows(
    np.asarray([0, 0, 0, 1]),
    tokens,
    np.asarray([2, 2, 2, 2]),
    row_weight=np.asarray([1.0, 0.0, 1.0, 0.0]),
  )
  np.testing.assert_array_equal(m.weight[: m.distinct], [1, 1, 0])


def test_every_group_informative_replays_the_unfiltered_run(tmp_path):
  """Dynamic sampling on where the first batch is all informative (the tiny config's random
  RM scores every rollout differently): the same step as without it, bit for bit (metrics and
  final params), with its counts beside."""
  from conftest import comparable, final_params  # pylint: disable=import-outside-toplevel
  from test_train import _train  # pylint: disable=import-outside-toplevel

  from cooper_jax.metrics import read_metrics  # pylint: disable=import-outside-toplevel

  _train(tmp_path / "off", steps=2)
  _train(tmp_path / "on", "--config.rollout.dynamic_sampling.enable=True", steps=2)
  off, on = comparable(read_metrics(tmp_path / "off")), comparable(read_metrics(tmp_path / "on"))
  assert all(r["sampling/batches_drawn"] == 1 and r["sampling/informative_frac"] == 1 for r in on)
  assert [{k: r[k] for k in a} for a, r in zip(off, on)] == off
  (sa, pa), (sb, pb) = final_params(tmp_path / "off"), final_params(tmp_path / "on")
  assert sa == sb == 2
  jax.tree.map(np.testing.assert_array_equal, pa, pb)


def test_resume_with_dynamic_sampling_equals_the_straight_run(tmp_path):
  """Cooper on the small task, groups filtered by their rule verdicts (the SFT policy answers
  about half right, so groups of 2 are dropped and replaced), overlong penalty and filter on:
  a run stopped after step 2 and resumed equals the straight run (the prompt iterator's
  position, moved by every batch drawn, is in the checkpoint)."""
  from conftest import comparable, final_params  # pylint: disable=import-outside-toplevel
  from test_train import _small  # pylint: disable=import-outside-toplevel

  ds = (
    "--config.rollout.dynamic_sampling.enable=True",
    "--config.rollout.dynamic_sampling.metric=rule",
    "--config.rollout.dynamic_sampling.max_batches=2",
    "--config.rollout.group_size=2",  # half the groups flat
    "--config.rollout.max_new_tokens=40",  # some responses cut (~30 tokens on average)
    "--config.rollout.overlong.penalty_buffer=16",
    "--config.rollout.overlong.filter=True",
  )
  straight = _small(tmp_path / "straight", "cooper", *ds, steps=4)
  _small(tmp_path / "split", "cooper", *ds, "--config.train.stop_after=2", steps=4)
  split = _small(tmp_path / "split", "cooper", *ds, steps=4)
  assert [r["step"] for r in split] == [1, 2, 3, 4]
  assert sum(r["sampling/batches_drawn"] for r in straight) > 4  # some step drew again
  assert sum(r["pairs/n_valid"] for r in straight) > 0
  assert sum(r["policy/overlong_masked_rows"] for r in straight) > 0
  drop = ("rollout/sampler_compiles", "policy/step_compiles")  # per process
  same = lambda rs: [{k: v for k, v in r.items() if k not in drop} for r in comparable(rs)]
  assert same(straight) == same(split)
  (sa, pa), (sb, pb) = final_params(tmp_path / "straight"), final_params(tmp_path / "split")
  assert sa == sb == 4
  jax.tree.map(np.testing.assert_array_equal, pa, pb)
