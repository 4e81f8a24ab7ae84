"""Share of even final answers in a run's saved rollouts (all, and rule-wrong), per 10 steps:
  python results/exploration_v3/even_share.py st2_static_planted st2_cooper_planted
"""
import gzip, json, sys, numpy as np
sys.path.insert(0, '.')
from cooper_jax.tasks.blind_spot import has_pattern
for n in sys.argv[1:]:
  R = [json.loads(l) for l in gzip.open(f"results/exploration_v3/runs/{n}/rollouts.jsonl.gz", "rt")]
  steps = sorted({r["step"] for r in R})
  out = []
  for s0 in range(1, max(steps) + 1, 10):
    rr = [r for r in R if s0 <= r["step"] < s0 + 10]
    ev = np.mean([has_pattern(r["response"]) for r in rr])
    wrong = [r for r in rr if not r["rule_correct"]]
    ew = np.mean([has_pattern(r["response"]) for r in wrong]) if wrong else float("nan")
    out.append(f"{ev:.2f}/{ew:.2f}")
  print(n, "even share (all/wrong) per 10 steps:", " ".join(out))
