"""Responses packed into shared rows (config `policy.pack_rows`): fewer padded positions.

A merged batch (cooper_jax.merge) pads every response to the step's response width w, a
bucket of its longest one. On the small task the responses average ~30 tokens at w = 64, so
about 60% of the positions the policy step and the reference pass compute are padding. Packed,
the responses to one prompt share rows of width w back to back (first-fit decreasing, longest
first); each sees its prompt and its own earlier tokens only, at the positions it would have
alone (`Transformer.hidden_shared_prompt` with segment ids), so its log-probs are the ones of a
row of its own up to float32 rounding. Rows never mix prompts: a row's prompt keys/values stay
one prompt's (`prompt_index`), as in the merged batch.

Each packed position names the merged row and column it holds (`src_row`, `src_col`; -1 for
padding), which is how the per-token inputs (advantage, weight, the sampler's and the reference
pass's log-probs) are laid out. The loss must be a token mean (config.validate).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

ROW_MULTIPLE = 8  # packed batches have a multiple of this many rows (and of the devices)


@dataclasses.dataclass(frozen=True)
class Packed:
  """prompt [r]: each packed row's prompt (padding rows repeat prompt[0]); src_row, src_col
  [r, w]: the input row and column each position holds (-1: padding); segment [r, w] int32:
  1, 2, ... for the responses of a row in order, 0 for padding; rows: packed rows that are not
  padding."""

  prompt: np.ndarray
  src_row: np.ndarray
  src_col: np.ndarray
  segment: np.ndarray
  rows: int

  @property
  def valid(self) -> np.ndarray:
    return self.segment > 0

  def gather(self, per_row_col: np.ndarray, fill=0) -> np.ndarray:
    """x [n, w] of the input rows (host) -> [r, w] at the packed positions, `fill` at padding."""
    x = np.asarray(per_row_col)
    out = x[np.maximum(self.src_row, 0), np.maximum(self.src_col, 0)]
    return np.where(self.valid, out, np.asarray(fill, x.dtype))

  def flat_index(self, row_of: np.ndarray | None = None) -> np.ndarray:
    """[r, w] int32 indices into an [m, w] array flattened (w: this packing's width), of each
    packed position's (row_of[src_row], src_col) (row_of: identity by default); 0 at padding."""
    width = self.src_col.shape[1]
    rows = self.src_row if row_of is None else np.asarray(row_of)[np.maximum(self.src_row, 0)]
    return np.where(self.valid, rows * width + self.src_col, 0).astype(np.int32)


def pack_rows(
  prompt_of_row: np.ndarray, lengths: np.ndarray, width: int, *, n_devices: int = 1
) -> Packed:
  """Input row i (a response of lengths[i] tokens to prompt prompt_of_row[i]) into rows of
  `width` positions: per prompt, longest first, each into the first row of that prompt with
  room (first-fit decreasing); rows in order of their prompts' first input row. Empty responses
  hold no position (a token mean never counts them). Rows are padded to a multiple of
  lcm(ROW_MULTIPLE, n_devices) with empty rows of the first row's prompt."""
  prompt_of_row, lengths = np.asarray(prompt_of_row), np.asarray(lengths)
  if len(prompt_of_row) != len(lengths):
    raise ValueError(f"pack_rows: {len(prompt_of_row)} prompts for {len(lengths)} lengths")
  if len(lengths) and (lengths.max() > width or lengths.min() < 0):
    raise ValueError(
      f"pack_rows: response lengths {lengths.min()}..{lengths.max()} not in 0..{width}"
    )
  bins: list[tuple[int, list[int]]] = []  # (prompt, input rows) per packed row
  room: list[int] = []
  for prompt in dict.fromkeys(prompt_of_row.tolist()):
    mine = [i for i in np.flatnonzero(prompt_of_row == prompt) if lengths[i] > 0]
    first = len(bins)
    for i in sorted(mine, key=lambda i: (-int(lengths[i]), i)):
      j = next((j for j in range(first, len(bins)) if room[j] >= lengths[i]), None)
      if j is None:
        bins.append((prompt, []))
        room.append(width)
        j = len(bins) - 1
      bins[j][1].append(int(i))
      room[j] -= int(lengths[i])
  multiple = math.lcm(ROW_MULTIPLE, n_devices)
  r = max(multiple, -(-len(bins) // multiple) * multiple)
  src_row = np.full((r, width), -1, np.int64)
  src_col = np.full((r, width), -1, np.int64)
  segment = np.zeros((r, width), np.int32)
  first_prompt = bins[0][0] if bins else int(prompt_of_row[0]) if len(prompt_of_row) else 0
  prompt = np.full(r, first_prompt, np.int64)
  for j, (p, members) in enumerate(bins):
    prompt[j], t = p, 0
    for s, i in enumerate(members, start=1):
      n = int(lengths[i])
      src_row[j, t : t + n], src_col[j, t : t + n], segment[j, t : t + n] = i, np.arange(n), s
      t += n
  return Packed(prompt=prompt, src_row=src_row, src_col=src_col, segment=segment, rows=len(bins))


@functools.partial(jax.jit, static_argnums=2)
def take_positions(x: jax.Array, flat_index: jax.Array, out_sharding) -> jax.Array:
  """x [m, w'] at flat_index [r, w] (into x flattened), laid out as out_sharding: a device-side
  gather of per-token values (log-probs) onto packed positions."""
  out = jnp.take(x.reshape(-1), flat_index.reshape(-1), axis=0).reshape(flat_index.shape)
  return jax.lax.with_sharding_constraint(out, out_sharding)
