"""Templated arithmetic word problems with integer answers, worked solutions, and wrong ones.

Why this task: the Cooper study (rule reward vs static RM vs Cooper, several seeds) must run on
a 2-core CPU. These problems are short, their answers are integers that math-verify checks
exactly, and difficulty is a knob, so a tiny policy can sit at moderate accuracy and RL has
room to move it.

A worked solution is one line per computation, then the boxed answer:

    12 + 7 = 19
    19 - 5 = 14
    The answer is \\boxed{14}.

Lines follow one structure that `make_wrong_solution` relies on to re-run the arithmetic:
a "chain" line `x +|- y = z` whose left operand is the running total (the first one: the
starting amount), optionally preceded by an "aux" line `k * m = p` whose result is the next
chain line's right operand ("buys 3 bags with 12 in each").

Difficulties: 1 = one add/subtract on single digits; 2 = two steps, numbers <= 15;
3 = three steps, numbers up to 40 (results up to ~100) and possibly a multiplication step.
Everything is deterministic given the seed: row i of a split uses default_rng([seed, i, try]).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

from cooper_jax.io import write_jsonl

SOURCE = "arith"
DIFFICULTIES = (1, 2, 3)

# difficulty -> (start range, operand range, number of events, multiplication allowed)
# Ranges are small on purpose: a ~0.2M-parameter model must learn the arithmetic from a few
# thousand examples on a CPU (with 2-3 digit operands it learned the format but not the sums).
_LEVELS = {
  1: ((2, 9), (1, 9), 1, False),
  2: ((3, 15), (1, 9), 2, False),
  3: ((10, 40), (2, 15), 3, True),
}
_NAMES = (
  ("Tom", "he"),
  ("Anna", "she"),
  ("Ben", "he"),
  ("Lucy", "she"),
  ("Sam", "he"),
  ("Mia", "she"),
  ("Leo", "he"),
  ("Emma", "she"),
  ("Jack", "he"),
  ("Sara", "she"),
  ("Max", "he"),
  ("Lily", "she"),
  ("Noah", "he"),
  ("Zoe", "she"),
  ("Omar", "he"),
  ("Nina", "she"),
)
_ITEMS = (
  "apples",
  "marbles",
  "stickers",
  "pencils",
  "cookies",
  "cards",
  "books",
  "shells",
  "coins",
  "stamps",
  "balloons",
  "candies",
  "toy cars",
  "beads",
  "oranges",
  "eggs",
)
_CONTAINERS = ("bags", "boxes", "packs", "jars")
_ADD = (
  "{P} buys {n} more.",
  "{P} finds {n} more.",
  "{F} gives {o} {n} more.",
  "{P} wins {n} more in a game.",
  "{P} gets {n} more from {F}.",
)
_SUB = (
  "{P} gives away {n}.",
  "{P} loses {n}.",
  "{P} gives {n} to {F}.",
  "{P} sells {n}.",
  "{P} uses {n} of them.",
)
_MUL = "{P} buys {k} {c} with {m} {items} in each."
_ASK = ("How many {items} does {name} have now?", "How many {items} does {name} have in the end?")

_LINE = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)$")
_BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


def _int(rng: np.random.Generator, lo: int, hi: int) -> int:
  return int(rng.integers(lo, hi + 1))


def format_solution(lines: Sequence[tuple[int, str, int, int]]) -> str:
  """Worked-solution text for (x, op, y, z) lines; the last chain result is the answer."""
  if not lines:
    raise ValueError("a solution needs at least one line")
  body = "\n".join(f"{x} {op} {y} = {z}" for x, op, y, z in lines)
  return f"{body}\nThe answer is \\boxed{{{lines[-1][3]}}}."


def make_problem(rng: np.random.Generator, difficulty: int) -> dict:
  """One problem {question, answer, solution, difficulty, source} drawn with `rng`."""
  if difficulty not in _LEVELS:
    raise ValueError(f"difficulty must be one of {sorted(_LEVELS)}, got {difficulty!r}")
  (s_lo, s_hi), (n_lo, n_hi), n_events, allow_mul = _LEVELS[difficulty]
  name, pro = _NAMES[rng.integers(len(_NAMES))]
  friend = _NAMES[rng.integers(len(_NAMES))][0]
  while friend == name:
    friend = _NAMES[rng.integers(len(_NAMES))][0]
  items = _ITEMS[rng.integers(len(_ITEMS))]
  fill = dict(P=_cap(pro), F=friend, o="him" if pro == "he" else "her", items=items)
  cur = _int(rng, s_lo, s_hi)
  sentences = [f"{name} has {cur} {items}."]
  lines: list[tuple[int, str, int, int]] = []
  used_mul = False
  for _ in range(n_events):
    kinds = ["add", "sub"] if cur >= 2 else ["add"]
    if allow_mul and not used_mul:
      kinds.append("mul")
    kind = kinds[rng.integers(len(kinds))]
    if kind == "mul":
      # One multiplication at most: a single-digit count keeps it a "step", not long multiplication.
      k, m = _int(rng, 2, 5), _int(rng, 2, 5)
      c = _CONTAINERS[rng.integers(len(_CONTAINERS))]
      sentences.append(_MUL.format(k=k, m=m, c=c, **fill))
      lines += [(k, "*", m, k * m), (cur, "+", k * m, cur + k * m)]
      cur, used_mul = cur + k * m, True
    elif kind == "add":
      n = _int(rng, n_lo, n_hi)
      sentences.append(_ADD[rng.integers(len(_ADD))].format(n=n, **fill))
      lines.append((cur, "+", n, cur + n))
      cur += n
    else:
      # Never take everything away: "How many are left?" with 0 is a degenerate problem.
      n = _int(rng, min(n_lo, cur - 1), min(n_hi, cur - 1))
      sentences.append(_SUB[rng.integers(len(_SUB))].format(n=n, **fill))
      lines.append((cur, "-", n, cur - n))
      cur -= n
  for i in range(2, len(sentences)):
    # "Then he ..." reads as a sequence of events without changing the arithmetic.
    s = sentences[i]
    sentences[i] = "Then " + s[:1].lower() + s[1:] if not s.startswith(friend) else "Then " + s
  sentences.append(_ASK[rng.integers(len(_ASK))].format(items=items, name=name))
  return {
    "question": " ".join(sentences),
    "answer": str(cur),
    "solution": format_solution(lines),
    "difficulty": int(difficulty),
    "source": SOURCE,
  }


def parse_solution(solution: str) -> list[tuple[int, str, int, int]]:
  """The (x, op, y, z) lines of a worked solution in this module's format; ValueError if not."""
  lines = []
  for raw in solution.strip().split("\n"):
    if raw.startswith("The answer is"):
      break
    m = _LINE.match(raw.strip())
    if m is None:
      raise ValueError(f"not an arith solution line: {raw!r}")
    lines.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))))
  if not lines:
    raise ValueError("solution has no computation lines")
  return lines


