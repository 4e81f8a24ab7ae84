"""Identical rollouts of a step, run once (config `policy.merge_duplicate_rows`).

A policy that has learned a problem samples the same response for it again and again: in the
small task's studies about half of each group's rollouts repeat another one of the group. Rows
with the same prompt, the same tokens (and, for the policy step, the same advantage) give the
same log-probs and the same per-token loss, so the policy step and the reference pass can run
each distinct row once with a weight (its count; `steps.policy_loss_fn`). Loss, gradient and
metrics are then the full batch's up to float rounding.

Distinct rows keep the order of their first occurrence; the merged batch is padded to a bucket
of rows (fewer shapes to compile) with copies of its first row at weight 0.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import distributed as dist
from cooper_jax import pack as pack_lib
from cooper_jax import sharding

ROW_MULTIPLE = 16  # merged batches have a multiple of this many rows (and of the devices)


@dataclasses.dataclass(frozen=True)
class Merged:
  """index [m]: the original row each merged row holds (padding repeats index[0]); weight [m]:
  how many original rows it stands for (0 for padding); inverse [n]: the merged row of each
  original row; distinct: merged rows that are not padding."""

  index: np.ndarray
  weight: np.ndarray
  inverse: np.ndarray
  distinct: int


def merge_rows(
  prompt_of_row: np.ndarray,
  tokens: np.ndarray,
  lengths: np.ndarray,
  *,
  extra: np.ndarray | None = None,
  n_devices: int = 1,
  row_weight: np.ndarray | None = None,
) -> Merged:
  """Rows i and j merge when they answer the same prompt, their first lengths[i] tokens are
  equal (lengths equal too) and, with `extra`, extra[i] == extra[j] bit for bit (the advantage
  of a policy row). The result has a multiple of lcm(ROW_MULTIPLE, n_devices) rows, at most
  the original count. row_weight [n]: each original row's loss weight (1 when None); a merged
  row weighs the sum of its rows'."""
  n = len(prompt_of_row)
  if not len(tokens) == len(lengths) == n or (extra is not None and len(extra) != n):
    raise ValueError(
      f"merge_rows: {n} prompts, {len(tokens)} token rows, {len(lengths)} lengths"
      + ("" if extra is None else f", {len(extra)} extra values")
    )
  keys = [(int(prompt_of_row[i]), tokens[i, : int(lengths[i])].tobytes()) for i in range(n)]
  if extra is not None:
    keys = [k + (np.asarray(x).tobytes(),) for k, x in zip(keys, extra)]
  distinct, slot = distinct_items(keys)
  inverse = np.asarray(slot, np.int64)
  _, first = np.unique(inverse, return_index=True)  # each distinct row's first occurrence
  counts = np.bincount(inverse, weights=row_weight, minlength=len(distinct))
  first, counts = first.tolist(), counts.tolist()
  pad = padded_rows(len(first), n, n_devices) - len(first)
  return Merged(
    index=np.asarray(first + [first[0]] * pad, np.int64),
    weight=np.asarray(counts + [0] * pad, np.float32),
    inverse=inverse,
    distinct=len(first),
  )


