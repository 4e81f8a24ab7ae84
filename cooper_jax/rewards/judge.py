"""A reference-based LLM judge: "is the candidate's final answer equivalent to the reference?"

Second labeller of Cooper's hybrid annotation (the paper used Qwen3-4B next to Math-Verify;
only triples where both agree train the RM). Any causal LM that load_pretrained can read
works as the judge.

The decision reads no generated text: after the chat-templated prompt, the judge's
next-token log-probabilities of the "yes" tokens are compared with those of the "no" tokens
(log-sum-exp over the case/space variants that are single tokens in its vocabulary). Why:
one forward pass per batch, deterministic, no answer parsing that could fail, and the
normalised p(yes) doubles as a confidence. A label is undecided (-1) only when no yes or no
token exists, the two sides tie exactly, or the logits are not finite; each is counted.

Only last-position logits are computed (Transformer.hidden, then Transformer.logits on the
last column, as sampling.py does): `forward()` would materialise [b, t, vocab] float32
logits, ~1 GB for 8 prompts of 640 tokens on a 49K vocabulary, to read one column of it.
The test checks the decisions against `forward()` directly.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import Transformer, positions_from_mask
from cooper_jax.prompts import cut_long_text, left_pad, padded_batches
from cooper_jax.rewards.pairs import perturb_solution
from cooper_jax.stats import roc_auc, sign_test

logger = logging.getLogger(__name__)

JUDGE_INSTRUCTION = (
  "Here is a problem, its reference answer and a candidate solution. "
  "Is the candidate's final answer equivalent to the reference answer? "
  "Answer with only 'yes' or 'no'."
)
# Spellings the judge may start its answer with. With a chat template the answer starts
# right after "assistant\n" (no space); a plain-text prompt ends in "Answer:", so the
# space-prefixed forms matter there. Multi-token spellings are skipped: their first piece
# ("Y", "N") would be shared with unrelated words.
YES_WORDS = ("yes", "Yes", "YES", " yes", " Yes", " YES")
NO_WORDS = ("no", "No", "NO", " no", " No", " NO")


def judge_prompt(question: str, reference: str, completion: str) -> str:
  """The judge's user message. Reference and completion are cut as the RM's input is
  (prompts.cut_long_text: first 500 + last 1000 characters), so both verifiers see the same
  text; the question is never cut. The instruction is repeated at the end because small
  judges follow the instruction nearest the answer slot."""
  return (
    f"{JUDGE_INSTRUCTION}\n\n"
    f"Problem:\n{question}\n\n"
    f"Reference answer:\n{cut_long_text(reference)}\n\n"
    f"Candidate solution:\n{cut_long_text(completion)}\n\n"
    "Is the candidate's final answer equivalent to the reference answer? "
    "Answer with only 'yes' or 'no'."
  )


def answer_token_ids(tokenizer) -> tuple[list[int], list[int]]:
  """(yes ids, no ids) from the (YES_WORDS[i], NO_WORDS[i]) pairs whose two spellings are
  each one token. Kept in pairs so both sides sum over the same kinds of spelling: an extra
  "NO" with no "YES" counterpart would tilt the log-sum-exp towards "no"."""
  yes, no = [], []
  for y, n in zip(YES_WORDS, NO_WORDS):
    ey, en = tokenizer.encode(y), tokenizer.encode(n)
    if len(ey) == 1 and len(en) == 1 and ey[0] not in yes and en[0] not in no:
      yes.append(int(ey[0]))
      no.append(int(en[0]))
  return yes, no


@functools.partial(jax.jit, static_argnames=("cfg",))
def _last_logprobs(params, tokens_bt, mask_bt, ids_k, *, cfg: ModelConfig):
  """log-softmax at the last position, read at ids_k: [b, k] float32."""
  model = Transformer(cfg)
  variables = {"params": params}
  h_btd, _ = model.apply(
    variables, tokens_bt, positions_from_mask(mask_bt), mask_bt, method=Transformer.hidden
  )
  logits_bv = model.apply(variables, h_btd[:, -1:], method=Transformer.logits)[:, 0]
  return jnp.take(jax.nn.log_softmax(logits_bv, axis=-1), ids_k, axis=1)


def _render(tokenizer, user_texts: list[str], chat: bool) -> list[str]:
  if chat:
    return [tokenizer.chat_prompt(t) for t in user_texts]
  return [t + "\nAnswer:" for t in user_texts]


def decide(logp_yes: np.ndarray, logp_no: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
  """labels int8 (1 yes, 0 no, -1 undecided), p_yes = P(yes | yes or no), reason counts.

  logp_yes [n, ky], logp_no [n, kn]: log-probs of the yes / no tokens at the answer slot.
  """
  n = logp_yes.shape[0]
  reasons = {"no_answer_tokens": 0, "tie": 0, "non_finite": 0}
  if logp_yes.shape[1] == 0 or logp_no.shape[1] == 0:
    reasons["no_answer_tokens"] = n
    return np.full(n, -1, np.int8), np.full(n, np.nan), reasons
  with np.errstate(all="ignore"):
    ly = np.logaddexp.reduce(logp_yes.astype(np.float64), axis=1)
    ln = np.logaddexp.reduce(logp_no.astype(np.float64), axis=1)
    p_yes = 1.0 / (1.0 + np.exp(ln - ly))
  finite = np.isfinite(ly) & np.isfinite(ln)
  labels = np.where(ly > ln, 1, 0).astype(np.int8)
  tie = finite & (ly == ln)
  labels[~finite | tie] = -1
  reasons["non_finite"], reasons["tie"] = int((~finite).sum()), int(tie.sum())
  return labels, np.where(finite, p_yes, np.nan), reasons


def llm_judge(
  cfg: ModelConfig,
  params,
  tokenizer,
  questions: Sequence[str],
  references: Sequence[str],
  completions: Sequence[str],
  *,
  batch_size: int = 8,
  chat: bool | None = None,
  max_len: int = 2048,
  pad_to_multiple: int = 64,
) -> tuple[np.ndarray, dict]:
  """Judge each (question, reference, completion): (labels int8 [n], stats).

  labels: 1 yes (equivalent), 0 no, -1 undecided. chat=None uses the tokenizer's chat
  template when it has one (else a plain "...\\nAnswer:" prompt; stats["chat"] says which).
  Prompts are sorted by length into batches (less padding), each batch padded to batch_size
  rows (one compiled shape per width); results come back in input order.
  stats: counts (yes/no/undecided and why), truncated prompts, the token ids used, mean
  p_yes and mean yes+no probability mass (low mass = the judge is not answering yes/no at
  all, so its labels mean little), timings, and per-item "p_yes" (a list; NaN where undecided).
  """
  n = len(questions)
  if len(references) != n or len(completions) != n:
    raise ValueError(
      f"length mismatch: {n} questions, {len(references)} references, "
      f"{len(completions)} completions"
    )
  if batch_size < 1 or max_len < 1:
    raise ValueError("batch_size and max_len must be >= 1")
  if cfg.head != "lm":
    raise ValueError(f"the judge needs next-token logits (head='lm'), got head={cfg.head!r}")
  t0 = time.perf_counter()
  yes_ids, no_ids = answer_token_ids(tokenizer)
  if chat is None:
    chat = bool(getattr(tokenizer.hf, "chat_template", None))
  stats = {
    "n": n,
    "chat": chat,
    "yes_token_ids": yes_ids,
    "no_token_ids": no_ids,
    "batch_size": batch_size,
    "max_len": max_len,
    "truncated_prompts": 0,
  }
  logp_yes = np.full((n, len(yes_ids)), -np.inf)
  logp_no = np.full((n, len(no_ids)), -np.inf)
  forward_s = 0.0
  if n and yes_ids and no_ids:
    texts = _render(
      tokenizer,
      [judge_prompt(q, r, c) for q, r, c in zip(questions, references, completions)],
      chat,
    )
    encoded = [tokenizer.encode(t) for t in texts]
    order = np.argsort([len(r) for r in encoded], kind="stable")
    ids_k = jnp.asarray(yes_ids + no_ids, jnp.int32)
    for _, idx, real in padded_batches(order, batch_size):
      tokens, mask, cut = left_pad(
        [encoded[i] for i in idx], tokenizer.pad_id, max_len, pad_to_multiple
      )
      stats["truncated_prompts"] += int(cut[:real].sum())
      t1 = time.perf_counter()
      lp = np.asarray(
        _last_logprobs(params, jnp.asarray(tokens), jnp.asarray(mask), ids_k, cfg=cfg)
      )
      forward_s += time.perf_counter() - t1
      logp_yes[idx[:real]] = lp[:real, : len(yes_ids)]
      logp_no[idx[:real]] = lp[:real, len(yes_ids) :]
  elif n:
    logger.warning(
      "judge tokenizer has no single-token yes/no (yes %s, no %s): all %d items undecided",
      yes_ids,
      no_ids,
      n,
    )
  labels, p_yes, reasons = decide(logp_yes, logp_no)
  with np.errstate(all="ignore"):
    mass = (
      np.exp(
        np.logaddexp(np.logaddexp.reduce(logp_yes, axis=1), np.logaddexp.reduce(logp_no, axis=1))
      )
      if n
      else np.zeros(0)
    )
  decided = labels >= 0
  stats.update(
    yes=int((labels == 1).sum()),
    no=int((labels == 0).sum()),
    undecided=int((labels < 0).sum()),
    undecided_reasons=reasons,
    mean_p_yes=float(np.mean(p_yes[decided])) if decided.any() else None,
    mean_yes_no_mass=float(np.mean(mass[np.isfinite(mass)])) if np.isfinite(mass).any() else None,
    forward_s=forward_s,
    wall_s=time.perf_counter() - t0,
    p_yes=[None if not np.isfinite(p) else float(p) for p in p_yes],
  )
  if stats["undecided"]:
    logger.warning("judge: %d of %d items undecided (%s)", stats["undecided"], n, reasons)
  if stats["truncated_prompts"]:
    logger.warning(
      "judge: %d prompts over max_len=%d kept only their last tokens",
      stats["truncated_prompts"],
      max_len,
    )
  return labels, stats


# A clean solution whose only content is its final answer: the control asks the judge the
# easiest form of its question (is this boxed answer the reference?).
CONTROL_SOLUTION = "Working through the problem step by step gives the result.\nThe final answer is $\\boxed{{{answer}}}$."


def control_items(
  references: Sequence[str], seed: int = 0
) -> tuple[list[int], list[str], list[str]]:
  """(kept question indexes, right completions, wrong completions) for the judge control.

  Right: CONTROL_SOLUTION with the reference boxed. Wrong: the same text with its final
  answer perturbed (rewards.pairs.perturb_solution: another number, or " + 1" on a
  non-numeric answer), so the two differ only in the answer. A reference that is empty or
  that the perturbation cannot change is skipped (the caller counts them)."""
  rng = np.random.default_rng(seed)
  idx, right, wrong = [], [], []
  for i, ref in enumerate(references):
    ref = str(ref).strip()
    if not ref:
      continue
    good = CONTROL_SOLUTION.format(answer=ref)
    bad = perturb_solution(good, rng)
    if not bad or bad == good:
      continue
    idx.append(i)
    right.append(good)
    wrong.append(bad)
  return idx, right, wrong


def judge_control(
  judge_fn: Callable, questions: Sequence[str], references: Sequence[str], *, seed: int = 0
) -> dict:
  """A positive control for a judge, before its labels are trusted: can it tell a right
  final answer from a wrong one when nothing else differs?

  judge_fn(questions, references, completions) -> (labels, stats with per-item "p_yes"), e.g.
  functools.partial(llm_judge, cfg, params, tokenizer). Each question is judged with a right
  and a wrong clean solution (control_items). Returns counts and: auc (p_yes of right vs
  wrong items), per question whether p_yes(right) > p_yes(wrong) (prefers_right /
  prefers_wrong / ties, an undecided item counting as a tie), the exact sign test's p over
  those, the yes rates on right and wrong items, and `discriminates` (more questions prefer
  right than wrong at p < 0.05). A judge at chance here labels real rollouts at chance too.
  """
  idx, right, wrong = control_items(references, seed)
  n = len(idx)
  out = {"n_questions": len(questions), "n_items": 2 * n, "skipped": len(questions) - n}
  if n == 0:
    return out | {"auc": None, "discriminates": False}
  qs = [questions[i] for i in idx] * 2
  refs = [str(references[i]) for i in idx] * 2
  labels, stats = judge_fn(qs, refs, right + wrong)
  p = np.array([np.nan if v is None else v for v in stats["p_yes"]], np.float64)
  labels = np.asarray(labels)
  y = np.r_[np.ones(n, int), np.zeros(n, int)]
  ok = np.isfinite(p)
  pr, pw = p[:n], p[n:]
  decided = np.isfinite(pr) & np.isfinite(pw)
  better, worse = int((decided & (pr > pw)).sum()), int((decided & (pr < pw)).sum())
  sign_p = sign_test(better, worse)
  return out | {
    "auc": roc_auc(p[ok], y[ok]),
    "undecided_items": int((~ok).sum()),
    "prefers_right": better,
    "prefers_wrong": worse,
    "ties": n - better - worse,
    "sign_test_p": sign_p,
    "yes_rate_right": float((labels[:n] == 1).mean()),
    "yes_rate_wrong": float((labels[n:] == 1).mean()),
    "discriminates": bool(better > worse and sign_p < 0.05),
    "example": {"reference": refs[0], "right": right[0], "wrong": wrong[0]},
  }


def describe_control(c: dict | None) -> str:
  """One line for judge_control's result, as the annotation stats, its warning and the
  pipeline's report print it."""
  if not c:
    return "judge control: not run"
  if c.get("auc") is None:
    return f"judge control: no decided item ({c['n_questions']} questions, {c['skipped']} skipped)"
  verdict = (
    "the judge discriminates"
    if c["discriminates"]
    else "the judge does not discriminate: its labels are near chance, so the kept set is the "
    "triples where a chance label happened to match the rule's"
  )
  return (
    f"judge control ({c['n_items'] // 2} questions, a right and a wrong clean solution each): "
    f"AUC {c['auc']:.3f}; prefers the right one in {c['prefers_right']}, the wrong one in "
    f"{c['prefers_wrong']}, ties {c['ties']} (sign test p {c['sign_test_p']:.3g}); says yes to "
    f"{c['yes_rate_right']:.2f} of right, {c['yes_rate_wrong']:.2f} of wrong: {verdict}"
  )


__all__ = [
  "JUDGE_INSTRUCTION",
  "judge_prompt",
  "answer_token_ids",
  "decide",
  "llm_judge",
  "control_items",
  "judge_control",
  "describe_control",
]
