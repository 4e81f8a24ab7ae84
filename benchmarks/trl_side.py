"""The TRL peer: GRPO iterations of TRL's `GRPOTrainer` (PyTorch, HF `generate`), timed in a
throwaway venv (never a project dependency) next to rule-only iterations of our train loop.

Protocol and layout as tunix_side.py: `TrlPeer` here, `_Worker` under the TRL venv's python,
numpy and the stdlib at module level only. The worker loads one project file,
cooper_jax/rewards/verify.py, by path (stdlib + math-verify: no package, no jax), so both sides
score every completion with the very same `verify_one`.

Both sides run the same fp32 weights (our export, gated first), the prompts our train loop draws
at each step in its order (chat-templated text; TRL tokenizes it, checked equal to our ids),
P prompts x G samples at temperature 1.0 stopping on the same EOS ids, the rule reward, group-
normalised advantages, a token-mean GRPO loss with a k3 KL term to a frozen reference, grad clip
and AdamW at our lr, one update per batch. `grpo_config` maps our config onto GRPOConfig; what
it cannot map is NOT_MATCHED (in the report's notes).

Traps of TRL 1.16.0 / transformers 5.24 that make the peer run something else than ours, each
handled in `grpo_config` or the worker:
- GRPOConfig defaults to bf16=True (autocast, on a CPU too) and gradient_checkpointing=True,
  which transformers 5.24 renamed activation_checkpointing (the old name wins while the new one
  is unset): bf16=False (fp32 like ours), activation_checkpointing=False (ours recomputes only
  projections; TRL recomputes whole layers or nothing: nothing, its faster choice).
- lr_scheduler_type defaults to "linear" decay to 0 over max_steps (with 4 steps the lr changes
  every step), weight_decay to 0.0, beta (KL) to 0.0 (then there is no reference model at all),
  shuffle_dataset to True, num_generations to 8: all set from our config.
- TRL stops generation on the tokenizer's eos and model.generation_config.eos_token_id only; our
  sampler also stops on <|endoftext|> (tokenizer.eos_ids). The worker sets the model's
  generation_config.eos_token_id to our ids before building the trainer (TRL reads them there,
  and cuts completions after the first) and refuses to time if TRL ends up with other ids.
- TRL measures generation (profiling_context "transformers.generate") but reports it only to
  wandb / mlflow / trackio, and its `step_time` metric times `training_step`, which leaves out
  grad clipping and optimizer.step (the HF Trainer runs them after it; on the first step of a
  135M model that was half the step). The worker times a step from on_step_begin to on_step_end
  (a TrainerCallback) and generation by wrapping `generate` on its own model instance, and
  refuses a step without exactly one generate call.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

if __package__:  # imported by the project side
  from benchmarks.torch_side import WorkerClient, rule_reward_fn, serve
else:  # this file as the TRL venv's worker script: its sibling (stdlib and numpy only)
  from torch_side import WorkerClient, rule_reward_fn, serve  # type: ignore[no-redef]

DEFAULT_TRL_PYTHON = "/tmp/trl/bin/python"
CPUS = 2  # CPUs (and torch threads) of the worker; run.py pins our side to as many
# Our loss aggregation -> TRL loss_type of the same normalisation (one process, no accumulation):
# "dapo" divides by the batch's unmasked tokens, "grpo" averages per sequence.
LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo"}
NOT_MATCHED = (
  "TRL's k3 KL is not clamped (ours, low_var_kl: to [-10, 10])",
  "no dual clip (ours: dual_clip_c 3); with one on-policy update the ratio is 1 and no clip acts",
  "TRL runs each prompt once per sample (P x G rows); ours once per group (share_prompt) in the "
  "sampler's prefill, the reference pass and the policy step",
  "TRL pads prompts and responses to the longest; ours to multiples of "
  "rollout.prompt_pad_multiple / rollout.response_pad_multiple",
  "remat: ours recomputes projections in the backward; TRL nothing (its other choice recomputes "
  "whole layers)",
  "TRL's generation time is `generate` alone; ours (time/sample_s) also fetches and decodes",
  "rule reward: ours in a process pool with a 5 s deadline per item; TRL's in-process, none",
)


def grpo_config(c, steps: int) -> dict:
  """GRPOConfig keyword arguments for `steps` iterations of our run config `c`."""
  r, p, oc, loss = c.rollout, c.policy, c.policy.optim, c.policy.loss
  if loss.agg not in LOSS_TYPES:
    raise ValueError(f"policy.loss.agg={loss.agg!r} has no TRL loss_type")
  if oc.schedule not in ("constant", "linear_warmup"):
    raise ValueError(f"policy.optim.schedule={oc.schedule!r}: only constant / linear_warmup map")
  if oc.name != "adamw":
    raise ValueError(f"policy.optim.name={oc.name!r}: only adamw maps (TRL's adamw_torch)")
  if p.ppo_mini_batch_size not in (0, r.prompts_per_step * r.group_size):
    raise ValueError("policy.ppo_mini_batch_size: TRL's update here is one whole-batch step")
  warm = int(oc.warmup_steps) if oc.schedule == "linear_warmup" else 0
  return dict(
    per_device_train_batch_size=r.prompts_per_step * r.group_size,
    num_generations=r.group_size,
    gradient_accumulation_steps=1,
    num_iterations=int(p.ppo_epochs),
    max_completion_length=int(r.max_new_tokens),
    temperature=float(r.temperature),
    top_p=float(r.top_p),
    top_k=int(r.top_k),
    beta=float(loss.kl_coef),
    epsilon=float(loss.clip_eps),
    epsilon_high=None if loss.clip_eps_high is None else float(loss.clip_eps_high),
    loss_type=LOSS_TYPES[loss.agg],
    scale_rewards="group" if loss.scale_adv_by_std else "none",
    learning_rate=float(oc.lr),
    lr_scheduler_type="constant_with_warmup" if warm else "constant",
    warmup_steps=warm,
    weight_decay=float(oc.adamw.weight_decay),
    adam_beta1=float(oc.adamw.b1),
    adam_beta2=float(oc.adamw.b2),
    adam_epsilon=float(oc.adamw.eps),
    max_grad_norm=float(oc.grad_clip),
    optim="adamw_torch",
    bf16=False,
    fp16=False,
    activation_checkpointing=False,  # the new name; False here turns the old one off too
    use_vllm=False,
    shuffle_dataset=False,
    seed=int(c.seed),
    max_steps=int(steps),
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    use_cpu=True,
    dataloader_num_workers=0,
  )


# ------------------------------------------------------------------------ project side (client)
class TrlPeer(WorkerClient):
  """The TRL worker (this file under the TRL venv's python)."""

  name = "trl"

  def __init__(self, python: str = DEFAULT_TRL_PYTHON):
    env = dict(TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1", HF_HUB_OFFLINE="1")
    hint = (
      "create it with `python3.11 -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 "
      "trl==1.16.0 transformers==5.24.0 safetensors math-verify==0.9.0`"
    )
    super().__init__(python, __file__, env, hint)


def gate(cfg, params, tokens, mask, pad_id, peer: TrlPeer, hf_dir: str, greedy_tokens: int = 16):
  """The peer runs our model, or no timing: (ok, figures). Logits of every real position of the
  same left-padded ids within 1e-3 of `forward`'s, and `greedy_tokens` greedy tokens (no EOS)
  equal to `sample`'s, from the model as the TRL worker loads it."""
  from benchmarks.harness import gate_figures, our_gate_side  # pylint: disable=import-outside-toplevel

  out = peer.path("logits")
  npz = peer.save_arrays(tokens=tokens, mask=mask, pad_id=pad_id)
  theirs = peer.call("gate", hf_dir=hf_dir, npz=npz, out=out, new_tokens=greedy_tokens)
  ours_l, ours_g = our_gate_side(cfg, params, tokens, mask, greedy_tokens)
  with np.load(out) as z:
    peer_l = z["logits"]
  return gate_figures(ours_l, peer_l, mask, ours_g, theirs["tokens"], theirs["load_s"])


def _open(python: str):
  return TrlPeer(python)  # looked up at call time (tests replace it)


def _setting(info: dict, theirs: dict) -> str:
  del theirs
  return f"TRL on {info['threads']} torch threads (CPUs {info['cpus']})"


def _gate(peer, cfg, params, tokens, mask, pad_id, hf_dir):
  return gate(cfg, params, tokens, mask, pad_id, peer, hf_dir)


def trl_iteration_section(
  report, spec: str, overrides, warmup: int, runs: int, workroot, python, run_train=None
) -> None:
  """`warmup` + `runs` GRPO iterations of TRL's GRPOTrainer against as many rule-only
  iterations of our train loop (iteration.peer_iteration_section)."""
  from benchmarks.iteration import IterationPeer, peer_iteration_section  # pylint: disable=import-outside-toplevel

  trl = IterationPeer(
    key="trl_iteration",
    name="TRL",
    library="TRL GRPOTrainer",
    open=_open,
    versions=lambda info: f" (trl {info['trl']}, torch {info['torch']})",
    gate=_gate,
    make_config=grpo_config,
    setting=_setting,
    runs_as="one trainer.train",
    not_matched=NOT_MATCHED,
  )
  peer_iteration_section(report, trl, spec, overrides, warmup, runs, workroot, python, run_train)


# -------------------------------------------------------------------------- TRL venv (worker)
class _Worker:
  def __init__(self):
    import torch  # pylint: disable=import-outside-toplevel

    self.torch = torch

  def hello(self):
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel

    return {
      "trl": version("trl"),
      "torch": self.torch.__version__,
      "transformers": version("transformers"),
      "math_verify": version("math-verify"),
      "threads": self.torch.get_num_threads(),
      "cpus": sorted(os.sched_getaffinity(0)),
    }

  def _model(self, hf_dir: str):
    """As TRL's create_model_from_path loads it (float32)."""
    from transformers import AutoModelForCausalLM  # pylint: disable=import-outside-toplevel

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=self.torch.float32)

  def gate(self, hf_dir, npz, out, new_tokens):
    """Logits [b, t, v] of the ids as our side lays them out (left padding, positions counted
    from the first real token, as `generate` counts them) and greedy tokens with no EOS."""
    t = self.torch
    t0 = time.perf_counter()
    model = self._model(hf_dir).eval()
    load_s = time.perf_counter() - t0
    z = np.load(npz)
    ids = t.from_numpy(z["tokens"].astype(np.int64))
    mask = t.from_numpy(z["mask"].astype(np.int64))
    with t.inference_mode():
      pos = (mask.cumsum(-1) - 1).clamp(min=0)
      logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
      np.savez(out, logits=logits.float().numpy())
      model.generation_config.eos_token_id = None  # no stop token, as our eos_ids=()
      gen = model.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        pad_token_id=int(z["pad_id"]),
      )
    return {"load_s": load_s, "tokens": gen[:, ids.shape[1] :].tolist()}

  def iteration(self, hf_dir, prompts, config, eos_ids, verify_py):
    """config["max_steps"] iterations of GRPOTrainer on `prompts` (in order, P per step); per
    step: seconds from on_step_begin to on_step_end, seconds inside `generate`, and the metrics
    the trainer logs."""
    from datasets import Dataset  # pylint: disable=import-outside-toplevel
    from transformers import PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel
    from trl import GRPOConfig, GRPOTrainer  # pylint: disable=import-outside-toplevel

    with open(prompts, encoding="utf-8") as f:
      rows = json.load(f)
    tok = PreTrainedTokenizerFast.from_pretrained(hf_dir, clean_up_tokenization_spaces=False)
    theirs = tok(text=[r["prompt"] for r in rows])["input_ids"]  # as TRL tokenizes text prompts
    bad = [i for i, (a, r) in enumerate(zip(theirs, rows)) if list(a) != r["ids"]]
    if bad:
      raise RuntimeError(f"TRL's tokenizer gives other ids than ours for prompts {bad[:5]}")

    rule_reward, status = rule_reward_fn(verify_py)

    model = self._model(hf_dir)
    model.generation_config.eos_token_id = list(eos_ids)  # TRL reads its stop ids from here
    timer = _phase_timer(model, time.perf_counter)
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    with tempfile.TemporaryDirectory(prefix="trl_out_") as out_dir:
      t0 = time.perf_counter()
      trainer = GRPOTrainer(
        model=model,
        reward_funcs=rule_reward,
        args=GRPOConfig(output_dir=out_dir, **config),
        train_dataset=data,
        processing_class=tok,
        callbacks=[timer],
      )
      init_s = time.perf_counter() - t0
      a = trainer.args
      keys = ("beta", "loss_type", "lr_scheduler_type", "bf16", "activation_checkpointing")
      resolved = {
        "eos_token_ids": list(trainer.eos_token_ids),
        "generation_batch_size": a.generation_batch_size,
        "steps_per_generation": a.steps_per_generation,
        "ref_model": trainer.ref_model is not None,
        "dtype": str(next(model.parameters()).dtype),
        "threads": self.torch.get_num_threads(),
        "device": str(a.device),
        **{k: getattr(a, k) for k in keys},
      }
      if sorted(resolved["eos_token_ids"]) != sorted(eos_ids):
        raise RuntimeError(f"TRL stops on {resolved['eos_token_ids']}, we on {eos_ids}")
      trainer.train()
    return {
      "steps": [dict(s, len=s.get("completions/mean_length")) for s in timer.steps],
      "resolved": json.loads(json.dumps(resolved, default=str)),
      "reward_status": status,
      "init_s": init_s,
    }


