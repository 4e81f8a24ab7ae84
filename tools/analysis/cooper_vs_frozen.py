"""Co-trained RM arms against the frozen RM, paired by seed: per seed, the
gold (the rollouts' rule accuracy, 20-step blocks) of each arm at the frozen arm's peak and at
the end, each arm's hacking onset (the first block >= --drop points below its running peak),
and the final held-out accuracy; seed-level tests of Cooper - frozen.

  python tools/analysis/cooper_vs_frozen.py \
      --frozen results/overopt_competent:static_rm_competent \
      --rule results/overopt_competent:rule \
      --cooper results/overopt_competent_cooper:cooper_competent_rewrite \
      --cooper results/overopt_competent_onpolicy:cooper_competent_onpolicy_rmlr1x \
      --out results/overopt_competent_cooper/cooper_vs_frozen

Each STUDY:CONDITIONS names a cooper-study folder whose overoptimization.json (written by
tools/analysis/overoptimization.py for those conditions) and results.json hold the arms; the
arms may come from different study folders (same experiment, seeds and settings) as runs are
deterministic per seed. Only seeds present in every arm are compared. Writes <out>.md and
<out>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from overoptimization import peak_and_onset  # this folder (run as a script; tests add it)

from cooper_jax import stats


def heldout(study: Path, cond: str) -> dict[int, float]:
  """{seed: final held-out accuracy (fraction)} of one condition of a cooper-study folder."""
  path = study / "results.json"
  res = json.loads(path.read_text())
  if cond not in res.get("summaries", {}):
    raise KeyError(f"{path}: no condition {cond!r} (has {sorted(res.get('summaries', {}))})")
  return {int(s): a for s, a in zip(res["seeds"], res["summaries"][cond]["seed_accuracies"])}


def load_arms(spec: str, drop: float) -> dict[str, dict[int, dict]]:
  """STUDY:COND[,COND] -> {cond: {seed: {gold, steps, onset, end, heldout}}}."""
  study, _, conds = spec.rpartition(":")
  if not study:
    raise ValueError(f"{spec!r}: expected STUDY:CONDITION[,CONDITION...]")
  over = json.loads((Path(study) / "overoptimization.json").read_text())
  arms = {}
  for cond in conds.split(","):
    if cond not in over:
      raise KeyError(
        f"{study}: condition {cond!r} missing from overoptimization.json "
        f"(run tools/analysis/overoptimization.py --study {study} --conditions ...)"
      )
    final = heldout(Path(study), cond)
    arms[cond] = {}
    for s, v in over[cond]["seeds"].items():
      summary = peak_and_onset(np.asarray(v["steps"]), np.asarray(v["gold_rollouts"]), drop)
      arms[cond][int(s)] = {
        "steps": v["steps"],
        "gold": v["gold_rollouts"],
        "onset": summary["onset"],
        "peak_step": summary["peak_step"],
        "heldout": 100 * final[int(s)],
      }
  return arms


def gold_at(arm: dict, step: int) -> float:
  return float(arm["gold"][arm["steps"].index(step)])


def t_ci(d: np.ndarray) -> list[float]:
  from scipy import stats as st  # pylint: disable=import-outside-toplevel

  half = st.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
  return [float(d.mean() - half), float(d.mean() + half)]


def verdict(frozen_onset, cooper_onset) -> str:
  if frozen_onset is None:
    return "frozen not hacked"
  if cooper_onset is None:
    return "prevented"
  return "delayed" if cooper_onset > frozen_onset else "not delayed"


def compare(frozen: dict[int, dict], cooper: dict[int, dict]) -> dict:
  seeds = sorted(set(frozen) & set(cooper))
  rows, at_peak, at_end, heldout = [], [], [], []
  for s in seeds:
    f, c = frozen[s], cooper[s]
    peak, end = f["peak_step"], min(f["steps"][-1], c["steps"][-1])
    row = {
      "seed": s,
      "frozen_peak_step": peak,
      "at_peak": gold_at(c, peak) - gold_at(f, peak),
      "at_end": gold_at(c, end) - gold_at(f, end),
      "end_step": end,
      "heldout": c["heldout"] - f["heldout"],
      "onset_frozen": f["onset"],
      "onset_cooper": c["onset"],
      "verdict": verdict(f["onset"], c["onset"]),
    }
    rows.append(row)
    at_peak.append(row["at_peak"])
    at_end.append(row["at_end"])
    heldout.append(row["heldout"])
  out = {"seeds": seeds, "per_seed": rows}
  for name, d in (("at_peak", at_peak), ("at_end", at_end), ("heldout", heldout)):
    d = np.asarray(d)
    test = stats.seed_paired_test(d, np.zeros_like(d)) if d.size >= 2 else {}
    out[name] = {**test, "ci95": t_ci(d) if d.size >= 2 else None}
  return out


def table(frozen_name: str, rule: dict | None, results: dict[str, dict], arms: dict) -> str:
  lines = []
  for cond, r in results.items():
    lines.append(f"\n### {cond} − {frozen_name}\n")
    lines.append(
      "| seed | gold at the frozen peak (step) | gold at the end | held-out, final | "
      "onset frozen → co-trained | reading |\n|---|---|---|---|---|---|"
    )
    for x in r["per_seed"]:
      lines.append(
        f"| {x['seed']} | {x['at_peak']:+.1f} ({x['frozen_peak_step']}) | {x['at_end']:+.1f} | "
        f"{x['heldout']:+.1f} | {x['onset_frozen'] or '-'} → {x['onset_cooper'] or '-'} | "
        f"{x['verdict']} |"
      )
    for name in ("at_peak", "at_end", "heldout"):
      t = r[name]
      if t.get("ci95"):
        lines.append(
          f"\n{name}: mean {t['mean_diff']:+.1f} points (95% t CI {t['ci95'][0]:+.1f} to "
          f"{t['ci95'][1]:+.1f}; t-test p {t['t_test_p']:.3g}, sign-flip p "
          f"{t['sign_flip_p']:.3g}; detectable at 80% power {t['mde80']:.1f}) over "
          f"{t['n_seeds']} seeds"
        )
  head = "| arm | per seed: gold first block → end (onset) | held-out final |\n|---|---|---|\n"
  body = []
  for cond, a in {**arms, **({"rule": rule} if rule else {})}.items():
    cells = "; ".join(
      f"s{s} {v['gold'][0]:.0f}→{v['gold'][-1]:.0f} ({v['onset'] or '-'})" for s, v in a.items()
    )
    held = ", ".join(f"{v['heldout']:.1f}" for v in a.values())
    body.append(f"| {cond} | {cells} | {held} |")
  return head + "\n".join(body) + "\n" + "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--frozen", required=True, help="STUDY:CONDITION")
  ap.add_argument(
    "--cooper", required=True, action="append", help="STUDY:CONDITION[,CONDITION...], repeatable"
  )
  ap.add_argument("--rule", default=None, help="STUDY:CONDITION (shown, not compared)")
  ap.add_argument("--drop", type=float, default=10.0)
  ap.add_argument("--out", required=True, help="path prefix: writes <out>.md and <out>.json")
  a = ap.parse_args(argv)
  ((frozen_name, frozen),) = load_arms(a.frozen, a.drop).items()
  cooper = {cond: arm for spec in a.cooper for cond, arm in load_arms(spec, a.drop).items()}
  rule = next(iter(load_arms(a.rule, a.drop).values())) if a.rule else None
  results = {cond: compare(frozen, arm) for cond, arm in cooper.items()}
  text = table(frozen_name, rule, results, {frozen_name: frozen, **cooper})
  Path(a.out + ".md").write_text(text)
  Path(a.out + ".json").write_text(json.dumps(results, indent=1))
  print(text)
  return results


if __name__ == "__main__":
  main()
