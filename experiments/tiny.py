"""Tiny runs on CPU for checking the loop, logging, checkpoints and resume (plumbing, not
learning). arg: "[mode=]<reward_mode>[,models=random|small_task]", named or positional.

  python -m cooper_jax.train --config experiments/tiny.py --workdir runs/tiny
  python -m cooper_jax.train --config experiments/tiny.py:cooper,models=small_task \\
      --workdir runs/tiny_rm --config.rm.optim.name=lion

models=random (default): random 2-layer models over the SmolLM2 tokenizer, GSM8K prompts, 4
steps. Their rollouts are never correct, so Cooper builds no pair and its RM never takes a step.

models=small_task: the small task's shipped SFT policy (0.23M parameters, about half its
samples correct) and RM (experiments/assets/small_task), its arithmetic prompts. Some rollout
of the step is correct, so Cooper's RM takes a step on (correct rollout, perturbed answer)
pairs from the first step on: RM-side settings (rm.optim.*, pairs.*) show in rm_train/* within
4 steps. The RM's lr warms up over 2 steps and decays linearly to 0 over the 4
(warmup_linear_decay), so `rm_train/lr` moves every step.

Wall time on the 2-core VM (2026-12-07, while other jobs kept its load average at 7-8): 33 s with
XLA's persistent cache warm (cooper_jax.host_platform; a rerun), 76-101 s compiling from cold,
most of it the first step's compiles; the random models' run: 87 s.
"""

from pathlib import Path

from cooper_jax.config import base_config
from experiments import parse_arg

SMALL_TASK = Path(__file__).resolve().parent / "assets" / "small_task"
MODELS = ("random", "small_task")


def get_config(arg: str = ""):
  a = parse_arg(arg, ("mode", "models"))
  models = a.get("models", "random")
  if models not in MODELS:
    raise ValueError(f"tiny models={models!r}: expected one of {MODELS}")
  c = base_config()
  c.reward_mode = a.get("mode", "cooper")
  c.rollout.prompts_per_step = 2
  c.rollout.group_size = 4
  c.policy.optim.lr = 1e-3
  c.policy.optim.warmup_steps = 0
  c.rm.optim.lr = 1e-3
  c.train.steps = 4
  c.train.checkpoint_every = 2
  c.verifier.workers = 1
  if models == "random":
    for m in (c.policy, c.rm):
      m.model = "random"
      m.tokenizer = "smollm2-135m-instruct"
    c.rollout.max_prompt_len = 256
    c.rollout.max_new_tokens = 16
    c.rm.max_len = 512
    return c
  c.policy.model = f"{SMALL_TASK}/policy"
  c.rm.model = f"{SMALL_TASK}/rm"
  c.data.train = f"{SMALL_TASK}/data/train.jsonl"
  c.data.eval = f"{SMALL_TASK}/data/test.jsonl"
  # The task's prompts are 30-73 tokens and its solutions ~30: one prompt width, one response
  # width, so each jitted function compiles once.
  c.rollout.max_prompt_len = 128
  c.rollout.prompt_pad_multiple = 128
  c.rollout.max_new_tokens = 64
  c.rollout.response_pad_multiple = 64
  c.rm.max_len = 384
  c.policy.optim.lr = 1e-4
  c.rm.optim.schedule = "warmup_linear_decay"
  c.rm.optim.warmup_steps = 2
  return c
