"""Preference pairs for the RM co-training step (Cooper component 4).

Per prompt: the positive is a rollout the rule verifier marks correct (precise when it says
"correct"); the negative is a wrong solution made on purpose from that positive. A negative
is accepted only when math-verify says its final answer differs from the positive's; up to
`max_tries` candidates are made per prompt, else the pair is dropped. Every prompt that ends
without a pair is counted with its reason: nothing is dropped silently.

Negative generators share one interface, `generate(questions, positives, attempt, rng)`,
called only on the rows still lacking an accepted negative (a generator with
`per_row_seeds = True` also gets `row_seeds`, one seed per row from (run seed, step, attempt,
global prompt index), so its draws do not depend on how rows are batched; one with
`collective = True` is called by every process the same number of times, possibly with no
rows):
  - `PerturbNegatives`: model-free, rewrites the final answer's numbers (fast; for tests,
    CPU runs and as an ablation of the paper's choice);
  - `LLMRewriteNegatives` (cooper_jax/rewards/rewrite.py): the paper's choice, a frozen
    assistant LLM asked to rewrite the positive into a plausible but wrong solution of
    similar length.

Beyond the paper, `build_on_policy_pairs` takes the negative from the group itself: a rollout
the rule verifier rejected. It is a sound negative only where the verifier's recall is high
(a correct answer it fails to recognise would be taught as wrong).
"""

from __future__ import annotations

import dataclasses
import re
import time
from decimal import Decimal
from typing import Protocol

import numpy as np

from cooper_jax import distributed as dist
from cooper_jax.rewards.verify import RuleVerifier, last_boxed_span

REJECT_REASONS = ("same_answer", "no_answer", "timeout", "error", "empty")
STRATEGIES = ("first", "random")


# --------------------------------------------------------------------------------------------
# Positives
# --------------------------------------------------------------------------------------------


def select_positives(
  correct_b: np.ndarray,
  group_size: int,
  strategy: str = "first",
  rng: np.random.Generator | None = None,
) -> np.ndarray:
  """Index (into the flat [n_prompts * G] rollout batch) of each prompt's positive, or -1.

  Rollouts are grouped prompt-major: rows p*G .. p*G+G-1 belong to prompt p. "first" takes
  the first correct rollout, as the reference code does; "random" draws one of the correct
  rollouts uniformly with `rng` (required, for reproducibility). A prompt with no correct
  rollout gets -1: it yields no pair.
  """
  correct = np.asarray(correct_b, dtype=bool).reshape(-1)
  if group_size < 1 or correct.size % group_size:
    raise ValueError(f"{correct.size} rollouts do not split into groups of {group_size}")
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
  if strategy == "random" and rng is None:
    raise ValueError("strategy='random' needs an rng (np.random.Generator)")
  groups = correct.reshape(-1, group_size)
  out = np.full(groups.shape[0], -1, dtype=np.int64)
  for p, row in enumerate(groups):
    hits = np.flatnonzero(row)
    if hits.size:
      j = hits[0] if strategy == "first" else rng.choice(hits)
      out[p] = p * group_size + int(j)
  return out


# --------------------------------------------------------------------------------------------
# Negative generators
# --------------------------------------------------------------------------------------------


class NegativeGenerator(Protocol):
  """Makes one candidate negative per row; "" (or None) where it cannot make one."""

  name: str

  def generate(
    self, questions: list[str], positives: list[str], attempt: int, rng: np.random.Generator
  ) -> list[str]: ...


def row_seed(seed, attempt: int, prompt_id: int) -> int:
  """A negative's sampling seed: a function of (run seed and step, attempt, global prompt
  index) only, the same in a 1-process and an N-process run."""
  return int(np.random.SeedSequence([*seed, attempt, prompt_id]).generate_state(1)[0])


# A number as written in a solution: "18", "70,000", "0.5". Not preceded by a letter, "_" or
# "." (so subscripts like x_2 and the tail of "3.14" are left alone); the sign stays outside,
# so perturbing the magnitude of "-5" gives another negative number.
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)")


def final_answer_span(text: str) -> tuple[int, int] | None:
  """Where the final answer is written: the last \\boxed{} content, else the last number.

  The same places math-verify looks first, so changing this span changes its parse.
  """
  span = last_boxed_span(text)
  if span is not None:
    return span
  last = None
  for last in _NUMBER.finditer(text):
    pass
  return None if last is None else last.span()


