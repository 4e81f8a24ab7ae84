"""The experiment config schema (an ml_collections ConfigDict) with the paper's defaults, and its
validation. Experiment files in experiments/ start from `base_config()` and override fields.

Field types are locked: `--config.rm.optim.lr=abc` or an unknown key fails at parse time with
the key named; `validate` then checks values (sizes, names, mesh vs batch) before anything loads.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import ml_collections
from ml_collections import config_dict

from cooper_jax import registry
from cooper_jax.models import REMAT_CHOICES
from cooper_jax.objectives import FLAT as OBJECTIVE_FLAT
from cooper_jax.objectives import OBJECTIVES
from cooper_jax.objectives import hyperparameters as objective_hyperparameters
from cooper_jax.optim import OPTIMIZERS, SCHEDULES, hyperparameters
from cooper_jax.prompts import INSTRUCTION_SUFFIX

DECODE_WEIGHTS = ("sharded", "replicated", "mlp_split")  # rollout / pairs.assistant_decode_weights
SAMPLER_DTYPES = ("", "float32", "bfloat16", "float16")  # rollout.dtype ("" = the policy's)
SAMPLER_IS_KINDS = ("none", "token_tis", "seq_mask")  # policy.loss.sampler_is (sampler_is.py)
SAMPLER_IS_SEQ_RATIOS = ("geometric", "product")


def optim_config(lr: float, warmup_steps: int = 20, name: str = "adamw", **hp):
  """The reference code's optimizer by default: AdamW (b1 0.9, b2 0.999, eps 1e-8, wd 0.01),
  clip 1.0, linear warm-up then constant. name: one of optim.OPTIMIZERS; every optimizer's
  hyperparameters are present as optim.<name>.<key> (their defaults), so each can be set from
  the command line; hp: the named optimizer's, e.g. optim_config(1e-4, b2=0.95)."""
  c = ml_collections.ConfigDict(
    dict(
      name=name,
      lr=lr,
      schedule="linear_warmup",
      warmup_steps=warmup_steps,
      # Steps the decaying schedules span; unset = the run's train.steps (resolved in one
      # place, optim.make_schedule), so --config.train.steps=500 moves the decay with it.
      total_steps=config_dict.placeholder(int),
      end_lr_frac=0.0,
      grad_clip=1.0,
      **{opt: dict(spec.defaults) for opt, spec in OPTIMIZERS.items()},
    )
  )
  if name not in OPTIMIZERS:
    raise ValueError(f"optim name={name!r}: expected one of {', '.join(sorted(OPTIMIZERS))}")
  for key, value in hp.items():
    if key not in c[name]:
      raise ValueError(f"optim_config: {key!r} is not a hyperparameter of {name}")
    c[name][key] = value
  return c


def random_model_config() -> ml_collections.ConfigDict:
  """Fields of ModelConfig for `model="random"` (tests, smoke runs, benchmarks)."""
  return ml_collections.ConfigDict(
    dict(
      vocab_size=49152,
      d_model=64,
      n_layers=2,
      n_heads=4,
      n_kv_heads=2,
      head_dim=16,
      d_ff=128,
      rope_theta=10000.0,
      rms_eps=1e-5,
      qkv_bias=False,
      tie_embeddings=True,
      family="llama",
      max_seq_len=2048,
    )
  )


def model_config(**extra) -> ml_collections.ConfigDict:
  """A model section (policy or RM): what weights, tokenizer, dtypes and remat."""
  return ml_collections.ConfigDict(
    dict(
      model="smollm2-135m-instruct",
      tokenizer=config_dict.placeholder(str),
      random_model=random_model_config(),
      dtype="float32",
      param_dtype="float32",
      remat="projections",  # or "none", "full": see cooper_jax/models/__init__.py
      attn_chunk_bytes=0,  # attention in chunks of rows (a CPU setting): transformer.attend
      **extra,
    )
  )


def logprob_micro_batch_size(c) -> int:
  """Rows per micro-batch of the reference log-prob pass (0 = the whole batch)."""
  return c.policy.logprob_micro_batch_size or c.policy.micro_batch_size


