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
  - `LLMRewriteNegatives`: the paper's choice, a frozen assistant LLM asked to rewrite the
    positive into a plausible but wrong solution of similar length.

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
from cooper_jax.prompts import widen_left
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


# The system instruction for the assistant LLM. The paper's (code) instruction asks for wrong
# reasoning, a wrong result, similar length, a solution that looks right and plausible-
# sounding content; we add the \boxed{} answer so math-verify can check it differs.
REWRITE_SYSTEM = (
  "You turn correct solutions of math problems into convincing wrong ones. Given a math "
  "problem and a correct solution, write a new solution that:\n"
  "1. uses wrong reasoning or wrong calculations;\n"
  "2. reaches a final result different from the correct one;\n"
  "3. has about the same length as the correct solution;\n"
  "4. looks like a genuine, confident solution of the problem, with no hint that it is "
  "wrong;\n"
  "5. states its final answer as \\boxed{answer}."
)


def rewrite_prompt(question: str, positive: str) -> str:
  """The user message asking for a wrong rewrite of `positive` (pure; no template)."""
  return (
    f"Math problem:\n{question}\n\n"
    f"Correct solution:\n{positive}\n\n"
    "Reply with the wrong solution only: its steps and the final answer in "
    "\\boxed{}, nothing else."
  )


REWRITE_FORMATS = ("paper", "plain")


def rewrite_chat_prompt(tokenizer, question: str, positive: str, fmt: str = "paper") -> str:
  """The assistant's rendered prompt for one rewrite, in one place (the sampler and the tool
  that trains a small-task assistant both call it).

  "paper": the paper's instruction as the system message and `rewrite_prompt` as the user
  message (an instruction-following chat model). "plain": the question and the correct
  solution alone, one per line, as the user message, for an assistant trained on that format
  whose vocabulary has no instructions (experiments/assets/small_task/rewriter)."""
  if fmt == "paper":
    return tokenizer.chat_prompt(rewrite_prompt(question, positive), system=REWRITE_SYSTEM)
  if fmt == "plain":
    return tokenizer.chat_prompt(f"{question}\n{positive}")
  raise ValueError(f"rewrite format {fmt!r}: expected one of {REWRITE_FORMATS}")


def rewrite_token_budget(positive: str) -> int:
  """Paper (code): max tokens = number of words in the positive + 500."""
  return len(positive.split()) + 500


