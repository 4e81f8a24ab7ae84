"""The paper's setups (Cooper, arXiv 2508.05613, Table 3): Qwen2.5-1.5B-Instruct or
Llama-3.2-1B-Instruct policy, VerifyRM on Qwen2.5-Math-1.5B-Instruct, G=16, temperature 1.0,
512/512 prompt/response tokens, policy AdamW lr 1e-6 (20 warm-up steps), RM lr 1e-5, k3 KL 0.001.

  python -m cooper_jax.train --config experiments/paper.py:qwen,cooper --workdir runs/qwen_cooper \
      --config.policy.model=/ckpts/Qwen2.5-1.5B-Instruct --config.rm.model=/ckpts/VerifyRM \
      --config.pairs.assistant_model=/ckpts/Qwen2.5-7B-Instruct

arg = "<policy>,<mode>": policy in {qwen, llama}; mode in {rule, static_rm, cooper}. The three
model fields (policy.model, rm.model, pairs.assistant_model) are Hugging Face directories, or
hub ids where a hub is reachable; on a TPU slice give each host local copies (BUILD.md's recipe;
tests/test_docs.py fails if a model field here is left without an override in its launch line).
The RM directory is a trained reference-based RM (Qwen2ForSequenceClassification, num_labels=1),
made by the pipeline's annotation and RM stages (cooper_jax/cli/pipeline.py).
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
  c.policy.remat = "full"
  c.rm.model = VERIFY_RM
  c.rm.dtype = "bfloat16"
  c.rm.remat = "full"
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
  # Sizes that fit the 8-device slices with ~16 GiB HBM per device (v5e-8: 15.75 GiB usable
  # per chip; v4-8: 15.25 per TensorCore, 2 per chip), compiled ahead of time with
  # cooper-aot (docs/tpu.md). What stays resident is ~6.8 GiB
  # per device for qwen,cooper (policy fp32 params + AdamW moments 2.16, reference 0.72, RM
  # state 2.16, bf16 assistant 1.77), so a function gets ~9 GiB. All sizes are global rows,
  # multiples of the 8 data x fsdp devices that divide the batch, so the next size up is 2x:
  # - policy.micro_batch_size 32 (4 rows per device): policy_step 13.4 GiB resident; 64 needs
  #   16.6.
  # - policy.logprob_micro_batch_size 128 for the forward-only reference pass (12.5 GiB
  #   resident; 256 needs 17.8): its 8 strided micro-batches hold 2 rows of each group of 16,
  #   which share one prompt forward (policy.share_prompt), so the pass does ~3/4 of the
  #   unshared FLOPs (v5e-8 roofline 1.54 s against 2.02 with the step's 32-row micro-batches,
  #   where no row shares).
  # - policy.logprob_chunk 128 response positions: LM-head logits [rows, 128, vocab] f32 per
  #   chunk instead of [rows, 512, vocab] (151936 vocab: 0.6 GiB instead of 2.3 per 8 rows).
  # - rm.micro_batch_size 16 pairs in rm_step (16 pairs = 32 rows: 13.1 GiB resident; 32 pairs
  #   need 16.3).
  # - rm.score_micro_batch_size 128 rows per forward of the reward pass (1024/128 = 8 passes:
  #   11.6 GiB resident; 256 needs 16.2).
  # - rollout.sample_batch_size 0: all 1024 rollouts in one sampler call, 13.1 GiB resident
  #   (each prompt is prefilled once for its 16 samples, so the KV cache dominates). With more
  #   prompts per step, cap it at 1024 rows per call (512 rows: 10.3 GiB).
  # (v5e-8 figures; v4-8's are within 0.5 GiB of them; v5p-8 has 95.7 GiB per chip.)
  # More passes cost time only through weight reads (each pass re-gathers the weights; FLOPs
  # are the same): policy_step/ref/reward stay near their one-shot roofline (docs/tpu.md); every
  # extra sampler call would re-read them at each of its 512 decode steps (4 calls of 256
  # rows: 18.6 s roofline on v5e-8 against 7.0 s for one call).
  c.policy.micro_batch_size = 32
  c.policy.logprob_micro_batch_size = 128
  c.policy.logprob_chunk = 128
  c.rm.micro_batch_size = 16
  c.rm.score_micro_batch_size = 128
  c.rollout.sample_batch_size = 0
  # The decode in 4 segments, each reading only the cache slots filled by its end (9% fewer
  # bytes per step on v5e-8), with the cache allocated whole and read through slices:
  # growing it between segments holds two caches at once. +0.2 GiB over 1 segment (v4-8).
  c.rollout.cache_segments = 4
  c.rollout.grow_cache = False
  # The decode's bf16 weight copy replicated on every chip, gathered once per sampler call:
  # each decode step then runs on its own rows with no collective and reads 8.80 GB per chip
  # (11.69 with the copy fsdp-sharded, which also all-reduces [1024, 8960] MLP activations per
  # layer over ICI), both with v5e's VMEM prefetching off so every byte is an HBM byte (docs/tpu.md).
  # Sampler 14.47 GiB resident on v5e-8 (13.01 sharded).
  c.rollout.decode_weights = "replicated"
  # Each prompt's keys/values held once for its 16 rows and read once per decode step
  # (transformer.attend_shared_prompt): the prompts' part of the cache 1/16, the decode step's
  # XLA bytes per chip 7.95 -> 6.03 GB averaged over the decode on v5e:2x4 (docs/tpu.md).
  c.rollout.shared_prompt_decode = True
  # Each step's token and log-prob from one pass over the [128, 151936] float32 logits per chip
  # (sampling.draw_one_pass) instead of four passes and a gather: the decode step's XLA bytes
  # per chip 6.87 -> 6.63 GB at the whole cache on v5e:2x4 (docs/tpu.md).
  c.rollout.one_pass_draw = True
  c.pairs.assistant_dtype = "bfloat16"  # 7B: 1.8 GiB per chip sharded, 3.5 in float32
  # The assistant's MLP split by its hidden columns over every chip for its decode, the rest as
  # its params are (sharding.MLPSplit): each step all-reduces one [64, 3584] per layer instead
  # of the [64, 18944] partial sums of gate and up, so its bytes fall with the slice. Per chip
  # per step, prefetching off: 3.46 -> 3.07 GB on v5e:2x4 (1.32x -> 1.18x the floor), 2.07 ->
  # 1.69 GB on v5e:4x4 (1.59x -> 1.29x) (docs/tpu.md).
  c.pairs.assistant_decode_weights = "mlp_split"
  return c
