"""A decoder-only transformer (Llama / Qwen2 families) in Flax linen.

The same layers serve full-sequence training and KV-cache sampling. `Transformer` scans them
over a stacked leading axis (as MaxText's scan_layers does), which keeps compile time flat in
depth, and returns the keys/values each layer computed (the prefill's cache). `decode_hidden`
runs the same `Block` unrolled on per-layer weights (`split_layers`) against the sampler's
per-layer cache: each layer writes its new keys/values into its own buffer in place, then
attends over it. Shape suffixes: b batch, t query time, s cache slot, d model,
h heads, k kv heads, g query heads per kv head, e head_dim, f feed-forward, v vocab, l layer.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cooper_jax.models.config import ModelConfig, RopeScaling

# ModelConfig.remat -> what a layer saves for the backward pass. "projections" saves the dots
# without batch dimensions (the projections) and recomputes the attention's batched dots,
# softmax and the elementwise ops: on a 2-core CPU the SmolLM2-135M policy_step (8 x 256
# tokens) took 7.5 s against 8.3 s saving everything, whose stacked per-layer residuals (the
# [b, k, g, t, t] attention probabilities among them) XLA zero-fills and copies at every step.
REMAT_POLICIES = {
  "projections": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  "full": jax.checkpoint_policies.nothing_saveable,
}
_NEG_INF = -1e30  # finite, so a fully masked row (a left-pad query) gives a uniform, not NaN


class KVCache(NamedTuple):
  """The sampler's static-shape cache: per layer, k and v [b, k, s, e]; valid-slot mask [b, s].

  One array per layer (not one [l, ...] array): the decode runs its layers unrolled, each
  reading and updating its own buffers in place, where a layer scan would copy every layer's
  slice out of the stacked arrays at every step. kv-head-major ([b, k, s, e], not the
  [b, s, k, e] a layer returns): the attention's batched dots run over (b, k), so this layout
  feeds them as it is, where [b, s, k, e] made XLA transpose the cache at every step."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  mask: jax.Array
  length: jax.Array  # int32 scalar: slots [0, length) are filled
  # A shared prompt (`sampling.sample(..., shared_prompt=True)`): each prompt's keys/values
  # once, per layer [u, k, p, e], and its mask [u, p], for b = u * G rows (prompt-major); k, v
  # and mask then hold only the rows' own (response) slots. None: every row's prompt is in k, v.
  prompt_k: tuple[jax.Array, ...] | None = None
  prompt_v: tuple[jax.Array, ...] | None = None
  prompt_mask: jax.Array | None = None


def _tokens_flat(x_btd):
  """[b, t, d] -> [b * t, d] (a bitcast), what the MLP's projections take: their weight
  gradients then contract one token axis. Over (b, t) XLA's CPU backend wrote each [b, t, f]
  activation gradient out transposed first, which cost a training step more than all its
  attention (SmolLM2-135M, 8 x 256 tokens: MLP forward + backward 186 vs 110 ms a layer; the
  step 13.1 -> 8.8 s). Not in the attention's projections or the LM head: there it made no
  difference on the CPU beyond noise and cost the paper's policy_step 1.2 GiB more per chip
  on TPU v5e (13.4 -> 14.6 GiB)."""
  return x_btd.reshape(-1, x_btd.shape[-1])


