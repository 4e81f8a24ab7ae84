"""One block per run: rule acc, reward, greedy eval, RM probe, pairs, RM pair acc:
  python results/exploration_v3/summarise.py st2_rule_lr1e-4_w20
"""
import json, sys, numpy as np
for name in sys.argv[1:]:
  try:
    rows = [json.loads(l) for l in open(f"results/exploration_v3/runs/{name}/metrics.jsonl")]
  except FileNotFoundError:
    print(name, "none"); continue
  tr = [r for r in rows if "rule/acc" in r]
  acc = np.array([r["rule/acc"] for r in tr]); rew = np.array([r["reward/mean"] for r in tr])
  ev = [(r["step"], r["eval/acc"]) for r in rows if "eval/acc" in r]
  chunks = lambda a: " ".join(f"{a[i:i+10].mean():.2f}" for i in range(0, len(a), 10))
  st = np.mean([r["time/step_s"] for r in tr[5:]]) if len(tr) > 5 else 0
  print(f"{name}: steps {len(tr)} ({st:.2f}s/step)\n  rule acc/10: {chunks(acc)}\n  reward/10:   {chunks(rew)}\n  eval: {' '.join(f'{a:.2f}' for s,a in ev)}")
  pr = [(r["step"], r["eval/rm_probe_score"]) for r in rows if "eval/rm_probe_score" in r]
  if pr: print("  probe:", " ".join(f"{a:.2f}" for s, a in pr))
  pv = [r.get("pairs/n_valid") for r in tr if "pairs/n_valid" in r]
  if pv: print("  pairs/10:", chunks(np.array(pv, float)))
  ev2 = [r["eval/rm_pair_acc"] for r in rows if "eval/rm_pair_acc" in r]
  if ev2: print("  rm pair acc:", " ".join(f"{a:.2f}" for a in ev2))