def perturb_number(s: str, rng: np.random.Generator) -> str:
  """A different number written in the same style ("70,000" -> "70,004", "0.5" -> "0.8").

  Integers: +/- d (d in 1..9), or x2 / x3 (typical slips); decimals: +/- d units of the last
  decimal place. The new value never equals the old one (d != 0, factor != 1 on a nonzero
  value, and a subtraction that would go below zero becomes an addition).
  """
  plain = s.replace(",", "")
  value = Decimal(plain)
  places = len(plain.split(".")[1]) if "." in plain else 0
  ops = ["add", "sub"] + (["scale"] if places == 0 and value != 0 else [])
  op = ops[int(rng.integers(len(ops)))]
  step = Decimal(int(rng.integers(1, 10))).scaleb(-places)
  if op == "scale":
    new = value * int(rng.choice([2, 3]))
  elif op == "sub" and value - step >= 0:
    new = value - step
  else:
    new = value + step
  assert new != value
  return f"{new:{',' if ',' in s else ''}.{places}f}"


def perturb_solution(text: str, rng: np.random.Generator, attempt: int = 0) -> str:
  """The solution with a different final answer; "" if it has no answer to change.

  One number of the final answer is changed (the first on attempt 0, the next on a retry:
  a degenerate choice such as the base of 5^0 then gets another chance); an answer without
  numbers (\\boxed{x}) gets " + 1". The change is made consistently: every other place the
  old answer is written in the text gets the new one too, so the derivation leads to the
  wrong result instead of contradicting it (for a number answer: every standalone
  occurrence of that number).
  """
  span = final_answer_span(text)
  if span is None:
    return ""
  old = text[span[0] : span[1]]
  nums = list(_NUMBER.finditer(old))
  if not nums:
    if not old.strip():
      return ""
    return text[: span[0]] + old.rstrip() + " + 1" + text[span[1] :]
  m = nums[attempt % len(nums)]
  new = old[: m.start()] + perturb_number(m.group(), rng) + old[m.end() :]
  if _NUMBER.fullmatch(old.strip()):
    # A number answer: replace it as a number, so "18" does not match inside "180".
    pat = re.compile(r"(?<![\w.])" + re.escape(old.strip()) + r"(?![\d]|[.,]\d)")
    return pat.sub(new.strip(), text)
  return text.replace(old, new)


@dataclasses.dataclass
class PerturbNegatives:
  """Model-free negatives: the positive with its final answer perturbed (deterministic
  given the rng). Cheap, but the negative differs from the positive in a few digits only,
  unlike the paper's LLM rewrite; use it where no assistant model is available."""

  name: str = "perturb"

  @classmethod
  def from_config(cls, c, mesh) -> PerturbNegatives:
    del c, mesh
    return cls()

  def generate(
    self, questions: list[str], positives: list[str], attempt: int, rng: np.random.Generator
  ) -> list[str]:
    del questions  # the answer alone is perturbed
    return [perturb_solution(p, rng, attempt) for p in positives]


# --------------------------------------------------------------------------------------------
# Acceptance and pair building
# --------------------------------------------------------------------------------------------


def check_negatives(
  verifier: RuleVerifier,
  negatives: list[str],
  positives: list[str],
  *,
  deadline_s: float = 5.0,
  accept_no_answer: bool = False,
) -> list[str | None]:
  """The one acceptance rule: None where a negative is accepted, else its reject reason.

  Accepted only when math-verify says the answers differ (in either direction:
  verify.differ_one). The reference code checks one direction and also accepts a negative
  with no parseable answer (`not verify([], pos)` is True) or whose check timed out
  (math-verify's verify returns False); by default we reject the first ("no_answer"): an RM
  trained on such pairs can learn "no \\boxed{} -> wrong" instead of checking the answer.
  Timeouts and verifier errors are rejects, never accepts (docs/parity.md).
  """
  reasons: list[str | None] = ["empty"] * len(negatives)
  live = [i for i, neg in enumerate(negatives) if neg and neg.strip()]
  if not live:
    return reasons
  res = verifier.differ_batch(
    [negatives[i] for i in live], [positives[i] for i in live], deadline_s
  )
  for i, status, differ in zip(live, res.status, res.differ):
    if status == "ok":
      reasons[i] = None if differ else "same_answer"
    elif status == "no_answer":
      reasons[i] = None if accept_no_answer else "no_answer"
    else:
      reasons[i] = "timeout" if status == "timeout" else "error"
  return reasons