class RMSNorm(nn.Module):
  eps: float
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    # As HF: normalise in float32, cast back, then scale.
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return x32.astype(self.dtype) * scale.astype(self.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None):
  """RoPE inverse frequencies [head_dim / 2], float32, as transformers computes them.

  With Llama-3 scaling, long wavelengths (beyond the pre-training context / low_freq_factor)
  are slowed by `factor`, short ones (under context / high_freq_factor) kept, and the band
  between blends the two linearly in context / wavelength. The operations and their order follow
  transformers' _compute_llama3_parameters, so float32 rounding matches too.
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if scaling is None:
    return inv_freq
  ctx = scaling.original_max_position_embeddings
  low, high, factor = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
  wavelen = 2 * math.pi / inv_freq
  long_wave = wavelen > ctx / low
  scaled = jnp.where(long_wave, inv_freq / factor, inv_freq)
  smooth = (ctx / wavelen - low) / (high - low)
  blended = (1 - smooth) * scaled / factor + smooth * scaled
  in_band = ~(wavelen < ctx / high) & ~long_wave
  return jnp.where(in_band, blended, scaled)


def rope(x_bthe, positions_bt, theta, scaling: RopeScaling | None = None):
  """Rotate-half RoPE, Hugging Face layout (first half / second half of head_dim)."""
  inv_freq = rope_inv_freq(x_bthe.shape[-1], theta, scaling)
  ang_bt_e2 = positions_bt.astype(jnp.float32)[..., None] * inv_freq
  cos = jnp.cos(ang_bt_e2)[:, :, None, :]
  sin = jnp.sin(ang_bt_e2)[:, :, None, :]
  x1, x2 = jnp.split(x_bthe.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bthe.dtype)


def _attend_rows(q_bkqe, k_bkse, v_bkse, ok_bts, group: int, dtype):
  b, kh, gt, _ = q_bkqe.shape
  t, s_len = gt // group, k_bkse.shape[2]
  scores = jnp.einsum(
    "bkqe,bkse->bkqs", q_bkqe, k_bkse.astype(q_bkqe.dtype), preferred_element_type=jnp.float32
  ).reshape(b, kh, group, t, s_len)
  scores = jnp.where(ok_bts[:, None, None], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
  return jnp.einsum("bkqs,bkse->bkqe", probs.reshape(b, kh, gt, s_len), v_bkse.astype(probs.dtype))


def attend(q_bkqe, k_bkse, v_bkse, ok_bts, group: int, dtype, chunk_bytes: int = 0):
  """softmax(q k^T, masked) v per row and kv head: queries [b, k, g * t, e] (group g query
  heads per kv head, head-major), keys/values [b, k, s, e], ok [b, t, s] -> [b, k, g * t, e].

  chunk_bytes > 0: the rows run in chunks whose float32 scores take about that many bytes
  (`lax.map`, each chunk rematerialised for the backward pass). The scores are the largest
  arrays of a small model's step, and the softmax passes over them several times; on a CPU,
  chunks that stay in cache make those passes cheap (the small task's RM reward forward, 64
  rows x 128 tokens, 1 MiB chunks, one thread of a 2-core AVX2 EPYC: 0.154 -> 0.085 s). Each
  row is computed as in one piece, the same values up to float32 rounding. Chunk i holds rows
  i, i + n, i + 2n, ... (n chunks), so a batch sharded over devices stays spread over them.
  Off (0) by default: an accelerator runs one large call faster."""
  b, kh, gt, _ = q_bkqe.shape
  row_bytes = 4 * kh * gt * k_bkse.shape[2]
  rows = b if chunk_bytes <= 0 else max(1, chunk_bytes // row_bytes)
  while b % rows:
    rows -= 1
  run = lambda q, k, v, ok: _attend_rows(q, k, v, ok, group, dtype)
  if rows >= b:
    return run(q_bkqe, k_bkse, v_bkse, ok_bts)
  n = b // rows
  split = lambda x: jnp.swapaxes(x.reshape(rows, n, *x.shape[1:]), 0, 1)
  out = jax.lax.map(
    lambda a: jax.checkpoint(run)(*a), tuple(map(split, (q_bkqe, k_bkse, v_bkse, ok_bts)))
  )
  return jnp.swapaxes(out, 0, 1).reshape(q_bkqe.shape)


def attend_shared_prompt(q_bkqe, prompt_kv, k_bkse, v_bkse, ok_bts, group: int, dtype):
  """`attend` over each row's prompt keys/values, then its own, with the prompt held once per
  prompt: prompt_kv = (keys, values [u, k, p, e], mask [u, p]) for b = u * G rows, prompt-major.
  The same values as `attend` over the rows' [prompt copy, own] caches up to float32 rounding
  (the two parts' mixing sums are added, not summed as one, and normalised after the mixing),
  with a prompt's keys and values read once for its G rows instead of copied G times (the
  decode's largest read at a short response: sampling.sample)."""
  pk_ukpe, pv_ukpe, pok_up = prompt_kv
  b, kh, gt, e = q_bkqe.shape
  u, p = pok_up.shape
  rows, t = b // u, gt // group
  # [b, k, gt, .] <-> [u, k, G * gt, .]: a prompt's G rows side by side as one query block.
  to_prompt = lambda x: jnp.swapaxes(x.reshape(u, rows, kh, gt, -1), 1, 2).reshape(
    u, kh, rows * gt, -1
  )
  to_rows = lambda x: jnp.swapaxes(x.reshape(u, kh, rows, gt, -1), 1, 2).reshape(b, kh, gt, -1)
  f32 = jnp.float32
  s_p = jnp.einsum(  # [u, k, G * gt, p]: kept in the prompts' layout, as its values are
    "ukre,ukpe->ukrp", to_prompt(q_bkqe), pk_ukpe.astype(q_bkqe.dtype), preferred_element_type=f32
  )
  s_p = jnp.where(pok_up[:, None, None, :], s_p, _NEG_INF)
  s_r = jnp.einsum(
    "bkqe,bkse->bkqs", q_bkqe, k_bkse.astype(q_bkqe.dtype), preferred_element_type=f32
  ).reshape(b, kh, group, t, -1)
  s_r = jnp.where(ok_bts[:, None, None], s_r, _NEG_INF).reshape(b, kh, gt, -1)
  # The softmax over [prompt, own] slots in two parts (one max, one denominator) and normalised
  # after the mixing: no concatenated or transposed copy of the scores, one pass less over them.
  m = jnp.maximum(to_rows(s_p.max(-1, keepdims=True)), s_r.max(-1, keepdims=True))
  m = jax.lax.stop_gradient(m)
  e_p, e_r = jnp.exp(s_p - to_prompt(m)), jnp.exp(s_r - m)
  denom = to_rows(e_p.sum(-1, keepdims=True)) + e_r.sum(-1, keepdims=True)
  # The two parts combined in the prompts' layout and the result moved to the rows' once: one
  # transposed copy of the bf16 output instead of two of the float32 prompt part (the same
  # values; paper.py's decode step 29 MB less per chip on v5e:2x4).
  out_p = jnp.einsum("ukrp,ukpe->ukre", e_p.astype(dtype), pv_ukpe.astype(dtype)).astype(f32)
  out_r = jnp.einsum("bkqs,bkse->bkqe", e_r.astype(dtype), v_bkse.astype(dtype)).astype(f32)
  return to_rows(((out_p + to_prompt(out_r)) / to_prompt(denom)).astype(dtype))


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(
    self,
    x_btd,
    positions_bt,
    mask_bt,
    cache_kv=None,
    cache_mask_bs=None,
    cache_index=0,
    read_slots: int | None = None,
    prompt_kv=None,
  ):
    """-> (out [b, t, d], kv). Without a cache: causal attention within the call, kv = this
    call's (k, v) [b, t, k, e]. With cache_kv = (k, v) [b, k, s, e]: the call's tokens (all
    real) go to slots [cache_index, cache_index + t) and kv is the updated cache; the attention
    reads its first read_slots slots (static; default all, which must cover the filled ones).
    prompt_kv: a shared prompt ahead of the cache (`attend_shared_prompt`; KVCache.prompt_k)."""
    cfg = self.cfg
    dense = lambda feats, name, bias, axis=-1: nn.DenseGeneral(
      feats,
      axis=axis,
      use_bias=bias,
      dtype=cfg.jnp_dtype,
      param_dtype=cfg.jnp_param_dtype,
      name=name,
    )
    q_bthe = dense((cfg.n_heads, cfg.head_dim), "q", cfg.qkv_bias)(x_btd)
    k_btke = dense((cfg.n_kv_heads, cfg.head_dim), "k", cfg.qkv_bias)(x_btd)
    v_btke = dense((cfg.n_kv_heads, cfg.head_dim), "v", cfg.qkv_bias)(x_btd)
    q_bthe = rope(q_bthe, positions_bt, cfg.rope_theta, cfg.rope_scaling)
    k_btke = rope(k_btke, positions_bt, cfg.rope_theta, cfg.rope_scaling)

    b, t = x_btd.shape[:2]
    g = cfg.n_heads // cfg.n_kv_heads
    q_btkge = q_bthe.reshape(b, t, cfg.n_kv_heads, g, cfg.head_dim) * (cfg.head_dim**-0.5)

    if cache_kv is None and not cfg.attn_chunk_bytes:
      # Against this call's own tokens: causal within the call, pads masked.
      causal_tt = jnp.tril(jnp.ones((t, t), dtype=bool))
      ok_btt = causal_tt[None] & mask_bt[:, None, :]
      scores = jnp.einsum("btkge,bske->bkgts", q_btkge, k_btke, preferred_element_type=jnp.float32)
      scores = jnp.where(ok_btt[:, None, None], scores, _NEG_INF)
      probs = jax.nn.softmax(scores, axis=-1).astype(cfg.jnp_dtype)
      out_btkge = jnp.einsum("bkgts,bske->btkge", probs, v_btke)
      new_kv = (k_btke, v_btke)
    else:
      if cache_kv is None:  # the same, as a cache of this call's own keys/values (chunked)
        k_bkse, v_bkse = jnp.swapaxes(k_btke, 1, 2), jnp.swapaxes(v_btke, 1, 2)
        new_kv = (k_btke, v_btke)
        ok_bts = jnp.tril(jnp.ones((t, t), dtype=bool))[None] & mask_bt[:, None, :]
      else:
        # Decode: write this call's keys/values into slots [cache_index, cache_index + t)
        # first, then attend over the cache alone. Reading after writing lets XLA update the
        # buffers in place (a read before an unordered in-place write makes it copy them).
        slot = (0, 0, cache_index, 0)
        put = lambda c, x: jax.lax.dynamic_update_slice(
          c, jnp.swapaxes(x, 1, 2).astype(c.dtype), slot
        )
        k_bkse, v_bkse = put(cache_kv[0], k_btke), put(cache_kv[1], v_btke)
        new_kv = (k_bkse, v_bkse)
        seg_bs = None
        if isinstance(cache_mask_bs, tuple):  # packed rows: (mask, each slot's response)
          cache_mask_bs, seg_bs = cache_mask_bs
          seg_bt = jax.lax.dynamic_slice_in_dim(seg_bs, cache_index, t, axis=1)
        if read_slots is not None:
          k_bkse, v_bkse = k_bkse[:, :, :read_slots], v_bkse[:, :, :read_slots]
          cache_mask_bs = cache_mask_bs[:, :read_slots]
          seg_bs = None if seg_bs is None else seg_bs[:, :read_slots]
        s_len = k_bkse.shape[2]
        # Slot j is visible to query i iff it holds a real token and j <= cache_index + i.
        causal_ts = jnp.arange(s_len)[None, :] <= cache_index + jnp.arange(t)[:, None]
        ok_bts = cache_mask_bs[:, None, :] & causal_ts[None]
        if seg_bs is not None:  # ... and is a prompt slot (0) or the query's own response's
          ok_bts &= (seg_bs[:, None, :] == 0) | (seg_bs[:, None, :] == seg_bt[:, :, None])
      # Queries as [b, k, g * t, e]: dots batched over (b, k) whose operands and results need
      # no transposes of the cache-sized arrays (2x faster on a CPU than [b, k, g, t, s]).
      q_bkqe = jnp.transpose(q_btkge, (0, 2, 3, 1, 4)).reshape(b, cfg.n_kv_heads, g * t, -1)
      if prompt_kv is None:
        out_bkqe = attend(q_bkqe, k_bkse, v_bkse, ok_bts, g, cfg.jnp_dtype, cfg.attn_chunk_bytes)
      else:
        out_bkqe = attend_shared_prompt(q_bkqe, prompt_kv, k_bkse, v_bkse, ok_bts, g, cfg.jnp_dtype)
      out_btkge = jnp.transpose(out_bkqe.reshape(b, cfg.n_kv_heads, g, t, -1), (0, 3, 1, 2, 4))
    out_bthe = out_btkge.reshape(b, t, cfg.n_heads, cfg.head_dim)
    out_btd = dense(cfg.d_model, "o", False, axis=(-2, -1))(out_bthe)
    return out_btd, new_kv


class MLP(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_btd, columns=None):
    """columns: None, or the NamedSharding of the hidden activations [n, d_ff] in the decode
    layout mlp_split (sharding.MLPSplit): the input whole on every device, each device's
    columns, the output summed over the devices."""
    cfg = self.cfg
    dense = lambda feats, name: nn.Dense(
      feats, use_bias=False, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype, name=name
    )
    x_nd = _tokens_flat(x_btd)
    whole = None if columns is None else NamedSharding(columns.mesh, P())
    if whole is not None:
      x_nd = jax.lax.with_sharding_constraint(x_nd, whole)
    h_nf = nn.silu(dense(cfg.d_ff, "gate")(x_nd)) * dense(cfg.d_ff, "up")(x_nd)
    if whole is not None:
      h_nf = jax.lax.with_sharding_constraint(h_nf, columns)
    out_nd = dense(cfg.d_model, "down")(h_nf)
    if whole is not None:
      out_nd = jax.lax.with_sharding_constraint(out_nd, whole)
    return out_nd.reshape(x_btd.shape)


class Block(nn.Module):
  """One pre-norm decoder layer; scanned, so (carry, per-layer input) -> (carry, output).

  The carry is one stream x [b, t, d], or, for `Transformer.hidden_shared_prompt`, a pair
  (prompts [P, p, d], responses [b, n, d]) with positions paired the same way, masks as
  (prompts', responses', each row's prompt index [b] or None for G consecutive rows each) and
  cache_mask_bs the responses' full [b, p + n] mask (for packed rows, with each slot's
  response: `Attention`): the layer runs once on the P prompts, then
  on the b = P * G responses, which attend over their prompt's keys/values (repeated G times)
  and their own, as a decode step of n tokens against a cache holding the prompt."""

  cfg: ModelConfig

  @nn.compact
  def __call__(
    self,
    x_btd,
    layer_cache,
    positions_bt,
    mask_bt,
    cache_mask_bs=None,
    cache_index=0,
    read_slots: int | None = None,
    prompt_kv=None,
    mlp_columns=None,
  ):
    cfg = self.cfg
    norm = lambda name: RMSNorm(cfg.rms_eps, cfg.jnp_dtype, cfg.jnp_param_dtype, name=name)
    attn, attn_norm = Attention(cfg, name="attn"), norm("attn_norm")
    mlp, mlp_norm = MLP(cfg, name="mlp"), norm("mlp_norm")

    def layer(x, *attn_args):
      h, kv = attn(attn_norm(x), *attn_args)
      x = x + h
      return x + mlp(mlp_norm(x), mlp_columns), kv

    if not isinstance(x_btd, tuple):
      return layer(
        x_btd, positions_bt, mask_bt, layer_cache, cache_mask_bs, cache_index, read_slots, prompt_kv
      )
    (x_pd, x_bnd), (pos_p, pos_b), (mask_p, mask_b, prompt_of_row) = x_btd, positions_bt, mask_bt
    x_pd, (k_ptke, v_ptke) = layer(x_pd, pos_p, mask_p)
    group, n, p = x_bnd.shape[0] // x_pd.shape[0], x_bnd.shape[1], x_pd.shape[1]

    def per_row(a_pk):  # each response row's prompt: G consecutive rows, or as indexed
      if prompt_of_row is None:
        return jnp.repeat(a_pk, group, axis=0)
      return jnp.take(a_pk, prompt_of_row, axis=0)

    # [P, p, k, e] -> [b, k, p + n, e]: each row's prompt keys/values, then n empty slots that
    # the responses' own keys/values fill.
    as_cache = lambda a: jnp.pad(per_row(jnp.swapaxes(a, 1, 2)), ((0, 0), (0, 0), (0, n), (0, 0)))
    x_bnd, _ = layer(x_bnd, pos_b, mask_b, (as_cache(k_ptke), as_cache(v_ptke)), cache_mask_bs, p)
    return (x_pd, x_bnd), None


class Transformer(nn.Module):
  """tokens [b, t] -> (logits [b, t, v] float32 or scores [b] float32, new_kv).

  positions: RoPE positions of the tokens; mask: which tokens are real (pads are never attended
  to). With head="score", the score is read at the last real token of each row. Decoding
  against a KV cache is `decode_hidden` (the same parameters, the layers unrolled).
  """

  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.embed = nn.Embed(
      cfg.vocab_size,
      cfg.d_model,
      dtype=cfg.jnp_dtype,
      param_dtype=cfg.jnp_param_dtype,
      embedding_init=nn.initializers.normal(0.02),
      name="embed",
    )
    block = Block
    if cfg.remat != "none":
      block = nn.remat(Block, prevent_cse=False, policy=REMAT_POLICIES[cfg.remat])
    self.layers = nn.scan(
      block,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
      length=cfg.n_layers,
    )(cfg, name="layers")
    self.final_norm = RMSNorm(cfg.rms_eps, cfg.jnp_dtype, cfg.jnp_param_dtype, name="final_norm")
    dense = lambda feats, name: nn.Dense(
      feats, use_bias=False, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype, name=name
    )
    if cfg.head == "score":
      self.score = dense(1, "score")
    elif not cfg.tie_embeddings:
      self.lm_head = dense(cfg.vocab_size, "lm_head")

  def hidden(self, tokens_bt, positions_bt, mask_bt):
    """Final-norm hidden states [b, t, d] and this call's (k, v), each [l, b, t, k, e]."""
    x_btd, new_kv = self.layers(self.embed(tokens_bt), None, positions_bt, mask_bt, None)
    return self.final_norm(x_btd), new_kv

  def hidden_shared_prompt(
    self,
    prompt_pp,
    prompt_mask_pp,
    response_bn,
    response_mask_bn,
    prompt_of_row_b=None,
    segment_bn=None,
  ):
    """Final-norm hidden states of P left-padded prompts [P, p, d] and of their b = P * G
    right-padded responses [b, n, d] (rows g * G .. g * G + G - 1 answer prompt g): what
    `hidden` gives on the concatenated [b, p + n] rows, with each prompt run once instead of
    G times (a GRPO batch's prompt positions are G-fold copies). prompt_of_row_b [b] (int):
    row i answers prompt prompt_of_row_b[i] instead, for any number of rows per prompt.
    segment_bn [b, n] (int, with prompt_of_row_b): packed rows (`cooper_jax.pack`), each
    holding several responses to its prompt back to back, numbered 1, 2, ... (0: padding);
    each response sees the prompt and its own earlier tokens only, at the positions it would
    have alone, so each gets the hidden states it has in a row of its own."""
    if prompt_of_row_b is not None:
      prompt_mask_bp = jnp.take(prompt_mask_pp, prompt_of_row_b, axis=0)
    else:
      group = response_bn.shape[0] // prompt_pp.shape[0]
      if group * prompt_pp.shape[0] != response_bn.shape[0]:
        raise ValueError(
          f"{response_bn.shape[0]} response rows are not a multiple of {prompt_pp.shape[0]} prompts"
        )
      prompt_mask_bp = jnp.repeat(prompt_mask_pp, group, axis=0)
    full_mask = jnp.concatenate([prompt_mask_bp, response_mask_bn], 1)
    pos_bn = positions_from_mask(full_mask)[:, prompt_pp.shape[1] :]
    if segment_bn is not None:  # each slot's response (0: the prompt's slots, seen by all)
      pos_bn = packed_positions(prompt_mask_bp, segment_bn)
      slot_segment = jnp.pad(segment_bn.astype(jnp.int32), ((0, 0), (prompt_pp.shape[1], 0)))
      full_mask = (full_mask, slot_segment)
    (x_pd, x_bnd), _ = self.layers(
      (self.embed(prompt_pp), self.embed(response_bn)),
      None,
      (positions_from_mask(prompt_mask_pp), pos_bn),
      (prompt_mask_pp, response_mask_bn, prompt_of_row_b),
      full_mask,
    )
    return self.final_norm(x_pd), self.final_norm(x_bnd)

  def logits(self, h_btd):
    if self.cfg.tie_embeddings:
      return self.embed.attend(h_btd).astype(jnp.float32)
    return self.lm_head(h_btd).astype(jnp.float32)

  def scores(self, h_btd, mask_bt):
    """Scalar score (a logit) at the last real token of each row, as HF's SequenceClassification."""
    last_b = jnp.max(jnp.where(mask_bt, jnp.arange(mask_bt.shape[1])[None], -1), axis=1)
    h_bd = jnp.take_along_axis(h_btd, jnp.maximum(last_b, 0)[:, None, None], axis=1)[:, 0]
    return self.score(h_bd)[:, 0].astype(jnp.float32)

  def __call__(self, tokens_bt, positions_bt, mask_bt):
    h_btd, new_kv = self.hidden(tokens_bt, positions_bt, mask_bt)
    if self.cfg.head == "score":
      return self.scores(h_btd, mask_bt), new_kv
    return self.logits(h_btd), new_kv


def split_layers(params, dtype=None):
  """The parameters with params["layers"] ([l, ...] leaves, as the layer scan holds them) as a
  tuple of per-layer trees: what `decode_hidden` takes. Made once per sampler call, outside
  the decode loop, so the loop reads each layer's weights where they lie. dtype: cast every
  leaf to it (the compute dtype: the model casts each parameter to it before use, so the
  results are the same, and the loop reads bf16 weights instead of converting float32 ones at
  every step)."""
  if dtype is not None:
    params = jax.tree.map(lambda x: x.astype(dtype), params)
  layers = params["layers"]
  n = jax.tree.leaves(layers)[0].shape[0]
  return {**params, "layers": tuple(jax.tree.map(lambda x, i=i: x[i], layers) for i in range(n))}


def outer_variables(params):
  """{"params": ...} without the layers: what Transformer's embed, final_norm and logits read
  (decode_hidden and the sampler apply them to params as split_layers makes them)."""
  return {"params": {k: v for k, v in params.items() if k != "layers"}}


def decode_hidden(
  cfg: ModelConfig,
  params,
  tokens_bt,
  positions_bt,
  cache: KVCache,
  read_slots: int | None = None,
  mlp_columns=None,
):
  """Feeds real tokens [b, t] at cache slots [cache.length, cache.length + t): (final-norm hidden
  states [b, t, d], the cache with their keys/values written and length advanced). params as
  `split_layers` makes them; the layers run unrolled, each on its own cache buffers. The
  attention reads the first read_slots slots (static; default all): the caller's bound on the
  filled part. mlp_columns: the MLPs' hidden-activation sharding in the decode layout
  mlp_split (`MLP`; sharding.decode_mlp_columns), else None."""
  model = Transformer(cfg)
  outer = outer_variables(params)
  x_btd = model.apply(outer, tokens_bt, method=lambda m, t: m.embed(t))
  mask_bt = jnp.ones(tokens_bt.shape, bool)
  block = Block(cfg)
  ks, vs = [], []
  shared = cache.prompt_k is not None
  for i, (layer_params, ck, cv) in enumerate(zip(params["layers"], cache.k, cache.v, strict=True)):
    x_btd, (ck, cv) = block.apply(
      {"params": layer_params},
      x_btd,
      (ck, cv),
      positions_bt,
      mask_bt,
      cache.mask,
      cache.length,
      read_slots,
      (cache.prompt_k[i], cache.prompt_v[i], cache.prompt_mask) if shared else None,
      mlp_columns,
    )
    ks.append(ck)
    vs.append(cv)
  h_btd = model.apply(outer, x_btd, method=lambda m, x: m.final_norm(x))
  t = tokens_bt.shape[1]
  return h_btd, cache._replace(k=tuple(ks), v=tuple(vs), length=cache.length + t)


def segment_starts(segment_bn):
  """[b, n] bool: where a packed row's responses begin (a real token whose segment id differs
  from the one before it)."""
  before = jnp.pad(segment_bn[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
  return (segment_bn > 0) & (segment_bn != before)


def packed_positions(prompt_mask_bp, segment_bn):
  """RoPE positions [b, n] of packed response rows: each response's tokens at the positions
  after its prompt's real tokens, as if alone in its row."""
  col = jnp.arange(segment_bn.shape[1])[None]
  start_bn = jax.lax.cummax(jnp.where(segment_starts(segment_bn), col, 0), axis=1)
  return jnp.sum(prompt_mask_bp.astype(jnp.int32), axis=1)[:, None] + col - start_bn


def positions_from_mask(mask_bt):
  """RoPE positions that start at 0 on each row's first real token (left padding)."""
  return jnp.maximum(jnp.cumsum(mask_bt.astype(jnp.int32), axis=1) - 1, 0)


def init_params(cfg: ModelConfig, rng: jax.Array):
  """Random parameters (for tests, benchmarks and fresh score heads)."""
  tokens = jnp.zeros((1, 4), jnp.int32)
  mask = jnp.ones((1, 4), bool)
  return Transformer(cfg).init(rng, tokens, positions_from_mask(mask), mask)["params"]


def forward(cfg: ModelConfig, params, tokens_bt, mask_bt):
  """Full-sequence forward pass: logits [b, t, v] (lm) or scores [b] (score head), float32."""
  out, _ = Transformer(cfg).apply(
    {"params": params}, tokens_bt, positions_from_mask(mask_bt), mask_bt
  )
  return out
