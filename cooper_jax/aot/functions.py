"""The jitted functions one iteration of cooper_jax.train runs, built by the functions train.py
and reward_modes.py build them with (cooper_jax.run_steps), with abstract inputs, their analytic cost and the per-device bytes
of what stays on the chip all iteration (states, frozen parameters)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from cooper_jax import optim, run_steps, sharding, steps
from cooper_jax.aot.cost import (
  Cost,
  chunked_head_bytes,
  forward_bytes,
  forward_flops,
  per_device,
  sampler_flops,
  shared_forward_bytes,
  shared_forward_flops,
  train_bytes,
  train_flops,
  weight_bytes,
)
from cooper_jax.aot.models import (
  ConfigError,
  abstract_batch,
  abstract_params,
  abstract_state,
  assistant_config,
  device_bytes,
  model_config,
)
from cooper_jax.config import logprob_micro_batch_size
from cooper_jax.sampling import SampleOptions

FUNCTIONS = (
  "sampler",
  "ref_logprobs",
  "rm_reward",
  "policy_step",
  "rm_step",
  "assistant_sampler",
)


@dataclasses.dataclass
class FnSpec:
  name: str
  lower: Callable[[], Any]  # -> jax.stages.Lowered
  persistent_arg_bytes: int  # per device: persistent buffers passed in (not counted twice)
  arg_bytes: int  # per-device argument bytes (used when the compile runs out of memory)
  cost: Cost
  calls: int = 1  # calls per training iteration
  # Samplers: their decode step lowered alone (aot.decode.lower_decode_step), one per cache
  # segment (reading the slots filled by its end), with the steps each runs. The report then
  # counts bytes as `cost.bytes` (the prefill) + the sum of steps x each compiled step's XLA
  # bytes per device: what the step's program reads, whichever of weights or activations XLA
  # moves between chips, where an analytic count must guess.
  decode_segments: Callable[[], list[tuple[int, Any]]] | None = None


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _sampler_spec(mesh, name, cfg, params, rows, prompt, options, calls):
  """sample() on `rows` output rows with `options` (sampling.SampleOptions): rows /
  options.group_size prompts, each prefilled once and its cache copied to its group_size
  samples (train.Run.rollout). The prompts are split over the batch devices when they divide
  evenly, else replicated, as train.py places them."""
  from cooper_jax.sampling import sample  # pylint: disable=import-outside-toplevel

  i32 = jnp.int32
  n_dev, tensor = mesh.devices.size, mesh.shape["tensor"]
  new = options.max_new_tokens
  u = rows // options.group_size
  shape = (u, prompt)
  psh = (
    sharding.batch_sharding(mesh)
    if u % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0
    else sharding.replicated(mesh)
  )
  batch = {k: jax.ShapeDtypeStruct(shape, d, sharding=psh) for k, d in (("t", i32), ("m", bool))}
  rng = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=sharding.replicated(mesh))

  def decode_segments():
    from cooper_jax.aot.decode import lower_decode_step  # pylint: disable=import-outside-toplevel
    from cooper_jax.sampling import segment_ends  # pylint: disable=import-outside-toplevel

    ends = segment_ends(new, options.cache_segments)
    lower = lambda slots: lower_decode_step(cfg, mesh, rows, prompt, options, read_slots=slots)[0]
    starts = [0] + ends[:-1]
    before = 0 if options.shared_prompt else prompt  # cache slots ahead of the rows' own
    return [
      (end - start, lower(None if end == new else before + end)) for start, end in zip(starts, ends)
    ]

  return FnSpec(
    name,
    lambda: sample.lower(params, batch["t"], batch["m"], rng, cfg=cfg, options=options),
    device_bytes(params),
    device_bytes(params) + device_bytes(batch),
    # FLOPs of the whole call; bytes of the prefill (its activations, the weights once): the
    # decode steps' bytes come from their compiled program (FnSpec.decode_segments).
    Cost(
      sampler_flops(cfg, rows, prompt, new, prefill_rows=u),
      per_device(
        forward_bytes(cfg, u, prompt, prompt, 1, tensor), weight_bytes(cfg), n_dev, tensor, 1
      ),
    ),
    calls,
    decode_segments=decode_segments,
  )


def build_functions(c, mesh) -> tuple[list[FnSpec], dict[str, int]]:
  """The jitted functions of one iteration of train.Run.train_step, with abstract inputs, and
  the per-device bytes of each persistent buffer (states, frozen params)."""
  n_dev = mesh.devices.size
  tensor = mesh.shape["tensor"]
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  p_len, n_new = c.rollout.max_prompt_len, c.rollout.max_new_tokens
  seq = p_len + n_new
  i32, f32 = jnp.int32, jnp.float32
  persistent: dict[str, int] = {}
  fns: list[FnSpec] = []
  pol_cfg = model_config(c.policy, "lm")
  pol_params = abstract_params(pol_cfg, mesh)
  pol_opt = optim.make_optimizer(c.policy.optim, c.train.steps)
  pol_state = abstract_state(pol_params, pol_opt, mesh)
  persistent["policy_state"] = device_bytes(pol_state)
  kl = c.policy.loss.kl_coef > 0
  if kl:  # train.py keeps a separate copy of the initial parameters as the reference
    persistent["ref_params"] = device_bytes(pol_params)
  w_pol = weight_bytes(pol_cfg)

  # Rollouts: train.Run.rollout samples in calls of rollout.sample_batch_size rows (whole
  # groups), each prompt prefilled once for its group_size samples.
  sbs = c.rollout.sample_batch_size or rows
  if rows % sbs or sbs % c.rollout.group_size:
    raise ConfigError(
      f"rollout.sample_batch_size={sbs} must divide the rollout batch {rows} and hold whole "
      f"groups of {c.rollout.group_size}"
    )
  # The model's own end and pad ids stand for the tokenizer's (shapes and cost only).
  eos = (pol_cfg.eos_id,) if pol_cfg.eos_id is not None else ()
  options = SampleOptions.from_rollout(
    c.rollout, eos_ids=eos, pad_id=pol_cfg.pad_id or 0, mesh=mesh
  )
  fns.append(_sampler_spec(mesh, "sampler", pol_cfg, pol_params, sbs, p_len, options, rows // sbs))

  pmb, chunk = c.policy.micro_batch_size, c.policy.logprob_chunk
  lmb = logprob_micro_batch_size(c)
  # The batches as train builds them (shared prompts, merged or packed rows: run_steps), at
  # their largest: every rollout row distinct, responses at max_new_tokens.
  layout = run_steps.PolicyLayout.of(c)
  p_rows, n_updates = run_steps.policy_updates(c, rows)
  lp_shapes, _ = run_steps.policy_batch_shapes(layout, rows, p_len, n_new, kl=kl, old_logp=False)
  # Forward-only log-prob passes of an iteration: the reference's (a KL term) and, where the
  # ratio is the trainer's own under a sampler correction, the old policy's (train.py).
  old_pass = run_steps.old_logp_in_batch(c, n_updates) and c.policy.loss.sampler_is.kind != "none"
  if kl or old_pass:
    lp_batch = abstract_batch(mesh, lp_shapes)
    lp_fn = run_steps.logprob_fn(c, layout, pol_cfg, mesh, pol_params)
    n_lp_micro = steps.micro_count(rows, lmb, mesh)
    g_lp = steps.micro_prompt_group(layout.shared_prompt_rows(), n_lp_micro)
    fwd_acts = shared_forward_bytes(pol_cfg, rows, p_len, n_new, n_new, tensor, g_lp)
    fns.append(
      FnSpec(
        "ref_logprobs" if kl else "old_logprobs",
        lambda: lp_fn.lower(pol_params, lp_batch),
        device_bytes(pol_params),
        device_bytes(pol_params) + device_bytes(lp_batch),
        Cost(
          shared_forward_flops(pol_cfg, rows, p_len, n_new, n_new, g_lp),
          per_device(fwd_acts, w_pol, n_dev, tensor, n_lp_micro)
          + n_lp_micro * chunked_head_bytes(pol_cfg, n_new, chunk, 1),
        ),
        calls=int(kl) + int(old_pass),
      )
    )

  rm_len = c.rm.max_len
  rmb, smb = c.rm.micro_batch_size, c.rm.score_micro_batch_size
  if c.reward_mode in ("static_rm", "cooper"):
    rm_cfg = model_config(c.rm, "score")
    rm_params = abstract_params(rm_cfg, mesh)
    w_rm = weight_bytes(rm_cfg)
    # As reward_modes: rm.optim for the co-trained RM, no optimizer state for a static one.
    rm_opt = run_steps.rm_optimizer(c, trains_rm=c.reward_mode == "cooper")
    rm_state = abstract_state(rm_params, rm_opt, mesh)
    persistent["rm_state"] = device_bytes(rm_state)
    r_batch = abstract_batch(mesh, {"t": ((rows, rm_len), i32), "m": ((rows, rm_len), bool)})
    r_fn = run_steps.reward_fn(c, rm_cfg, mesh, rm_params)
    fns.append(
      FnSpec(
        "rm_reward",
        lambda: r_fn.lower(rm_params, r_batch["t"], r_batch["m"]),
        device_bytes(rm_params),
        device_bytes(rm_params) + device_bytes(r_batch),
        Cost(
          forward_flops(rm_cfg, rows, rm_len, rm_len, 0),
          per_device(
            forward_bytes(rm_cfg, rows, rm_len, rm_len, 0, tensor),
            w_rm,
            n_dev,
            tensor,
            steps.micro_count(rows, smb, mesh),  # the reward pass's micro-batches
          ),
        ),
      )
    )

  # policy_update: one update on the whole batch, or ppo_epochs x (rows / ppo_mini_batch_size)
  # updates of that many rows; old_logp as train carries it. sampler_logp is always there.
  old_logp = run_steps.old_logp_in_batch(c, n_updates)
  _, pb_shapes = run_steps.policy_batch_shapes(
    layout, p_rows, p_len, n_new, kl=kl, old_logp=old_logp
  )
  p_batch = abstract_batch(mesh, pb_shapes)
  n_p_micro = steps.micro_count(p_rows, pmb, mesh)
  whole = p_rows == rows  # random mini-batch rows break the groups
  g_p = steps.micro_prompt_group(layout.shared_prompt_rows() if whole else 1, n_p_micro)
  p_fn = run_steps.policy_step(c, layout, pol_cfg, pol_opt, mesh, pol_state, p_batch, whole=whole)
  fns.append(
    FnSpec(
      "policy_step",
      lambda: p_fn.lower(pol_state, p_batch),
      device_bytes(pol_state),
      device_bytes(pol_state) + device_bytes(p_batch),
      Cost(
        train_flops(pol_cfg, p_rows, seq, n_new, chunked_head=0 < chunk < n_new, group=g_p),
        train_bytes(
          pol_cfg,
          shared_forward_bytes(pol_cfg, p_rows, p_len, n_new, n_new, tensor, g_p),
          w_pol,
          n_dev,
          tensor,
          n_p_micro,
        )
        + n_p_micro * chunked_head_bytes(pol_cfg, n_new, chunk, 3),
      ),
      n_updates,
    )
  )

  if c.reward_mode == "cooper":
    # reward_modes.CooperReward builds the RM pair batch (one pair per prompt) and always
    # trains it with "bt"; its micro_batch_size counts pairs (2 rows each).
    pairs = c.rollout.prompts_per_step
    rb = abstract_batch(
      mesh,
      {
        "pos_tokens": ((pairs, rm_len), i32),
        "pos_mask": ((pairs, rm_len), bool),
        "neg_tokens": ((pairs, rm_len), i32),
        "neg_mask": ((pairs, rm_len), bool),
        "valid": ((pairs,), f32),
      },
    )
    rm_fn = run_steps.rm_step(c, rm_cfg, rm_opt, mesh, rm_state, rb)
    fns.append(
      FnSpec(
        "rm_step",
        lambda: rm_fn.lower(rm_state, rb),
        device_bytes(rm_state),
        device_bytes(rm_state) + device_bytes(rb),
        Cost(
          train_flops(rm_cfg, 2 * pairs, rm_len, 0),
          train_bytes(
            rm_cfg,
            forward_bytes(rm_cfg, 2 * pairs, rm_len, rm_len, 0, tensor),
            w_rm,
            n_dev,
            tensor,
            steps.micro_count(pairs, rmb, mesh),
          ),
        ),
      )
    )
    if c.pairs.negatives == "llm_rewrite":
      # reward_modes loads the assistant in pairs.assistant_dtype, sharded like the policy or,
      # under pairs.assistant_decode_weights=mlp_split, in that layout.
      # It writes one rewrite per pending prompt, rows padded to a power of two; its prompt
      # holds the question and the positive, estimated as max_prompt_len + max_new_tokens.
      a_cfg = assistant_config(c)
      a_params = abstract_params(a_cfg, mesh, c.pairs.assistant_decode_weights)
      persistent["assistant_params"] = device_bytes(a_params)
      a_rows = max(1 << (c.rollout.prompts_per_step - 1).bit_length(), 1)
      a_rows = _round_up(a_rows, mesh.shape["data"] * mesh.shape["fsdp"])
      # As rewrite.LLMRewriteNegatives samples: top-p 1, one row per prompt, the rest default.
      a_options = SampleOptions(
        max_new_tokens=c.pairs.assistant_max_new_tokens,
        temperature=c.pairs.assistant_temperature,
        eos_ids=(a_cfg.eos_id,) if a_cfg.eos_id is not None else (),
        pad_id=a_cfg.pad_id or 0,
        weights_sharding=sharding.decode_weights(mesh, c.pairs.assistant_decode_weights),
      )
      a_prompt = _round_up(seq, 64)
      fns.append(
        _sampler_spec(mesh, "assistant_sampler", a_cfg, a_params, a_rows, a_prompt, a_options, 1)
      )
  return fns, persistent