def _phase_timer(model, clock):
  """A TrainerCallback timing each optimizer step and the `generate` calls inside it (wrapped on
  this model instance, which TRL's unwrap_model_for_generation hands back on one process);
  `steps` gets one dict per step, with the metrics the trainer logs for it."""
  from transformers import TrainerCallback  # pylint: disable=import-outside-toplevel

  class PhaseTimer(TrainerCallback):
    def __init__(self):
      self.steps: list[dict] = []
      self.gen: list[float] = []
      self.t0 = 0.0

    def on_step_begin(self, args, state, control, **kw):
      self.gen, self.t0 = [], clock()

    def on_step_end(self, args, state, control, **kw):
      s = {"step": state.global_step, "step_s": clock() - self.t0}
      self.steps.append(dict(s, generate_s=sum(self.gen), generate_calls=len(self.gen)))

    def on_log(self, args, state, control, logs=None, **kw):
      keep = ("completions/", "reward", "kl", "loss", "learning_rate", "grad_norm", "step_time")
      if self.steps and logs:
        self.steps[-1].update({k: v for k, v in logs.items() if k.startswith(keep)})

  timer = PhaseTimer()
  generate = model.generate

  def timed_generate(*args, **kwargs):
    t0 = clock()
    try:
      return generate(*args, **kwargs)
    finally:
      timer.gen.append(clock() - t0)

  model.generate = timed_generate
  return timer


def _serve() -> None:
  import torch  # pylint: disable=import-outside-toplevel

  cpus = sorted(os.sched_getaffinity(0))[:CPUS]
  os.sched_setaffinity(0, cpus)  # as tunix_side.limit_cpus; then as many torch threads
  torch.set_num_threads(len(cpus))
  serve(_Worker)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
  _serve()
