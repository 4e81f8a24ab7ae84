"""Rule verifier: correctness on GSM8K/LaTeX answers, deadlines, crashes, accounting."""

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from cooper_jax.rewards.verify import (
  STATUSES,
  RuleVerifier,
  parse_reference,
  verify_one,
)

DATA = Path(__file__).resolve().parent.parent / "data"
DEADLINE = 1.5


# Top-level so spawned workers can import them by name.
def faulty_verify(completion: str, reference: str):
  """verify_one, except on sentinel inputs that misbehave the way real bugs do."""
  if completion == "HANG":
    # Like a hang inside a C extension: no signal can interrupt it, only a kill.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
  if completion == "SLOW":
    time.sleep(60)  # interruptible: the in-worker soft timer ends it
  if completion == "CRASH":
    os._exit(3)
  if completion == "RAISE":
    raise RuntimeError("boom")
  return verify_one(completion, reference)


@pytest.fixture(scope="module")
def pool():
  with RuleVerifier(num_workers=2, worker_fn=faulty_verify) as v:
    yield v


CASES = [  # (completion, reference, expected correct)
  ("\\boxed{18}", "18", True),
  ("So she makes $18 every day.", "18", True),  # no box: last number
  ("\\boxed{17}", "18", False),
  ("The answer is \\boxed{0.5}", "\\frac{1}{2}", True),
  ("$\\frac{1}{2}$", "0.5", True),
  ("\\boxed{70,000}", "70000", True),
  ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
  ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)", False),
  ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", True),
  ("\\boxed{4.6667}", "\\frac{14}{3}", False),
  ("\\boxed{10\\%}", "10\\%", True),
  ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", True),
  ("\\boxed{18.90}", "\\$18.90", True),
]


def test_correct_and_incorrect(pool):
  comps, refs, want = zip(*CASES)
  r = pool.verify(list(comps), list(refs), deadline_s=5.0)
  assert r.correct.dtype == np.bool_
  assert r.correct.tolist() == list(want), list(zip(comps, r.correct, r.status, r.pred))
  assert r.status == ["ok"] * len(CASES)
  assert r.counts == {**dict.fromkeys(STATUSES, 0), "ok": len(CASES)}
  assert r.pred[0] == "18" and r.pred[2] == "17"


def test_no_answer_and_bad_reference_are_counted(pool):
  r = pool.verify(
    ["I am not sure.", "", "\\boxed{3}", "\\boxed{3}"], ["18", "18", "\\boxed{}", "3"]
  )
  assert r.status == ["no_answer", "no_answer", "ref_parse_error", "ok"]
  assert r.correct.tolist() == [False, False, False, True]
  assert r.counts["no_answer"] == 2 and r.counts["ref_parse_error"] == 1
  assert "did not parse" in r.detail[2]


