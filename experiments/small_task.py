"""The small verifiable arithmetic task (cooper_jax/tasks/arith.py) for fast research on CPU.

Its artifacts ship in experiments/assets/small_task (how they were made: its README.md):
  policy/   SFT policy (tools/assets/sft_small_policy.py), an HF dir with its tokenizer (0.23M params)
  rm/       reference-based RM (cooper_jax/cli/pretrain_rm.py) trained on that policy's rollouts
  data/     train / test splits and held-out RM pairs (JSONL)

  python -m cooper_jax.train --config experiments/small_task.py:cooper --workdir runs/st_cooper

arg: "[cond=]<condition>[,[work=]<dir>][,policy=small|wide]", named or positional (the
positional "<condition>,<workdir>" of recorded commands reads as before). work: the artifacts
rebuilt elsewhere (cooper_jax/cli/study.py --workdir), default the shipped ones. policy=wide:
the Evidence III testbed, what experiments/small_task_wide.py gives (see its docstring): the
0.86M policy_wide/, lr 2e-4, a cosine schedule for both models, 300 steps, evaluation every 20:
  python -m cooper_jax.train --config experiments/small_task.py:cond=cooper_weak_rewrite,policy=wide \\
      --workdir runs/wide_cooper

Conditions:
  rule, static_rm, cooper       the paper's three (cooper: perturb negatives, RM lr 10x the policy's)
  rule_chain                    control: the rule reward only where every line is also right
  cooper_rewrite                cooper with the paper's llm_rewrite negatives (the shipped assistant)
  cooper_rewrite_rmlr1x         ... with the RM's lr at 1x the policy's
  cooper_rmlr{1,3,30}x          the RM's lr at 1x / 3x / 30x the policy's
  cooper_rmlr0p{1,3}x           ... and at 0.1x / 0.3x (below the ratio, toward a frozen RM)
  static_rm_planted,            the co-training positive control: an RM with a planted blind spot
  cooper_planted                (even answers scored correct), frozen or co-trained
  cooper_planted_rewrite        ... co-trained with llm_rewrite negatives (the paper's Cooper)
  static_rm_weak, cooper_weak   a weak natural RM (rm_weak/: stopped early, no planted flaw),
                                frozen or co-trained: hacking without a hand-made exploit
  cooper_weak_rewrite,          ... co-trained with llm_rewrite / on-policy negatives (RM lr 10x);
  cooper_weak_onpolicy          cooper_weak_rewrite_rmlr{1,3,30}x, cooper_weak_onpolicy_rmlr1x:
                                the RM's lr at that multiple of the policy's
  static_rm_competent,          a competent RM built the paper's way for the wide testbed
  cooper_competent_rewrite      (rm_competent/: policy_wide's backbone, BCE on hybrid-labelled
                                rollouts of it), frozen or co-trained as the paper's Cooper
                                (llm_rewrite negatives, RM lr 10x, one RM step per policy step)
  cooper_competent_onpolicy     ... co-trained with the group's rule-rejected rollouts as negatives
  cooper_competent_rewrite_rmlr{0p1,1}x   ... the paper's Cooper with the RM's lr at 0.1x / 1x
  cooper_competent_onpolicy_rmlr1x        ... on-policy negatives, the RM's lr at 1x
  cooper_competent_rewrite_rmlr1x_boxedpos  ... rewrite, RM lr 1x, positives must box their answer
  cooper_onpolicy               beyond the paper: the group's rule-rejected rollouts as negatives
                                (the rule verifier's recall on this task: 100% of 105 correct
                                rollouts, results/verifier_comparison)
  cooper_onpolicy_chainpos      ... with positives whose every line is right (rule + chain check)
  cooper_k4                     beyond the paper: 4 RM steps per policy step on the step's pairs
  static_rm_nostd               control: static_rm with advantages not divided by the group std
                                (separates drift on std-amplified noise from hacking)

The RM's lr is a multiple of the policy's (an ml_collections reference), so a policy-lr override
moves it too: `--config.policy.optim.lr=6e-4` (cooper-study: `--set policy.optim.lr=6e-4`) gives
cooper 6e-3 and cooper_rmlr3x 1.8e-3. Setting rm.optim.lr explicitly replaces the multiple.
"""

