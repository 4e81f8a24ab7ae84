"""RM input format and the co-training pairs: positives, negatives, acceptance, accounting."""

import time

import numpy as np
import pytest

from cooper_jax import registry
from cooper_jax.prompts import build_rm_input, cut_long_text, encode_rm_inputs
from cooper_jax.rewards.pairs import (
  REJECT_REASONS,
  PerturbNegatives,
  build_on_policy_pairs,
  build_pairs,
  check_negatives,
  pair_records,
  perturb_solution,
  select_positives,
)
from cooper_jax.rewards.rewrite import (
  REWRITE_SYSTEM,
  LLMRewriteNegatives,
  rewrite_chat_prompt,
  rewrite_prompt,
  rewrite_token_budget,
)
from cooper_jax.rewards.verify import RuleVerifier, differ_one


# Top-level so the spawned verifier worker can import it by name.
def slow_differ(a_text: str, b_text: str):
  """differ_one, except a "SLOW" negative overruns any deadline (as a sympy blow-up would)."""
  if a_text == "SLOW":
    time.sleep(60)
  return differ_one(a_text, b_text)


@pytest.fixture(scope="module")
def verifier():
  with RuleVerifier(num_workers=1, differ_fn=slow_differ) as v:
    yield v


@pytest.fixture(scope="module")
def tok():
  from cooper_jax.tokenizer import load_tokenizer

  return load_tokenizer("smollm2-135m-instruct")


# ---- RM input ------------------------------------------------------------------------------


def test_rm_input_exact_format():
  got = build_rm_input("What is 2+2?", "4", "2+2 = \\boxed{4}")
  assert got == (
    "<question>What is 2+2?</question>\n"
    "<reference_answer>4</reference_answer>\n"
    "<completion>2+2 = \\boxed{4}</completion>"
  )


def test_cut_keeps_first_500_and_last_1000_chars():
  text = "A" * 500 + "B" * 1500 + "C" * 1000  # 3000 chars
  cut = cut_long_text(text)
  assert cut == "A" * 500 + "C" * 1000  # every B (the middle) is gone
  assert len(cut) == 1500
  assert cut_long_text("x" * 1500) == "x" * 1500  # the reference cuts only when > 1500
  assert cut_long_text("y" * 1501) == "y" * 500 + "y" * 1000
  # Reference and completion are cut, the question is not.
  q = "Q" * 2000
  s = build_rm_input(q, text, text)
  assert (
    s == f"<question>{q}</question>\n<reference_answer>{cut}</reference_answer>\n"
    f"<completion>{cut}</completion>"
  )