@dataclasses.dataclass
class PairBatch:
  """One row per prompt. Where valid is False, negative is "" and drop_reason says why:
  "no_positive", or the reject reason of the last of max_tries candidates."""

  questions: list[str]
  references: list[str]
  positives: list[str]  # "" where the prompt had no correct rollout
  negatives: list[str]
  valid: np.ndarray  # bool [n_prompts]
  positive_index: np.ndarray  # int [n_prompts], row in the rollout batch, -1 if none
  drop_reason: list[str | None]  # None where valid
  # Per prompt, every candidate negative in the order made: {"text", "reason"} (reason None:
  # accepted). Empty for on-policy pairs (no candidates are made).
  candidates: list[list[dict]] = dataclasses.field(default_factory=list)


def pair_records(pairs: PairBatch, step: int, prompt_ids, limit: int) -> list[dict]:
  """pairs.jsonl rows of the first `limit` prompts: the pair (or why there is none) and every
  candidate negative with its reject reason, so a negative generator can be inspected."""
  rows = []
  for p in range(min(limit, len(pairs.questions))):
    cands = pairs.candidates[p] if pairs.candidates else []
    rows.append(
      {
        "step": int(step),
        "prompt": int(prompt_ids[p]),
        "question": pairs.questions[p],
        "reference": str(pairs.references[p]),
        "positive_row": int(pairs.positive_index[p]),
        "positive": pairs.positives[p],
        "negative": pairs.negatives[p],
        "accepted": bool(pairs.valid[p]),
        "reason": pairs.drop_reason[p],
        "candidates": cands,
      }
    )
  return rows


def build_pairs(
  questions: list[str],
  references: list[str],
  completions: list[str],
  correct_b: np.ndarray,
  group_size: int,
  negatives: NegativeGenerator,
  verifier: RuleVerifier,
  *,
  strategy: str = "first",
  rng: np.random.Generator,
  max_tries: int = 3,
  deadline_s: float = 5.0,
  accept_no_answer: bool = False,
  seed: tuple[int, ...] | None = None,
  prompt_ids=None,
) -> tuple[PairBatch, dict]:
  """(PairBatch, stats) from one RL step's rollouts.

  seed (the run's seed and step) and prompt_ids (each local prompt's index in the step's
  global batch; default 0..n-1): give a `per_row_seeds` generator its `row_seeds`. A
  `collective` generator is called by every process at every attempt while any process still
  has rows without a negative.

  questions/references: one per prompt; completions/correct_b: n_prompts * group_size
  rollouts, prompt-major. completions are the decoded responses (the EOS, a special token,
  is not in the text; a rollout cut at the length limit keeps its last token), and a pair's
  positive and negative reach the RM as such plain text. The reference drops the positive's
  last token assuming it is EOS (a real token when truncated) before the assistant and the
  acceptance check see it, and its negatives pass through the chat template and reach the RM
  ending in a newline where positives do not (docs/parity.md).
  stats: n_prompts, n_with_positive, n_valid, valid_pair_rate (valid / prompts, the
  reference code's reward/valid_rate), negative_tries (candidates made), rejects by reason
  (every rejected candidate), dropped_no_positive, dropped_max_tries, verifier_restarts,
  negatives_s, check_s.
  """
  n = len(questions)
  if len(references) != n:
    raise ValueError(f"{n} questions but {len(references)} references")
  if len(completions) != n * group_size or np.size(correct_b) != n * group_size:
    raise ValueError(
      f"expected {n} x {group_size} rollouts, got {len(completions)} "
      f"completions and {np.size(correct_b)} correct flags"
    )
  if max_tries < 1:
    raise ValueError(f"max_tries must be >= 1, got {max_tries}")
  pos_idx = select_positives(correct_b, group_size, strategy, rng)
  positives = [completions[j] if j >= 0 else "" for j in pos_idx]
  negs = [""] * n
  drop: list[str | None] = [None if j >= 0 else "no_positive" for j in pos_idx]
  rejects = dict.fromkeys(REJECT_REASONS, 0)
  candidates: list[list[dict]] = [[] for _ in range(n)]
  tries, gen_s, check_s = 0, 0.0, 0.0
  restarts0 = verifier.total_restarts

  pending = [p for p in range(n) if pos_idx[p] >= 0]
  collective = getattr(negatives, "collective", False)
  ids = np.arange(n) if prompt_ids is None else np.asarray(prompt_ids)
  for attempt in range(max_tries):
    if not (dist.any_process(bool(pending)) if collective else pending):
      break
    kw = {}
    if seed is not None and getattr(negatives, "per_row_seeds", False):
      kw["row_seeds"] = [row_seed(seed, attempt, int(ids[p])) for p in pending]
    t0 = time.monotonic()
    cands = negatives.generate(
      [questions[p] for p in pending], [positives[p] for p in pending], attempt, rng, **kw
    )
    gen_s += time.monotonic() - t0
    if len(cands) != len(pending):
      raise ValueError(
        f"negative generator {negatives.name!r} returned {len(cands)} "
        f"candidates for {len(pending)} rows"
      )
    cands = [c if isinstance(c, str) else "" for c in cands]
    tries += len(cands)
    t0 = time.monotonic()
    reasons = check_negatives(
      verifier,
      cands,
      [positives[p] for p in pending],
      deadline_s=deadline_s,
      accept_no_answer=accept_no_answer,
    )
    check_s += time.monotonic() - t0
    still = []
    for p, cand, reason in zip(pending, cands, reasons):
      candidates[p].append({"text": cand, "reason": reason})
      if reason is None:
        negs[p], drop[p] = cand, None
      else:
        rejects[reason] += 1
        drop[p] = reason
        still.append(p)
    pending = still

  return _pair_batch(
    questions,
    references,
    positives,
    negs,
    pos_idx,
    drop,
    candidates,
    negative_tries=tries,
    rejects=rejects,
    verifier_restarts=verifier.total_restarts - restarts0,
    negatives_s=gen_s,
    check_s=check_s,
  )


