"""The reference-based reward model's input: the one place it is built.

Cooper's VerifyRM reads plain text, no chat template (reference code, `cooper_format_prompt`):

    <question>{q}</question>\\n<reference_answer>{a}</reference_answer>\\n<completion>{o}</completion>

Scoring (RL reward), RM pretraining and the co-training pairs must all go through
`build_rm_input`, or the RM is trained on one format and queried with another.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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
) -> tuple[np.ndarray, np.ndarray, int]:
  """(tokens int32 [B, T], mask bool [B, T], n_truncated), left padded, T <= max_len.

  An input longer than max_len tokens keeps its LAST max_len tokens. Why the end: the score
  is read at the last real token, and the end holds the completion's final answer. (The
  reference code right-truncates by default, which cuts exactly the answer the RM must
  judge; with the 500+1000 character cut above this only bites on very long questions.)
  Every such cut is counted in n_truncated so the caller can report it.
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
  n_truncated = sum(len(r) > max_len for r in rows)
  rows = [r[-max_len:] for r in rows]
  longest = max(len(r) for r in rows)
  width = min(max_len, -(-longest // pad_to_multiple) * pad_to_multiple)
  tokens = np.full((n, width), tokenizer.pad_id, dtype=np.int32)
  mask = np.zeros((n, width), dtype=np.bool_)
  for i, r in enumerate(rows):
    tokens[i, width - len(r) :] = r
    mask[i, width - len(r) :] = True
  return tokens, mask, int(n_truncated)
