"""The Cooper host loop: prompts -> G rollouts -> rule verify -> reward -> policy_step ->
(cooper: pairs -> rm_step) -> monitors -> periodic eval -> checkpoint.

  python -m cooper_jax.train --config experiments/smollm2.py:cooper --workdir runs/x \
      --config.train.steps=10

reward_mode: "rule" (math-verify reward), "static_rm" (frozen RM reward), "cooper" (RM reward,
and the RM is updated every step on pairs from the policy's own rollouts); what each mode does
per step is `cooper_jax/reward_modes.py`. Everything random at step t derives from (seed, t),
so a resumed run repeats a straight one.

One code path for 1 and N processes (`config.distributed`, cooper_jax/distributed.py): every
process draws the same global prompt batch and samples it as one global array; each verifies
and scores only the whole groups its devices hold; rewards, advantages and metrics are agreed
over all processes; the primary writes metrics, config and manifests; a stop signal seen by
any process stops all after the same step, with one checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from cooper_jax import config as config_lib
from cooper_jax import distributed as dist
from cooper_jax import dynamic_sampling as dapo
from cooper_jax import (
  kl_monitor,
  losses,
  merge,
  optim,
  rollouts,
  run_records,
  run_steps,
  sharding,
  steps,
)
from cooper_jax.checkpoint import CheckpointStore, model_cfg_to_meta
from cooper_jax.data import PromptIterator, load_qa, run_data_keys
from cooper_jax.evaluate import evaluate_model
from cooper_jax.metrics import progress_line, step_line
from cooper_jax.paths import as_path
from cooper_jax.reward_modes import Rollouts, make_reward_mode
from cooper_jax.rewards.verify import RuleVerifier
from cooper_jax.run_outputs import RunOutputs
from cooper_jax.sampling import sample
from cooper_jax.tokenizer import load_tokenizer
from cooper_jax.weights import load_from_config

_STOP = {"requested": False}


def _on_stop_signal(signum, frame):  # pylint: disable=unused-argument
  """SIGTERM (a preemption) and SIGINT (Ctrl-C): finish this step, checkpoint, exit 0. A second
  Ctrl-C stops at once, without the checkpoint."""
  if signum == signal.SIGINT and _STOP["requested"]:
    raise KeyboardInterrupt
  name = signal.Signals(signum).name
  logging.warning("%s: will checkpoint after this step and exit (Ctrl-C again: now)", name)
  _STOP["requested"] = True


class Run:
  """Everything one training run holds: models, states, compiled steps, data and workers."""

  def __init__(self, c, workdir: str, reward=None):
    """reward: a reward source with the interface of reward_modes.RuleReward to use instead of
    the one `c.reward_mode` names (tests, positive controls: a reward the policy can learn)."""
    config_lib.validate(c, jax.device_count())
    config_lib.validate_processes(c, dist.process_count())
    self.c, self.workdir = c, as_path(workdir)
    # A start that cannot run fails before it writes anything: the config against the run's
    # record first, then models, plug-ins and data load; the workdir is written after.
    self.config_changes = run_records.check_restart(c, self.workdir)
    self.mesh = sharding.make_mesh(**c.mesh)
    self.group = c.rollout.group_size
    # How the policy batches hold their rows (shared prompts, merged or packed rows): one
    # object that the AOT tool builds too (run_steps).
    self.layout = run_steps.PolicyLayout.of(c)

    self.policy_cfg, policy_params, self.tok_src = load_from_config(c.policy, "lm", c.seed)
    self.tokenizer = load_tokenizer(self.tok_src)
    self.policy_opt = optim.make_optimizer(c.policy.optim, c.train.steps)
    self.policy_lr = optim.make_schedule(c.policy.optim, c.train.steps)
    self.policy_state = sharding.shard_tree(
      steps.init_state(policy_params, self.policy_opt), self.mesh
    )
    # The frozen reference gets its own buffers (via host), since policy_step donates the state.
    self.ref_params = (
      sharding.shard_tree(jax.device_get(policy_params), self.mesh)
      if c.policy.loss.kl_coef > 0
      else None
    )
    self.logprob_fn = run_steps.logprob_fn(
      c, self.layout, self.policy_cfg, self.mesh, policy_params
    )
    self._policy_step = None

    # The RM update of step t in a worker thread while step t + 1 samples (train.overlap_rm_update;
    # one process only): its metrics join step t's dict when it is joined (finish_rm_update).
    overlap = c.train.overlap_rm_update and dist.process_count() == 1
    self._rm_pool = ThreadPoolExecutor(1, thread_name_prefix="rm_update") if overlap else None
    self._rm_pending = None  # (future, the metrics dict of its step)

    self.verifier = RuleVerifier(c.verifier.workers or None)
    self.reward = reward if reward is not None else make_reward_mode(c, self.mesh, self.verifier)
    self.rm_lr = (
      optim.make_schedule(c.rm.optim, c.train.steps)
      if getattr(self.reward, "trains_rm", False)
      else None
    )

    self.train_rows, report = load_qa(c.data.train, **run_data_keys(c.data, "train"))
    logging.info(
      "train data %s: %d rows, %d skipped", c.data.train, len(self.train_rows), report.skipped
    )
    self.eval_rows = None
    if c.train.eval_every > 0:
      eval_keys = run_data_keys(c.data, "eval")
      self.eval_rows, _ = load_qa(c.data.eval, limit=c.data.eval_limit or None, **eval_keys)
    self.iterator = PromptIterator(self.train_rows, seed=c.seed)
    self.kl_monitor = None  # KL(pi_t || pi_0) at evaluations (train.eval_kl_prompts)
    if self.eval_rows is not None and kl_monitor.enabled(c):
      init = self.ref_params
      if init is None:  # no KL term: a copy of the initial parameters for the monitor
        init = sharding.shard_tree(jax.device_get(policy_params), self.mesh)
      self.kl_monitor = kl_monitor.KLMonitor(self, init)

    if dist.is_primary():
      self.workdir.mkdir(parents=True, exist_ok=True)
    dist.barrier("cooper_workdir")
    self.store = CheckpointStore(
      self.workdir / "checkpoints", c.train.max_to_keep, async_save=c.train.async_checkpoint
    )
    self.step = 0
    # rollout.off_policy_steps = k > 0: rollouts sampled k steps ahead (cooper_jax/rollouts.py).
    k = c.rollout.off_policy_steps
    self.ahead = rollouts.RolloutQueue(self, k) if k else None
    restored = self.store.restore_latest(self.policy_state, self.reward.state)
    if restored is not None:
      self.policy_state, self.reward.state, meta = restored
      self.iterator.load_state_dict(meta["data_iterator"])
      self.step = int(meta["step"])
      if self.ahead is not None and meta.get("rollouts_ahead"):
        load = functools.partial(self.store.restore_ahead, self.step)
        self.ahead.restore(meta["rollouts_ahead"], load)
      logging.info("resumed from %s at step %d", self.store.directory, self.step)
      if self.config_changes is None:
        logging.warning("%s has no config record: this config is not compared", self.workdir)
    start_record = run_records.write_start(c, self.workdir, self.step, self.config_changes)
    # A reward source that builds RM pairs hands them over by pop_pair_records.
    self.makes_pairs = hasattr(self.reward, "pop_pair_records")
    self.out = RunOutputs(c, self.workdir, self.step, self.makes_pairs, start_record)

  # ------------------------------------------------------------------------------ one step
  def rng(self, step: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(self.c.seed), step)

  def rollout(self, rows, rng):
    """(prompt tokens, mask) on the host and the sampler's output for `rows` with the current
    parameters (cooper_jax/rollouts.py)."""
    return rollouts.rollout(self, rows, rng)

  def policy_update(self, batch: dict, step: int) -> dict:
    """PPO updates on one rollout batch: policy.ppo_epochs passes over mini-batches of
    policy.ppo_mini_batch_size rows (0 = the whole batch). A single update is on-policy (ratio
    1, the sampler's log-probs only measure the sampler-vs-trainer mismatch); several use the
    sampler's log-probs as old_logp, so later mini-batches are clipped against the policy that
    generated them; under policy.loss.sampler_is they are the trainer's own at the sampling
    parameters (one more forward pass), and the sampler's enter the correction only. Metrics
    are means over the updates; the mismatch is the first update's, taken at the sampling
    parameters. Rollouts sampled ahead (rollout.off_policy_steps) are off-policy from the
    first update: old_logp is the sampler's, or with sampler_is the trainer's now, the
    correction then covering the staleness too (run_steps.old_logp_in_batch). `batch` holds the reference log-probs when a KL term needs them
    (`train_step` dispatches that pass as soon as the tokens exist)."""
    c = self.c
    b = batch["advantages"].shape[0]
    mb, n_updates = run_steps.policy_updates(c, b)
    if run_steps.old_logp_in_batch(c, n_updates):
      if c.policy.loss.sampler_is.kind == "none":
        batch = dict(batch, old_logp=batch["sampler_logp"])
      else:  # the ratio pi / pi_old is the trainer's; pi_old / pi_sampler is corrected
        rows = {k: batch[k] for k in _LOGPROB_KEYS if k in batch}
        batch = dict(batch, old_logp=self.logprob_fn(self.policy_state["params"], rows))
    if n_updates == 1:
      batches = [batch]
    else:
      batches = []
      for epoch in range(c.policy.ppo_epochs):
        order = np.random.default_rng([c.seed, step, epoch]).permutation(b)
        for start in range(0, b, mb):
          idx = np.sort(order[start : start + mb])
          batches.append(
            {
              k: jax.device_put(v[idx], sharding.batch_sharding(self.mesh, v.ndim))
              for k, v in batch.items()
            }
          )
    if self._policy_step is None:
      # Mini-batches of random rows break the groups; whole-batch updates keep them.
      self._policy_step = run_steps.policy_step(
        c,
        self.layout,
        self.policy_cfg,
        self.policy_opt,
        self.mesh,
        self.policy_state,
        batches[0],
        whole=mb == b,
      )
    lr = float(self.policy_lr(int(self.policy_state["step"])))  # the lr of the first update
    per_update = []
    for mini in batches:
      self.policy_state, pm = self._policy_step(self.policy_state, mini)
      per_update.append(jax.device_get(pm))
    m = {f"policy/{k}": float(np.mean([u[k] for u in per_update])) for k in per_update[0]}
    for k in ("sampler_logp_abs_diff", "sampler_kl"):
      if k in per_update[0]:
        m[f"policy/{k}"] = float(per_update[0][k])
    # At the sampling parameters and temperature the first update's ratio is 1 up to rounding.
    m["policy/first_ratio_mean"] = float(per_update[0]["ratio_mean"])
    m["policy/step_compiles"] = _compiled_count(self._policy_step)
    return {"policy/lr": lr, "policy/updates": n_updates, **m}

  def train_step(self) -> dict:
    c, step, group = self.c, self.step, self.group
    rng = self.rng(step)
    t0 = time.perf_counter()
    drawn = None  # rollout.dynamic_sampling: the batch chosen from several (dynamic_sampling)
    params_age = 0  # how many updates old the parameters that sampled this step's rollouts are
    if dapo.enabled(c):
      drawn = dapo.draw(self, rng)
      rows, tok, mask, out = drawn.rows, drawn.tok, drawn.mask, drawn.out
    elif self.ahead is not None:  # sampled k steps ahead (rollout.off_policy_steps)
      ahead = self.ahead.take(step)
      rows, tok, mask, out = ahead.rows, ahead.tok, ahead.mask, ahead.out
      params_age = step - ahead.params_step
    else:
      rows = self.iterator.next_batch(c.rollout.prompts_per_step)  # the same on every process
      tok, mask, out = self.rollout(rows, rollouts.step_key(self, step))
    n = len(rows) * group
    # This process's rollouts: the rows its devices hold, whole groups (checked).
    own = dist.local_rows(out.tokens.sharding, n, 2)
    if len(own) % group or np.any(own.reshape(-1, group) != own[::group, None] + np.arange(group)):
      raise ValueError(
        f"process {dist.process_index()} holds rows {own.tolist()}, not whole groups"
      )
    out_tok, out_mask = dist.fetch_local_rows(out.tokens), dist.fetch_local_rows(out.mask)
    # The last step's RM update ran while this step sampled; it ends before anything else uses
    # the RM or the verifier.
    self.finish_rm_update()
    resp_len = dist.gather_rows(own, out_mask.sum(1), n)
    w = _bucket(int(resp_len.max()), c.rollout.response_pad_multiple, c.rollout.max_new_tokens)
    if self.layout.merge:  # distinct rows only, on every process alike
      resp = dist.gather_rows(own, out_tok[:, :w], n)
      merger = merge.MergedStep(
        self.mesh, group, self.layout.n_prompts, tok, mask, resp, resp_len, pack=self.layout.packed
      )
      batch = merger.ref_batch()
    else:
      bs = sharding.batch_sharding(self.mesh)
      batch = {
        "prompt_tokens": dist.put_global(np.asarray(tok, np.int32), bs),
        "prompt_mask": dist.put_global(mask, bs),
        "response_tokens": _first_columns(out.tokens.astype(jnp.int32), w),
        "response_mask": _first_columns(out.mask, w),
      }
    if self.ref_params is not None:
      # Dispatched now (asynchronously): the reference pass needs only the tokens, so it runs
      # on the devices while the host decodes, verifies and scores.
      batch["ref_logp"] = self.logprob_fn(self.ref_params, batch)
    if drawn is None:
      texts = [self.tokenizer.decode(out_tok[i][out_mask[i]].tolist()) for i in range(len(own))]
      t_sample = time.perf_counter()
      ro, rewards, m = dapo.score_rollouts(self, rows, own, texts, n)
    else:  # sampled, verified and scored while drawing
      t_sample = time.perf_counter()
      ro, rewards, m = drawn.ro, drawn.rewards, drawn.metrics
    t_verify = time.perf_counter()
    self.out.write_rollouts(ro, rewards, step)
    adv = losses.grpo_advantages(  # the overlong penalty joins the rewards before advantages
      jnp.asarray(dapo.shaped(c, rewards, resp_len, m)),
      group,
      scale_by_std=c.policy.loss.scale_adv_by_std,
    )
    weight = dapo.row_weight(c, resp_len, drawn, m)
    adv = np.asarray(adv, np.float32)
    sampler_logp = _first_columns(out.logprobs.astype(jnp.float32), w)
    if self.layout.merge:
      batch = merger.policy_batch(adv, sampler_logp, batch.get("ref_logp"), weight)
      m["policy/rows"], m["policy/distinct_rows"] = merger.rows, merger.distinct
      m["policy/token_fill"] = merger.fill
    else:
      batch["advantages"] = dist.put_global(adv, sharding.batch_sharding(self.mesh, 1))
      batch["sampler_logp"] = sampler_logp
      if weight is not None:
        batch["row_weight"] = dist.put_global(weight, sharding.batch_sharding(self.mesh, 1))
    m.update(self.policy_update(batch, step))
    m["policy/response_width"] = w
    m["rollout/params_age"] = params_age
    m["rollout/prompt_width"] = int(tok.shape[1])
    m["rollout/sampler_compiles"] = _compiled_count(
      sample
    )  # shapes compiled so far (rollouts and evaluation)
    m["response/len_mean"] = float(resp_len.mean())
    m["response/truncated_frac"] = float(np.mean(resp_len == c.rollout.max_new_tokens))
    t_policy = time.perf_counter()
    if self.rm_lr is not None:
      m["rm_train/lr"] = float(self.rm_lr(int(self.reward.state["step"])))
    if self._rm_pool is None:
      self._join_rm_update(m, self._rm_update(ro, step))
    else:  # joined once the next step has sampled (or by finish_rm_update)
      self._rm_pending = (self._rm_pool.submit(self._rm_update, ro, step), m)
    t_end = time.perf_counter()
    m["rollout/new_tokens"] = new_tokens = int(resp_len.sum())
    if self.ahead is None:
      m["time/sample_tokens_per_s"] = new_tokens / (t_sample - t0)
    m.update(
      {
        "time/step_tokens_per_s": new_tokens / (t_end - t0),
        # Off-policy: the wait for rollouts sampled during earlier steps, not their sampling.
        "time/sample_s": t_sample - t0,
        "time/verify_s": t_verify - t_sample,
        "time/policy_s": t_policy - t_verify,
        "time/step_s": t_end - t0,
      }
    )
    self.step += 1
    return m

  def _rm_update(self, ro: Rollouts, step: int) -> tuple[dict, list[dict]]:
    """(the update's metrics, its pairs.jsonl rows); in the worker thread when overlapped."""
    t = time.perf_counter()
    m = self.reward.update(ro, step)
    m["time/rm_s"] = time.perf_counter() - t
    return m, self.reward.pop_pair_records() if self.makes_pairs else []

  def _join_rm_update(self, m: dict, result: tuple[dict, list[dict]]) -> None:
    """A finished RM update: its metrics into its step's dict, its pairs written (in the main
    thread, in step order, before the step's metrics line)."""
    rm, pairs = result
    m.update(rm)
    self.out.write_pairs(pairs)

  @property
  def rm_update_pending(self) -> bool:
    return self._rm_pending is not None

  def finish_rm_update(self) -> None:
    """Waits for the RM update running in the worker thread (train.overlap_rm_update), if
    any, and adds its metrics to its step's dict; re-raises what it raised."""
    if self._rm_pending is not None:
      future, m = self._rm_pending
      self._rm_pending = None
      self._join_rm_update(m, future.result())

  # ----------------------------------------------------------------------------- plumbing
  def evaluate(self) -> dict:
    c = self.c
    self.finish_rm_update()
    m = self.reward.evaluate()
    if self.eval_rows is None:
      return m
    res = evaluate_model(
      self.policy_cfg,
      self.policy_state["params"],
      self.tokenizer,
      {c.data.eval: self.eval_rows},
      samples=c.train.eval_samples,
      temperature=c.train.eval_temperature,
      top_p=1.0,
      max_new_tokens=c.train.eval_max_new_tokens,
      batch_size=min(64, len(self.eval_rows) * c.train.eval_samples),
      seed=c.seed,
      verifier=self.verifier,
      suffix=c.data.prompt_suffix,
      # N processes: every one samples and verifies the whole eval set (the params are global
      # arrays); the primary's numbers are logged.
      mesh=self.mesh if dist.process_count() > 1 else None,
    )
    b = res["benchmarks"][c.data.eval]
    m.update({"eval/acc": b["accuracy"], "eval/ci_lo": b["ci95"][0], "eval/ci_hi": b["ci95"][1]})
    if self.kl_monitor is not None:
      m.update(self.kl_monitor(self.policy_state["params"], self.step))
    return m

  def save(self):
    self.finish_rm_update()
    # Off-policy: the batches sampled ahead, and the data position from before they were drawn.
    ahead = self.ahead.saved() if self.ahead is not None else None
    position = self.ahead.data_position() if self.ahead is not None else None
    meta = {
      "data_iterator": position or self.iterator.state_dict(),
      "rollouts_ahead": ahead[1] if ahead else [],
      "config": json.loads(self.c.to_json_best_effort()),
      "policy_model": model_cfg_to_meta(self.policy_cfg),
      "tokenizer": self.tok_src,
      **self.reward.checkpoint_meta(),
    }
    path = self.store.save(
      self.step, self.policy_state, self.reward.state, meta, ahead=ahead[0] if ahead else None
    )
    logging.info("checkpoint step %d -> %s", self.step, path)

  def close(self):
    if self.ahead is not None:
      self.ahead.close()
    if self._rm_pool is not None:
      self._rm_pool.shutdown(wait=True)
    self.out.close()
    self.verifier.close()
    self.store.close()


def train(c, workdir: str, reward=None) -> Run:
  run = Run(c, workdir, reward)
  _STOP["requested"] = False  # a stop honoured by an earlier train() in this process is spent
  stop_signals = (signal.SIGTERM, signal.SIGINT)
  prev = {s: signal.signal(s, _on_stop_signal) for s in stop_signals}
  try:
    total = c.train.stop_after or c.train.steps  # the schedules span train.steps
    if c.train.eval_every and run.step == 0:
      run.out.write(0, run.evaluate())  # the curves start at the initial policy
    # A bar on a terminal; under nohup or a scheduler a plain line per step (a bar's carriage
    # returns would fill the log).
    plain = dist.is_primary() and not sys.stderr.isatty()
    bar = tqdm(
      total=total,
      initial=run.step,
      desc=f"cooper[{c.reward_mode}]",
      dynamic_ncols=True,
      disable=not dist.is_primary() or plain,
    )
    recent = []  # this interval's step metrics, summarised at each evaluation

    def log(step: int, m: dict) -> None:
      nonlocal recent
      run.out.write(step, m)
      if plain:
        logging.info("%s", step_line(step, total, m))
      bar.update(1)
      bar.set_postfix(
        reward=f"{m['reward/mean']:.3f}", rule=f"{m['rule/acc']:.3f}", s=f"{m['time/step_s']:.1f}"
      )
      recent.append(m)
      if "eval/acc" in m or "eval/rm_pair_acc" in m:
        if dist.is_primary():
          bar.write(progress_line(step, recent))
        recent = []

    waiting = None  # (step, metrics) whose RM update runs on (train.overlap_rm_update)
    while run.step < total:
      m = run.train_step()  # joins the last step's RM update once it has sampled
      if waiting is not None:
        log(*waiting)
        waiting = None
      evaluate = c.train.eval_every and run.step % c.train.eval_every == 0
      # A signal reaches one process (a preempted host) or all: every process stops after the
      # same step, so they all take part in the one final save.
      stop = dist.any_process(_STOP["requested"])
      save = run.step % c.train.checkpoint_every == 0 or run.step == total or stop
      if evaluate:
        m.update(run.evaluate())  # after the RM update
      if evaluate or save or not run.rm_update_pending:
        run.finish_rm_update()
        log(run.step, m)
      else:
        waiting = (run.step, m)
      if save:
        run.save()
      if stop:
        logging.warning("stopped by signal after step %d (checkpoint saved)", run.step)
        break
    run.finish_rm_update()
    if waiting is not None:
      log(*waiting)
    bar.close()
    artefacts = run.out.artefacts(run.store)
  finally:
    for s, handler in prev.items():
      signal.signal(s, handler)
    run.close()
  if dist.is_primary():
    print("\n".join(f"{what}: {where}" for what, where in artefacts), flush=True)
  return run


# What the log-prob pass reads of a policy batch (steps.make_logprob_fn; the last two only in
# a prompt-indexed or packed batch).
_LOGPROB_KEYS = (
  "prompt_tokens",
  "prompt_mask",
  "response_tokens",
  "response_mask",
  "prompt_index",
  "response_segment",
)


@functools.partial(jax.jit, static_argnums=1)
def _first_columns(x, w: int):
  """x[:, :w], rows staying where they are (the positions after w are padding)."""
  return x[:, :w]


def _bucket(n: int, multiple: int, cap: int) -> int:
  """n rounded up to a multiple (at least one multiple), at most cap; multiple 0: cap."""
  if multiple <= 0:
    return cap
  return min(cap, max(multiple, -(-n // multiple) * multiple))


def _compiled_count(jitted) -> int:
  """How many input shapes a jitted function has compiled for (-1 where jax does not say)."""
  size = getattr(jitted, "_cache_size", None)
  return int(size()) if callable(size) else -1


if __name__ == "__main__":  # the command line is cooper_jax.cli.train (cooper-train)
  from cooper_jax.cli.train import cli  # pylint: disable=import-outside-toplevel

  cli()
