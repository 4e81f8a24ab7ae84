"""Supervised fine-tuning: next-token cross-entropy on response tokens only.

Used to give a randomly initialised small policy its starting behaviour (tools/
sft_small_policy.py). The step has the same shape as the RL steps in `steps`: a pure
`(state, batch) -> (state, metrics)`, jit-compiled over a mesh with the state donated, and its
update goes through `steps.apply_update` (so a non-finite loss skips the update); the jit and
the optional micro-batching are `steps.make_train_step`'s.

SFT batch (b rows, t tokens, prompt then response, right-padded):
  tokens [b, t] int32, mask [b, t] bool (real tokens),
  loss_mask [b, t-1] float32 (1 where target t+1 is a response token, end-of-turn included).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from cooper_jax import losses, steps
from cooper_jax.logprobs import token_logprobs
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import forward


def encode_sft_batch(
  tokenizer,
  prompts: Sequence[str],
  responses: Sequence[str],
  max_len: int,
  pad_to_multiple: int = 1,
) -> dict[str, np.ndarray]:
  """Tokens/mask/loss_mask for (rendered chat prompt, response text) pairs.

  Prompt and response are encoded separately, as at sampling time (the prompt is encoded,
  then the model emits response tokens), and the tokenizer's end-of-turn id is appended so
  the model learns to stop. Rows are right-padded to the longest row rounded up to
  `pad_to_multiple`, capped at max_len; a row longer than max_len is an error, because cutting
  it would train on a response with no end.
  """
  if len(prompts) != len(responses) or not prompts:
    raise ValueError(
      f"need the same non-zero number of prompts and responses, got "
      f"{len(prompts)} and {len(responses)}"
    )
  if max_len < 2 or pad_to_multiple < 1:
    raise ValueError(
      f"max_len must be >= 2 and pad_to_multiple >= 1, got {max_len}, {pad_to_multiple}"
    )
  rows = []
  for i, (p, r) in enumerate(zip(prompts, responses)):
    p_ids, r_ids = tokenizer.encode(p), tokenizer.encode(r) + [tokenizer.eos_id]
    if not p_ids:
      raise ValueError(f"row {i}: prompt encodes to no tokens")
    if len(p_ids) + len(r_ids) > max_len:
      raise ValueError(
        f"row {i}: {len(p_ids)} prompt + {len(r_ids)} response tokens exceed max_len={max_len}"
      )
    rows.append((p_ids, r_ids))
  longest = max(len(p) + len(r) for p, r in rows)
  width = min(max_len, -(-longest // pad_to_multiple) * pad_to_multiple)
  b = len(rows)
  tokens = np.full((b, width), tokenizer.pad_id, np.int32)
  mask = np.zeros((b, width), np.bool_)
  loss_mask = np.zeros((b, width - 1), np.float32)
  for i, (p_ids, r_ids) in enumerate(rows):
    n_p, n = len(p_ids), len(p_ids) + len(r_ids)
    tokens[i, :n] = p_ids + r_ids
    mask[i, :n] = True
    # Position j predicts token j+1: response tokens sit at n_p..n-1, predicted from n_p-1..n-2.
    loss_mask[i, n_p - 1 : n - 1] = 1.0
  return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask}


def sft_loss_fn(model_cfg: ModelConfig, params, batch):
  """(loss, metrics): mean CE over every response token of the batch, in float32."""
  if model_cfg.head != "lm":
    raise ValueError(f"SFT needs an lm head, got head={model_cfg.head!r}")
  logits_btv = forward(model_cfg, params, batch["tokens"], batch["mask"])[:, :-1]
  targets_bt = batch["tokens"][:, 1:]
  logp_bt = token_logprobs(logits_btv, targets_bt)
  loss_mask_bt = batch["loss_mask"]
  loss = losses.masked_mean(-logp_bt, loss_mask_bt)
  hit_bt = (jnp.argmax(logits_btv, axis=-1) == targets_bt).astype(jnp.float32)
  metrics = {
    "token_accuracy": jax.lax.stop_gradient(losses.masked_mean(hit_bt, loss_mask_bt)),
    "response_tokens": jnp.sum(loss_mask_bt),
  }
  return loss, metrics


def make_sft_step(
  model_cfg: ModelConfig,
  optimizer,
  mesh: Mesh,
  state: steps.State,
  batch_like: dict,
  *,
  micro_batch_size: int = 0,
):
  """Returns jitted `sft_step(state, batch) -> (state, metrics)` for batches like `batch_like`.

  State shardings follow the parameter rules, batch rows are split over (data, fsdp), the
  state buffer is donated (do not reuse the state passed in). micro_batch_size > 0 accumulates
  gradients over micro-batches of that many rows (same result, less activation memory).
  """
  missing = {"tokens", "mask", "loss_mask"} - set(batch_like)
  if missing:
    raise ValueError(f"SFT batch is missing {sorted(missing)}")

  def loss_fn(params, batch):
    loss, metrics = sft_loss_fn(model_cfg, params, batch)
    # Both are means over the response tokens, the CE loss's denominator.
    n = metrics["response_tokens"]
    return steps.Mean(loss, n), {
      "token_accuracy": steps.Mean(metrics["token_accuracy"], n),
      "response_tokens": steps.Sum(n),
    }

  return steps.make_train_step(
    loss_fn, optimizer, mesh, state, batch_like, micro_batch_size=micro_batch_size
  )


def train_sft(
  cfg: ModelConfig,
  tokenizer,
  params,
  prompts: Sequence[str],
  responses: Sequence[str],
  *,
  n_steps: int,
  batch_size: int,
  lr: float,
  warmup: int,
  max_len: int,
  rng: np.random.Generator,
  log_every: int = 100,
):
  """SFT of `params` on (rendered prompt, response) pairs with the small-task recipe
  (`supervised.adamw_warmup_cosine`), one device mesh; the one loop tools/assets/sft_small_policy.py
  and tools/assets/train_small_rewriter.py share. Returns (params on the host, log, seconds)."""
  from cooper_jax import optim, sharding  # pylint: disable=import-outside-toplevel
  from cooper_jax.supervised import adamw_warmup_cosine, train_supervised  # pylint: disable=import-outside-toplevel

  opt = optim.make_optimizer(adamw_warmup_cosine(lr, warmup, n_steps))
  mesh = sharding.make_mesh()
  state = sharding.shard_tree(steps.init_state(params, opt), mesh)
  state, log, seconds = train_supervised(
    state,
    n_rows=len(prompts),
    steps=n_steps,
    batch_size=batch_size,
    rng=rng,
    # Width rounded to 32: a handful of shapes to compile instead of one per batch.
    encode=lambda idx: encode_sft_batch(
      tokenizer, [prompts[j] for j in idx], [responses[j] for j in idx], max_len, pad_to_multiple=32
    ),
    make_step=lambda state, batch: make_sft_step(cfg, opt, mesh, state, batch),
    describe=lambda m: (
      f"loss {m['loss']:.4f} token_acc {m['token_accuracy']:.3f} "
      f"grad_norm {m['grad_norm']:.2f} skipped {int(m['n_skipped'])} {m['elapsed_s']:.0f}s"
    ),
    log_every=log_every,
  )
  return jax.device_get(state["params"]), log, seconds
