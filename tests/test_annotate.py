"""LLM judge, hybrid-annotation agreement filter, verifier metrics and exact_int gold labels."""

import importlib.util
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import stats
from cooper_jax.cli import annotate, pretrain_rm  # noqa: E402
from cooper_jax.models.tolerance import float32_logit_atol
from cooper_jax.models.transformer import forward
from cooper_jax.prompts import cut_long_text
from cooper_jax.rewards.judge import (
  control_items,
  describe_control,
  judge_control,
  judge_prompt,
  llm_judge,
)
from cooper_jax.rewards.verify import RuleVerifier

_spec = importlib.util.spec_from_file_location(
  "_tool_compare_verifiers",
  Path(__file__).resolve().parent.parent / "tools" / "analysis" / "compare_verifiers.py",
)
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


@pytest.fixture(scope="module")
def tiny(tiny_smol):
  return tiny_smol


def test_judge_prompt_contents_and_cut():
  long = "A" * 600 + "B" * 2000 + "\\boxed{7}"
  p = judge_prompt("What is 3+4?", "7", long)
  assert "What is 3+4?" in p and "Reference answer:\n7" in p
  assert cut_long_text(long) in p and long not in p  # cut as the RM input is: 500 + 1000
  assert len(cut_long_text(long)) == 1500 and p.count("\\boxed{7}") == 1
  assert "Answer with only 'yes' or 'no'." in p
  short = judge_prompt("q", "r", "short answer \\boxed{1}")
  assert "short answer \\boxed{1}" in short


def test_llm_judge_matches_forward_logits(tiny):
  cfg, params, tok = tiny
  qs = ["What is 2+2?", "How many legs does a cat have?", "What is 10/2?"]
  refs = ["4", "4", "5"]
  comps = ["2+2 = 4, so \\boxed{4}.", "Cats have \\boxed{3} legs." * 3, "\\boxed{5}"]
  labels, stats = llm_judge(cfg, params, tok, qs, refs, comps, batch_size=2)
  assert labels.shape == (3,) and labels.dtype == np.int8
  assert set(labels.tolist()) <= {0, 1} and stats["undecided"] == 0
  assert stats["yes"] + stats["no"] == 3 and len(stats["p_yes"]) == 3

  # Independent check: token ids from the words, full forward() per prompt, last position.
  yes_ids = [tok.encode(w)[0] for w in ("yes", "Yes", " yes", " Yes")]
  no_ids = [tok.encode(w)[0] for w in ("no", "No", " no", " No")]
  assert all(len(tok.encode(w)) == 1 for w in ("yes", "Yes", "no", "No"))
  assert sorted(stats["yes_token_ids"]) == sorted(yes_ids)
  assert sorted(stats["no_token_ids"]) == sorted(no_ids)
  for i in range(3):
    ids = tok.encode(tok.chat_prompt(judge_prompt(qs[i], refs[i], comps[i])))
    logits = np.asarray(
      forward(cfg, params, jnp.asarray([ids], jnp.int32), jnp.ones((1, len(ids)), bool))
    )[0, -1].astype(np.float64)
    lse = lambda idx: np.logaddexp.reduce(logits[idx])  # same log-normaliser on both sides
    assert labels[i] == int(lse(yes_ids) > lse(no_ids))
    p_yes = 1 / (1 + np.exp(lse(no_ids) - lse(yes_ids)))
    # A logit error d (the judge's batched, padded forward vs this one) moves each lse by at
    # most d, their difference by 2 d, and the sigmoid of it by at most 2 d / 4.
    d = float32_logit_atol(cfg, float(np.abs(logits).max()), len(ids))
    assert stats["p_yes"][i] == pytest.approx(p_yes, abs=d / 2)


def test_agreement_filter_hand_built():
  kept, s = annotate.agreement_filter([1, 0, 1, 0], [1, 1, 1, 0])
  assert kept.tolist() == [0, 2, 3]
  assert s["n"] == 4 and s["kept"] == 3 and s["agreement_rate"] == 0.75
  assert s["kept_positive"] == 2 and s["kept_negative"] == 1
  assert s["confusion"] == {
    "rule=1": {"judge=1": 2, "judge=0": 0, "judge=-1": 0},
    "rule=0": {"judge=1": 1, "judge=0": 1, "judge=-1": 0},
    "rule=-1": {"judge=1": 0, "judge=0": 0, "judge=-1": 0},
  }
  # po = 0.75, pe = 0.5*0.75 + 0.5*0.25 = 0.5 -> kappa 0.5
  assert s["cohen_kappa"] == pytest.approx(0.5)
  kept, s = annotate.agreement_filter([1, -1, 0], [1, 1, -1])  # undecided never kept
  assert kept.tolist() == [0] and s["rule_undecided"] == 1 and s["judge_undecided"] == 1
  assert s["confusion"]["rule=-1"]["judge=1"] == 1 and s["confusion"]["rule=0"]["judge=-1"] == 1


