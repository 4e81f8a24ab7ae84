"""The small task's Evidence III testbed: a 4x wider policy, lr 2e-4, 300 steps, cosine lr.

experiments/small_task.py with policy=wide (the same config; this file keeps the recorded
commands, `small_task_wide.py:<condition>[,<workdir>]`, working). The conditions, data, RMs and
assistant are small_task.py's (see its docstring); what changes is the policy and the schedule:
  policy_wide/  d_model 128 (0.86M parameters), SFT'd like policy/ on the same data
                (tools/assets/sft_small_policy.py --d_model 128; experiments/assets/small_task/README.md)
  lr 2e-4 with a 20-step warm-up, then a cosine to 0 over 300 steps (the RM's schedule too;
  its lr stays the condition's multiple of the policy's, 10x for cooper).

Why (results/wide_policy): on the 0.23M policy the rule reward raises sampled held-out accuracy
but greedy accuracy falls a few points in every seed (results/greedy_kl, in git history); the wider policy at lr
2e-4 gains +19 points sampled in every seed with greedy within 1 point, and with the weak RM
(rm_weak/) frozen it is hacked in 5 of 5 seeds. The conditions of its study: rule,
static_rm_weak (the frozen RM), cooper_weak_rewrite (the paper's Cooper: llm_rewrite negatives,
RM lr 10x); ablations cooper_weak_rewrite_rmlr{1,3,30}x and cooper_weak_onpolicy_rmlr1x.

  python -m cooper_jax.train --config experiments/small_task_wide.py:cooper_weak_rewrite \\
      --workdir runs/wide_cooper
arg: small_task.py's (named or positional), default condition cooper_weak_rewrite.
"""

from experiments import parse_arg, small_task


def get_config(arg: str = ""):
  a = parse_arg(arg, ("cond", "work", "policy"))
  if a.setdefault("policy", "wide") != "wide":
    raise ValueError(
      f"small_task_wide.py is policy=wide; for policy={a['policy']} use small_task.py"
    )
  a.setdefault("cond", "cooper_weak_rewrite")
  return small_task.get_config(",".join(f"{k}={v}" for k, v in a.items()))
