"""A step's rollouts: prompts encoded on the host, G samples per prompt from the compiled sampler,
and, with `rollout.off_policy_steps` = k > 0, rollouts sampled k steps ahead of the update that
uses them (one-step-off-policy at k = 1, as verl's `one_step_off_policy` recipe and tunix's
asynchronous rollouts).

Off-policy timeline, k = 1: at the start of step t the sampler starts on step t + 1's prompts
with the current parameters theta_t (in a worker thread on one process), and step t goes on
with the rollouts sampled during step t - 1 with theta_{t-1}: decoding, rule verification, the
RM's reward, pairs and negatives, the policy update and the RM update all run while the next
batch samples. The update of step t therefore learns from rollouts of parameters one update
old. In general step t's rollouts come from theta_{max(t - k, 0)}: the first k steps all use
the initial parameters, and no rollout is sampled for a step at or past `train.steps`.

What the loss does with stale rollouts (train.Run.policy_update): the PPO ratio is taken
against the sampler's log-probs (old_logp = sampler_logp: the behaviour policy's), so the clip
bounds how far an update moves on them; under `policy.loss.sampler_is` the ratio is the
trainer's own (old_logp = sg(logp) at the current parameters, verl's "proximal" policy) and
the correction pi_theta_t / pi_sampler carries both the staleness and the numeric mismatch,
capped (token_tis) or masked (seq_mask).

Resume: a checkpoint written after step t - 1 holds the k rollout batches sampled ahead (steps
t .. t + k - 1) as arrays beside the models, and the data position from before they were drawn;
a resumed run draws the same prompts again, takes the saved samples and goes on exactly as the
straight run did (tests/test_off_policy.py kills a run mid-overlap and compares).

Every batch is deterministic in (seed, step): rows from the data iterator in step order, key
fold_in(fold_in(key(seed), step), 0), chunk i of a split batch fold_in(key, i).
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import distributed as dist
from cooper_jax import sharding
from cooper_jax.prompts import build_prompts
from cooper_jax.sampling import SampleOptions, SampleOutput, sample


@dataclasses.dataclass
class Batch:
  """One step's rollouts: the prompts' rows, their tokens [P * G, width] and mask on the host
  (each prompt repeated G times), and the sampler's output as global arrays, rows split over
  the batch devices. params_step: the step whose parameters sampled it."""

  rows: list[dict]
  tok: np.ndarray
  mask: np.ndarray
  out: SampleOutput
  params_step: int


def encode(run, rows) -> tuple[np.ndarray, np.ndarray]:
  """The prompts of `rows` as (tokens, mask) [P, width], left-padded (on the host)."""
  c = run.c
  prompts = build_prompts(run.tokenizer, [r["question"] for r in rows], c.data.prompt_suffix)
  return run.tokenizer.encode_prompts(
    prompts, max_len=c.rollout.max_prompt_len, pad_to_multiple=c.rollout.prompt_pad_multiple
  )


def sample_encoded(run, tok_u, mask_u, rng, params) -> SampleOutput:
  """G samples per prompt of the global batch, in sampler calls of at most
  rollout.sample_batch_size rows, as global arrays split over (data, fsdp) like every batch.
  Each prompt is prefilled once for its G samples (`sample(..., group_size=G)`). Returns once
  the sampler calls are dispatched (jax's asynchronous dispatch)."""
  c, g, mesh = run.c, run.group, run.mesh
  chunk = (c.rollout.sample_batch_size or len(tok_u) * g) // g  # prompts per sampler call
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  # Prompts split over the batch devices when they divide evenly; otherwise every device
  # holds the few prompts (small: [prompts, width] ids) and the G-fold copy is split.
  prompt_sh = sharding.batch_sharding(mesh) if chunk % shards == 0 else sharding.replicated(mesh)
  options = SampleOptions.from_rollout(
    c.rollout, eos_ids=run.tokenizer.eos_ids, pad_id=run.tokenizer.pad_id, mesh=mesh
  )
  outs = []
  for i, start in enumerate(range(0, len(tok_u), chunk)):
    out = sample(
      params,
      dist.put_global(tok_u[start : start + chunk], prompt_sh),
      dist.put_global(mask_u[start : start + chunk], prompt_sh),
      rng if chunk == len(tok_u) else jax.random.fold_in(rng, i),
      cfg=run.policy_cfg,
      options=options,
    )
    outs.append(out)
  rows_sh = sharding.batch_sharding(mesh, 1)  # leading axis split, the rest replicated
  if len(outs) > 1:  # one batch again, each row back on the devices that own it
    return jax.jit(
      lambda o: jax.tree.map(lambda *x: jnp.concatenate(x), *o), out_shardings=rows_sh
    )(outs)
  return jax.device_put(outs[0], rows_sh)


def rollout(run, rows, rng) -> tuple[np.ndarray, np.ndarray, SampleOutput]:
  """(prompt tokens, mask) [P * G, width] on the host and the sampler's output for `rows`, with
  the current policy parameters."""
  tok_u, mask_u = encode(run, rows)
  out = sample_encoded(run, tok_u, mask_u, rng, run.policy_state["params"])
  g = run.group
  return np.repeat(tok_u, g, axis=0), np.repeat(mask_u, g, axis=0), out


def step_key(run, step: int) -> jax.Array:
  """The key of a step's (first) rollout batch."""
  return jax.random.fold_in(run.rng(step), 0)


class RolloutQueue:
  """Rollout batches sampled ahead of their step (rollout.off_policy_steps = k >= 1).

  `take(step)` first starts the sampler, with the current parameters, on every step in
  [step, step + k] that has no batch yet (and is before train.steps), then returns step's batch
  (its sampler may still be running). The sampler is dispatched from a worker thread on one
  process (two threads run two compiled calls at once on a CPU; an accelerator interleaves
  them), from the main thread on N processes (every process must issue its collectives in one
  order); `take` returns only once the new batch's sampler calls are dispatched, so the
  update that follows may donate the parameters they read."""

  def __init__(self, run, ahead: int):
    self.run, self.ahead = run, ahead
    self.pool = (
      ThreadPoolExecutor(1, thread_name_prefix="rollout") if dist.process_count() == 1 else None
    )
    # step -> (rows, data position before they were drawn, tok_u, mask_u, Future[SampleOutput],
    # params_step)
    self.pending: dict[int, tuple] = {}

  def _launch(self, step: int, params_step: int) -> None:
    run = self.run
    before = run.iterator.state_dict()
    rows = run.iterator.next_batch(run.c.rollout.prompts_per_step)  # main thread, step order
    tok_u, mask_u = encode(run, rows)  # main thread: a tokenizer is not for two threads
    params, key = run.policy_state["params"], step_key(run, step)
    if self.pool is None:
      future = Future()
      future.set_result(sample_encoded(run, tok_u, mask_u, key, params))
    else:
      dispatched = threading.Event()

      def work():
        try:
          return sample_encoded(run, tok_u, mask_u, key, params)
        finally:
          dispatched.set()

      future = self.pool.submit(work)
      dispatched.wait()
    self.pending[step] = (rows, before, tok_u, mask_u, future, params_step)

  def take(self, step: int) -> Batch:
    last = min(step + self.ahead, self.run.c.train.steps - 1)
    for s in range(step, last + 1):
      if s not in self.pending:
        self._launch(s, params_step=step)
    rows, _, tok_u, mask_u, future, params_step = self.pending.pop(step)
    g = self.run.group
    return Batch(
      rows, np.repeat(tok_u, g, axis=0), np.repeat(mask_u, g, axis=0), future.result(), params_step
    )

  # ----------------------------------------------------------------------- checkpointing
  def data_position(self) -> dict:
    """The data iterator's position before the earliest batch sampled ahead: a checkpoint's
    position, from which a resumed run draws those batches' prompts again."""
    if not self.pending:
      return self.run.iterator.state_dict()
    return self.pending[min(self.pending)][1]

  def saved(self) -> tuple[dict, list[dict]] | None:
    """(arrays, their description) of the batches sampled ahead, for a checkpoint (waits for
    their samplers); None when there are none."""
    if not self.pending:
      return None
    arrays, described = {}, []
    for s in sorted(self.pending):
      _, _, _, _, future, params_step = self.pending[s]
      out = future.result()
      arrays[str(s)] = out._asdict()
      described.append(
        {
          "step": s,
          "params_step": params_step,
          **{k: [list(v.shape), str(v.dtype)] for k, v in out._asdict().items()},
        }
      )
    return arrays, described

  def restore(self, described: list[dict], load) -> None:
    """Refills the queue from a checkpoint: `described` as `saved` wrote it; load(target) the
    saved arrays into `target` (ShapeDtypeStructs); the data iterator at `data_position`."""
    run = self.run
    rows_sh = sharding.batch_sharding(run.mesh, 1)
    target = {
      str(d["step"]): {
        k: jax.ShapeDtypeStruct(tuple(d[k][0]), jnp.dtype(d[k][1]), sharding=rows_sh)
        for k in SampleOutput._fields
      }
      for d in described
    }
    arrays = load(target)
    for d in described:
      before = run.iterator.state_dict()
      rows = run.iterator.next_batch(run.c.rollout.prompts_per_step)
      tok_u, mask_u = encode(run, rows)
      future = Future()
      future.set_result(SampleOutput(**arrays[str(d["step"])]))
      self.pending[d["step"]] = (rows, before, tok_u, mask_u, future, d["params_step"])

  def close(self) -> None:
    if self.pool is not None:
      self.pool.shutdown(wait=True)


def validate(c) -> None:
  """rollout.off_policy_steps: an int >= 0, and not with what draws several batches a step."""
  k = c.rollout.off_policy_steps
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    raise ValueError(f"config.rollout.off_policy_steps must be an int >= 0, got {k!r}")
  if k and c.rollout.dynamic_sampling.enable:
    raise ValueError(
      "config.rollout.off_policy_steps > 0 and rollout.dynamic_sampling.enable cannot be "
      "combined: dynamic sampling draws further batches after verifying the first"
    )