def test_parse_policies_and_paths():
  assert annotate.parse_policies("a@0.7, b ,c@x", 1.0) == [("a", 0.7), ("b", 1.0), ("c@x", 1.0)]
  p = annotate.out_paths("runs/x.jsonl")
  assert str(p["kept"]) == "runs/x.kept.jsonl" and str(p["stats"]) == "runs/x.stats.json"


def test_binary_metrics_hand_computed():
  # pred 1 1 1 0 0 -1 ; gold 1 1 0 1 0 1 -> tp 2, fp 1, fn 2 (one undecided), tn 1
  m = stats.binary_metrics([1, 1, 1, 0, 0, -1], [1, 1, 0, 1, 0, 1])
  assert (m["tp"], m["fp"], m["fn"], m["tn"], m["undecided"]) == (2, 1, 2, 1, 1)
  assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(0.5)
  assert m["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
  assert m["accuracy"] == pytest.approx(0.5)
  assert stats.binary_metrics([0, 0], [1, 0])["precision"] is None  # no positives predicted
  ci = stats.bootstrap_binary_metrics(
    [1, 1, 1, 0, 0, -1], [1, 1, 0, 1, 0, 1], [0, 0, 1, 1, 2, 2], n_resamples=200
  )
  lo, hi = ci["precision"]
  assert 0 <= lo <= 2 / 3 <= hi <= 1


def test_sign_test_and_auc_hand_computed():
  # 10 : 2 -> 2 (C(12,0) + C(12,1) + C(12,2)) / 2^12 = 158 / 4096
  assert stats.sign_test(10, 2) == pytest.approx(158 / 4096)
  assert stats.sign_test(2, 10) == pytest.approx(158 / 4096)
  assert stats.sign_test(3, 3) == 1.0 and stats.sign_test(0, 0) == 1.0
  assert stats.sign_test(5, 0) == pytest.approx(2 / 32)
  # pairs (pos, neg): 0.9>0.4, 0.9>0.1, 0.4=0.4 (1/2), 0.4>0.1 -> 3.5 / 4
  assert stats.roc_auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx(0.875)
  assert stats.roc_auc([0.3, 0.2], [1, 1]) is None


REFS = ["42", "1,000", "3.5", "0", "\\frac{1}{2}", "x^2", "-7", ""]


def test_control_items_are_right_and_wrong_by_math_verify():
  idx, right, wrong = control_items(REFS, seed=3)
  assert idx == list(range(len(REFS) - 1))  # only the empty reference is skipped
  refs = [REFS[i] for i in idx]
  with RuleVerifier(1) as v:
    good = v.verify(right, refs, 5.0).labels()
    bad = v.verify(wrong, refs, 5.0).labels()
  assert list(good) == [1] * len(idx) and list(bad) == [0] * len(idx)
  # the two solutions differ only inside the box
  for r, w in zip(right, wrong):
    assert r.split("\\boxed")[0] == w.split("\\boxed")[0] and r != w


def _fake_judge(p_of):
  """A judge_fn whose p_yes is p_of(reference, boxed answer)."""

  def judge_fn(questions, references, completions):
    boxed = [c.split("\\boxed{")[1].rsplit("}$", 1)[0] for c in completions]
    p = [p_of(r, b) for r, b in zip(references, boxed)]
    return np.array([-1 if x is None else int(x > 0.5) for x in p]), {"p_yes": p}

  return judge_fn


def test_judge_control_oracle_chance_and_inverted():
  qs = [f"q{i}" for i in range(len(REFS))]
  n = len(REFS) - 1
  oracle = judge_control(_fake_judge(lambda r, b: float(r == b)), qs, REFS)
  assert oracle["n_items"] == 2 * n and oracle["skipped"] == 1
  assert oracle["auc"] == 1.0 and oracle["prefers_right"] == n and oracle["ties"] == 0
  assert oracle["sign_test_p"] == pytest.approx(2 / 2**n) and oracle["discriminates"]
  assert (oracle["yes_rate_right"], oracle["yes_rate_wrong"]) == (1.0, 0.0)
  flat = judge_control(_fake_judge(lambda r, b: 0.7), qs, REFS)
  assert flat["auc"] == 0.5 and flat["ties"] == n and flat["sign_test_p"] == 1.0
  assert not flat["discriminates"]
  inverted = judge_control(_fake_judge(lambda r, b: float(r != b)), qs, REFS)
  assert inverted["auc"] == 0.0 and inverted["prefers_wrong"] == n
  assert not inverted["discriminates"]  # significant, but the wrong way round
  none = judge_control(_fake_judge(lambda r, b: None), qs, REFS)  # every item undecided
  assert none["undecided_items"] == 2 * n and none["auc"] is None and not none["discriminates"]
  assert describe_control(oracle).endswith(": the judge discriminates")
  assert "AUC 0.500" in describe_control(flat) and "does not discriminate" in describe_control(flat)
  assert describe_control(none).startswith("judge control: no decided item")
  assert describe_control(None) == "judge control: not run"


def test_pretrain_rm_heldout_metrics_undefined_is_none(tiny):
  _, _, tok = tiny

  def fixed(probs):
    return lambda params, tokens, mask: np.asarray(probs[: tokens.shape[0]])

  def triples(labels):
    return [{"question": "q", "reference": "1", "completion": "c", "label": y} for y in labels]

  # no correct triple held out and none predicted: precision and recall undefined, not 0
  m = pretrain_rm.heldout_metrics(fixed([0.1, 0.2, 0.3, 0.4]), None, tok, triples([0] * 4), 64)
  assert m["precision"] is None and m["recall"] is None
  assert (m["tp"], m["fp"], m["fn"], m["tn"], m["accuracy"]) == (0, 0, 0, 4, 1.0)
  # scores 0.9 0.6 0.2 0.1 on labels 1 0 1 0: tp 1, fp 1, fn 1, tn 1
  m = pretrain_rm.heldout_metrics(fixed([0.9, 0.6, 0.2, 0.1]), None, tok, triples([1, 0, 1, 0]), 64)
  assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (1, 1, 1, 1)
  assert m["precision"] == 0.5 and m["recall"] == 0.5 and m["accuracy"] == 0.5
  assert m["auc"] == 0.75  # positives 0.9, 0.2 over negatives 0.6, 0.1: 3 of 4 orderings
  # one question: pairs (0.9, 0.6) (0.9, 0.1) (0.2, 0.6) (0.2, 0.1), the third one wrong
  assert (m["pair_acc"], m["n_pairs"], m["n_pair_questions"]) == (0.75, 4, 1)


def test_pretrain_rm_pair_accuracy_pairs_within_a_question_only():
  rows = [
    {"question": q, "label": y} for q, y in (("a", 1), ("a", 0), ("b", 1), ("b", 0), ("c", 1))
  ]
  # a: 0.4 > 0.3 right; b: 0.2 < 0.5 wrong (0.4 > 0.2 across questions is no pair); c: no pair
  m = pretrain_rm.pair_accuracy(np.asarray([0.4, 0.3, 0.2, 0.5, 0.9]), rows)
  assert m == {"pair_acc": 0.5, "n_pairs": 2, "n_pair_questions": 2}
  tie = pretrain_rm.pair_accuracy(np.asarray([0.5, 0.5]), rows[:2])
  assert tie["pair_acc"] == 0.0  # a tie is an error, as eval/rm_pair_acc counts it
  assert pretrain_rm.pair_accuracy(np.asarray([0.9]), rows[4:])["pair_acc"] is None


def test_pretrain_rm_hybrid_label_needs_rollouts():
  with pytest.raises(SystemExit):
    pretrain_rm.parse_args(
      ["--data", "x.jsonl", "--backbone", "b", "--out", "o", "--label", "rule+chain"]
    )
  a = pretrain_rm.parse_args(["--from_policy", "p", "--questions", "q", "--out", "o"])
  assert a.label == "rule"  # the default is unchanged


def test_exact_int_gold():
  f = compare.exact_int_label
  assert f("so the total is \\boxed{42}.", "42") == 1
  assert f("\\boxed{41}", "42") == 0
  assert f("the answer is 1,000", "1000") == 1
  assert f("I cannot tell.", "7") == 0
  assert f("first \\boxed{3}, corrected: \\boxed{\\$1{,}200.00}", "1200") == 1  # last box wins
  assert f("\\boxed{42} ... then 17 more words 99", "42") == 1  # a box beats the last number
  assert f("\\boxed{\\frac{84}{2}}", "42") == 0  # strict on form: not a plain integer
  assert f("10-3=7", "7") == 1 and f("10-3", "-3") == 0  # a binary minus is not a sign
  with pytest.raises(ValueError):
    f("\\boxed{1}", "3/4")
  labels, how, counts = compare.exact_int_labels(["\\boxed{2}", "x"], ["2", "1/2"])
  assert labels.tolist() == [1, -1] and counts == {"boxed": 1, "ref_not_integer": 1}
