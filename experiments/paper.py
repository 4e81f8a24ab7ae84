"""The paper's setups (Cooper, arXiv 2508.05613, Table 3): Qwen2.5-1.5B-Instruct or
Llama-3.2-1B-Instruct policy, VerifyRM on Qwen2.5-Math-1.5B-Instruct, G=16, temperature 1.0,
512/512 prompt/response tokens, policy AdamW lr 1e-6 (20 warm-up steps), RM lr 1e-5, k3 KL 0.001.

  python -m cooper_jax.train --config experiments/paper.py:qwen,cooper --workdir runs/qwen_cooper \
      --config.policy.model=/ckpts/Qwen2.5-1.5B-Instruct --config.rm.model=/ckpts/VerifyRM

arg = "<policy>,<mode>": policy in {qwen, llama}; mode in {rule, static_rm, cooper}. Model
fields are Hugging Face directories (or hub ids where a hub is reachable); the RM directory is
a trained reference-based RM (Qwen2ForSequenceClassification, num_labels=1).
"""

from cooper_jax.config import base_config

POLICIES = {"qwen": "Qwen/Qwen2.5-1.5B-Instruct", "llama": "meta-llama/Llama-3.2-1B-Instruct"}
VERIFY_RM = "Qwen/Qwen2.5-Math-1.5B-Instruct"  # backbone; point rm.model at the trained VerifyRM
ASSISTANT = "Qwen/Qwen2.5-7B-Instruct"


def get_config(arg: str = "qwen,cooper"):
  policy, mode = (arg or "qwen,cooper").split(",")
  if policy not in POLICIES:
    raise ValueError(f"unknown policy {policy!r}: {sorted(POLICIES)}")
  c = base_config()
  c.reward_mode = mode
  c.policy.model = POLICIES[policy]
  c.policy.dtype = "bfloat16"
  c.policy.remat = True
  c.rm.model = VERIFY_RM
  c.rm.dtype = "bfloat16"
  c.rm.remat = True
  c.pairs.negatives = "llm_rewrite"
  c.pairs.assistant_model = ASSISTANT
  c.data.train = "gsm8k/train"
  c.data.eval = "math500/test"
  c.data.eval_limit = 500
  c.rollout.prompts_per_step = 64  # x G=16 = 1024 rollouts per step
  c.rollout.group_size = 16
  c.rollout.max_prompt_len = 512
  c.rollout.max_new_tokens = 512
  c.train.steps = 200
  c.train.eval_every = 10
  c.train.eval_samples = 8
  c.train.eval_temperature = 0.7
  c.train.eval_max_new_tokens = 512
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  return c
