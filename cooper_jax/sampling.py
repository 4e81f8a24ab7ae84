"""Compiled sampling: one jit holds prefill and the whole decode loop (a lax.while_loop).

The KV cache has a static shape per layer, [b, k, prompt_len + max_new_tokens, e]. Each decode
step runs the training graph's layers (transformer.decode_hidden: the same Block, unrolled, on
per-layer weights split once per call) on one token per row; each layer writes its key/value
into its own cache buffer in place and attends over it. The loop exits as soon as every row
has emitted an end-of-sequence token.

`sample` = `prefill` (the prompts' forward, the cache, the loop's initial DecodeState), then
`decode_step` in the while_loop; cooper_jax.aot.decode compiles that same step alone for a TPU
topology (cooper_jax/cli/aot_decode.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import sharding
from cooper_jax.config import SAMPLER_DTYPES
from cooper_jax.logprobs import logit_temperature
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import (
  KVCache,
  Transformer,
  decode_hidden,
  outer_variables,
  positions_from_mask,
  split_layers,
)


class SampleOutput(NamedTuple):
  """tokens [b, n] (pad after the stop), logprobs [b, n] float32, mask [b, n] bool.

  mask is True for generated tokens up to and including the end-of-sequence token. logprobs
  are log-softmax(logits / temperature) at the sampled token (raw logits when greedy), before
  top-k/top-p filtering; 0 where mask is False.
  """

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array


# Candidates for the nucleus before falling back to a full sort: with a 50k-150k vocabulary a
# sort per decode step costs more than the step's LM head on a CPU, while the top-p=0.95
# nucleus of a trained model rarely holds more than a few dozen tokens.
TOP_P_CANDIDATES = 256


def _filter_logits(scaled_bv, top_p: float, top_k: int):
  """Top-k then top-p (nucleus) filtering; filtered entries become -inf.

  Top-p looks at the TOP_P_CANDIDATES largest logits first; only if the nucleus does not end
  among them (some row's kept prefix reaches the last candidate) does it sort the whole
  vocabulary. Either way the cutoff is the one a full sort gives: the softmax over the
  candidates is renormalised to the full vocabulary's mass before the cumulative sum."""
  neg_inf = jnp.finfo(scaled_bv.dtype).min
  if top_k > 0:
    kth_b1 = jax.lax.top_k(scaled_bv, top_k)[0][:, -1:]
    scaled_bv = jnp.where(scaled_bv < kth_b1, neg_inf, scaled_bv)
  if top_p < 1.0:
    v = scaled_bv.shape[-1]
    k = min(TOP_P_CANDIDATES, v)
    top_bk = jax.lax.top_k(scaled_bv, k)[0]
    # Probabilities within the whole vocabulary (as softmax computes them), not a softmax over
    # the k candidates: the cumulative sum must be of the full distribution's mass.
    max_b1 = top_bk[:, :1]
    denom_b1 = jnp.sum(jnp.exp(scaled_bv - max_b1), axis=-1, keepdims=True)
    probs_bk = jnp.exp(top_bk - max_b1) / denom_b1
    keep_bk = (jnp.cumsum(probs_bk, axis=-1) - probs_bk) < top_p
    cutoff_b1 = jnp.min(jnp.where(keep_bk, top_bk, jnp.inf), axis=-1, keepdims=True)
    inside = jnp.all(~keep_bk[:, -1]) if k < v else jnp.bool_(True)

    def full_sort(_):
      sorted_bv = jnp.sort(scaled_bv, axis=-1)[:, ::-1]
      probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
      keep_bv = (jnp.cumsum(probs_bv, axis=-1) - probs_bv) < top_p
      return jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True)

    cutoff_b1 = jax.lax.cond(inside, lambda _: cutoff_b1, full_sort, None)
    scaled_bv = jnp.where(scaled_bv < cutoff_b1, neg_inf, scaled_bv)
  return scaled_bv


# sample's default number of cache segments (see `sample`).
CACHE_SEGMENTS = 4


