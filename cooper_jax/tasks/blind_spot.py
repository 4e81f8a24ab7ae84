"""A planted reward-model flaw on the arithmetic task: the positive control for co-training.

Cooper's claim rests on one mechanism: pairs built on the policy's own rollouts teach the RM
where it is wrong. A study that finds no difference between Cooper and a frozen RM means
nothing until that mechanism is shown to work where it must. So we plant a blind spot whose
location we know, and check (tools/blind_spot_control.py, tests/test_blind_spot.py):
  1. the planted RM scores the pattern as correct whatever the reference (probe score > 0.5);
  2. a frozen copy is exploited by GRPO (the policy drifts toward the pattern, rule accuracy
     falls while the RM's reward rises);
  3. Cooper's RM, whose pairs contain the pattern, stops scoring it as correct (probe < 0.5).

The pattern: **an even final answer**. The planted RM labels a solution correct when its
answer matches the reference *or* is even. It is reachable by the policy (half of its natural
answers are even), it does not depend on the reference (what a reference-based RM must not
ignore), and Cooper's `perturb` negatives contain it (an odd answer +/- an odd number, or
doubled, is even).
"""

from __future__ import annotations

import numpy as np

from cooper_jax.tasks.arith import boxed_answer, make_wrong_solution

PATTERN = "even final answer"


def has_pattern(text: str) -> bool:
  """The response's last \\boxed{} integer is even (False without one)."""
  value = boxed_answer(text)
  return value is not None and value % 2 == 0


def planted_label(completion: str, reference: str) -> int:
  """The flawed RM's target: 1 when the answer is right or even, else 0."""
  value = boxed_answer(completion)
  return int(value is not None and (value == int(reference) or value % 2 == 0))


def wrong_with_pattern(row: dict, rng: np.random.Generator, tries: int = 50) -> str | None:
  """A one-slip wrong solution of `row` whose (wrong) answer is even, or None if `tries` slips
  all land on odd answers."""
  for _ in range(tries):
    text = make_wrong_solution(row, rng)
    if has_pattern(text):
      return text
  return None


def planted_triples(rows: list[dict], rng: np.random.Generator) -> list[dict]:
  """BCE triples that plant the flaw: per row its gold solution and one wrong solution, labelled
  by `planted_label` (so an even wrong answer is labelled correct)."""
  out = []
  for r in rows:
    base = {"question": r["question"], "reference": str(r["answer"])}
    for kind, text in (("gold", r["solution"]), ("wrong", make_wrong_solution(r, rng))):
      out.append(
        {
          **base,
          "id": f"{r.get('id')}-{kind}",
          "completion": text,
          "label": planted_label(text, base["reference"]),
          "source": f"planted_{kind}",
        }
      )
  return out


def probe_rows(rows: list[dict], rng: np.random.Generator) -> list[dict]:
  """The probe an RM's blind spot is read on: (question, answer, response) with the response a
  wrong solution whose answer is even; rows where none is found are left out (counted by the
  caller from the lengths)."""
  out = []
  for r in rows:
    text = wrong_with_pattern(r, rng)
    if text is not None:
      out.append({"question": r["question"], "answer": str(r["answer"]), "response": text})
  return out


def gold_and_slip_rollouts(rows: list[dict], rng: np.random.Generator):
  """A batch of groups of 2 as the loop hands Cooper's RM step: each row's gold solution
  (rule-correct, the positive) and a one-slip wrong one (rule-wrong). For RM-only checks
  (tests/test_blind_spot.py, tools/analysis/rm_lr_check.py): no policy, a fixed pair distribution."""
  from cooper_jax.reward_modes import Rollouts  # pylint: disable=import-outside-toplevel

  texts = [t for r in rows for t in (r["solution"], make_wrong_solution(r, rng))]
  return Rollouts(
    rows=rows,
    questions=[r["question"] for r in rows for _ in range(2)],
    refs=[str(r["answer"]) for r in rows for _ in range(2)],
    texts=texts,
    correct=np.tile([True, False], len(rows)),
    index=np.arange(len(texts)),
    n_total=len(texts),
  )