def _pair_batch(questions, references, positives, negs, pos_idx, drop, candidates, **extra):
  """The PairBatch and its stats (counts by outcome, plus `extra`)."""
  n = len(questions)
  valid = np.array([d is None for d in drop], dtype=bool)
  n_pos = int((pos_idx >= 0).sum())
  n_valid = int(valid.sum())
  stats = {
    "n_prompts": n,
    "n_with_positive": n_pos,
    "n_valid": n_valid,
    "valid_pair_rate": n_valid / n if n else 0.0,
    "dropped_no_positive": n - n_pos,
    "dropped_max_tries": n_pos - n_valid,
    **extra,
  }
  batch = PairBatch(
    questions=list(questions),
    references=list(references),
    positives=positives,
    negatives=negs,
    valid=valid,
    positive_index=pos_idx,
    drop_reason=drop,
    candidates=candidates,
  )
  return batch, stats


def build_on_policy_pairs(
  questions: list[str],
  references: list[str],
  completions: list[str],
  correct_b: np.ndarray,
  group_size: int,
  *,
  strategy: str = "first",
  rng: np.random.Generator,
  positive_ok: np.ndarray | None = None,
) -> tuple[PairBatch, dict]:
  """(PairBatch, stats) with each prompt's negative drawn uniformly from its group's rollouts
  that the rule verifier rejected; a group with no correct or no rejected rollout gives no pair
  ("no_positive" / "no_negative"). positive_ok: which rollouts may be the positive (default:
  the rule verdicts; a stricter check, e.g. rule+chain, must imply correct_b); a rule-correct
  rollout it refuses is neither positive nor negative. stats has build_pairs' keys (no
  candidates are made)."""
  n = len(questions)
  if len(references) != n or len(completions) != n * group_size:
    raise ValueError(
      f"{n} questions, {len(references)} references, {len(completions)} completions for "
      f"groups of {group_size}"
    )
  correct = np.asarray(correct_b, bool).reshape(n, group_size)
  ok = correct if positive_ok is None else np.asarray(positive_ok, bool).reshape(n, group_size)
  if np.any(ok & ~correct):
    raise ValueError("positive_ok marks a rollout the rule verifier rejected")
  pos_idx = select_positives(ok, group_size, strategy, rng)
  positives, negs = [""] * n, [""] * n
  drop: list[str | None] = [None] * n
  for p in range(n):
    wrong = np.flatnonzero(~correct[p])
    if pos_idx[p] < 0:
      drop[p] = "no_positive"
    elif wrong.size == 0:
      drop[p] = "no_negative"
    else:
      positives[p] = completions[pos_idx[p]]
      negs[p] = completions[p * group_size + int(rng.choice(wrong))]
  return _pair_batch(
    questions,
    references,
    positives,
    negs,
    pos_idx,
    drop,
    [],
    negative_tries=0,
    rejects=dict.fromkeys(REJECT_REASONS, 0),
    verifier_restarts=0,
    negatives_s=0.0,
    check_s=0.0,
  )