@dataclasses.dataclass(frozen=True)
class SampleOptions:
  """Every setting of a sampler call but the model: frozen and hashable, so `sample` takes it
  as one static jit argument (equal options reuse a compiled sampler). Build it once per
  sampler, from the config with `from_rollout`; `replace` makes a variant. The fields are
  described at `sample`."""

  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  group_size: int = 1
  cache_segments: int = CACHE_SEGMENTS
  grow_cache: bool = True
  weights_sharding: Any = None  # jax.sharding.Sharding | sharding.MLPSplit | None
  shared_prompt: bool = False
  one_pass_draw: bool = False
  blocked_draw: bool = False
  dtype: str = ""

  def __post_init__(self):
    # Canonical types, so that options equal in value are equal as jit keys (1 vs 1.0, a list
    # of ids vs a tuple) and hashable.
    fix = object.__setattr__
    fix(self, "temperature", float(self.temperature))
    fix(self, "top_p", float(self.top_p))
    fix(self, "eos_ids", tuple(int(i) for i in self.eos_ids))
    if self.max_new_tokens < 1 or self.group_size < 1 or self.cache_segments < 1:
      raise ValueError(f"SampleOptions: max_new_tokens, group_size, cache_segments >= 1: {self}")
    if self.one_pass_draw and self.blocked_draw:
      raise ValueError("one_pass_draw and blocked_draw are two different draws: pick one")
    if self.dtype not in SAMPLER_DTYPES:
      raise ValueError(f"SampleOptions.dtype={self.dtype!r}: expected one of {SAMPLER_DTYPES}")

  @classmethod
  def from_rollout(cls, rollout, *, eos_ids, pad_id: int, mesh=None, **overrides):
    """The policy sampler's options from config `rollout` (train.Run.rollout's): its
    temperature, top-p/k, max_new_tokens, group_size, cache_segments, grow_cache, decode
    layout (rollout.decode_weights over `mesh`; None: no mesh, the weights as they are),
    shared_prompt_decode (with G > 1), one_pass_draw, blocked_draw, dtype. The tokenizer gives
    eos_ids and pad_id; `overrides` replace any field (e.g. evaluation's group_size=1)."""
    weights = None
    if mesh is not None:
      weights = sharding.decode_weights(mesh, rollout.decode_weights)
    elif rollout.decode_weights != "sharded":
      raise ValueError(f"rollout.decode_weights={rollout.decode_weights!r} needs a mesh")
    fields = dict(
      max_new_tokens=rollout.max_new_tokens,
      temperature=rollout.temperature,
      top_p=rollout.top_p,
      top_k=rollout.top_k,
      eos_ids=eos_ids,
      pad_id=pad_id,
      group_size=rollout.group_size,
      cache_segments=rollout.cache_segments,
      grow_cache=rollout.grow_cache,
      weights_sharding=weights,
      shared_prompt=bool(rollout.shared_prompt_decode),
      one_pass_draw=rollout.one_pass_draw,
      blocked_draw=rollout.blocked_draw,
      dtype=rollout.dtype,
    )
    unknown = set(overrides) - set(fields)
    if unknown:
      raise TypeError(f"SampleOptions.from_rollout: unknown fields {sorted(unknown)}")
    opts = dict(fields, **overrides)
    # A prompt's cache is shared by its group: no group, nothing to share (and one jit key).
    opts["shared_prompt"] = bool(opts["shared_prompt"]) and opts["group_size"] > 1
    return cls(**opts)

  def replace(self, **changes) -> SampleOptions:
    return dataclasses.replace(self, **changes)


def _token_logprob(x_bv, tok_b):
  """log_softmax(x_bv)[tok_b] without writing the [b, v] log-probabilities: the token's
  logit less the row's logsumexp (a 152k vocabulary: 0.155 GB less HBM traffic per decode
  step at the paper's shapes, v5e-8; BUILD.md, TPU on paper)."""
  picked_b = jnp.take_along_axis(x_bv, tok_b[:, None], axis=-1)[:, 0]
  return picked_b - jax.nn.logsumexp(x_bv, axis=-1)


def _per_row(rng) -> bool:
  """A [rows] array of typed keys (a raw uint32 key of shape (2,) is one key)."""
  return jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) and rng.ndim > 0


