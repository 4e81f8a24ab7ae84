"""Positive control for co-training (cooper_jax/tasks/blind_spot.py): an RM with a planted blind
spot (it scores an even final answer as correct whatever the reference) must stop doing so once
Cooper's RM steps train it on pairs that contain the pattern.

If this fails, co-training cannot close a blind spot it is shown, and no study of Cooper on
this codebase means anything.
"""

from pathlib import Path

import jax
import numpy as np
import pytest

from cooper_jax import optim, sharding, steps
from cooper_jax.config import load_config
from cooper_jax.io import read_jsonl
from cooper_jax.prompts import encode_rm_inputs
from cooper_jax.reward_modes import CooperReward, Rollouts, RuleChainReward, RuleReward
from cooper_jax.rewards.verify import RuleVerifier
from cooper_jax.tasks import blind_spot
from cooper_jax.tasks.arith import make_wrong_solution, parse_solution

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20  # Cooper RM steps
ASSETS = ROOT / "experiments" / "assets" / "small_task"


def _rows(name, n):
  return [r for _, r in read_jsonl(ASSETS / "data" / name)][:n]


def _cooper_config(probe_path):
  c = load_config(str(ROOT / "experiments" / "tiny.py") + ":cooper")
  c.rm.model = "random"
  c.rm.tokenizer = str(ASSETS / "policy")
  c.rm.random_model.vocab_size = 529
  c.rm.random_model.n_layers = 1
  c.rm.random_model.d_model = 32
  c.rm.random_model.head_dim = 8
  c.rm.random_model.d_ff = 64
  c.rm.max_len = 192
  c.rm.optim.lr = 1e-3
  c.rm.optim.warmup_steps = 0
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 2
  c.pairs.negatives = "perturb"
  c.data.rm_probe = str(probe_path)
  c.mesh.data = 1  # one device: what is tested is the learning, not the sharding
  return c


def _plant(reward, rows, n_steps=150, seed=0):
  """BCE on the pattern alone (label = even answer, the reference ignored): the planted flaw."""
  rng = np.random.default_rng([seed, 1])
  texts = [r["solution"] for r in rows] + [make_wrong_solution(r, rng) for r in rows]
  refs = [str(r["answer"]) for r in rows] * 2
  questions = [r["question"] for r in rows] * 2
  labels = np.asarray([blind_spot.has_pattern(t) for t in texts], np.float32)
  tok, mask, _ = encode_rm_inputs(reward.tokenizer, questions, refs, texts, 192, pad_to_multiple=64)
  opt = optim.make_optimizer(optim_cfg(3e-3))
  state = sharding.shard_tree(steps.init_state(reward.state["params"], opt), reward.mesh)
  batch = lambda idx: {"tokens": tok[idx], "mask": mask[idx], "labels": labels[idx]}
  step = steps.make_rm_step(reward.cfg, "bce", opt, reward.mesh, state, batch(np.arange(32)))
  for i in range(n_steps):
    state, _ = step(state, batch(rng.permutation(len(texts))[:32]))
  return jax.device_get(state["params"])


def optim_cfg(lr):
  from cooper_jax.config import optim_config  # pylint: disable=import-outside-toplevel

  return optim_config(lr, warmup_steps=0)


class OddNegatives:
  """A negative generator whose negatives never show the pattern: a one-slip wrong solution with
  an odd answer (the control: pairs without the pattern must not close the blind spot)."""

  name = "odd_only"

  def __init__(self, rows):
    self.by_question = {r["question"]: r for r in rows}

  def generate(self, questions, positives, attempt, rng):
    del positives, attempt
    out = []
    for q in questions:
      texts = (make_wrong_solution(self.by_question[q], rng) for _ in range(50))
      out.append(next((t for t in texts if not blind_spot.has_pattern(t)), ""))
    return out


@pytest.mark.parametrize("negatives", ["perturb", "odd_only"])
def test_cotraining_closes_a_planted_blind_spot(tmp_path, negatives):
  from cooper_jax.io import write_jsonl  # pylint: disable=import-outside-toplevel

  probe = blind_spot.probe_rows(_rows("test.jsonl", 64), np.random.default_rng(7))
  assert len(probe) >= 48  # most rows have an even one-slip answer
  write_jsonl(tmp_path / "probe.jsonl", probe)
  c = _cooper_config(tmp_path / "probe.jsonl")
  mesh = sharding.make_mesh(**c.mesh)
  verifier = RuleVerifier(1)
  try:
    reward = CooperReward(c, mesh, verifier)
    pool = _rows("train.jsonl", 2000)[400:]
    if negatives == "odd_only":
      reward.negatives = OddNegatives(pool)
    planted = _plant(reward, _rows("train.jsonl", 400))
    reward.state = dict(reward.state, params=sharding.shard_tree(planted, mesh))
    before = reward.probe_scores()
    # The flaw is there: the RM calls most wrong even answers correct.
    assert np.mean(before > 0.5) > 0.8, before.round(2)

    rng = np.random.default_rng(3)
    history = [float(np.mean(before))]
    for step in range(STEPS):
      rows = [pool[i] for i in rng.choice(len(pool), c.rollout.prompts_per_step, replace=False)]
      # Each group: its gold solution (rule-correct) and a one-slip wrong one (rule-wrong).
      ro = blind_spot.gold_and_slip_rollouts(rows, rng)
      m = reward.update(ro, step)
      assert m["pairs/n_valid"] == len(rows)  # every group has a positive and a negative
      history.append(float(np.mean(reward.probe_scores())))
    if negatives == "perturb":
      # Pairs with the pattern (perturbed answers are often even) close it within STEPS RM
      # steps of 8 pairs (measured: 0.98 -> 0.42 after 7 steps, 0.005 after 15;
      # the odd-only control stayed at 0.82-0.94).
      assert min(history) < 0.5, np.round(history, 3).tolist()
    else:
      # The same RM steps on pairs without the pattern leave the blind spot open.
      assert min(history) > 0.5, np.round(history, 3).tolist()
  finally:
    verifier.close()