class LLMRewriteNegatives:
  """Negatives written by a frozen assistant LLM (the paper's generator).

  The assistant is loaded like any policy (`load_pretrained`), sampled at temperature 0.7.
  The sampler takes one static length per batch, so the batch runs for
  min(max_new_tokens, max over rows of words + 500) tokens and each row is then cut to its
  own budget, as the per-request max_tokens of the reference code would. Rows are padded to
  a power of two and prompts to a multiple of `batch_pad_multiple` tokens, so retries on a
  few rows reuse a handful of compiled shapes.

  With a `mesh` (the training run's) the assistant's params are global arrays and each call
  is collective: every process brings its own rows (those of the groups it holds), the row
  count, prompt width and token budget are agreed over processes (the largest, rows padded
  to a power of two that the process's batch devices divide), the prompts become one global
  array with each process's rows on its own devices, and each process reads back its rows.
  Every row is drawn with its own key (`row_seeds`), so a row's rewrite does not depend on
  the batch it sits in: N processes draw what one draws.
  """

  name = "llm_rewrite"
  per_row_seeds = True

  def __init__(
    self,
    cfg,
    params,
    tokenizer,
    *,
    temperature: float = 0.7,
    max_new_tokens: int,
    batch_pad_multiple: int = 64,
    top_p: float = 1.0,
    prompt_format: str = "paper",
    mesh=None,
  ):
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prompt_format not in REWRITE_FORMATS:
      raise ValueError(f"prompt_format {prompt_format!r}: expected one of {REWRITE_FORMATS}")
    self.prompt_format = prompt_format
    self.cfg, self.params, self.tokenizer = cfg, params, tokenizer
    self.temperature, self.top_p = temperature, top_p
    self.max_new_tokens, self.batch_pad_multiple = max_new_tokens, batch_pad_multiple
    self.mesh = mesh
    self.collective = mesh is not None

  @classmethod
  def from_config(cls, c, mesh) -> LLMRewriteNegatives:
    """The config's assistant (pairs.assistant_*), loaded in its dtype and sharded over the
    run's mesh like the policy (a 7B model in float32 on one device does not fit an
    accelerator); sampled as global arrays, each process its own rows."""
    import logging  # pylint: disable=import-outside-toplevel

    from cooper_jax import sharding  # pylint: disable=import-outside-toplevel
    from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
    from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

    p = c.pairs
    cfg, params = load_pretrained(
      p.assistant_model, dtype=p.assistant_dtype, param_dtype=p.assistant_dtype
    )
    logging.info(
      "assistant %s: %s, sharded over %s", p.assistant_model, p.assistant_dtype, mesh.shape
    )
    return cls(
      cfg,
      sharding.shard_tree(params, mesh),
      load_tokenizer(p.assistant_model),
      temperature=p.assistant_temperature,
      max_new_tokens=p.assistant_max_new_tokens,
      prompt_format=p.rewrite_format,
      mesh=mesh,
    )

  def chat_prompts(self, questions: list[str], positives: list[str]) -> list[str]:
    return [
      rewrite_chat_prompt(self.tokenizer, q, p, self.prompt_format)
      for q, p in zip(questions, positives)
    ]

  def generate(
    self,
    questions: list[str],
    positives: list[str],
    attempt: int,
    rng: np.random.Generator,
    row_seeds: list[int] | None = None,
  ) -> list[str]:
    del attempt  # a fresh sample per try is what the reference code retries with
    n = len(positives)
    if n == 0 and not self.collective:
      return []
    budgets = [min(self.max_new_tokens, rewrite_token_budget(p)) for p in positives]
    if row_seeds is None:
      row_seeds = [int(x) for x in rng.integers(2**31 - 1, size=n)]
    if self.collective:
      toks, mask = self._sample_global(self.chat_prompts(questions, positives), budgets, row_seeds)
    else:
      toks, mask = self._sample_local(self.chat_prompts(questions, positives), budgets, row_seeds)
    return [self.tokenizer.decode(toks[i][mask[i]][: budgets[i]].tolist()) for i in range(n)]

  def _sample_local(self, prompts, budgets, row_seeds):
    import jax  # pylint: disable=import-outside-toplevel

    rows = 1 << (len(prompts) - 1).bit_length()
    tokens, mask = self.tokenizer.encode_prompts(
      prompts + [prompts[-1]] * (rows - len(prompts)),  # filler rows, discarded
      pad_to_multiple=self.batch_pad_multiple,
    )
    seeds = np.zeros(rows, np.uint32)
    seeds[: len(row_seeds)] = row_seeds
    out = self._sample(tokens, mask, jax.vmap(jax.random.key)(seeds), max(budgets))
    return np.asarray(out.tokens), np.asarray(out.mask)

  def _sample_global(self, prompts, budgets, row_seeds):
    """The collective path (see the class doc): this process's rows of one global batch."""
    import jax  # pylint: disable=import-outside-toplevel

    from cooper_jax import sharding  # pylint: disable=import-outside-toplevel

    n, procs = len(prompts), dist.process_count()
    per_proc = max(1, self.mesh.shape["data"] * self.mesh.shape["fsdp"] // procs)
    # One allgather agrees on rows, prompt width and budget (each the largest of any process).
    filler = self.chat_prompts([""], [""])[0]
    tokens, mask = self.tokenizer.encode_prompts(
      prompts or [filler], pad_to_multiple=self.batch_pad_multiple
    )
    n_max, width, budget = (
      int(v)
      for v in dist.allgather(np.asarray([n, tokens.shape[1], max(budgets, default=1)])).max(0)
    )
    rows = 1 << (max(n_max, 1) - 1).bit_length()
    rows = -(-rows // per_proc) * per_proc
    fill = rows - len(tokens)  # filler rows (copies of the last), discarded on the way back
    tokens = np.concatenate([tokens, np.repeat(tokens[-1:], fill, 0)])
    mask = np.concatenate([mask, np.repeat(mask[-1:], fill, 0)])
    tokens, mask = widen_left(tokens, mask, width, self.tokenizer.pad_id)
    seeds = np.zeros(rows, np.uint32)
    seeds[:n] = row_seeds
    shape = (rows * procs,)
    rows_sh = sharding.batch_sharding(self.mesh, 1)
    put = lambda x, sh: dist.put_local_rows(x, sh, shape + x.shape[1:])
    bs = sharding.batch_sharding(self.mesh)
    keys = jax.jit(jax.vmap(jax.random.key), out_shardings=rows_sh)(put(seeds, rows_sh))
    out = self._sample(put(tokens, bs), put(mask, bs), keys, budget)
    return dist.fetch_local_rows(out.tokens), dist.fetch_local_rows(out.mask)

  def _sample(self, tokens, mask, keys, max_new_tokens):
    from cooper_jax.sampling import sample  # pylint: disable=import-outside-toplevel

    return sample(
      self.params,
      tokens,
      mask,
      keys,
      cfg=self.cfg,
      max_new_tokens=max_new_tokens,
      temperature=self.temperature,
      top_p=self.top_p,
      eos_ids=tuple(self.tokenizer.eos_ids),
      pad_id=self.tokenizer.pad_id,
    )


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

  Accepted only when math-verify says the answers differ. The reference code also accepts
  a negative with no parseable answer (`not verify([], pos)` is True); by default we reject
  it ("no_answer"): an RM trained on such pairs can learn "no \\boxed{} -> wrong" instead
  of checking the answer. Timeouts and verifier errors are rejects, never accepts.
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
  rollouts, prompt-major. stats: n_prompts, n_with_positive, n_valid, valid_pair_rate
  (valid / prompts, the reference code's reward/valid_rate), negative_tries (candidates
  made), rejects by reason (every rejected candidate), dropped_no_positive,
  dropped_max_tries, verifier_restarts, negatives_s, check_s.
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
    negative_tries=tries,
    rejects=rejects,
    verifier_restarts=verifier.total_restarts - restarts0,
    negatives_s=gen_s,
    check_s=check_s,
  )


def _pair_batch(questions, references, positives, negs, pos_idx, drop, **extra):
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
) -> tuple[PairBatch, dict]:
  """(PairBatch, stats) with each prompt's negative drawn uniformly from its group's rollouts
  that the rule verifier rejected; a group with no correct or no rejected rollout gives no pair
  ("no_positive" / "no_negative"). stats has build_pairs' keys (no candidates are made)."""
  n = len(questions)
  if len(references) != n or len(completions) != n * group_size:
    raise ValueError(
      f"{n} questions, {len(references)} references, {len(completions)} completions for "
      f"groups of {group_size}"
    )
  correct = np.asarray(correct_b, bool).reshape(n, group_size)
  pos_idx = select_positives(correct, group_size, strategy, rng)
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
    negative_tries=0,
    rejects=dict.fromkeys(REJECT_REASONS, 0),
    verifier_restarts=0,
    negatives_s=0.0,
    check_s=0.0,
  )