def shared_prompt_decode(c) -> bool:
  """Whether the policy sampler holds each prompt's cache once for its group (only G > 1 has
  a group to share it)."""
  return bool(c.rollout.shared_prompt_decode) and c.rollout.group_size > 1


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.reward_mode = "cooper"

  c.policy = model_config()
  c.policy.optim = optim_config(1e-6)
  c.policy.micro_batch_size = 0  # rows per grad-accumulation micro-batch; 0 = whole batch
  # Rows per micro-batch of the forward-only reference log-prob pass; 0 = micro_batch_size.
  # It holds no gradients, so it can take larger micro-batches, and then rows that share a
  # prompt share its forward (steps.micro_prompt_group).
  c.policy.logprob_micro_batch_size = 0
  c.policy.logprob_chunk = 0  # response positions per log-prob chunk (no [b,n,v] logits); 0 = off
  # Each prompt's positions run once per group of G rollouts in the policy step and the
  # reference pass, not G times (logprobs.response_logprobs); the same log-probs up to float
  # rounding. Off only to compare.
  c.policy.share_prompt = True
  # Identical rollouts of a step (same prompt, tokens and advantage) run once in the policy
  # step and the reference pass, weighted by their count (steps.policy_loss_fn): the same
  # loss, gradient and metrics up to float rounding, for fewer rows when the policy repeats
  # itself. Rows padded to a multiple of 16 (fewer shapes to compile). Whole-batch updates
  # only (micro_batch_size, logprob_micro_batch_size and ppo_mini_batch_size 0).
  c.policy.merge_duplicate_rows = False
  # The merged batch's responses packed into shared rows, several to a row of one prompt
  # (cooper_jax/pack.py): the same log-probs up to float32 rounding, fewer padded positions in
  # the policy step and the reference pass. Needs merge_duplicate_rows, share_prompt and the
  # token_mean loss.
  c.policy.pack_rows = False
  # PPO: passes over each rollout batch and rows per update (0 = the whole batch). One epoch
  # of one mini-batch is the on-policy GRPO update; more reuse the rollouts, clipped against
  # the sampler's log-probs.
  c.policy.ppo_epochs = 1
  c.policy.ppo_mini_batch_size = 0
  # The policy objective (cooper_jax/objectives.py OBJECTIVES): "ppo_clip" (verl's PPO/GRPO
  # clip, the paper's), "gspo" (sequence-level ratio and clip; needs agg=seq_mean_token_mean,
  # the GSPO paper's mean over responses), "gspo_token" (GSPO-token: any agg, packed rows) or
  # "cispo" (REINFORCE x clipped stop-gradient ratio, MiniMax-M1). ppo_clip's hyperparameters
  # are the flat clip_eps, clip_eps_high (unset: clip_eps), dual_clip_c; every other's are
  # policy.loss.<name>.<key>, their defaults the papers' (GSPO 3e-4 / 4e-4; CISPO 1.0, i.e. no
  # lower bound, and 4.0, ScaleRL's bound of 5). agg and the KL term apply to every objective.
  c.policy.loss = dict(
    name="ppo_clip",
    kl_coef=0.001,
    kl_kind="low_var_kl",
    clip_eps=0.2,
    clip_eps_high=config_dict.placeholder(float),
    dual_clip_c=3.0,
    agg="token_mean",
    scale_adv_by_std=True,
    **{k: dict(o.defaults) for k, o in OBJECTIVES.items() if k != OBJECTIVE_FLAT},
    # The sampler-vs-trainer mismatch corrected (cooper_jax/sampler_is.py): "none" (measured
    # only), "token_tis" (each token's term times min(pi_trainer / pi_sampler, cap)) or
    # "seq_mask" (responses whose seq_ratio, "geometric" mean or "product" of the token
    # ratios, lies outside [1/cap, cap] leave the loss).
    sampler_is=dict(kind="none", cap=2.0, seq_ratio="geometric"),
  )

  # The reward model. `model` may be a trained RM directory (head already there) or a causal
  # LM, which then gets a fresh zero score head (stated in the run's log).
  c.rm = model_config(max_len=1024)
  c.rm.optim = optim_config(1e-5, warmup_steps=0)
  c.rm.micro_batch_size = 0  # rows (pairs for 'bt') per rm_step micro-batch; 0 = whole batch
  c.rm.score_micro_batch_size = 0  # rows per forward micro-batch of the RM reward; 0 = all
  # Equal (question, reference, response) rows of an RM reward call scored once (the same
  # rewards; rows padded to a multiple of 16, so fewer shapes compile). Needs
  # score_micro_batch_size 0.
  c.rm.merge_duplicate_rows = False
  # cooper: RM steps per policy step on the step's pairs (1 = the paper; more: beyond it).
  c.rm.updates_per_step = 1

  c.data = dict(
    train="gsm8k/train",
    eval="gsm8k/test",
    eval_limit=64,
    question_key="question",
    answer_key="answer",
    # data.eval's keys when they differ from the train set's ("" = question_key / answer_key).
    eval_question_key="",
    eval_answer_key="",
    on_bad_row="raise",
    prompt_suffix=INSTRUCTION_SUFFIX,
    # Optional held-out RM pairs (JSONL: question, answer, positive, negative):
    # RM pair accuracy is logged at every evaluation (the RM-stability curve).
    rm_eval_pairs="",
    # Optional probe (JSONL: question, answer, response) of wrong responses sharing a pattern
    # (a known or planted blind spot, cooper_jax/tasks/blind_spot.py): the RM's mean reward
    # on it and the share above 0.5 are logged at every evaluation.
    rm_probe="",
  )

  c.rollout = dict(
    prompts_per_step=4,
    group_size=16,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    max_prompt_len=512,
    max_new_tokens=512,
    prompt_pad_multiple=64,
    # Rows per sampler call (0 = all rollouts in one call): bounds the KV cache and the
    # prefill activations when prompts_per_step * group_size rows do not fit at once.
    sample_batch_size=0,
    # The trainer sees responses cut to the batch's longest, rounded up to this multiple
    # (0 = always max_new_tokens): fewer padded positions in every policy step, at most
    # max_new_tokens / multiple compiled widths (logged as policy/step_compiles).
    response_pad_multiple=32,
    # The decode in cache_segments parts, each attending over only the cache slots filled by
    # its end (sampling.sample): S=4 reads 5/8 of the new-token slots on average, not all.
    # grow_cache: the cache grows between segments (fastest on a CPU; holds two caches while
    # it grows) or, False, is allocated whole and read through static slices (TPU: XLA fuses
    # the slices into the attention, so no extra memory; experiments/paper.py).
    cache_segments=4,
    grow_cache=True,
    # The decode's weight copy: "sharded" as the params are (fsdp: at each decode step XLA
    # moves either the weights or the rows' activations between devices, its choice) or
    # "replicated" (gathered once per sampler call; each step needs no collective, costs the
    # whole copy in the compute dtype per device; sampling.sample, BUILD.md) or "mlp_split"
    # (the MLP's hidden columns split over every device, the rest as the params are; one
    # [rows, d] all-reduce per layer: sharding.MLPSplit).
    decode_weights="sharded",
    # A prompt's keys/values held once for its G rows and read once per decode step, instead
    # of copied to each row (sampling.sample shared_prompt): the same distribution, values equal
    # up to float32 rounding. Off by default so that recorded runs replay bit for bit.
    shared_prompt_decode=False,
    # Each decode step's token and log-prob from one pass over the [rows, vocab] logits
    # (sampling.draw_one_pass: one variadic reduction instead of four reductions and a gather):
    # the same tokens, log-probs equal up to float32 rounding. Saves HBM traffic on an
    # accelerator; a CPU runs variadic reductions slower. Off by default so recorded runs replay.
    one_pass_draw=False,
    # Each token drawn in two Gumbel-max draws, a block of 128 vocabulary entries by its mass,
    # then a token within it (sampling.draw_blocked): the same distribution from noise for
    # v / 128 + 128 entries a row instead of v, other tokens than the default draw's for a key.
    # On a CPU the whole vocabulary's noise is the costliest part of a large-vocabulary draw.
    # Not with one_pass_draw. Off by default so recorded runs replay.
    blocked_draw=False,
    # The sampler's compute dtype: "" = the policy's (policy.dtype); "bfloat16": the weights
    # cast once per sampler call, prefill, cache and decode in bf16 while the trainer keeps
    # its own dtype, so the sampler's log-probs differ from the trainer's (the mismatch
    # policy.loss.sampler_is corrects; sampling.sample).
    dtype="",
    # DAPO's dynamic sampling (cooper_jax/dynamic_sampling.py): groups whose reward is flat (no
    # gradient) are dropped and further batches of prompts_per_step prompts drawn until the
    # step holds prompts_per_step informative groups, at most max_batches batches (then flat
    # groups pad it at loss weight 0, counted). metric "reward": flat in the reward the policy
    # trains on (rule: the verdict; static_rm/cooper: the RM score, so min_std > 0 to drop
    # near-flat groups); "rule": flat in the rule verdict. Cooper's RM pairs come from the
    # kept groups. One process only. Off: one batch per step, as without it.
    dynamic_sampling=dict(enable=False, max_batches=4, metric="reward", min_std=0.0),
    # Off-policy rollouts (cooper_jax/rollouts.py): k > 0 samples step t + k's rollouts with
    # step t's parameters while step t verifies, scores and updates (1: one-step-off-policy);
    # the loss's ratio is then against the sampler's log-probs (policy.loss.sampler_is
    # corrects staleness and numerics together). 0: on-policy, each step samples its own.
    off_policy_steps=0,
    # DAPO's overlong handling (cooper_jax/overlong.py). penalty_buffer > 0 (L_cache, tokens):
    # the soft overlong punishment, 0 up to L_max - L_cache, linear to -penalty_factor at
    # L_max = penalty_max_len (0: max_new_tokens), added to the reward before advantages.
    # filter: responses cut at max_new_tokens get policy loss weight 0. Both off by default.
    overlong=dict(penalty_buffer=0, penalty_max_len=0, penalty_factor=1.0, filter=False),
  )

  # negatives: "perturb" / "llm_rewrite" (made from the positive, the paper's design) or
  # "on_policy" (beyond the paper: a rollout of the same group that the rule verifier rejected;
  # sound only where the rule verifier's recall is high, else it feeds right answers as wrong).
  c.pairs = dict(
    positive="first",
    # Which rollouts may be positives: "rule" (the rule verdict, the paper), "rule+chain"
    # (also every computation line right; arith rows, cooper_jax/tasks/arith.py) or
    # "rule+boxed" (also the answer stated in a non-empty \boxed{}).
    positive_check="rule",
    negatives="perturb",
    max_tries=3,
    accept_no_answer=False,
    assistant_model="smollm2-135m-instruct",
    assistant_temperature=0.7,
    assistant_max_new_tokens=512,
    assistant_dtype="float32",  # "bfloat16" on accelerators: params and compute
    assistant_decode_weights="sharded",  # the assistant sampler's layout, as rollout's
    # The assistant's prompt: "paper" (the paper's instruction, a chat model) or "plain" (the
    # question and the correct solution only; an assistant trained on that format).
    rewrite_format="paper",
  )

  c.verifier = dict(workers=0, deadline_s=5.0)  # workers 0: min(8, cpus // 2)

  c.mesh = dict(data=-1, fsdp=1, tensor=1)

  c.train = dict(
    steps=100,
    # Stop after this step (checkpoint saved) while the schedules still span train.steps: the
    # first N steps of the full run, the same floats; rerun without it in the same
    # workdir, the run resumes and goes on to train.steps. 0: every step.
    stop_after=0,
    eval_every=0,
    eval_samples=1,
    eval_temperature=0.0,
    eval_max_new_tokens=256,
    # KL(pi_t || pi_0) at each evaluation (cooper_jax/kl_monitor.py: eval/kl_init, the x-axis
    # of an overoptimization curve): eval_kl_samples samples of each of the first
    # eval_kl_prompts evaluation prompts at the rollout temperature. 0: off.
    eval_kl_prompts=0,
    eval_kl_samples=4,
    checkpoint_every=25,
    max_to_keep=3,
    # Save in a background thread (Orbax async): the next step starts while the arrays are
    # written; the manifest of a step is written once its save has finished.
    async_checkpoint=False,
    # The RM update of a step (its pairs, the llm_rewrite assistant, rm_step) run in a worker
    # thread while the next step's sampler runs, joined before that step verifies its rollouts
    # (train.Run.finish_rm_update): the same computations in the same order of dependence, so
    # the same numbers. A CPU's sampler leaves its second core idle. One process only (N
    # processes run their collectives in one order); off by default. time/rm_s is then the
    # update's own time, spent during the next step; time/step_s a step's wall time without it.
    overlap_rm_update=False,
    # Rollouts written to <workdir>/rollouts.jsonl per step (question, reference, response,
    # rule verdict, reward): the first N of the step's batch (the primary's rows); 0 = none.
    save_rollouts=8,
    # RM pairs written to <workdir>/pairs.jsonl per step (cooper): the first N prompts of the
    # primary's groups, each with its positive, the accepted negative or why none, and every
    # candidate negative with its reject reason; 0 = none.
    save_pairs=8,
    # A restart whose config differs from the run's record (<workdir>/starts/) is refused,
    # naming each key, unless this is True; keys that change no step's numbers may always
    # differ (cooper_jax/run_records.py MAY_DIFFER: stop_after, checkpoint and eval cadence,
    # what is saved, overlap_rm_update, verifier.workers, distributed).
    allow_config_change=False,
  )

  # The JAX distributed runtime (cooper_jax/distributed.py). "auto": joins when a coordinator
  # address is given or on a host of a multi-host TPU slice; "on": always (jax detects Cloud
  # TPU, SLURM, Open MPI); "off": one process. Unset address / count / id: detected by jax.
  c.distributed = dict(
    mode="auto",
    coordinator_address="",
    num_processes=0,
    process_id=-1,
    initialization_timeout_s=300,
    # A process that stops answering for this long fails the others (instead of a hang).
    heartbeat_timeout_s=100,
    shutdown_timeout_s=300,
  )
  return c