from pathlib import Path

from cooper_jax.config import base_config
from experiments import parse_arg

SHIPPED = Path(__file__).resolve().parent / "assets" / "small_task"

# Values may name the artifacts directory as {work}.
PLANTED = {"rm.model": "{work}/rm_planted"}
WEAK = {"rm.model": "{work}/rm_weak"}
COMPETENT = {"rm.model": "{work}/rm_competent"}
# The paper's negative generator: the small task's assistant (tools/assets/train_small_rewriter.py)
# rewrites the positive, sampled by the same compiled sampler, accepted when math-verify says
# its answer differs, up to pairs.max_tries tries.
REWRITE = {
  "pairs.negatives": "llm_rewrite",
  "pairs.assistant_model": "{work}/rewriter",
  "pairs.rewrite_format": "plain",
  "pairs.assistant_max_new_tokens": 96,
}
RM_LR_RATIO = "rm_lr_ratio"  # the RM's lr as a multiple of the policy's (default 10)
CONDITIONS = {
  "rule": ("rule", {}),
  "rule_chain": ("rule_chain", {}),
  "static_rm": ("static_rm", {}),
  "cooper": ("cooper", {}),
  "cooper_onpolicy": ("cooper", {"pairs.negatives": "on_policy"}),
  "cooper_k4": ("cooper", {"rm.updates_per_step": 4}),
  "static_rm_nostd": ("static_rm", {"policy.loss.scale_adv_by_std": False}),
  "cooper_rewrite": ("cooper", REWRITE),
  # The paper's negatives with the RM at 1x the policy's lr, where the RM alone stays stable
  # (results/rm_lr_check, in git history: docs/evidence.md): the 10x runs collapse in the RM's own optimiser.
  "cooper_rewrite_rmlr1x": ("cooper", {**REWRITE, RM_LR_RATIO: 1}),
  # Precise positives: a rule-correct rollout is a positive only if its whole chain is right
  # (what the rule verifier's imprecision costs Cooper).
  "cooper_chainpos": ("cooper", {"pairs.positive_check": "rule+chain"}),
  # ... with on-policy negatives: a rule-correct rollout with a wrong line is neither side.
  "cooper_onpolicy_chainpos": (
    "cooper",
    {"pairs.negatives": "on_policy", "pairs.positive_check": "rule+chain"},
  ),
  # RM-lr dose-response: the RM's lr as 0.1x, 0.3x, 1x, 3x, 30x the policy's (cooper is 10x).
  "cooper_rmlr0p1x": ("cooper", {RM_LR_RATIO: 0.1}),
  "cooper_rmlr0p3x": ("cooper", {RM_LR_RATIO: 0.3}),
  "cooper_rmlr1x": ("cooper", {RM_LR_RATIO: 1}),
  "cooper_rmlr3x": ("cooper", {RM_LR_RATIO: 3}),
  "cooper_rmlr30x": ("cooper", {RM_LR_RATIO: 30}),
  # The co-training positive control (cooper_jax/tasks/blind_spot.py): the RM with a planted
  # blind spot (an even final answer scored correct whatever the reference), frozen or co-trained.
  "static_rm_planted": ("static_rm", PLANTED),
  "cooper_planted": ("cooper", PLANTED),
  "cooper_planted_rmlr30x": ("cooper", {**PLANTED, RM_LR_RATIO: 30}),
  # ... co-trained as the paper runs it: llm_rewrite negatives, RM lr 10x.
  "cooper_planted_rewrite": ("cooper", {**PLANTED, **REWRITE}),
  # A weak natural RM (no planted flaw): 300 BCE steps on the current policy's labelled
  # rollouts, stopped before it learns the answer comparison well (held-out rollouts: accuracy
  # 0.596, precision 0.566, recall 0.452); frozen, or co-trained as Cooper's.
  "static_rm_weak": ("static_rm", WEAK),
  "cooper_weak": ("cooper", WEAK),
  # ... co-trained as the paper runs it (llm_rewrite negatives, RM lr 10x), or on its own
  # group's rule-rejected rollouts; their frozen twin is static_rm_weak.
  "cooper_weak_rewrite": ("cooper", {**WEAK, **REWRITE}),
  "cooper_weak_onpolicy": ("cooper", {**WEAK, "pairs.negatives": "on_policy"}),
  "cooper_weak_rewrite_rmlr1x": ("cooper", {**WEAK, **REWRITE, RM_LR_RATIO: 1}),
  "cooper_weak_rewrite_rmlr3x": ("cooper", {**WEAK, **REWRITE, RM_LR_RATIO: 3}),
  "cooper_weak_rewrite_rmlr30x": ("cooper", {**WEAK, **REWRITE, RM_LR_RATIO: 30}),
  "cooper_weak_onpolicy_rmlr1x": (
    "cooper",
    {**WEAK, "pairs.negatives": "on_policy", RM_LR_RATIO: 1},
  ),
  # A competent RM built the paper's way for the wide testbed (policy=wide): policy_wide/'s
  # backbone + score head, BCE on rollouts of policy_wide/ kept where the rule verifier and the
  # chain check agree (assets README: rm_competent/); frozen, or co-trained as the paper's Cooper.
  "static_rm_competent": ("static_rm", COMPETENT),
  "cooper_competent_rewrite": ("cooper", {**COMPETENT, **REWRITE}),
  "cooper_competent_onpolicy": ("cooper", {**COMPETENT, "pairs.negatives": "on_policy"}),
  "cooper_competent_rewrite_rmlr1x": ("cooper", {**COMPETENT, **REWRITE, RM_LR_RATIO: 1}),
  "cooper_competent_rewrite_rmlr0p1x": ("cooper", {**COMPETENT, **REWRITE, RM_LR_RATIO: 0.1}),
  "cooper_competent_onpolicy_rmlr1x": (
    "cooper",
    {**COMPETENT, "pairs.negatives": "on_policy", RM_LR_RATIO: 1},
  ),
  "cooper_competent_rewrite_rmlr1x_boxedpos": (
    "cooper",
    {**COMPETENT, **REWRITE, RM_LR_RATIO: 1, "pairs.positive_check": "rule+boxed"},
  ),
}


