"""DAPO's overlong handling (Yu et al. 2025, arXiv 2503.14476, section 3.4), by config
`rollout.overlong` (both parts off by default):

- soft overlong punishment (`penalty_buffer` > 0): eq. 13 of the paper, with L_max =
  `penalty_max_len` (0: rollout.max_new_tokens) and L_cache = `penalty_buffer`,

      R_length(y) = 0                               |y| <= L_max - L_cache
                  = ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                  = -1                              L_max < |y|

  times `penalty_factor` (verl's recipe/dapo `overlong_penalty_factor`, 1 in the paper), added
  to the reward of each rollout before the group advantages. |y| is the response's token count
  with its stop token, as verl's valid response length. The reward written to rollouts.jsonl
  and `reward/mean` stay the reward source's; the penalty's batch mean is
  `response/overlong_penalty_mean`.
- overlong filtering (`filter`): a response cut at rollout.max_new_tokens gets loss weight 0
  in the policy step (no gradient, out of every token and row count); counted as
  `policy/overlong_masked_rows`. "Cut" is `response/truncated_frac`'s test, length ==
  max_new_tokens: a response whose stop token falls exactly on the last slot counts too.
"""

from __future__ import annotations

import numpy as np


def penalty_on(c) -> bool:
  return c.rollout.overlong.penalty_buffer > 0


def penalty(resp_len, c) -> np.ndarray:
  """The soft overlong punishment of each response length ([n] float32, <= 0); zeros when off."""
  o = c.rollout.overlong
  length = np.asarray(resp_len, np.float64)
  if o.penalty_buffer <= 0:
    return np.zeros(length.shape, np.float32)
  l_max = o.penalty_max_len or c.rollout.max_new_tokens
  over = (length - (l_max - o.penalty_buffer)) / o.penalty_buffer
  return (-o.penalty_factor * np.clip(over, 0.0, 1.0)).astype(np.float32)


def truncated(resp_len, c) -> np.ndarray:
  """Which responses were cut at rollout.max_new_tokens ([n] bool)."""
  return np.asarray(resp_len) >= c.rollout.max_new_tokens


def row_weight(resp_len, c) -> np.ndarray | None:
  """Each rollout's loss weight under overlong filtering (0: cut at max_new_tokens, else 1),
  or None when filtering is off."""
  if not c.rollout.overlong.filter:
    return None
  return (~truncated(resp_len, c)).astype(np.float32)


def validate(c) -> None:
  o = c.rollout.overlong
  if not isinstance(o.filter, bool):
    raise ValueError(f"config.rollout.overlong.filter must be True or False, got {o.filter!r}")
  for key in ("penalty_buffer", "penalty_max_len"):
    if not isinstance(o[key], int) or isinstance(o[key], bool) or o[key] < 0:
      raise ValueError(f"config.rollout.overlong.{key} must be an int >= 0, got {o[key]!r}")
  if o.penalty_factor < 0:
    raise ValueError(f"config.rollout.overlong.penalty_factor must be >= 0, got {o.penalty_factor}")
  l_max = o.penalty_max_len or c.rollout.max_new_tokens
  if o.penalty_buffer > l_max:
    raise ValueError(
      f"config.rollout.overlong.penalty_buffer={o.penalty_buffer} (L_cache) exceeds L_max={l_max}"
      " (penalty_max_len, 0: rollout.max_new_tokens)"
    )