def padded_rows(distinct: int, n: int, n_devices: int = 1) -> int:
  """Rows of a merged batch: `distinct` rounded up to a multiple of lcm(ROW_MULTIPLE,
  n_devices), at most the original n (and at least distinct)."""
  multiple = math.lcm(ROW_MULTIPLE, n_devices)
  return max(distinct, min(n, -(-distinct // multiple) * multiple))


def distinct_items(items: list) -> tuple[list, list[int]]:
  """(the distinct items in order of first occurrence, each item's position among them)."""
  index: dict = {}
  slot = [index.setdefault(x, len(index)) for x in items]
  return list(index), slot


@functools.partial(jax.jit, static_argnums=2)
def take_rows(x: jax.Array, index: jax.Array, out_sharding) -> jax.Array:
  """x[index] along the rows, laid out as out_sharding (a device-side gather: global arrays on
  every process, index replicated)."""
  return jax.lax.with_sharding_constraint(jnp.take(x, index, axis=0), out_sharding)


class MergedStep:
  """One step's batches with identical rows merged (cooper_jax.merge): the reference pass on
  rows distinct in (prompt, tokens), the policy step on rows distinct in (prompt, tokens,
  advantage), each reading its reference log-probs from the first. After `policy_batch`:
  rows, the policy batch's rows; distinct, its distinct responses; fill, real response tokens
  over the positions it computes."""

  def __init__(self, mesh, group: int, n_prompts: int, tok, mask, resp_tok, resp_len, pack=False):
    """tok, mask: every row's prompt [n, p] (host); resp_tok [n, w], resp_len [n]: every row's
    response (host, all processes alike); group: rows per prompt, consecutive; n_prompts > 0:
    the batches say each row's prompt by index (steps.make_policy_step); pack: the distinct
    rows packed into shared rows (cooper_jax.pack; needs n_prompts > 0)."""
    if pack and not n_prompts:
      raise ValueError("packed rows need the prompt-indexed batch (n_prompts > 0)")
    self.mesh, self.n_prompts, self.tok, self.mask = mesh, n_prompts, tok, mask
    self.resp_tok, self.resp_len = resp_tok, np.asarray(resp_len)
    self.group, self.group_of = group, np.arange(len(tok)) // group
    self.n_dev = mesh.shape["data"] * mesh.shape["fsdp"]
    self.ref = merge_rows(self.group_of, resp_tok, self.resp_len, n_devices=self.n_dev)
    self.pack = pack
    if pack:
      self.ref_packed = self._pack(self.ref)

  def _put(self, x, ndim=2):
    return dist.put_global(x, sharding.batch_sharding(self.mesh, ndim))

  def _rows(self, idx) -> dict:
    resp_mask = np.arange(self.resp_tok.shape[1])[None] < self.resp_len[idx, None]
    rows = {
      "prompt_tokens": self._put(np.asarray(self.tok[idx], np.int32)),
      "prompt_mask": self._put(self.mask[idx]),
      "response_tokens": self._put(np.asarray(self.resp_tok[idx], np.int32)),
      "response_mask": self._put(resp_mask),
    }
    if self.n_prompts:
      rows["prompt_index"] = self._put(self.group_of[idx].astype(np.int32), 1)
    return rows

  def _pack(self, merged: Merged) -> pack_lib.Packed:
    """The merged rows' responses packed (padding rows left out): src_row indexes merged rows."""
    idx = merged.index[: merged.distinct]
    return pack_lib.pack_rows(
      self.group_of[idx], self.resp_len[idx], self.resp_tok.shape[1], n_devices=self.n_dev
    )

  def _packed_rows(self, merged: Merged, packed: pack_lib.Packed) -> dict:
    """The packed batch's prompt and response arrays (a representative row of each prompt)."""
    first_row = packed.prompt * self.group
    orig = merged.index[np.maximum(packed.src_row, 0)]
    tokens = np.where(packed.valid, self.resp_tok[orig, np.maximum(packed.src_col, 0)], 0)
    return {
      "prompt_tokens": self._put(np.asarray(self.tok[first_row], np.int32)),
      "prompt_mask": self._put(self.mask[first_row]),
      "response_tokens": self._put(tokens.astype(np.int32)),
      "response_mask": self._put(packed.valid),
      "prompt_index": self._put(packed.prompt.astype(np.int32), 1),
      "response_segment": self._put(packed.segment),
    }

  def ref_batch(self) -> dict:
    if self.pack:
      return self._packed_rows(self.ref, self.ref_packed)
    return self._rows(self.ref.index)

  def policy_batch(
    self, adv: np.ndarray, sampler_logp: jax.Array, ref_logp=None, row_weight=None
  ) -> dict:
    """The policy step's batch: adv [n] (host) and sampler_logp [n, w] of every row, ref_logp
    of the reference batch's rows (or None), gathered onto the merged policy rows; row_weight
    [n] (host, or None: 1): each row's loss weight (0: out of the loss, `merge_rows`)."""
    pol = merge_rows(
      self.group_of,
      self.resp_tok,
      self.resp_len,
      extra=adv,
      n_devices=self.n_dev,
      row_weight=row_weight,
    )
    self.rows, self.distinct = len(pol.index), pol.distinct
    everywhere = sharding.replicated(self.mesh)
    if self.pack:
      return self._packed_policy_batch(pol, adv, sampler_logp, ref_logp, everywhere)
    width = self.resp_tok.shape[1]
    self.fill = float(self.resp_len[pol.index[: pol.distinct]].sum()) / (self.rows * width)
    take = lambda x, idx: take_rows(
      x,
      dist.put_global(idx.astype(np.int32), everywhere),
      sharding.batch_sharding(self.mesh, x.ndim),
    )
    batch = self._rows(pol.index)
    batch["row_weight"] = self._put(pol.weight, 1)
    batch["advantages"] = self._put(adv[pol.index], 1)
    batch["sampler_logp"] = take(sampler_logp, pol.index)
    if ref_logp is not None:
      same = np.array_equal(pol.index, self.ref.index)  # the usual case: nothing to gather
      batch["ref_logp"] = ref_logp if same else take(ref_logp, self.ref.inverse[pol.index])
    return batch

  def _packed_policy_batch(self, pol: Merged, adv, sampler_logp, ref_logp, everywhere) -> dict:
    """policy_batch with the distinct rows packed: per-token advantage and weight, the
    sampler's log-probs gathered from its [n, w] rows, the reference pass's from its own
    packing (the same rows, usually: then the same packing, and nothing to gather)."""
    idx = pol.index[: pol.distinct]
    ref = self.ref_packed
    same = np.array_equal(idx, self.ref.index[: self.ref.distinct])
    packed = ref if same else self._pack(pol)  # packing depends on the rows alone
    self.rows, w = len(packed.prompt), self.resp_tok.shape[1]
    self.fill = float(packed.valid.sum()) / (self.rows * w)
    sh = sharding.batch_sharding(self.mesh, 2)
    take = lambda x, flat: pack_lib.take_positions(x, dist.put_global(flat, everywhere), sh)
    batch = self._packed_rows(pol, packed)
    at_rows = lambda v: np.broadcast_to(np.asarray(v)[:, None], (len(v), w))
    batch["row_weight"] = self._put(packed.gather(at_rows(pol.weight[: pol.distinct])))
    batch["advantages"] = self._put(packed.gather(at_rows(adv[idx].astype(np.float32))))
    batch["sampler_logp"] = take(sampler_logp, packed.flat_index(idx))
    if ref_logp is not None and same:
      batch["ref_logp"] = ref_logp
    elif ref_logp is not None:
      # Each policy position's reference log-prob: its (distinct reference row, column)'s
      # packed position in the reference batch.
      pos = np.zeros((self.ref.distinct, w), np.int64)
      pos[ref.src_row[ref.valid], ref.src_col[ref.valid]] = np.flatnonzero(ref.valid.reshape(-1))
      ref_row = self.ref.inverse[idx]
      flat = np.where(
        packed.valid,
        pos[ref_row[np.maximum(packed.src_row, 0)], np.maximum(packed.src_col, 0)],
        0,
      ).astype(np.int32)
      batch["ref_logp"] = take(ref_logp, flat)
    return batch