def test_encode_rm_inputs_left_pads_and_keeps_the_end(tok):
  qs, refs = ["What is 2+2?", "Long " * 300], ["4", "7"]
  comps = ["\\boxed{4}", "So the answer is \\boxed{7}"]
  full = [tok.encode(build_rm_input(q, a, o)) for q, a, o in zip(qs, refs, comps)]
  assert len(full[0]) < 64 < len(full[1])
  tokens, mask, cut = encode_rm_inputs(tok, qs, refs, comps, max_len=64)
  assert tokens.dtype == np.int32 and mask.dtype == np.bool_ and tokens.shape == (2, 64)
  assert cut.tolist() == [False, True]
  assert tokens[1].tolist() == full[1][-64:] and mask[1].all()  # the completion end survives
  k = len(full[0])
  assert tokens[0, -k:].tolist() == full[0] and mask[0, -k:].all() and not mask[0, :-k].any()
  assert (tokens[0, :-k] == tok.pad_id).all()
  # Nothing too long: width is the longest row rounded up, no truncation.
  tokens, mask, cut = encode_rm_inputs(
    tok, qs[:1], refs[:1], comps[:1], max_len=512, pad_to_multiple=16
  )
  assert not cut.any() and tokens.shape == (1, -(-k // 16) * 16)


# ---- positives -----------------------------------------------------------------------------

CORRECT = np.array([[0, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool).reshape(-1)


def test_select_positives_first_random_none():
  assert select_positives(CORRECT, 4).tolist() == [1, -1, 8]
  seen = set()
  for seed in range(20):
    idx = select_positives(CORRECT, 4, "random", np.random.default_rng(seed))
    assert idx[0] in (1, 3) and idx[1] == -1 and 8 <= idx[2] < 12
    seen.add(int(idx[0]))
  assert seen == {1, 3}
  a = select_positives(CORRECT, 4, "random", np.random.default_rng(7))
  assert a.tolist() == select_positives(CORRECT, 4, "random", np.random.default_rng(7)).tolist()
  assert select_positives(np.zeros(8, bool), 4).tolist() == [-1, -1]
  with pytest.raises(ValueError):
    select_positives(CORRECT, 4, "random")  # no rng: not reproducible
  with pytest.raises(ValueError):
    select_positives(CORRECT, 5)


# ---- perturbation --------------------------------------------------------------------------


@pytest.mark.parametrize(
  "text",
  [
    "So she makes \\boxed{18}",
    "the answer is 42.",
    "Half of it: \\boxed{\\frac{1}{2}}",
    "\\boxed{70,000}",
    "\\boxed{0.5}",
    "\\boxed{x}",
    "\\boxed{(3, \\frac{\\pi}{2})}",
  ],
)
def test_perturb_changes_the_answer(verifier, text):
  rng = np.random.default_rng(0)
  for attempt in range(3):
    neg = perturb_solution(text, rng, attempt)
    assert neg and neg != text
    res = verifier.differ_batch([neg], [text])
    assert res.status == ["ok"] and res.differ == [True], (neg, res.answers)


def test_perturb_is_deterministic_and_consistent():
  text = "18 = 9 * 2, not 180. So the total is 18. \\boxed{18}"
  a = perturb_solution(text, np.random.default_rng(3))
  assert a == perturb_solution(text, np.random.default_rng(3))
  new = a.split("\\boxed{")[1].rstrip("}")
  assert new != "18"
  # Every standalone 18 becomes the new answer; 180 and the other numbers stay.
  assert a == f"{new} = 9 * 2, not 180. So the total is {new}. \\boxed{{{new}}}"
  assert perturb_solution("\\boxed{\\frac{1}{2}}", np.random.default_rng(0)).startswith(
    "\\boxed{\\frac{"
  )


def test_perturb_without_a_number_is_a_counted_reject(verifier):
  assert perturb_solution("No number here at all.", np.random.default_rng(0)) == ""
  assert perturb_solution("\\boxed{}", np.random.default_rng(0)) == ""
  reasons = check_negatives(
    verifier, ["", "   ", "I give up.", "\\boxed{5}", "\\boxed{3}"], ["\\boxed{3}"] * 5
  )
  assert reasons == ["empty", "empty", "no_answer", None, "same_answer"]
  # The reference code's looser rule accepts a negative without an answer.
  assert check_negatives(verifier, ["I give up."], ["\\boxed{3}"], accept_no_answer=True) == [None]


def test_verifier_timeout_is_a_reject_not_an_accept(verifier):
  reasons = check_negatives(verifier, ["SLOW", "\\boxed{4}"], ["\\boxed{3}"] * 2, deadline_s=1.0)
  assert reasons == ["timeout", None]


# ---- build_pairs ---------------------------------------------------------------------------


def _batch():
  """4 prompts x G=4: p0 correct at 1 and 3, p1 none, p2 at 8, p3 at 14 (no number)."""
  comps = [
    "\\boxed{17}",
    "So 18 apples. \\boxed{18}",
    "\\boxed{19}",
    "\\boxed{18}",
    "wrong",
    "wrong",
    "wrong",
    "wrong",
    "x = 7, so \\boxed{7}",
    "no",
    "no",
    "no",
    "no",
    "no",
    "It is the empty set.",
    "no",
  ]
  correct = np.zeros(16, bool)
  correct[[1, 3, 8, 14]] = True
  qs = [f"question {i}" for i in range(4)]
  refs = ["18", "5", "7", "\\emptyset"]
  return qs, refs, comps, correct


def test_build_pairs_counts(verifier):
  qs, refs, comps, correct = _batch()
  pairs, stats = build_pairs(
    qs, refs, comps, correct, 4, PerturbNegatives(), verifier, rng=np.random.default_rng(0)
  )
  assert pairs.valid.tolist() == [True, False, True, False]
  assert pairs.positive_index.tolist() == [1, -1, 8, 14]
  assert pairs.positives == [comps[1], "", comps[8], comps[14]]
  assert pairs.drop_reason == [None, "no_positive", None, "empty"]
  assert pairs.negatives[1] == pairs.negatives[3] == ""
  assert "18" not in pairs.negatives[0] and pairs.negatives[0].startswith("So ")
  assert stats["n_prompts"] == 4 and stats["n_with_positive"] == 3
  assert stats["n_valid"] == 2 and stats["valid_pair_rate"] == 0.5
  assert stats["negative_tries"] == 3 + 1 + 1  # p3 tried max_tries=3 times
  assert stats["rejects"] == {**dict.fromkeys(REJECT_REASONS, 0), "empty": 3}
  assert stats["dropped_no_positive"] == 1 and stats["dropped_max_tries"] == 1


def test_pair_records_keep_every_candidate_with_its_reason(verifier):
  """pairs.jsonl's rows: per prompt the pair or why none, and every candidate negative made,
  in order, with its reject reason (None: the accepted one)."""
  qs, refs, comps, correct = _batch()
  pairs, stats = build_pairs(
    qs, refs, comps, correct, 4, PerturbNegatives(), verifier, rng=np.random.default_rng(0)
  )
  rows = pair_records(pairs, step=5, prompt_ids=[8, 9, 10, 11], limit=3)
  assert [r["prompt"] for r in rows] == [8, 9, 10] and {r["step"] for r in rows} == {5}
  assert [r["accepted"] for r in rows] == [True, False, True]
  assert [r["reason"] for r in rows] == [None, "no_positive", None]
  assert rows[0]["positive"] == comps[1] and rows[0]["positive_row"] == 1
  assert rows[0]["candidates"] == [{"text": pairs.negatives[0], "reason": None}]
  assert rows[1]["candidates"] == [] and rows[1]["positive_row"] == -1
  # All four prompts: the candidates are the tries, their reasons the reject counts.
  every = pair_records(pairs, 1, range(4), limit=100)
  cands = [c for r in every for c in r["candidates"]]
  assert len(cands) == stats["negative_tries"] == 5
  assert [c["reason"] for c in every[3]["candidates"]] == ["empty"] * 3
  for reason, n in stats["rejects"].items():
    assert sum(c["reason"] == reason for c in cands) == n
  on_policy, _ = build_on_policy_pairs(qs, refs, comps, correct, 4, rng=np.random.default_rng(0))
  assert all(r["candidates"] == [] for r in pair_records(on_policy, 1, range(4), 4))


def test_on_policy_pairs_take_a_rejected_rollout_of_the_same_group():
  qs = ["q0", "q1", "q2"]
  comps = [f"p{p}r{i}" for p in range(3) for i in range(4)]
  correct = np.array([0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1], bool)
  for seed in range(5):
    pairs, stats = build_on_policy_pairs(
      qs, ["1", "2", "3"], comps, correct, 4, rng=np.random.default_rng(seed)
    )
    assert pairs.valid.tolist() == [True, False, False]
    assert pairs.drop_reason == [None, "no_positive", "no_negative"]
    assert pairs.positives[0] == "p0r1"
    assert pairs.negatives[0] in ("p0r0", "p0r2", "p0r3")
    assert pairs.negatives[1:] == ["", ""]
  assert stats["n_valid"] == 1 and stats["n_with_positive"] == 2
  assert stats["negative_tries"] == 0 and set(stats["rejects"]) == set(REJECT_REASONS)
  with pytest.raises(ValueError, match="completions"):
    build_on_policy_pairs(qs, ["1"] * 3, comps[:-1], correct[:-1], 4, rng=np.random.default_rng())


def test_on_policy_pairs_take_positives_only_where_positive_ok():
  """A stricter positive check (rule+chain): a rule-correct rollout it refuses is neither the
  positive nor a negative; a group whose only correct rollouts are refused gives no pair."""
  qs = ["q0", "q1"]
  comps = [f"p{p}r{i}" for p in range(2) for i in range(4)]
  correct = np.array([1, 1, 0, 0, 1, 0, 0, 0], bool)
  ok = np.array([0, 1, 0, 0, 0, 0, 0, 0], bool)  # p0r0 and p1r0: right answer, wrong chain
  for seed in range(5):
    pairs, _ = build_on_policy_pairs(
      qs, ["1", "2"], comps, correct, 4, rng=np.random.default_rng(seed), positive_ok=ok
    )
    assert pairs.valid.tolist() == [True, False]
    assert pairs.positives[0] == "p0r1" and pairs.negatives[0] in ("p0r2", "p0r3")
    assert pairs.drop_reason == [None, "no_positive"]
  with pytest.raises(ValueError, match="rejected"):
    build_on_policy_pairs(
      qs, ["1", "2"], comps, correct, 4, rng=np.random.default_rng(), positive_ok=~correct
    )


class EchoNegatives:
  """A broken generator: hands the positive back unchanged."""

  name = "echo"

  def __init__(self):
    self.calls = []

  def generate(self, questions, positives, attempt, rng):
    self.calls.append((attempt, len(positives)))
    return list(positives)


def test_unchanged_negative_is_rejected_max_tries_then_dropped(verifier):
  qs, refs, comps, correct = _batch()
  gen = EchoNegatives()
  pairs, stats = build_pairs(
    qs[:1],
    refs[:1],
    comps[:4],
    correct[:4],
    4,
    gen,
    verifier,
    rng=np.random.default_rng(0),
    max_tries=3,
  )
  assert gen.calls == [(0, 1), (1, 1), (2, 1)]
  assert not pairs.valid.any() and pairs.drop_reason == ["same_answer"]
  assert stats["rejects"]["same_answer"] == 3 and stats["negative_tries"] == 3
  assert stats["n_valid"] == 0 and stats["dropped_max_tries"] == 1


def test_build_pairs_checks_shapes(verifier):
  qs, refs, comps, correct = _batch()
  with pytest.raises(ValueError):
    build_pairs(
      qs,
      refs,
      comps[:-1],
      correct[:-1],
      4,
      PerturbNegatives(),
      verifier,
      rng=np.random.default_rng(0),
    )


def test_generators_by_name():
  assert registry.resolve("pairs.negatives", "perturb") is PerturbNegatives
  assert registry.resolve("pairs.negatives", "llm_rewrite") is LLMRewriteNegatives
  assert registry.resolve("pairs.negatives", "on_policy") is None
  with pytest.raises(ValueError, match=r"pairs.negatives='nope': expected one of \['llm_rewrite'"):
    registry.resolve("pairs.negatives", "nope")


# ---- LLM rewrite ---------------------------------------------------------------------------


def test_rewrite_prompt_is_pure_and_complete():
  p = rewrite_prompt("What is 3*6?", "3*6 = \\boxed{18}")
  assert p == rewrite_prompt("What is 3*6?", "3*6 = \\boxed{18}")
  assert "What is 3*6?" in p and "3*6 = \\boxed{18}" in p and "\\boxed{}" in p
  for must in (
    "wrong reasoning",
    "different from the correct one",
    "same length",
    "looks like a genuine",
    "\\boxed{answer}",
  ):
    assert must in REWRITE_SYSTEM
  assert rewrite_token_budget("one two  three\nfour") == 504


def test_llm_rewrite_negatives_generate(tiny_smol, verifier):
  cfg, params, tok = tiny_smol
  gen = LLMRewriteNegatives(cfg, params, tok, max_new_tokens=8)
  assert isinstance(gen, LLMRewriteNegatives) and gen.temperature == 0.7
  qs = ["What is 3*6?", "What is 2+2?", "Name a prime."]
  pos = ["3*6 = \\boxed{18}", "2+2 = \\boxed{4}", "\\boxed{7}"]
  chat = gen.chat_prompts(qs, pos)
  assert REWRITE_SYSTEM in chat[0] and pos[0] in chat[0] and qs[0] in chat[0]
  assert chat[0] == tok.chat_prompt(rewrite_prompt(qs[0], pos[0]), system=REWRITE_SYSTEM)
  outs = gen.generate(qs, pos, 0, np.random.default_rng(0))  # 3 rows, padded to 4
  assert len(outs) == 3 and all(isinstance(o, str) for o in outs)
  assert outs == gen.generate(qs, pos, 0, np.random.default_rng(0))  # seeded
  # Through build_pairs: random-model text is rejected or accepted, but always counted.
  correct = np.array([1, 0, 1, 0, 0, 1], bool)
  comps = [pos[0], "x", pos[1], "x", "x", pos[2]]
  pairs, stats = build_pairs(
    qs,
    ["18", "4", "7"],
    comps,
    correct,
    2,
    gen,
    verifier,
    rng=np.random.default_rng(1),
    max_tries=1,
  )
  assert stats["negative_tries"] == 3
  assert stats["n_valid"] + sum(stats["rejects"].values()) == 3
  assert stats["dropped_max_tries"] == 3 - stats["n_valid"]


def test_llm_rewrite_min_rows_keeps_one_batch_shape_and_the_same_rewrites(tiny_smol):
  """min_rows pads every call, first try and retries, to one row count: one sampler shape
  where 1, 3 and 5 rows would take three; the filler rows change no real row's rewrite (each
  row is drawn with its own key)."""
  cfg, params, tok = tiny_smol
  qs = ["What is 3*6?", "What is 2+2?", "Name a prime.", "What is 9-1?", "What is 5*5?"]
  pos = ["3*6 = \\boxed{18}", "2+2 = \\boxed{4}", "\\boxed{7}", "9-1 = 8", "\\boxed{25}"]
  seeds = [11, 22, 33, 44, 55]
  padded = LLMRewriteNegatives(cfg, params, tok, max_new_tokens=6, min_rows=8)
  plain = LLMRewriteNegatives(cfg, params, tok, max_new_tokens=6)
  shapes = []
  inner = padded._sample

  def recording(tokens, mask, keys, n):
    shapes.append(tuple(tokens.shape))
    return inner(tokens, mask, keys, n)

  padded._sample = recording
  rng = np.random.default_rng(0)
  for n in (1, 3, 5):
    got = padded.generate(qs[:n], pos[:n], 0, rng, row_seeds=seeds[:n])
    assert got == plain.generate(qs[:n], pos[:n], 0, rng, row_seeds=seeds[:n])
  assert [s[0] for s in shapes] == [8, 8, 8]  # unpadded: 1, 4, 8 rows
  assert len(set(shapes)) == 1


def test_plain_rewrite_format_is_the_question_and_solution_alone(tiny_smol):
  """The format an assistant without instructions is trained on (tools/assets/train_small_rewriter.py):
  the user turn is the question, a newline and the correct solution; no system message."""

  cfg, params, tok = tiny_smol
  q, p = "Tom has 3 apples. He gets 4 more. How many?", "3 + 4 = 7\nThe answer is \\boxed{7}."
  plain = rewrite_chat_prompt(tok, q, p, "plain")
  assert plain == tok.chat_prompt(q + "\n" + p)
  assert REWRITE_SYSTEM not in plain
  gen = LLMRewriteNegatives(cfg, params, tok, max_new_tokens=4, prompt_format="plain")
  assert gen.chat_prompts([q], [p]) == [plain]
  with pytest.raises(ValueError, match="expected one of"):
    LLMRewriteNegatives(cfg, params, tok, max_new_tokens=4, prompt_format="chat")