def load_config(spec: str, overrides=()) -> ml_collections.ConfigDict:
  """The config of `file.py[:arg]` (its `get_config(arg)`), with `key.path=value` overrides.

  What `--config file.py:arg --config.key=value` does for `cooper_jax.train`, for tools that
  build configs themselves. A value is a Python literal where it parses (True, 3, 1e-3), else
  a string; ConfigDict's type lock then rejects a mismatch or an unknown key, naming it."""
  path, _, arg = spec.partition(":")
  if not Path(path).is_file():
    raise FileNotFoundError(f"config file not found: {path}")
  mod_spec = importlib.util.spec_from_file_location(f"_config_{Path(path).stem}", path)
  module = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(module)
  c = module.get_config(arg) if arg else module.get_config()
  for kv in overrides:
    key, sep, value = kv.removeprefix("--config.").partition("=")
    if not sep:
      raise ValueError(f"config override {kv!r}: expected key.path=value")
    *parents, last = key.split(".")
    node = c
    for part in parents:
      if part not in node:
        raise KeyError(f"config override {kv!r}: no key {key!r} in the config")
      node = node[part]
    if last not in node:
      raise KeyError(f"config override {kv!r}: no key {key!r} in the config")
    try:
      parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      parsed = value
    node[last] = parsed
  return c