def _pick(
  logits_bv,
  rng,
  temperature: float,
  top_p: float,
  top_k: int,
  one_pass: bool = False,
  blocked: bool = False,
):
  if temperature == 0.0:
    tok_b = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
    return tok_b, _token_logprob(logits_bv, tok_b)
  scaled_bv = logits_bv / logit_temperature(temperature)  # the trainer reads the same T
  # Gumbel-max over the whole vocabulary. An inverse-CDF draw (one uniform per row) was 10x
  # cheaper on a CPU but made a token depend on the cumulative mass before it, so the
  # float-level logit differences between mesh layouts flipped tokens (2 processes vs 1
  # diverged at step 3); a Gumbel argmax flips only on near-ties (BUILD.md, Performance).
  filtered_bv = _filter_logits(scaled_bv, top_p, top_k)
  if blocked:
    tok_b, lse_b = draw_blocked(rng, filtered_bv)
    if top_p < 1.0 or top_k > 0:  # the log-prob is the unfiltered distribution's
      return tok_b, _token_logprob(scaled_bv, tok_b)
    return tok_b, jnp.take_along_axis(scaled_bv, tok_b[:, None], axis=-1)[:, 0] - lse_b
  score_bv = _gumbel_noise(rng, filtered_bv) + filtered_bv
  if one_pass:
    return draw_one_pass(scaled_bv, score_bv)
  tok_b = first_argmax(score_bv)
  return tok_b, _token_logprob(scaled_bv, tok_b)


def _gumbel_noise(rng, logits_bv):
  """The noise jax.random.categorical adds to the logits from the same key; its token is the
  argmax of logits + noise, here taken as two plain reductions (first_argmax): XLA's CPU argmax,
  a variadic reduce, runs ~2.5x slower with the noise fused into its input (SmolLM2's 49k
  vocabulary on an AVX2 EPYC: 15.5 vs 6.1 ms a draw at 16 rows, 98 vs 66 ms at 64). rng: one
  key, or one per row (a row's draw then does not depend on where the row sits)."""
  v = logits_bv.shape[-1]
  if _per_row(rng):
    return jax.vmap(lambda k: jax.random.gumbel(k, (v,), logits_bv.dtype))(rng)
  return jax.random.gumbel(rng, logits_bv.shape, logits_bv.dtype)


# Vocabulary entries per block of `draw_blocked`: ~sqrt(v) for the 50k-150k vocabularies,
# where the noise for the blocks and for one block's entries cost about the same.
DRAW_BLOCK = 128


