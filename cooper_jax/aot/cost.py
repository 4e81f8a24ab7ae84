"""Analytic FLOPs and HBM traffic of the iteration's functions, for the roofline.

Counted by hand, not read from cost_analysis(): XLA counts the body of a loop once (the layer
scan, the decode while_loop, a micro-batch scan), so its figure is one layer / one decode step.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from cooper_jax.models.config import ModelConfig


@dataclasses.dataclass
class Cost:
  flops: float  # global, one call
  bytes: float  # per device, one call


def _layer_matmul_params(cfg: ModelConfig) -> int:
  return cfg.d_model * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * (
    cfg.d_model * cfg.d_ff
  )


def _attention_flops(cfg: ModelConfig, rows: int, q_len: int, kv_len: int) -> int:
  return 4 * rows * cfg.n_layers * q_len * kv_len * cfg.n_heads * cfg.head_dim


def forward_flops(cfg: ModelConfig, rows: int, q_len: int, kv_len: int, head_tokens: int) -> int:
  """Matmul FLOPs of one forward: 2 per weight per token for q/k/v/o and the MLP, attention
  scores and mixing 4*q*kv*heads*head_dim per layer (this implementation computes every
  (query, slot) pair and masks, so no causal halving), the LM head on `head_tokens` positions
  (the score head's d FLOPs are negligible and left out). Norms, RoPE, softmax: left out."""
  layers = 2 * rows * q_len * cfg.n_layers * _layer_matmul_params(cfg)
  attn = _attention_flops(cfg, rows, q_len, kv_len)
  head = 2 * rows * head_tokens * cfg.d_model * cfg.vocab_size if cfg.head == "lm" else 0
  return layers + attn + head


def shared_forward_flops(
  cfg: ModelConfig, rows: int, prompt: int, new: int, head_tokens: int, group: int = 1
) -> int:
  """forward_flops of `rows` prompt + response sequences. group > 1: each group of `group`
  rows runs its shared prompt once (logprobs.response_logprobs, `prompt_group`), so the prompt
  positions count for rows / group rows attending to the prompt, and the response positions
  for every row attending to prompt + response."""
  if group <= 1:
    return forward_flops(cfg, rows, prompt + new, prompt + new, head_tokens)
  return forward_flops(cfg, rows // group, prompt, prompt, 0) + forward_flops(
    cfg, rows, new, prompt + new, head_tokens
  )


def shared_forward_bytes(
  cfg: ModelConfig, rows: int, prompt: int, new: int, head_tokens: int, tensor: int, group=1
) -> float:
  """forward_bytes of the same split as `shared_forward_flops`."""
  if group <= 1:
    return forward_bytes(cfg, rows, prompt + new, prompt + new, head_tokens, tensor)
  return forward_bytes(cfg, rows // group, prompt, prompt, 0, tensor) + forward_bytes(
    cfg, rows, new, prompt + new, head_tokens, tensor
  )


def train_flops(
  cfg: ModelConfig,
  rows: int,
  seq: int,
  head_tokens: int,
  chunked_head: bool = False,
  group: int = 1,
) -> int:
  """Forward + backward (2x forward) + what remat recomputes in the backward pass: each
  layer's whole forward under remat="full", its attention (scores and mixing) under
  "projections". The LM head is recomputed in the backward only when it runs in
  checkpointed chunks (policy.logprob_chunk > 0). The head runs on the last `head_tokens`
  positions (the response); group > 1: rows share prompts as in `shared_forward_flops`."""
  p, n = seq - head_tokens, head_tokens
  fwd = shared_forward_flops(cfg, rows, p, n, head_tokens, group)
  layers_only = shared_forward_flops(cfg.replace(head="score"), rows, p, n, 0, group)
  if group <= 1:
    attn = _attention_flops(cfg, rows, seq, seq)
  else:
    attn = _attention_flops(cfg, rows // group, p, p) + _attention_flops(cfg, rows, n, seq)
  head = fwd - layers_only
  recompute = {"none": 0, "projections": attn, "full": layers_only}[cfg.remat]
  return 3 * fwd + recompute + (head if chunked_head else 0)


def sampler_flops(
  cfg: ModelConfig, rows: int, prompt: int, new: int, prefill_rows: int | None = None
) -> int:
  """Prefill (head on the last position) of `prefill_rows` prompts (default `rows`; fewer when
  each prompt is prefilled once for its group) + max_new_tokens decode steps, each one token per
  row attending to all prompt+new cache slots and itself (an upper bound: the loop can stop
  early)."""
  pre = rows if prefill_rows is None else prefill_rows
  return forward_flops(cfg, pre, prompt, prompt, 1) + new * forward_flops(
    cfg, rows, 1, prompt + new + 1, 1
  )


def weight_bytes(cfg: ModelConfig) -> int:
  return cfg.num_params() * jnp.dtype(cfg.jnp_param_dtype).itemsize


def chunked_head_bytes(cfg: ModelConfig, head_tokens: int, chunk: int, head_passes: int) -> int:
  """Per-device extra weight reads of an LM head run in chunks of `chunk` positions: each
  chunk's matmul reads the whole [d, v] head again, `head_passes` times per micro-batch (1 for
  a forward; 3 in a train step: forward, checkpoint recompute, backward)."""
  if chunk <= 0 or chunk >= head_tokens or cfg.head != "lm":
    return 0
  n_chunks = -(-head_tokens // chunk)
  head = cfg.d_model * cfg.vocab_size * jnp.dtype(cfg.jnp_param_dtype).itemsize
  return (n_chunks - 1) * head_passes * head


def forward_bytes(
  cfg: ModelConfig, rows: int, q_len: int, kv_len: int, head_tokens: int, tensor: int
) -> float:
  """Estimated global HBM traffic of one forward's activations (each large tensor written/read
  once per use); the weights are added per pass by `per_device`.

  Activations per layer and token: ~12 d-wide and 2*(h+2k)*e q/k/v reads/writes, 5 f-wide (gate,
  up, product), in the compute dtype; attention scores materialise as [b, h, q, kv] float32
  (written, read by softmax) plus the probabilities in the compute dtype (written, read), per
  (query, slot) pair. Decode adds the KV-cache read (kv_len slots).
  LM-head logits [rows, head_tokens, v] float32 written and read twice (log-softmax).
  """
  a = jnp.dtype(cfg.jnp_dtype).itemsize
  tok = rows * q_len
  per_tok = (12 * cfg.d_model + 2 * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim) * a
  per_tok += 5 * cfg.d_ff * a
  scores = rows * cfg.n_heads * q_len * kv_len * (4 + 4 + a + a)
  kv_read = rows * kv_len * 2 * cfg.n_kv_heads * cfg.head_dim * a if q_len == 1 else 0
  acts = cfg.n_layers * (tok * per_tok + scores + kv_read)
  logits = 3 * rows * head_tokens * cfg.vocab_size * 4 if cfg.head == "lm" else 0
  return acts + logits


def per_device(total_acts: float, weights: float, n_dev: int, tensor: int, passes: float):
  """Per-device bytes: its share of the activations, plus the whole (gathered) weight set read
  once per pass (divided by the tensor-parallel size): fsdp gathers every layer on every
  device, so each extra pass (micro-batch, decode step) re-reads all weights."""
  return total_acts / n_dev + passes * weights / tensor


def train_bytes(cfg: ModelConfig, fwd_acts, w, n_dev, tensor, n_micro):
  """Forward + backward (~2x forward traffic) + remat recompute (1x), weights read in each of
  those passes per micro-batch, plus the AdamW update: per device, read param/grad/m/v and
  write param/m/v of its shard (fp32 moments as param_dtype here)."""
  passes = 3 + (1 if cfg.remat == "full" else 0)
  opt = 7 * w / n_dev
  return per_device(passes * fwd_acts, w, n_dev, tensor, passes * n_micro) + opt