def _positive(c, *keys):
  for key in keys:
    node = c
    for part in key.split("."):
      node = node[part]
    if not isinstance(node, (int, float)) or node <= 0:
      raise ValueError(f"config.{key} must be positive, got {node!r}")


def _validate_sampler_is(cfg, key: str = "policy.loss.sampler_is") -> None:
  if cfg.kind not in SAMPLER_IS_KINDS:
    raise ValueError(f"config.{key}.kind={cfg.kind!r}: expected one of {SAMPLER_IS_KINDS}")
  cap = cfg.cap
  if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 1.0:
    raise ValueError(f"config.{key}.cap must be a number > 1, got {cap!r}")
  if cfg.seq_ratio not in SAMPLER_IS_SEQ_RATIOS:
    raise ValueError(
      f"config.{key}.seq_ratio={cfg.seq_ratio!r}: expected one of {SAMPLER_IS_SEQ_RATIOS}"
    )


def validate(c: ml_collections.ConfigDict, n_devices: int | None = None) -> None:
  """Raises ValueError naming the offending key."""
  registry.check("reward_mode", c.reward_mode)
  _positive(
    c,
    "rollout.prompts_per_step",
    "rollout.group_size",
    "rollout.max_prompt_len",
    "rollout.max_new_tokens",
    "rollout.prompt_pad_multiple",
    "rm.max_len",
    "policy.optim.lr",
    "rm.optim.lr",
    "train.steps",
    "verifier.deadline_s",
    "pairs.max_tries",
    "train.checkpoint_every",
    "train.max_to_keep",
    "rm.updates_per_step",
  )
  if not isinstance(c.rollout.response_pad_multiple, int) or c.rollout.response_pad_multiple < 0:
    raise ValueError(
      "config.rollout.response_pad_multiple must be an int >= 0, got "
      f"{c.rollout.response_pad_multiple!r}"
    )
  for section in ("policy", "rm"):
    if c[section].remat not in REMAT_CHOICES:
      raise ValueError(
        f"config.{section}.remat={c[section].remat!r}: expected one of {REMAT_CHOICES}"
      )
    chunk = c[section].attn_chunk_bytes
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
      raise ValueError(
        f"config.{section}.attn_chunk_bytes must be an int >= 0 (0 = attention in one "
        f"piece), got {chunk!r}"
      )
  if not isinstance(c.rollout.cache_segments, int) or c.rollout.cache_segments < 1:
    raise ValueError(
      f"config.rollout.cache_segments must be an int >= 1, got {c.rollout.cache_segments!r}"
    )
  for key in ("rollout.decode_weights", "pairs.assistant_decode_weights"):
    section, field = key.split(".")
    if c[section][field] not in DECODE_WEIGHTS:
      raise ValueError(f"config.{key}={c[section][field]!r}: expected one of {DECODE_WEIGHTS}")
  if not isinstance(c.train.overlap_rm_update, bool):
    raise ValueError(
      f"config.train.overlap_rm_update must be True or False, got {c.train.overlap_rm_update!r}"
    )
  if not isinstance(c.policy.share_prompt, bool):
    raise ValueError(
      f"config.policy.share_prompt must be True or False, got {c.policy.share_prompt!r}"
    )
  merged = [("policy", k) for k in ("micro_batch_size", "logprob_micro_batch_size")]
  merged += [("policy", "ppo_mini_batch_size"), ("rm", "score_micro_batch_size")]
  for section, key in merged:
    if not isinstance(c[section].merge_duplicate_rows, bool):
      raise ValueError(
        f"config.{section}.merge_duplicate_rows must be True or False, got "
        f"{c[section].merge_duplicate_rows!r}"
      )
    if c[section].merge_duplicate_rows and c[section][key]:
      raise ValueError(
        f"config.{section}.merge_duplicate_rows needs whole batches: config.{section}.{key}="
        f"{c[section][key]} must be 0 (or set config.{section}.merge_duplicate_rows=False)"
      )
  pack = c.policy.pack_rows
  if not isinstance(pack, bool):
    raise ValueError(f"config.policy.pack_rows must be True or False, got {pack!r}")
  if pack and c.policy.loss.get("name") == "gspo":
    raise ValueError(
      "config.policy.pack_rows cannot run config.policy.loss.name='gspo' (a mean over "
      "responses; packed rows take token means only): set name=gspo_token (the sequence ratio "
      "per packed segment) or pack_rows=False"
    )
  # The objective's name, hyperparameters and agg (objectives.OBJECTIVES).
  objective_hyperparameters(c.policy.loss)
  if pack and not (c.policy.merge_duplicate_rows and c.policy.share_prompt):
    raise ValueError(
      "config.policy.pack_rows needs config.policy.merge_duplicate_rows=True and "
      "config.policy.share_prompt=True (packed rows are a merged, prompt-indexed batch)"
    )
  if pack and c.policy.loss.agg.replace("-", "_") != "token_mean":
    raise ValueError(
      f"config.policy.pack_rows needs config.policy.loss.agg='token_mean' (got "
      f"{c.policy.loss.agg!r}): a packed batch has no per-response rows to average over"
    )
  for key in ("grow_cache", "shared_prompt_decode", "one_pass_draw", "blocked_draw"):
    if not isinstance(c.rollout[key], bool):
      raise ValueError(f"config.rollout.{key} must be True or False, got {c.rollout[key]!r}")
  if c.rollout.one_pass_draw and c.rollout.blocked_draw:
    raise ValueError(
      "config.rollout.one_pass_draw and config.rollout.blocked_draw are two different draws: "
      "set at most one"
    )
  from cooper_jax import (  # pylint: disable=import-outside-toplevel
    dynamic_sampling,
    kl_monitor,
    overlong,
    rollouts,
  )

  dynamic_sampling.validate(c)
  rollouts.validate(c)
  kl_monitor.validate(c)
  overlong.validate(c)
  stop = c.train.stop_after
  if not isinstance(stop, int) or isinstance(stop, bool) or not 0 <= stop <= c.train.steps:
    raise ValueError(
      f"config.train.stop_after must be an int in [0, train.steps={c.train.steps}] "
      f"(0: run every step), got {stop!r}"
    )
  if not isinstance(c.train.allow_config_change, bool):
    raise ValueError(
      f"config.train.allow_config_change must be True or False, got {c.train.allow_config_change!r}"
    )
  for key in ("save_rollouts", "save_pairs"):
    n = c.train[key]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
      raise ValueError(f"config.train.{key} must be an int >= 0, got {n!r}")
  if c.rollout.temperature < 0:
    raise ValueError(f"config.rollout.temperature must be >= 0, got {c.rollout.temperature}")
  if not 0 < c.rollout.top_p <= 1:
    raise ValueError(f"config.rollout.top_p must be in (0, 1], got {c.rollout.top_p}")
  if c.rollout.group_size < 2 and c.reward_mode != "rule":
    raise ValueError("config.rollout.group_size must be >= 2 for GRPO advantages")
  for name in ("policy", "rm"):
    if c[name].optim.schedule not in SCHEDULES:
      raise ValueError(
        f"config.{name}.optim.schedule={c[name].optim.schedule!r}: expected one of {SCHEDULES}"
      )
    # The optimizer's name, its hyperparameters' keys, types and ranges (optim.OPTIMIZERS).
    hyperparameters(c[name].optim, f"config.{name}.optim")
  if c.rollout.dtype not in SAMPLER_DTYPES:
    raise ValueError(f"config.rollout.dtype={c.rollout.dtype!r}: expected one of {SAMPLER_DTYPES}")
  _validate_sampler_is(c.policy.loss.sampler_is)
  if c.policy.loss.sampler_is.kind == "token_tis" and c.policy.loss.get("name") == "gspo":
    raise ValueError(
      "config.policy.loss.sampler_is.kind='token_tis' weights each token's advantage, which "
      "config.policy.loss.name='gspo' takes constant within a response: use gspo_token, or "
      "sampler_is.kind='seq_mask'"
    )
  if c.policy.loss.kl_coef < 0:
    raise ValueError("config.policy.loss.kl_coef must be >= 0")
  if c.policy.loss.kl_kind not in ("k1", "k2", "k3", "low_var_kl"):
    raise ValueError(f"config.policy.loss.kl_kind={c.policy.loss.kl_kind!r} unknown")
  for key in (
    "policy.micro_batch_size",
    "policy.logprob_micro_batch_size",
    "policy.logprob_chunk",
    "rm.micro_batch_size",
    "rm.score_micro_batch_size",
    "rollout.sample_batch_size",
  ):
    section, field = key.split(".")
    if c[section][field] < 0:
      raise ValueError(f"config.{key} must be >= 0 (0 = off), got {c[section][field]}")
  if c.pairs.assistant_dtype not in ("float32", "bfloat16", "float16"):
    raise ValueError(
      f"config.pairs.assistant_dtype={c.pairs.assistant_dtype!r}: expected "
      "float32, bfloat16 or float16"
    )
  if c.pairs.rewrite_format not in ("paper", "plain"):
    raise ValueError(
      f"config.pairs.rewrite_format={c.pairs.rewrite_format!r}: expected 'paper' or 'plain'"
    )
  if c.pairs.positive_check not in ("rule", "rule+chain", "rule+boxed"):
    raise ValueError(
      f"config.pairs.positive_check={c.pairs.positive_check!r}: expected 'rule', 'rule+chain' "
      "or 'rule+boxed'"
    )
  if c.pairs.positive not in ("first", "random"):
    raise ValueError(f"config.pairs.positive={c.pairs.positive!r}: expected 'first' or 'random'")
  registry.check("pairs.negatives", c.pairs.negatives)
  if c.data.on_bad_row not in ("raise", "skip"):
    raise ValueError(f"config.data.on_bad_row={c.data.on_bad_row!r}: expected 'raise' or 'skip'")
  for axis in ("data", "fsdp", "tensor"):
    size = c.mesh[axis]
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{axis} must be positive or -1, got {size}")
  if n_devices is not None:
    sizes = dict(c.mesh)
    fixed = 1
    for v in sizes.values():
      fixed *= v if v > 0 else 1
    if n_devices % fixed:
      raise ValueError(f"config.mesh {sizes} does not fit {n_devices} devices")
    batch_shards = 1
    for axis in ("data", "fsdp"):
      batch_shards *= sizes[axis] if sizes[axis] > 0 else n_devices // fixed
    rows = c.rollout.prompts_per_step * c.rollout.group_size
    if rows % batch_shards:
      raise ValueError(
        f"config.rollout: prompts_per_step*group_size={rows} is not divisible by "
        f"the mesh's data*fsdp={batch_shards}"
      )
    if c.reward_mode == "cooper" and c.rollout.prompts_per_step % batch_shards:
      raise ValueError(
        f"config.rollout.prompts_per_step={c.rollout.prompts_per_step} (RM pairs "
        f"per step) is not divisible by the mesh's data*fsdp={batch_shards}"
      )
    # Every array a jitted step or the sampler sees is split over data*fsdp.
    for key, size in (
      ("policy.ppo_mini_batch_size", c.policy.ppo_mini_batch_size),
      ("policy.micro_batch_size", c.policy.micro_batch_size),
      ("policy.logprob_micro_batch_size", c.policy.logprob_micro_batch_size),
      ("rm.micro_batch_size", c.rm.micro_batch_size),
      ("rm.score_micro_batch_size", c.rm.score_micro_batch_size),
      ("rollout.sample_batch_size", c.rollout.sample_batch_size),
    ):
      if size % batch_shards:
        raise ValueError(
          f"config.{key}={size} is not divisible by the mesh's data*fsdp={batch_shards}"
        )
    if c.rollout.sample_batch_size % c.rollout.group_size:
      raise ValueError(
        f"config.rollout.sample_batch_size={c.rollout.sample_batch_size} must hold whole "
        f"groups (a multiple of group_size={c.rollout.group_size})"
      )
    if c.rollout.sample_batch_size and rows % c.rollout.sample_batch_size:
      raise ValueError(
        f"config.rollout.sample_batch_size={c.rollout.sample_batch_size} must divide "
        f"prompts_per_step*group_size={rows}"
      )


def validate_processes(c: ml_collections.ConfigDict, n: int) -> None:
  """What an N-process run needs beyond config.validate (which knows the device count)."""
  if n == 1:
    return
  if c.rollout.dynamic_sampling.enable:
    raise ValueError(
      f"config.rollout.dynamic_sampling runs in one process (this run has {n}): the batch it "
      "chooses would move groups between processes"
    )
  if c.rollout.prompts_per_step % n:
    raise ValueError(
      f"config.rollout.prompts_per_step={c.rollout.prompts_per_step} must be divisible by the "
      f"{n} processes (each takes whole groups)"
    )
  if c.rollout.sample_batch_size and c.rollout.sample_batch_size % (n * c.rollout.group_size):
    raise ValueError(
      f"config.rollout.sample_batch_size={c.rollout.sample_batch_size} must be a multiple of "
      f"processes x group_size = {n * c.rollout.group_size}"
    )