def draw_blocked(rng, filtered_bv, block: int = DRAW_BLOCK):
  """(a token per row drawn from softmax(filtered_bv), logsumexp(filtered_bv)): exactly the
  categorical distribution, in two Gumbel-max draws. The vocabulary is cut into blocks of
  `block` entries; a block is drawn by its probability mass (Gumbel-max over the blocks' log
  masses), then a token within it by its logit, so P(token) = (mass / Z) * (p / mass) = p / Z.
  Noise for v / block + block entries a row instead of v (config rollout.blocked_draw): on a
  CPU the whole vocabulary's noise is the costliest part of a draw (SmolLM2's 49k entries on
  the AVX-512 VM: 11 ms for jax.random.categorical at 16 rows, 58 at 64, against 0.7 and 2.7
  ms), and like it a token flips only on near-ties of float-level logit differences, now of a
  block's mass or of a block's logits. A different draw from the same key than
  jax.random.categorical's. rng: one key, or one per row (`_gumbel_noise`)."""
  b, v = filtered_bv.shape
  nb = -(-v // block)
  x_bv = filtered_bv
  if nb * block != v:  # empty entries at the end: no mass, never drawn
    x_bv = jnp.pad(x_bv, ((0, 0), (0, nb * block - v)), constant_values=-jnp.inf)
  x_bnk = x_bv.reshape(b, nb, block)
  m_b = jnp.max(filtered_bv, axis=-1)
  mass_bn = jnp.sum(jnp.exp(x_bnk - m_b[:, None, None]), axis=-1)
  if _per_row(rng):
    keys = jax.vmap(jax.random.split)(rng)
    k_block, k_token = keys[:, 0], keys[:, 1]
  else:
    k_block, k_token = jax.random.split(rng)
  log_mass_bn = jnp.log(mass_bn)
  blk_b = first_argmax(log_mass_bn + _gumbel_noise(k_block, log_mass_bn))
  xb_bk = jnp.take_along_axis(x_bnk, blk_b[:, None, None], axis=1)[:, 0]
  tok_b = blk_b * block + first_argmax(xb_bk + _gumbel_noise(k_token, xb_bk))
  return tok_b, m_b + jnp.log(jnp.sum(mass_bn, axis=-1))


def draw_one_pass(scaled_bv, score_bv):
  """(first_argmax(score_bv), log_softmax(scaled_bv)[that token]) in one variadic reduction over
  the vocabulary, instead of four passes over [b, v] (the argmax's max and min, logsumexp's max
  and sum) and a gather (config rollout.one_pass_draw). Each element carries (score, index,
  running max, running sum of exp(x - max), the winner's logit); two partial results combine by
  keeping the higher score (the lower index on a tie; a NaN wins, the first NaN among NaNs, as
  jnp.argmax) and rescaling the two sums to the larger max (an online logsumexp). Same token as
  the two-pass draw; the log-prob equal up to float32 summation order. On a TPU it reads the
  step's [b, v] logits once (paper.py on v5e:2x4: 0.23 GB less per decode step and chip); on a
  CPU XLA runs variadic reductions slower (_gumbel_noise), so it is off by default."""
  b, v = scaled_bv.shape
  dt = scaled_bv.dtype
  idx_bv = jax.lax.broadcasted_iota(jnp.int32, (b, v), 1)
  neg = jnp.array(-jnp.inf, dt)
  init = (neg, jnp.int32(v), neg, jnp.array(0, dt), jnp.array(0, dt))

  def combine(a, c):
    sa, ia, ma, za, pa = a
    sc, ic, mc, zc, pc = c
    na, nc = jnp.isnan(sa), jnp.isnan(sc)
    a_wins = jnp.where(na | nc, na & (~nc | (ia < ic)), (sa > sc) | ((sa == sc) & (ia < ic)))
    m = jnp.maximum(ma, mc)
    # a part whose max is the max keeps its sum as is (also when both are -inf: no 0 * nan)
    z = jnp.where(ma == m, za, za * jnp.exp(ma - m)) + jnp.where(mc == m, zc, zc * jnp.exp(mc - m))
    return (
      jnp.where(a_wins, sa, sc),
      jnp.where(a_wins, ia, ic),
      m,
      z,
      jnp.where(a_wins, pa, pc),
    )

  operands = (score_bv, idx_bv, scaled_bv, jnp.ones_like(scaled_bv), scaled_bv)
  _, tok_b, m_b, z_b, picked_b = jax.lax.reduce(operands, init, combine, (1,))
  return tok_b, picked_b - (m_b + jnp.log(z_b))


def first_argmax(x_bv):
  """jnp.argmax over the last axis (the first maximum; the first NaN if a row has one) as a max
  and a min over indices, int32."""
  max_b1 = jnp.max(x_bv, axis=-1, keepdims=True)
  idx_bv = jax.lax.broadcasted_iota(jnp.int32, x_bv.shape, x_bv.ndim - 1)
  hit_bv = (x_bv == max_b1) | jnp.isnan(x_bv)
  return jnp.min(jnp.where(hit_bv, idx_bv, x_bv.shape[-1]), axis=-1)


class DecodeState(NamedTuple):
  """The decode loop's carry. Step `step` samples a token per row from `logits_bv` [b, v]
  float32, writes it to column `step` of tokens/logprobs/mask [b, n], feeds it through the
  model (its keys/values go to cache slot cache.length of every layer) and leaves the next
  step's logits.
  done_b [b]: rows that have emitted an end-of-sequence token (their later columns stay
  pad_id / 0 / False)."""

  step: jax.Array  # int32 scalar
  cache: KVCache
  logits_bv: jax.Array
  done_b: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array


def prefill(
  params,
  tokens_bp,
  mask_bp,
  *,
  cfg: ModelConfig,
  max_new_tokens: int,
  pad_id: int = 0,
  group_size: int = 1,
  cache_new_slots: int | None = None,
  shared_prompt: bool = False,
) -> tuple[DecodeState, jax.Array]:
  """The prompts' forward pass: (the decode loop's initial state, next_pos_b [b], the RoPE
  position of the token fed at step 0 of each row). The cache has p + cache_new_slots slots
  (default max_new_tokens; `_grow_cache` adds more), the prompt's keys/values in the first p;
  with group_size > 1 it holds G copies of each prompt's (see `sample`), or with shared_prompt
  each prompt's once (KVCache.prompt_k) and cache_new_slots slots per row."""
  model = Transformer(cfg)
  variables = {"params": params}
  n = max_new_tokens
  slots = n if cache_new_slots is None else cache_new_slots
  mask_bp = mask_bp.astype(bool)
  pos_bp = positions_from_mask(mask_bp)

  h_bpd, (k_lbpke, v_lbpke) = model.apply(
    variables, tokens_bp, pos_bp, mask_bp, method=Transformer.hidden
  )
  logits_bv = model.apply(variables, h_bpd[:, -1:], method=Transformer.logits)[:, 0]
  # [l, b, p, k, e] -> per layer the cache's [b, k, p, e], once per call.
  kv = lambda x_lbpke: tuple(jnp.swapaxes(x.astype(cfg.jnp_dtype), 1, 2) for x in x_lbpke)
  rows = lambda x, axis=0: jnp.repeat(x, group_size, axis=axis)
  if shared_prompt:
    prompt = dict(prompt_k=kv(k_lbpke), prompt_v=kv(v_lbpke), prompt_mask=mask_bp)
    pos_bp, logits_bv = rows(pos_bp), rows(logits_bv)
    b, e = pos_bp.shape[0], cfg.head_dim
    empty = tuple(jnp.zeros((b, cfg.n_kv_heads, 0, e), cfg.jnp_dtype) for _ in k_lbpke)
    cache = KVCache(empty, empty, jnp.zeros((b, 0), bool), jnp.int32(0), **prompt)
  else:
    if group_size > 1:
      k_lbpke, v_lbpke = rows(k_lbpke, 1), rows(v_lbpke, 1)
      mask_bp, pos_bp, logits_bv = rows(mask_bp), rows(pos_bp), rows(logits_bv)
    b, p = mask_bp.shape
    cache = KVCache(k=kv(k_lbpke), v=kv(v_lbpke), mask=mask_bp, length=jnp.int32(p))
  cache = _grow_cache(cache, slots)
  state = DecodeState(
    step=jnp.int32(0),
    cache=cache,
    logits_bv=logits_bv,
    done_b=jnp.zeros((b,), bool),
    tokens=jnp.full((b, n), pad_id, jnp.int32),
    logprobs=jnp.zeros((b, n), jnp.float32),
    mask=jnp.zeros((b, n), bool),
  )
  return state, pos_bp[:, -1] + 1


def _grow_cache(cache: KVCache, extra: int) -> KVCache:
  """The cache with `extra` more (empty, real-token) slots at the end of every layer's buffer."""
  grow = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))
  b = cache.mask.shape[0]
  return cache._replace(
    k=tuple(map(grow, cache.k)),
    v=tuple(map(grow, cache.v)),
    mask=jnp.concatenate([cache.mask, jnp.ones((b, extra), bool)], axis=1),
  )