def test_reference_formats_parse():
  # Plain LaTeX references are wrapped in \boxed{} so they parse whole (bare, the tuple
  # would parse to just "3" and "\$18.90" to nothing).
  for ref, want in [
    ("18", "18"),
    ("70000", "70000"),
    ("\\frac{14}{3}", "\\frac{14}{3}"),
    ("10\\%", "10\\%"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", None),
    ("\\$18.90", "18.90"),
    ("\\boxed{5}", "5"),
  ]:
    parsed = parse_reference(ref)
    assert parsed, ref
    if want is not None:
      assert parsed[-1] == want
  assert str(parse_reference("\\left( 3, \\frac{\\pi}{2} \\right)")[0]) == "(3, pi/2)"


def test_hang_is_killed_and_pool_recovers(pool):
  comps = ["\\boxed{1}", "HANG", "\\boxed{2}", "\\boxed{3}", "\\boxed{5}", "\\boxed{4}"]
  refs = ["1", "1", "2", "3", "4", "4"]
  t0 = time.monotonic()
  r = pool.verify(comps, refs, deadline_s=DEADLINE)
  assert time.monotonic() - t0 < DEADLINE + 4
  assert r.status == ["ok", "timeout", "ok", "ok", "ok", "ok"]
  assert r.correct.tolist() == [True, False, True, True, False, True]
  assert r.counts["timeout"] == 1 and r.counts["ok"] == 5
  assert r.worker_restarts == 1 and "killed" in r.detail[1]
  # The pool keeps working after the kill (the replacement worker comes up in background).
  r2 = pool.verify(["\\boxed{7}"] * 8, ["7"] * 8, deadline_s=5.0)
  assert r2.correct.all() and r2.worker_restarts == 0


def test_equal_pairs_run_once_and_share_the_result(pool):
  # Four copies of a hang with one reference: one item runs (one kill), all four time out.
  r = pool.verify(["HANG"] * 4, ["1"] * 4, deadline_s=DEADLINE)
  assert r.status == ["timeout"] * 4 and r.counts["timeout"] == 4
  assert r.worker_restarts == 1
  # The same text against other references keeps its own verdict, in its own place.
  r = pool.verify(["\\boxed{2}", "\\boxed{2}", "\\boxed{3}", "\\boxed{2}"], ["2", "3", "3", "2"])
  assert r.correct.tolist() == [True, False, True, True] and r.counts["ok"] == 4
  assert r.pred[0] == r.pred[1] == r.pred[3]


def test_interruptible_slow_item_needs_no_restart(pool):
  t0 = time.monotonic()
  r = pool.verify(["SLOW", "\\boxed{2}"], ["1", "2"], deadline_s=DEADLINE)
  assert time.monotonic() - t0 < DEADLINE + 2
  assert r.status == ["timeout", "ok"] and r.worker_restarts == 0
  assert "soft timeout" in r.detail[0]


def test_crash_and_exception_give_error(pool):
  r = pool.verify(["CRASH", "RAISE", "\\boxed{9}", "\\boxed{8}"], ["1", "1", "9", "9"])
  assert r.status == ["error", "error", "ok", "ok"]
  assert r.correct.tolist() == [False, False, True, False]
  assert r.counts == {**dict.fromkeys(STATUSES, 0), "error": 2, "ok": 2}
  assert r.worker_restarts == 1  # the crash; an exception leaves the worker alive
  assert "crashed" in r.detail[0] and "RuntimeError: boom" in r.detail[1]
  assert pool.verify(["\\boxed{9}"], ["9"]).correct.tolist() == [True]


def test_differ_batch(pool):
  d = pool.differ_batch(
    ["so \\boxed{3}", "\\boxed{\\frac{1}{2}}", "\\boxed{3}", "\\boxed{3}"],
    ["hence $3$", "\\boxed{0.5}", "\\boxed{4}", "no answer here"],
  )
  assert d.differ == [False, False, True, True] and d.status[3] == "no_answer"


def test_labels_keep_unknown_apart_from_wrong(pool):
  r = pool.verify(["\\boxed{18}", "\\boxed{1}", "no answer"], ["18", "2", "3"])
  assert r.labels().tolist() == [1, 0, 0]
  r.status[1] = "timeout"  # a verdict that did not arrive is unknown, not wrong
  assert r.labels().tolist() == [1, -1, 0]


def test_verify_and_totals(pool):
  before = dict(pool.totals)
  r = pool.verify(["\\boxed{18}", "\\boxed{1}"], ["18", "2"])
  assert r.correct.tolist() == [True, False]
  assert pool.totals["ok"] == before["ok"] + 2
  assert pool.verify([], []).counts == dict.fromkeys(STATUSES, 0)
  with pytest.raises(ValueError):
    pool.verify(["a"], [])


def test_shipped_references_verify_against_themselves(pool):
  # Every shipped test reference, boxed as a completion, must be judged correct: catches
  # references the gold parse mangles (a silent 0 reward for every rollout on that prompt).
  # Samples (LaTeX-heavy sets weighted up) to keep the test fast; all 3494 test references
  # and the 7473 GSM8K train ones pass this check too (checked once, ~20 s on 2 workers).
  refs = []
  for name, keep in [
    ("math500/test", 500),
    ("olympiadbench/test", 250),
    ("gsm8k/test", 100),
    ("svamp/test", 100),
  ]:
    with open(DATA / f"{name}.jsonl", encoding="utf-8") as f:
      refs += [json.loads(line)["answer"] for line in f][:keep]
  r = pool.verify([f"The final answer is $\\boxed{{{a}}}$." for a in refs], refs)
  assert r.counts["ok"] == len(refs) == 950
  assert r.correct.all()


def test_option_letter_answers_accept_the_letter_or_its_value_only(pool):
  """Math Odyssey: all 387 references verify against themselves; each of the 127 option-letter
  answers also accepts its option's value boxed, and rejects another option's value."""
  from cooper_jax.rewards.choices import (  # pylint: disable=import-outside-toplevel
    accepted_references,
    option_values,
  )

  with open(DATA / "odyssey_math/test.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  refs = [accepted_references(r) for r in rows]
  r = pool.verify([f"So $\\boxed{{{x['answer']}}}$." for x in rows], refs)
  assert r.counts["ok"] == 387 and r.correct.all()
  letters = [(x, ref) for x, ref in zip(rows, refs) if isinstance(ref, tuple)]
  assert len(letters) == 127
  right = pool.verify([f"So $\\boxed{{{ref[1]}}}$." for _, ref in letters], [t for _, t in letters])
  assert right.correct.all()
  other = [
    next(v for k, v in option_values(x["question"]).items() if k != x["answer"] and v != ref[1])
    for x, ref in letters
  ]
  wrong = pool.verify([f"So $\\boxed{{{v}}}$." for v in other], [t for _, t in letters])
  assert not wrong.correct.any()
