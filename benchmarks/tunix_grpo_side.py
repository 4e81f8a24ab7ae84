"""The tunix GRPO peer: tunix's own `GRPOLearner` (RLCluster, vanilla rollout, one CPU device,
fp32) timed in the tunix venv (never a project dependency) next to rule-only iterations of our
train loop, as trl_side.py times TRL's GRPOTrainer: same fp32 weights (our export, gated first
with tunix_side's gate), the prompts our loop draws in its order, P prompts x G samples at our
temperature stopping on our EOS ids, our rule verdict as the reward (torch_side.rule_reward_fn),
group-normalised advantages (both: std with ddof 1, + 1e-6), token-mean loss, low_var_kl (k3,
clamped to [-10, 10]) to a frozen reference, clip eps and dual clip c, grad clip and AdamW at
our lr, one update per batch. `learner_config` maps our config; what it cannot map is
NOT_MATCHED.

The worker is tunix_side's (same model loading, rope fix, gate answers) plus `iteration`.
Traps of tunix 0.1.7 met on the way, each handled in the worker:
- every dataset column must be a numpy array: the learner repeats a batch G times with
  jax.tree.map(np.repeat), so a Python list of strings becomes G copies of each string (as
  leaves) and the sampler tokenizes their repr;
- the rollout seed is fixed: RolloutConfig.seed=None means PRNGKey(0) at every generate call
  (the same noise each step); the worker sets seed = step index per call;
- the pad id masks everywhere (prompt and completion masks, attention and positions of the
  reference and train passes), so SmolLM2's pad <|im_end|> would mask every chat turn's end:
  the tokenizer gets tunix_side.peer_pad_id (in no prompt) as pad, and its samples are counted;
- the reference must be a second model instance: the actor is updated in place;
- GRPOConfig defaults to beta 0.04, kl "kl" (k1), sequence-mean-token-mean, G 2, no dual clip;
  the dual clip (epsilon_c) and a separate upper clip (epsilon_high) are not fields: the loss
  reads them as attributes (getattr / hasattr), so they are set after construction; RolloutConfig to temperature 0.9, one EOS,
  max_prompt_length 64 (a longer prompt is padded to the next power of 2); all set here;
- the train step is dispatched asynchronously: a step's time waits for the updated weights;
- tunix re-tokenizes text prompts (HF encode, then a BOS prepended unless already first): the
  worker checks that the ids it fed equal ours at every call.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

if __package__:  # imported by the project side
  from benchmarks import tunix_side
  from benchmarks.torch_side import WorkerClient, rule_reward_fn, serve
else:  # this file as the tunix venv's worker script: its siblings (stdlib and numpy only)
  import tunix_side  # type: ignore[no-redef]
  from torch_side import WorkerClient, rule_reward_fn, serve  # type: ignore[no-redef]

# Our loss aggregation -> tunix's loss_agg_mode.
LOSS_AGG = {"token_mean": "token-mean", "seq_mean_token_mean": "sequence-mean-token-mean"}
NOT_MATCHED = (
  "tunix runs each prompt once per sample (P x G rows) in prefill, the reference pass and the "
  "train step; ours once per group (share_prompt)",
  "tunix pads every prompt to one width (the longest prompt of the run, rounded up to our "
  "rollout.prompt_pad_multiple) and every completion to max_new_tokens; ours each step's "
  "prompts to multiples of rollout.prompt_pad_multiple, responses to "
  "rollout.response_pad_multiple",
  "tunix leaves the EOS token out of the trained tokens and of its lengths; ours trains it",
  "tunix's k3 KL is clamped on its output only; ours also clamps the log-ratio first",
  "remat: ours recomputes projections in the backward; tunix nothing",
  "tunix's train step also computes logits over prompt positions and a full-vocabulary "
  "entropy for its metrics",
  "tunix's generation time is its rollout's generate (tokenize, prefill, decode, detokenize); "
  "ours (time/sample_s) samples, fetches and decodes",
  "rule reward: ours in a process pool with a 5 s deadline per item; tunix's in-process, none",
)


def learner_config(c, steps: int) -> dict:
  """The worker's settings for `steps` iterations of our run config `c` (tunix config keyword
  groups), or a ValueError naming the key that has no tunix counterpart."""
  r, p, oc, loss = c.rollout, c.policy, c.policy.optim, c.policy.loss
  if loss.agg not in LOSS_AGG:
    raise ValueError(f"policy.loss.agg={loss.agg!r} has no tunix loss_agg_mode")
  if loss.kl_kind != "low_var_kl":
    raise ValueError(f"policy.loss.kl_kind={loss.kl_kind!r}: only low_var_kl is mapped")
  if not loss.scale_adv_by_std:
    raise ValueError("policy.loss.scale_adv_by_std=False: tunix's GRPO always divides by std")
  if oc.schedule not in ("constant", "linear_warmup") or (
    oc.schedule == "linear_warmup" and oc.warmup_steps
  ):
    raise ValueError("policy.optim: only a constant lr maps (tunix runs the optax one as given)")
  if oc.name != "adamw":
    raise ValueError(f"policy.optim.name={oc.name!r}: only adamw maps (the peer's optax.adamw)")
  if p.ppo_mini_batch_size not in (0, r.prompts_per_step * r.group_size):
    raise ValueError("policy.ppo_mini_batch_size: tunix's update here is one whole-batch step")
  return dict(
    steps=int(steps),
    prompts_per_step=int(r.prompts_per_step),
    prompt_pad_multiple=int(r.prompt_pad_multiple),
    seed=int(c.seed),
    rollout=dict(
      max_tokens_to_generate=int(r.max_new_tokens),
      temperature=float(r.temperature),
      top_p=float(r.top_p),
      top_k=int(r.top_k) or None,
    ),
    grpo=dict(
      num_generations=int(r.group_size),
      num_iterations=int(p.ppo_epochs),
      beta=float(loss.kl_coef),
      epsilon=float(loss.clip_eps),
      loss_agg_mode=LOSS_AGG[loss.agg],
      kl_loss_mode="low_var_kl",
      kl_clamp_value=10.0,
    ),
    # read with getattr / hasattr by tunix's loss: attributes, not GRPOConfig fields
    extra=dict(
      epsilon_c=None if loss.dual_clip_c is None else float(loss.dual_clip_c),
      epsilon_high=None if loss.clip_eps_high is None else float(loss.clip_eps_high),
    ),
    optim=dict(
      lr=float(oc.lr),
      b1=float(oc.adamw.b1),
      b2=float(oc.adamw.b2),
      eps=float(oc.adamw.eps),
      weight_decay=float(oc.adamw.weight_decay),
      grad_clip=float(oc.grad_clip),
    ),
  )


# ------------------------------------------------------------------------ project side (client)
class TunixGrpoPeer(WorkerClient):
  """The tunix worker with GRPO (this file under the tunix venv's python)."""

  name = "tunix"

  def __init__(self, python: str = tunix_side.DEFAULT_TUNIX_PYTHON):
    env = dict(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TQDM_DISABLE="1", TF_CPP_MIN_LOG_LEVEL="2")
    super().__init__(python, __file__, env, tunix_side.VENV_HINT)


def _open(python: str):
  return TunixGrpoPeer(python)  # looked up at call time (tests replace it)


def _setting(info: dict, theirs: dict) -> str:
  return (
    f"one CPU device each, pinned to CPUs {info['cpus']}; tunix's prompt width "
    f"{theirs['width']}, pad id {theirs['pad_id']} sampled {theirs['pad_sampled']} times"
  )


def _gate(peer, cfg, params, tokens, mask, pad_id, hf_dir):
  del pad_id  # tunix_side's gate picks its own pad id (one in no prompt)
  return tunix_side.gate(cfg, params, tokens, mask, peer, hf_dir)


def tunix_iteration_section(
  report, spec: str, overrides, warmup: int, runs: int, workroot, python, run_train=None
) -> None:
  """`warmup` + `runs` GRPO iterations of tunix's GRPOLearner against as many rule-only
  iterations of our train loop (iteration.peer_iteration_section)."""
  from benchmarks.iteration import IterationPeer, peer_iteration_section  # pylint: disable=import-outside-toplevel

  tunix = IterationPeer(
    key="tunix_iteration",
    name="tunix",
    library="tunix GRPOLearner",
    open=_open,
    versions=lambda info: f" (tunix {info['tunix']}, jax {info['jax']})",
    gate=_gate,
    make_config=learner_config,
    setting=_setting,
    runs_as="one learner.train",
    not_matched=NOT_MATCHED,
  )
  peer_iteration_section(report, tunix, spec, overrides, warmup, runs, workroot, python, run_train)


# ------------------------------------------------------------------------ tunix venv (worker)
class _Worker(tunix_side._Worker):  # pylint: disable=protected-access
  def iteration(self, hf_dir, prompts, config, eos_ids, verify_py):
    """config["steps"] iterations of tunix's GRPOLearner on `prompts` (in order, P per step);
    per step: seconds of the global step (until the updated weights exist), of the rollout's
    generate calls inside it, of the reference log-probs, and the mean completion length."""
    import dataclasses  # pylint: disable=import-outside-toplevel

    import optax  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    from tunix.models.llama3 import params as params_lib  # pylint: disable=import-outside-toplevel
    from tunix.rl import rl_cluster as rl  # pylint: disable=import-outside-toplevel
    from tunix.rl.grpo import grpo_learner  # pylint: disable=import-outside-toplevel
    from tunix.rl.rollout import base_rollout  # pylint: disable=import-outside-toplevel

    jax, jnp, k = self.jax, self.jnp, config
    with open(prompts, encoding="utf-8") as f:
      rows = json.load(f)
    n_p, steps = k["prompts_per_step"], k["steps"]
    if len(rows) != n_p * steps:
      raise ValueError(f"{len(rows)} prompts for {steps} steps of {n_p}")
    ids = {r["prompt"]: r["ids"] for r in rows}
    pad = tunix_side.peer_pad_id(*[np.asarray(r["ids"]) for r in rows])
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    tok.pad_token = tok.convert_ids_to_tokens(pad)
    m = max(k["prompt_pad_multiple"], 1)
    width = -(-max(len(r["ids"]) for r in rows) // m) * m

    t0 = time.perf_counter()
    cfg = self.config(hf_dir, sampling=False)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    load = lambda: params_lib.create_model_from_safe_tensors(
      hf_dir, cfg, mesh=mesh, dtype=jnp.float32
    )
    actor, reference = load(), load()  # two instances: the actor is updated in place
    o = k["optim"]
    optimizer = optax.inject_hyperparams(  # around the whole chain, so tunix can log the lr
      lambda learning_rate: optax.chain(
        optax.clip_by_global_norm(o["grad_clip"]),
        optax.adamw(
          learning_rate, b1=o["b1"], b2=o["b2"], eps=o["eps"], weight_decay=o["weight_decay"]
        ),
      )
    )(learning_rate=o["lr"])
    per_step = dict.fromkeys(
      (
        "mini_batch_size",
        "train_micro_batch_size",
        "rollout_micro_batch_size",
        "compute_logps_micro_batch_size",
      ),
      n_p,
    )
    training = rl.RLTrainingConfig(
      actor_optimizer=optimizer,
      eval_every_n_steps=10**9,  # a required field; no eval dataset is given
      max_steps=steps,
      checkpoint_root_directory=None,
      metrics_logging_options=None,
      **per_step,
    )
    rollout_cfg = base_rollout.RolloutConfig(
      **k["rollout"],
      seed=None,  # set per call below
      max_prompt_length=width,
      kv_cache_size=width + k["rollout"]["max_tokens_to_generate"],
      data_type=jnp.float32,
      eos_tokens=list(eos_ids),
      return_logprobs=False,
    )
    cluster = rl.RLCluster(
      actor=actor,
      reference=reference,
      tokenizer=tok,
      cluster_config=rl.ClusterConfig(
        role_to_mesh={rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=training,
        rollout_config=rollout_cfg,
      ),
    )
    algo = grpo_learner.GRPOConfig(**k["grpo"])
    for name, value in k["extra"].items():
      if value is not None:
        setattr(algo, name, value)
    reward, status = rule_reward_fn(verify_py)
    learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster, algo_config=algo, reward_fns=[reward], data_shuffle_seed=None
    )
    init_s = time.perf_counter() - t0

    rec = {"steps": [], "cur": None, "calls": 0, "pad_sampled": 0}
    generate = cluster.rollout.generate

    def timed_generate(texts, rollout_config, **kw):
      rollout_config = dataclasses.replace(rollout_config, seed=k["seed"] + rec["calls"])
      rec["calls"] += 1
      t = time.perf_counter()
      out = generate(texts, rollout_config, **kw)  # host numpy: finished when it returns
      rec["cur"]["generate"].append(time.perf_counter() - t)
      fed = [row[row != pad].tolist() for row in np.asarray(out.left_padded_prompt_tokens)]
      if fed != [ids[str(x)] for x in texts]:
        raise RuntimeError("tunix fed other prompt ids than ours")
      rec["cur"]["lens"] += [len(x) for x in out.tokens]
      rec["pad_sampled"] += int(sum(int(np.sum(np.asarray(x) == pad)) for x in out.tokens))
      return out

    ref_logps = cluster.get_ref_per_token_logps

    def timed_ref(*a, **kw):
      t = time.perf_counter()
      out = jax.block_until_ready(ref_logps(*a, **kw))
      rec["cur"]["ref"].append(time.perf_counter() - t)
      return out

    global_step = learner._run_global_step  # pylint: disable=protected-access

    def timed_step(*a, **kw):
      rec["cur"] = {"generate": [], "ref": [], "lens": []}
      t = time.perf_counter()
      global_step(*a, **kw)
      jax.block_until_ready(nnx.state(cluster.actor_trainer.model, nnx.Param))  # async update
      cur = rec["cur"]
      rec["steps"].append(
        {
          "step": len(rec["steps"]) + 1,
          "step_s": time.perf_counter() - t,
          "generate_s": sum(cur["generate"]),
          "generate_calls": len(cur["generate"]),
          "ref_s": sum(cur["ref"]),
          "len": float(np.mean(cur["lens"])) if cur["lens"] else None,
        }
      )

    cluster.rollout.generate = timed_generate
    cluster.get_ref_per_token_logps = timed_ref
    learner._run_global_step = timed_step  # pylint: disable=protected-access
    data = [
      {
        "prompts": np.array([r["prompt"] for r in rows[s * n_p : (s + 1) * n_p]]),
        "answer": np.array([r["answer"] for r in rows[s * n_p : (s + 1) * n_p]]),
      }
      for s in range(steps)
    ]
    learner.train(data)
    if len(rec["steps"]) != steps:
      raise RuntimeError(f"tunix ran {len(rec['steps'])} global steps, not {steps}")
    logged = {}
    for name in ("loss", "kl", "grad_norm", "learning_rate"):
      try:
        hist = cluster._rl_metrics_logger.get_metric_history("actor", name, "train")  # pylint: disable=protected-access
        logged[name] = [float(np.asarray(x)) for x in hist]
      except (ValueError, KeyError, TypeError):
        logged[name] = []
    out = {
      "steps": rec["steps"],
      "logged": logged,
      "reward_status": status,
      "init_s": init_s,
      "width": width,
      "pad_id": pad,
      "pad_sampled": rec["pad_sampled"],
      "resolved": {
        "grpo": {f.name: getattr(algo, f.name) for f in dataclasses.fields(algo)},
        **{name: getattr(algo, name, None) for name in k["extra"]},
        "rollout_shares_actor_weights": not learner.should_sync_weights,
        "dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(nnx.state(actor, nnx.Param))}),
      },
    }
    return json.loads(json.dumps(out, default=str))  # tunix's config values as JSON


def _serve() -> None:
  tunix_side.limit_cpus(tunix_side.CPUS)  # before jax starts its thread pools
  serve(_Worker)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  _serve()
