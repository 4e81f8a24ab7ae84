"""SmolLM2-135M-Instruct (the embedded default) on GSM8K: rule / static_rm / cooper.

  python -m cooper_jax.train --config experiments/smollm2.py:cooper --workdir runs/smollm2_cooper
  python -m cooper_jax.train --config experiments/smollm2.py:cpu_smoke --workdir runs/smoke

Until a trained reference-based RM exists for this tokenizer, the RM starts from the policy's
backbone with a fresh (zero) score head: in static_rm mode that RM gives 0.5 to everything, so
the static_rm row here is only meaningful with --config.rm.model=<a trained RM directory>
(cooper_jax/cli/pretrain_rm.py makes one).
Variants: rule | static_rm | cooper (paper settings, meant for a GPU) and cpu_smoke (a few
minutes on a 2-core CPU: 2 prompts x 4 rollouts, 64 new tokens, perturb negatives).
"""

from cooper_jax.config import base_config


def get_config(arg: str = "cooper"):
  c = base_config()
  variant = arg or "cooper"
  # A token in two Gumbel-max draws (a block of the 49k vocabulary, then a token in it): the
  # same distribution from a fraction of the noise (sampling.draw_blocked; BUILD.md).
  c.rollout.blocked_draw = True
  if variant in ("rule", "static_rm", "cooper"):
    c.reward_mode = variant
    c.rollout.prompts_per_step = 32  # x G=16 = 512 rollouts per step
    c.train.steps = 200
    c.train.eval_every = 20
    c.data.eval_limit = 256
  elif variant == "cpu_smoke":
    c.reward_mode = "cooper"
    c.rollout.prompts_per_step = 2
    c.rollout.group_size = 4
    c.rollout.max_new_tokens = 64
    c.rollout.max_prompt_len = 256
    c.rm.max_len = 512
    c.policy.optim.warmup_steps = 0
    c.train.steps = 3
    c.train.checkpoint_every = 3
  else:
    raise ValueError(f"unknown variant {variant!r}: rule | static_rm | cooper | cpu_smoke")
  return c
