"""Token log-probabilities of responses, optionally without ever holding full logits.

At the paper's scale (1024 rollouts x 512 response tokens x a 151936-token vocabulary) float32
logits [b, n, v] are ~300 GiB, far beyond everything else in a step. With `chunk > 0` the LM
head runs over `chunk` response positions at a time inside a `lax.scan`, and each chunk's body
is rematerialised (`jax.checkpoint`), so the backward pass recomputes that chunk's logits
instead of the forward pass storing all of them: the largest logits array alive is
[b, chunk, v], forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import Transformer, positions_from_mask, segment_starts


def logit_temperature(temperature: float) -> float:
  """What the logits are divided by before any log-prob: the sampling temperature, 1 for greedy.

  The one place that maps `rollout.temperature` to log-probs. The sampler draws from
  softmax(logits / T) and stores that distribution's log-probs; the trainer's PPO ratio, the
  reference pass (KL) and the sampler-vs-trainer mismatch must read the same distribution (as
  the reference code verl does: its actor divides the logits by the rollout temperature), or
  the ratio is off from the first mini-batch on. Greedy decoding (T = 0) has no such
  distribution: its log-probs are the raw logits'.
  """
  return float(temperature) if temperature > 0 else 1.0


def token_logprobs(logits_btv, targets_bt):
  """log softmax(logits)[target] per position, in float32.

  Alignment is the caller's job: logits at position t must be the prediction for
  targets_bt[:, t] (i.e. logits[:, :-1] against input_ids[:, 1:]).
  TRAP: bf16 logits lose ~3 significant digits, so the PPO ratio exp(logp - old) of two
  nearly equal numbers would be noise; upcast first.  We take logsumexp + a gather
  rather than a full log_softmax to avoid a second [B, T, V] float32 array.
  """
  logits_btv = logits_btv.astype(jnp.float32)
  lse_bt = jax.nn.logsumexp(logits_btv, axis=-1)
  tgt_bt = jnp.take_along_axis(logits_btv, targets_bt[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return tgt_bt - lse_bt


def head_logprobs(logits_fn: Callable, params, h_bnd, targets_bn, chunk: int = 0) -> jax.Array:
  """token_logprobs(logits_fn(params, h), targets) [b, n], `chunk` positions at a time.

  chunk <= 0 (or >= n) computes all positions at once. A width that `chunk` does not divide is
  zero-padded to a multiple of it; the padded positions are computed and dropped.
  """
  b, n, d = h_bnd.shape
  if chunk <= 0 or chunk >= n:
    return token_logprobs(logits_fn(params, h_bnd), targets_bn)
  n_chunks = -(-n // chunk)
  pad = n_chunks * chunk - n
  h_bnd = jnp.pad(h_bnd, ((0, 0), (0, pad), (0, 0)))
  targets_bn = jnp.pad(targets_bn, ((0, 0), (0, pad)))
  # Chunks become the leading (scanned) axis; the batch axis, and so its sharding, stays whole.
  h_cbkd = h_bnd.reshape(b, n_chunks, chunk, d).swapaxes(0, 1)
  t_cbk = targets_bn.reshape(b, n_chunks, chunk).swapaxes(0, 1)

  # Without the checkpoint the scan would save every chunk's logits for the backward pass,
  # which is the full [b, n, v] array again, just stacked.
  @jax.checkpoint
  def one_chunk(params, h_bkd, t_bk):
    return token_logprobs(logits_fn(params, h_bkd), t_bk)

  _, logp_cbk = jax.lax.scan(lambda _, x: (None, one_chunk(params, *x)), None, (h_cbkd, t_cbk))
  return logp_cbk.swapaxes(0, 1).reshape(b, n_chunks * chunk)[:, :n]


def response_logprobs(
  model_cfg: ModelConfig,
  params,
  prompt_tokens,
  prompt_mask,
  response_tokens,
  response_mask,
  *,
  chunk: int = 0,
  temperature: float = 1.0,
  prompt_group: int = 1,
  prompt_index=None,
  n_prompts: int = 0,
  response_segment=None,
):
  """log p(response token | everything before it): [b, n], float32, under softmax(logits / T)
  with T = logit_temperature(temperature) (the distribution the sampler drew from).

  The LM head runs only on the n positions that predict response tokens, not on the prompt:
  with a 49k-152k vocabulary that head (and its logits) is a large share of the step's FLOPs
  and memory. `chunk` > 0 bounds the logits held at once to [b, chunk, v] (see module doc).
  prompt_group = G > 1: rows g * G .. g * G + G - 1 share one prompt (a GRPO batch in its
  sampled order), which then runs once per group (`Transformer.hidden_shared_prompt`): the
  same log-probs up to float rounding, for a fraction of the prompt positions' work.
  prompt_index [b] (int, with n_prompts > 0, static): row i answers prompt prompt_index[i] of
  n_prompts, each of which occurs in the batch (any number of rows per prompt, in any order:
  a batch whose duplicate rows were merged); the n_prompts prompts run once each.
  response_segment [b, n] (int, with prompt_index): packed rows, several responses to the
  row's prompt back to back (`cooper_jax.pack`); each response's first token is predicted from
  its prompt's last position, the rest from the token before, as in a row of its own.
  """
  model = Transformer(model_cfg)
  p, n = prompt_tokens.shape[1], response_tokens.shape[1]
  indexed = prompt_index is not None and n_prompts > 0
  if response_segment is not None and not indexed:
    raise ValueError("packed rows (response_segment) need prompt_index and n_prompts > 0")
  if indexed or prompt_group > 1:
    b = prompt_tokens.shape[0]
    if indexed:  # each prompt's first row holds it (every prompt has a row)
      first_row = jnp.argmax(prompt_index[None, :] == jnp.arange(n_prompts)[:, None], axis=1)
      pick = lambda x: jnp.take(x, first_row, axis=0)
      per_row = lambda x: jnp.take(x, prompt_index, axis=0)
    else:
      if b % prompt_group:
        raise ValueError(f"prompt_group={prompt_group} does not divide the batch's {b} rows")
      pick = lambda x: x.reshape(b // prompt_group, prompt_group, *x.shape[1:])[:, 0]
      per_row = lambda x: jnp.repeat(x, prompt_group, axis=0)
    h_ppd, h_bnd = model.apply(
      {"params": params},
      pick(prompt_tokens),
      pick(prompt_mask).astype(bool),
      response_tokens,
      response_mask.astype(bool),
      prompt_index if indexed else None,
      response_segment,
      method=Transformer.hidden_shared_prompt,
    )
    # Position p - 1 (each prompt's last token: prompts are left-padded) predicts response
    # token 0; response position j predicts token j + 1.
    h_last = per_row(h_ppd[:, -1:])
    h_in = jnp.concatenate([h_last, h_bnd[:, : n - 1]], axis=1)
    if response_segment is not None:  # and the first token of each packed response
      h_in = jnp.where(segment_starts(response_segment)[..., None], h_last, h_in)
  else:
    tokens = jnp.concatenate([prompt_tokens, response_tokens], axis=1)
    mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(bool)
    h_btd, _ = model.apply(
      {"params": params}, tokens, positions_from_mask(mask), mask, method=Transformer.hidden
    )
    h_in = h_btd[:, p - 1 : p + n - 1]

  t = logit_temperature(temperature)

  def logits_fn(head_params, h):
    logits = model.apply({"params": head_params}, h, method=Transformer.logits)
    return logits if t == 1.0 else logits.astype(jnp.float32) / t

  # Only the head goes into the chunk loop, so its backward accumulates the head's gradient
  # alone rather than carrying zeros for every layer.
  head = "embed" if model_cfg.tie_embeddings else "lm_head"
  return head_logprobs(logits_fn, {head: params[head]}, h_in, response_tokens, chunk)