def _rerun(lines, slip_at: int, slip: str, delta: int):
  """Recomputes the chain with one slip at line `slip_at`; later lines use the wrong value.

  slip "result": that line's result is off by `delta`; "operand": its right operand was misread
  by `delta` and the (correct) arithmetic goes on from there.
  """
  # The starting amount is the left operand of the first chain line (line 0 may be aux).
  out, cur, pending = [], next(x for x, op, _, _ in lines if op != "*"), None
  for i, (x, op, y, _) in enumerate(lines):
    if op == "*":
      left = x
    else:
      left, y = cur, (pending if pending is not None else y)
      pending = None
    if i == slip_at and slip == "operand":
      y += delta
    z = left * y if op == "*" else (left + y if op == "+" else left - y)
    if i == slip_at and slip == "result":
      z += delta
    if min(left, y, z) < 0:
      return None  # a negative count would give the slip away
    out.append((left, op, y, z))
    if op == "*":
      pending = z
    else:
      cur = z
  return out


def make_wrong_solution(row: dict, rng: np.random.Generator, max_tries: int = 20) -> str:
  """A plausible wrong worked solution: one arithmetic slip, carried through to the end.

  Slips people make: off by one or two, a dropped/extra ten (carry), swapped digits, or a
  misread operand. Every later line is computed correctly from the wrong value, so the
  solution looks consistent and only the slipped line is wrong. The final answer always
  differs from row["answer"].
  """
  lines = parse_solution(row["solution"])
  answer = int(row["answer"])
  if lines[-1][3] != answer:
    raise ValueError(f"row {row.get('id')!r}: solution ends at {lines[-1][3]}, answer is {answer}")
  for _ in range(max_tries):
    i = int(rng.integers(len(lines)))
    x, op, y, z = lines[i]
    slip = "operand" if rng.random() < 0.3 else "result"
    target = y if slip == "operand" else z
    deltas = [1, -1, 2, -2, 10, -10]
    s = str(target)
    if len(s) >= 2 and s[-1] != s[-2]:
      deltas.append(int(s[:-2] + s[-1] + s[-2]) - target)  # transposed last two digits
    delta = deltas[int(rng.integers(len(deltas)))]
    wrong = _rerun(lines, i, slip, delta)
    if wrong is not None and wrong[-1][3] != answer:
      return format_solution(wrong)
  raise RuntimeError(f"row {row.get('id')!r}: no valid slip found in {max_tries} tries")


def chain_is_correct(response: str, solution: str) -> bool:
  """Every computation line of `response` is the gold `solution`'s line (same operands, same
  results, same order): the task's own check of the whole chain, where math-verify checks only
  the final answer. A response that does not parse as this module's format is not correct."""
  try:
    return parse_solution(response) == parse_solution(solution)
  except ValueError:
    return False


def boxed_answer(text: str) -> int | None:
  """The integer in the last \\boxed{...} of a text, or None."""
  found = _BOXED.findall(text)
  return int(found[-1]) if found else None


def generate_rows(
  n: int,
  seed: int,
  difficulties: Iterable[int] = DIFFICULTIES,
  exclude_questions: Iterable[str] = (),
) -> list[dict]:
  """n problems with ids f"arith-{seed}-{i}", difficulty cycling through `difficulties`.

  Row i depends only on (seed, i) (plus retries), so a longer split extends a shorter one.
  Questions in `exclude_questions` (e.g. the test split's) and duplicates are redrawn, so
  train and test never share a question.
  """
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  diffs = tuple(int(d) for d in difficulties)
  if not diffs or any(d not in _LEVELS for d in diffs):
    raise ValueError(f"difficulties must be a non-empty subset of {sorted(_LEVELS)}, got {diffs}")
  seen = set(exclude_questions)
  rows = []
  for i in range(n):
    for attempt in range(1000):
      row = make_problem(np.random.default_rng([seed, i, attempt]), diffs[i % len(diffs)])
      if row["question"] not in seen:
        break
    else:
      raise RuntimeError(f"could not draw a new question for row {i}: the space is exhausted")
    seen.add(row["question"])
    rows.append({"id": f"arith-{seed}-{i}", **row})
  return rows


def write_split(
  path: str | os.PathLike,
  n: int,
  seed: int,
  difficulties: Iterable[int] = DIFFICULTIES,
  exclude_questions: Iterable[str] = (),
) -> list[dict]:
  """Generates `n` rows (see generate_rows) and writes them to `path` as JSONL; returns them."""
  rows = generate_rows(n, seed, difficulties, exclude_questions)
  write_jsonl(path, rows)
  return rows