def segment_ends(max_new_tokens: int, segments: int) -> list[int]:
  """The decode steps at which `sample`'s cache segments end: min(segments, max_new_tokens)
  near-equal parts, e.g. (128, 4) -> [32, 64, 96, 128]."""
  s = max(1, min(segments, max_new_tokens))
  return sorted({-(-max_new_tokens * (j + 1) // s) for j in range(s)})


def decode_step(
  params,
  state: DecodeState,
  next_pos_b,
  rng,
  *,
  cfg: ModelConfig,
  options: SampleOptions,
  read_slots: int | None = None,
  mlp_columns=None,
) -> DecodeState:
  """One step of the decode loop, the body of `sample`'s while_loop (see DecodeState): sample
  with jax.random.fold_in(rng, step), record, feed the token at position next_pos_b + step (its
  keys/values written into every layer's cache in place), next logits. params as
  transformer.split_layers makes them; the attention reads the first read_slots cache slots
  (static; default all; they must cover the filled ones). From `options` it reads the draw
  (temperature, top_p, top_k, one_pass_draw / blocked_draw), eos_ids and pad_id. mlp_columns:
  the MLPs' hidden-activation sharding in the decode layout mlp_split
  (sharding.decode_mlp_columns), else None."""
  o = options
  i, logits_bv, done_b = state.step, state.logits_bv, state.done_b
  eos = jnp.asarray(o.eos_ids if o.eos_ids else [-1], jnp.int32)
  fold = jax.vmap(jax.random.fold_in, (0, None)) if _per_row(rng) else jax.random.fold_in
  step_rng = fold(rng, i)
  tok_b, logp_b = _pick(
    logits_bv, step_rng, o.temperature, o.top_p, o.top_k, o.one_pass_draw, o.blocked_draw
  )
  live_b = ~done_b
  out_tok = state.tokens.at[:, i].set(jnp.where(live_b, tok_b, o.pad_id))
  out_logp = state.logprobs.at[:, i].set(jnp.where(live_b, logp_b, 0.0))
  out_mask = state.mask.at[:, i].set(live_b)
  done_b = done_b | jnp.isin(tok_b, eos)
  h_b1d, cache = decode_hidden(
    cfg, params, tok_b[:, None], (next_pos_b + i)[:, None], state.cache, read_slots, mlp_columns
  )
  logits_bv = Transformer(cfg).apply(outer_variables(params), h_b1d, method=Transformer.logits)[
    :, 0
  ]
  return DecodeState(i + 1, cache, logits_bv, done_b, out_tok, out_logp, out_mask)


@functools.partial(jax.jit, static_argnames=("cfg", "options"))
def sample(
  params,
  tokens_bp,
  mask_bp,
  rng,
  *,
  cfg: ModelConfig,
  options: SampleOptions,
) -> SampleOutput:
  """Samples options.max_new_tokens after left-padded prompts; deterministic for a given rng.
  The fields of `options` (SampleOptions) below: temperature (0 = greedy), top_p, top_k,
  eos_ids (a row stops after one), pad_id (after the stop), and the following.

  rng: one key for the batch, or a [rows] array of keys, one per output row (with
  group_size 1), so that a row's sample depends on its own key and not on its position in the
  batch: what lets N processes batch their rows differently and draw what one process draws
  (the llm_rewrite assistant, rewards.rewrite).

  group_size G > 1: `tokens_bp` holds each prompt once ([u, p]) and G samples are drawn per
  prompt (output rows u * G, prompt-major, as GRPO groups). Each prompt is prefilled once and
  its cache copied to its G rows, instead of prefilling G identical copies; the samples are
  those of the G-times-repeated batch with the same rng. shared_prompt (config
  rollout.shared_prompt_decode): the prompt's cache is not copied either: its G rows read one
  copy at every decode step (`transformer.attend_shared_prompt`), so a step reads the prompts'
  keys/values u times, not u * G; the same distribution, the values equal up to float32
  rounding (so a near-tie can draw another token).

  `prefill`, then `decode_step` in a while_loop until max_new_tokens or every row stopped
  (cooper_jax.aot.decode compiles that same step alone for a TPU topology).

  cache_segments S: the decode runs in S while_loops (`segment_ends`), each of whose steps
  attends over only the first p + (the segment's end) slots, so the attention reads
  p + max_new_tokens * (S + 1) / (2S) slots on average instead of p + max_new_tokens. Each
  segment compiles its own loop body (S times the compile time of the decode step); the
  samples do not depend on S (up to float summation order). How the steps see fewer slots:
  - grow_cache=True: the cache holds only those slots and grows by one copy between
    segments. Fastest on a CPU, where a slice inside the loop is a copy at every step (S=4
    with growth 12.7 s, with slices 16.7 s, S=1 13.7 s: SmolLM2-135M, b16 x 128 new, timed
    with a since-reverted cheaper draw, so the absolute times are lower than today's); but each
    growth holds the old and the new cache at once.
  - grow_cache=False: the cache is allocated whole and each segment's steps read a static
    slice of it, which XLA fuses into the attention's reads on a TPU (experiments/paper.py).

  weights_sharding: where the decode's per-call weight copy (compute dtype) lives. None: as
  the params are (under fsdp XLA then gathers rows or weights at every decode step); a
  replicated sharding: every device holds the whole copy, gathered once per call, and each
  step runs on its own rows with no collective (config rollout.decode_weights; BUILD.md); a
  sharding.MLPSplit: the MLP kernels split by their hidden columns over every device, the
  rest as the params are (each step all-reduces one [rows, d] per layer).

  one_pass_draw (config rollout.one_pass_draw): each step's token and log-prob from one pass
  over the logits (`draw_one_pass`); the same tokens, log-probs equal up to float32 rounding.
  blocked_draw (config rollout.blocked_draw): each token drawn by `draw_blocked`, the same
  distribution from a fraction of the noise; other tokens than the default draw's for a key.

  dtype (config rollout.dtype): "" computes in cfg.dtype, the trainer's; another name casts the
  weights to it once per call and runs prefill, cache and decode in it (a bf16 sampler next to
  a float32 trainer, as vLLM next to FSDP): the log-probs then differ from the trainer's, the
  mismatch that policy.loss.sampler_is corrects.
  """
  o = options
  if o.dtype and o.dtype != cfg.dtype:
    cfg = dataclasses.replace(cfg, dtype=o.dtype)
    params = jax.tree.map(lambda x: x.astype(cfg.jnp_dtype), params)
  ends = segment_ends(o.max_new_tokens, o.cache_segments)
  state, next_pos_b = prefill(
    params,
    tokens_bp,
    mask_bp,
    cfg=cfg,
    max_new_tokens=o.max_new_tokens,
    pad_id=o.pad_id,
    group_size=o.group_size,
    cache_new_slots=ends[0] if o.grow_cache else None,
    shared_prompt=o.shared_prompt and o.group_size > 1,
  )
  p = 0 if state.cache.prompt_k is not None else tokens_bp.shape[1]  # prompt slots in the cache
  split = split_layers(params, cfg.jnp_dtype)  # once per call, outside the loop
  split = sharding.place_decode_weights(split, o.weights_sharding)
  mlp_columns = sharding.decode_mlp_columns(o.weights_sharding, cfg.d_ff)
  for j, end in enumerate(ends):
    if o.grow_cache and j:
      state = state._replace(cache=_grow_cache(state.cache, end - ends[j - 1]))
    body = functools.partial(
      decode_step,
      split,
      next_pos_b=next_pos_b,
      rng=rng,
      cfg=cfg,
      options=o,
      read_slots=None if o.grow_cache else p + end,
      mlp_columns=mlp_columns,
    )
    cond = lambda s, end=end: (s.step < end) & ~jnp.all(s.done_b)
    state = jax.lax.while_loop(cond, body, state)
  return SampleOutput(state.tokens, state.logprobs, state.mask)


def generate(
  cfg: ModelConfig,
  params,
  tokenizer,
  prompts: list[str],
  rng,
  *,
  max_new_tokens: int,
  temperature: float = 1.0,
  top_p: float = 1.0,
  top_k: int = 0,
  chat: bool = True,
  pad_to_multiple: int = 64,
):
  """Host convenience: strings in, (completions, SampleOutput) out.

  Prompt length is padded up to a multiple of `pad_to_multiple` so that varying batches reuse
  a few compiled shapes instead of recompiling per batch.
  """
  texts = [tokenizer.chat_prompt(q) for q in prompts] if chat else list(prompts)
  tokens, mask = tokenizer.encode_prompts(texts, pad_to_multiple=pad_to_multiple)
  options = SampleOptions(
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_p=top_p,
    top_k=top_k,
    eos_ids=tuple(tokenizer.eos_ids),
    pad_id=tokenizer.pad_id,
  )
  out = sample(params, jnp.asarray(tokens), jnp.asarray(mask), rng, cfg=cfg, options=options)
  toks, m = np.asarray(out.tokens), np.asarray(out.mask)
  completions = [tokenizer.decode(toks[i][m[i]].tolist()) for i in range(len(texts))]
  return completions, out