POLICIES = ("small", "wide")


def get_config(arg: str = "cooper"):
  a = parse_arg(arg, ("cond", "work", "policy"))
  name, work, policy = (
    a.get("cond", "cooper"),
    a.get("work", str(SHIPPED)),
    a.get("policy", "small"),
  )
  if name not in CONDITIONS:
    raise ValueError(f"small_task condition {name!r}: expected one of {sorted(CONDITIONS)}")
  if policy not in POLICIES:
    raise ValueError(f"small_task policy={policy!r}: expected one of {POLICIES}")
  mode, overrides = CONDITIONS[name]
  c = base_config()
  c.reward_mode = mode
  c.policy.model = f"{work}/policy"
  c.rm.model = f"{work}/rm"
  c.rm.max_len = 384
  # Attention in chunks of rows with 1 MiB of scores each (transformer.attend; the same values
  # up to float32 rounding): cheaper steps on a CPU (BUILD.md, "The small-task step").
  c.policy.attn_chunk_bytes = c.rm.attn_chunk_bytes = 1 << 20
  # A group's rollouts repeat one another (about half of them in the studies): the policy step,
  # the reference pass and the RM reward run each distinct one once, the policy's weighted by
  # its count (the same loss, gradient and rewards up to float32 rounding; cooper_jax/merge.py).
  c.policy.merge_duplicate_rows = c.rm.merge_duplicate_rows = True
  # ... and the distinct responses to a prompt packed into shared rows (cooper_jax/pack.py):
  # about 60% of a merged batch's positions are padding at ~30-token responses in rows of 64.
  # The sampler keeps each prompt's keys/values once for its G rows (sampling.sample's
  # shared_prompt). Both change float rounding only; studies recorded before 2026-12-05 ran
  # without them (results/wide_main; README's figures are from the setting as it is now).
  c.policy.pack_rows = True
  c.rollout.shared_prompt_decode = True
  c.data.train = f"{work}/data/train.jsonl"
  c.data.eval = f"{work}/data/test.jsonl"
  c.data.eval_limit = 100
  c.data.rm_eval_pairs = f"{work}/data/rm_eval_pairs.jsonl"
  probe = Path(work) / "data" / "rm_probe_even.jsonl"
  c.data.rm_probe = str(probe) if probe.exists() else ""
  c.rollout.prompts_per_step = 8
  c.rollout.group_size = 8
  c.rollout.max_prompt_len = 128
  c.rollout.max_new_tokens = 96
  # One prompt width and two response widths: the task's prompts are 30-73 tokens, so a
  # multiple of 80 pads every batch to 80; responses are cut to 64 or 96 (packed rows hold
  # two ~30-token responses in 64 as cheaply as one in 32). Each (prompt width, response
  # width, packed rows) is a policy step compiled per study and traced per run (~1-1.5 s
  # with the persistent cache warm): with multiples of 16 and 32 the main study met 28 such
  # shapes, 10-20 per run (results/wide_fewshapes/README.md).
  c.rollout.prompt_pad_multiple = 80
  c.rollout.response_pad_multiple = 64
  # lr 1e-4 with a 20-step warm-up (the reference code's), 100 steps: on this policy the rule
  # reward raises the rollouts' accuracy ~10 points and greedy held-out accuracy stays within
  # noise; at 2e-4 and 3e-4 greedy accuracy falls 6-8 points even under the rule reward
  # (results/exploration_v3/README.md). The RM's lr is 10x the policy's, the paper's ratio
  # (1e-5 / 1e-6), with the same warm-up.
  c.policy.optim.lr = 1e-4
  c.policy.optim.warmup_steps = 20
  c.rm.optim.lr = c.policy.optim.get_ref("lr") * overrides.get(RM_LR_RATIO, 10)
  c.rm.optim.warmup_steps = 20
  c.train.steps = 100
  c.train.eval_every = 10
  c.train.eval_samples = 1
  c.train.eval_temperature = 0.0
  c.train.eval_max_new_tokens = 96
  c.train.checkpoint_every = 100
  c.train.max_to_keep = 1
  c.verifier.workers = 1
  c.train.save_rollouts = 16  # two groups per step
  # A step's RM update (pairs, the assistant, rm_step) runs while the next step samples: on a
  # 2-core CPU the sampler keeps one core busy. The same numbers (BUILD.md, "The small-task step").
  c.train.overlap_rm_update = True
  for key, value in overrides.items():
    if key == RM_LR_RATIO:
      continue
    section, field = key.rsplit(".", 1)
    node = c
    for part in section.split("."):
      node = node[part]
    node[field] = value.format(work=work) if isinstance(value, str) else value
  if policy == "wide":  # why these settings: experiments/small_task_wide.py
    c.policy.model = str(Path(work) / "policy_wide")
    c.policy.optim.lr = 2e-4  # a reference: the RM's lr (a multiple of it) follows
    c.policy.optim.schedule = c.rm.optim.schedule = "warmup_cosine"
    c.train.steps = 300  # the optimizers' total_steps follow it
    c.train.eval_every = 20
  return c