def _updates_by_check(probe, ro, checks, negatives, **rollout) -> dict:
  """One CooperReward update of `ro` per pairs.positive_check in `checks` (its metrics)."""
  results = {}
  for check in checks:
    c = _cooper_config(probe)
    c.rollout.update(rollout)
    c.pairs.positive_check = check
    c.pairs.negatives = negatives
    verifier = RuleVerifier(1)
    try:
      results[check] = CooperReward(c, sharding.make_mesh(**c.mesh), verifier).update(ro, 0)
    finally:
      verifier.close()
  return results


def _wrong_chain_rollouts() -> tuple[list[dict], Rollouts]:
  """8 prompts x 2 rollouts: first a right answer reached through a wrong first line (the rule
  accepts it), then the gold solution (prompts 0-3) or a wrong answer (prompts 4-7)."""
  multi = [r for r in _rows("train.jsonl", 40) if r["solution"].count("\n") >= 2][:8]
  assert len(multi) == 8  # two or more lines each
  texts, correct = [], []
  for i, r in enumerate(multi):
    lines = r["solution"].split("\n")
    x, op, y, z = parse_solution(r["solution"])[0]
    wrong_chain = "\n".join([f"{x} {op} {y} = {z + 1}"] + lines[1:])  # right answer, wrong line 1
    texts += [
      wrong_chain,
      r["solution"] if i < 4 else make_wrong_solution(r, np.random.default_rng(i)),
    ]
    correct += [True, i < 4]
  return multi, Rollouts(
    rows=multi,
    questions=[r["question"] for r in multi for _ in range(2)],
    refs=[str(r["answer"]) for r in multi for _ in range(2)],
    texts=texts,
    correct=np.asarray(correct),
    index=np.arange(len(texts)),
    n_total=len(texts),
  )


def test_rule_chain_reward_pays_only_right_chains():
  """reward_mode rule_chain: the rule's 1 only where every line is right too; a row without a
  solution is an error naming it."""
  multi, ro = _wrong_chain_rollouts()
  c = load_config(str(ROOT / "experiments" / "tiny.py") + ":rule")
  c.rollout.group_size = 2
  rule, _ = RuleReward(c).rewards(ro)
  chain, m = RuleChainReward(c).rewards(ro)
  assert rule.tolist() == [1.0] * 8 + [1.0, 0.0] * 4
  assert chain.tolist() == [0.0, 1.0] * 4 + [0.0] * 8
  assert m["reward/chain_refused"] == 8
  del multi[2]["solution"]
  with pytest.raises(ValueError, match="rule_chain.*row"):
    RuleChainReward(c).rewards(ro)


@pytest.mark.parametrize("negatives", ["perturb", "on_policy"])
def test_chain_checked_positives_refuse_a_right_answer_reached_by_wrong_lines(tmp_path, negatives):
  """pairs.positive_check='rule+chain': a rule-correct rollout with a wrong intermediate line is
  no positive; counted in pairs/positives_chain_dropped. With on-policy negatives it is no
  negative either (the rule accepts it)."""
  multi, ro = _wrong_chain_rollouts()
  g = 2
  probe = tmp_path / "probe.jsonl"
  from cooper_jax.io import write_jsonl  # pylint: disable=import-outside-toplevel

  write_jsonl(probe, blind_spot.probe_rows(multi, np.random.default_rng(0)))
  results = _updates_by_check(
    probe, ro, ("rule", "rule+chain"), negatives, prompts_per_step=len(multi), group_size=g
  )
  assert results["rule"]["pairs/positives_chain_dropped"] == 0
  assert results["rule+chain"]["pairs/positives_chain_dropped"] == 8  # every wrong-chain one
  if negatives == "perturb":
    assert results["rule"]["pairs/n_valid"] == 8  # every group has a rule-correct rollout
    # Chain-checked: the 4 groups with a gold solution keep a pair.
    assert results["rule+chain"]["pairs/n_valid"] == 4
  else:
    # On-policy: only groups 4-7 have a rule-rejected rollout; their one rule-correct rollout
    # is the wrong chain, so the chain check leaves them no positive (groups 0-3: no negative).
    assert results["rule"]["pairs/n_valid"] == 4
    assert results["rule+chain"]["pairs/n_valid"] == 0
    assert results["rule+chain"]["pairs/reject_empty"] == 0  # nothing was generated


