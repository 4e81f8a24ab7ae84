"""A tiny random model end to end on CPU in well under a minute (plumbing, not learning).

  python -m cooper_jax.train --config experiments/tiny.py --workdir runs/tiny

The policy and RM are random 2-layer models over the SmolLM2 tokenizer; rewards are ~0 so
pairs are rare; use it to check the loop, logging, checkpoints and resume.
"""

from cooper_jax.config import base_config


def get_config(arg: str = "cooper"):
  c = base_config()
  c.reward_mode = arg or "cooper"
  for m in (c.policy, c.rm):
    m.model = "random"
    m.tokenizer = "smollm2-135m-instruct"
  c.rollout.prompts_per_step = 2
  c.rollout.group_size = 4
  c.rollout.max_prompt_len = 256
  c.rollout.max_new_tokens = 16
  c.rm.max_len = 512
  c.policy.optim.lr = 1e-3
  c.policy.optim.warmup_steps = 0
  c.rm.optim.lr = 1e-3
  c.train.steps = 4
  c.train.checkpoint_every = 2
  c.verifier.workers = 1
  return c
