"""Every model input built from text, in one place: the policy's prompt and the reference-based
reward model's input.

Policy: the question plus `INSTRUCTION_SUFFIX` in the model's chat template; training rollouts,
evaluation and SFT render it through `build_prompts`, so the policy is trained and measured on
one format.

RM: Cooper's VerifyRM reads plain text, no chat template (reference code, `cooper_format_prompt`):

    <question>{q}</question>\\n<reference_answer>{a}</reference_answer>\\n<completion>{o}</completion>

Scoring (RL reward), RM pretraining and the co-training pairs all go through
`encode_rm_inputs`, or the RM is trained on one format and queried with another.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

INSTRUCTION_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def widen_left(tok: np.ndarray, mask: np.ndarray, width: int, pad_id: int):
  """Left-padded inputs widened to `width` columns (more left padding: same model output), e.g.
  to a width every process agreed on."""
  extra = width - tok.shape[1]
  if extra == 0:
    return tok, mask
  return (
    np.pad(tok, ((0, 0), (extra, 0)), constant_values=pad_id),
    np.pad(mask, ((0, 0), (extra, 0)), constant_values=False),
  )


def left_pad(
  rows: Sequence[Sequence[int]], pad_id: int, max_len: int | None = None, pad_to_multiple: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens int32 [b, w], mask bool [b, w], cut bool [b]) with every row ending in column w-1.

  w is the longest row rounded up to `pad_to_multiple` (fewer shapes to compile), capped at
  max_len; a row longer than max_len keeps its LAST max_len tokens and is marked in `cut`
  (callers that must not cut, like prompts, check lengths first)."""
  if not rows:
    raise ValueError("left_pad needs at least one row")
  if pad_to_multiple < 1 or (max_len is not None and max_len < 1):
    raise ValueError(f"max_len and pad_to_multiple must be >= 1, got {max_len}, {pad_to_multiple}")
  cut = np.array([max_len is not None and len(r) > max_len for r in rows], bool)
  if max_len is not None:
    rows = [r[-max_len:] for r in rows]
  width = -(-max(len(r) for r in rows) // pad_to_multiple) * pad_to_multiple
  if max_len is not None:
    width = min(width, max_len)
  tokens = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.bool_)
  for i, r in enumerate(rows):
    if len(r):
      tokens[i, width - len(r) :], mask[i, width - len(r) :] = r, True
  return tokens, mask, cut


def padded_batches(order: Sequence[int] | np.ndarray, batch_size: int):
  """Yields (batch index, row indices [batch_size], n_real) over `order` in chunks; the last
  chunk is filled with copies of its last row, so every batch has one compiled shape. Callers
  keep the first n_real results."""
  order = np.asarray(order)
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  for bi, start in enumerate(range(0, order.size, batch_size)):
    idx = order[start : start + batch_size]
    yield bi, np.concatenate([idx, np.full(batch_size - idx.size, idx[-1])]), idx.size


def build_prompts(
  tokenizer, questions: Sequence[str], suffix: str = INSTRUCTION_SUFFIX, chat: bool = True
) -> list[str]:
  """The policy's prompt text per question (chat-templated unless chat=False)."""
  return [tokenizer.chat_prompt(q + suffix) if chat else q + suffix for q in questions]


# The reference code cuts a reference answer or completion longer than 1500 characters to
# its first 500 + last 1000 characters: `if len(x) > 1500: x = x[:500] + x[-1000:]`.
# The head keeps the setup of the solution, the (longer) tail keeps the final answer, which
# is what a reference-based verifier must compare. Text of exactly 1500 characters is kept
# whole. The question is never cut (reference code does not cut it either).
CUT_ABOVE_CHARS = 1500
HEAD_CHARS = 500
TAIL_CHARS = 1000


def cut_long_text(text: str) -> str:
  """text[:500] + text[-1000:] when len(text) > 1500, else text unchanged (reference rule)."""
  text = str(text)
  if len(text) > CUT_ABOVE_CHARS:
    return text[:HEAD_CHARS] + text[-TAIL_CHARS:]
  return text


def build_rm_input(question: str, reference: str, completion: str) -> str:
  """The RM's input text for one (question, reference answer, completion) triple."""
  return (
    f"<question>{question}</question>\n"
    f"<reference_answer>{cut_long_text(reference)}</reference_answer>\n"
    f"<completion>{cut_long_text(completion)}</completion>"
  )


def encode_rm_inputs(
  tokenizer,
  questions: Sequence[str],
  references: Sequence[str],
  completions: Sequence[str],
  max_len: int,
  *,
  pad_to_multiple: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens int32 [B, T], mask bool [B, T], cut bool [B]), left padded, T <= max_len.

  An input longer than max_len tokens keeps its LAST max_len tokens. Why the end: the score
  is read at the last real token, and the end holds the completion's final answer. (The
  reference code right-truncates by default, which cuts exactly the answer the RM must
  judge; with the 500+1000 character cut above this only bites on very long questions.)
  Every such cut is marked in `cut` so the caller can count and report it.
  No special tokens are added (as the reference code: add_special_tokens=False).
  """
  n = len(questions)
  if not n:
    raise ValueError("encode_rm_inputs needs at least one input")
  if len(references) != n or len(completions) != n:
    raise ValueError(
      f"length mismatch: {n} questions, {len(references)} references, "
      f"{len(completions)} completions"
    )
  if max_len < 1 or pad_to_multiple < 1:
    raise ValueError(f"max_len and pad_to_multiple must be >= 1, got {max_len}, {pad_to_multiple}")
  rows = [
    tokenizer.encode(build_rm_input(q, a, o)) for q, a, o in zip(questions, references, completions)
  ]
  tokens, mask, cut = left_pad(rows, tokenizer.pad_id, max_len, pad_to_multiple)
  return tokens, mask, cut