def test_boxed_positives_refuse_a_right_answer_with_no_boxed_answer(tmp_path):
  """pairs.positive_check='rule+boxed': a rule-correct rollout that does not box its answer
  (math-verify reads its last number) is no positive; counted in
  pairs/positives_unboxed_dropped. Prompts 0-3's right rollout ends in "\\boxed" / "\\boxed{}",
  prompts 4-7's boxes its answer; every second rollout is a boxed wrong answer."""
  rows = _rows("train.jsonl", 8)
  texts = []
  for i, r in enumerate(rows):
    bare = r["solution"].replace(f"\\boxed{{{r['answer']}}}.", "\\boxed" if i % 2 else "\\boxed{}.")
    assert bare != r["solution"] or i >= 4
    texts += [bare if i < 4 else r["solution"], make_wrong_solution(r, np.random.default_rng(i))]
  ro = Rollouts(
    rows=rows,
    questions=[r["question"] for r in rows for _ in range(2)],
    refs=[str(r["answer"]) for r in rows for _ in range(2)],
    texts=texts,
    correct=np.tile([True, False], 8),
    index=np.arange(16),
    n_total=16,
  )
  probe = tmp_path / "probe.jsonl"
  from cooper_jax.io import write_jsonl  # pylint: disable=import-outside-toplevel

  write_jsonl(probe, blind_spot.probe_rows(rows, np.random.default_rng(0)))
  results = _updates_by_check(probe, ro, ("rule", "rule+boxed"), "on_policy")
  assert results["rule"]["pairs/n_valid"] == 8
  assert results["rule"]["pairs/positives_unboxed_dropped"] == 0
  assert results["rule+boxed"]["pairs/n_valid"] == 4  # prompts 4-7 only
  assert results["rule+boxed"]["pairs/positives_unboxed_dropped"] == 4
  assert results["rule+boxed"]["pairs/positives_chain_dropped"] == 0


def test_rm_evaluation_is_rescored_only_when_the_rm_changed(tmp_path):
  """evaluate() keeps its numbers while the RM state is the one it scored (a frozen RM is scored
  once a run), and scores again after an RM step or a new state (a restore), equal to scoring
  the held-out sets afresh."""
  from cooper_jax.io import write_jsonl  # pylint: disable=import-outside-toplevel

  probe = blind_spot.probe_rows(_rows("test.jsonl", 16), np.random.default_rng(7))
  pairs = _rows("rm_eval_pairs.jsonl", 16)
  write_jsonl(tmp_path / "probe.jsonl", probe)
  write_jsonl(tmp_path / "pairs.jsonl", pairs)
  c = _cooper_config(tmp_path / "probe.jsonl")
  c.data.rm_eval_pairs = str(tmp_path / "pairs.jsonl")
  verifier = RuleVerifier(1)
  try:
    reward = CooperReward(c, sharding.make_mesh(**c.mesh), verifier)
    calls, reward_fn = [], reward.reward_fn
    reward.reward_fn = lambda *args: calls.append(1) or reward_fn(*args)

    def afresh():  # the held-out sets scored by `score`, as one batch each
      r, _ = reward.score(
        [p["question"] for p in pairs] * 2,
        [str(p["answer"]) for p in pairs] * 2,
        [p["positive"] for p in pairs] + [p["negative"] for p in pairs],
      )
      pos, neg = r[: len(pairs)], r[len(pairs) :]
      pr, _ = reward.score(
        [p["question"] for p in probe],
        [str(p["answer"]) for p in probe],
        [p["response"] for p in probe],
      )
      return {
        "eval/rm_pair_acc": float(np.mean(pos > neg)),
        "eval/rm_cls_acc": float(np.mean(np.concatenate([pos > 0.5, neg <= 0.5]))),
        "eval/rm_probe_score": float(np.mean(pr)),
        "eval/rm_probe_above_half": float(np.mean(pr > 0.5)),
      }

    first = reward.evaluate()
    assert len(calls) == 2  # the pairs, the probe
    assert reward.evaluate() == first and len(calls) == 2  # the same RM: not scored again
    assert first == afresh()

    rows = _rows("train.jsonl", c.rollout.prompts_per_step)
    m = reward.update(blind_spot.gold_and_slip_rollouts(rows, np.random.default_rng(3)), 0)
    assert m["rm_train/updated"] == 1.0
    calls.clear()
    after = reward.evaluate()
    assert len(calls) == 2 and after["eval/rm_probe_score"] != first["eval/rm_probe_score"]
    assert after == afresh()

    reward.state = dict(reward.state)  # a restored state: a new object, the same values
    calls.clear()
    assert reward.evaluate() == after and len(calls) == 2
  finally:
    verifier.close()
