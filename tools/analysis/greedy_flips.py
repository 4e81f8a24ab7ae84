"""Which held-out problems RL runs lose (or win) greedily, against the untrained small-task policy.

For each run directory (a cooper_jax training run with a checkpoint), the final policy decodes
every problem of the small task's held-out split greedily; a problem is *lost* when the untrained
policy's greedy answer is right and the run's is wrong, *gained* the other way. For each lost
problem: in how many runs, the untrained policy's smallest top-1 minus top-2 log-prob margin
over its own greedy response (a near-tie flips under any small change of the weights), its chain
length, and one run's first line that differs. What it answers: does greedy accuracy fall on the
same problems in every run (a systematic change) or on near-ties (noise in the weights)?

  python tools/analysis/greedy_flips.py --runs results/wide_study8/runs/rule_s{0,1} --out flips.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
ASSETS = ROOT / "experiments" / "assets" / "small_task"


def greedy_records(cfg, params, tok, rows, verifier) -> list[dict]:
  from cooper_jax.evaluate import evaluate_model  # pylint: disable=import-outside-toplevel

  res = evaluate_model(
    cfg,
    params,
    tok,
    {"heldout": rows},
    samples=1,
    temperature=0.0,
    max_new_tokens=96,
    batch_size=64,
    verifier=verifier,
  )
  return res["records"]["heldout"]


def greedy_margins(cfg, params, tok, rows, completions) -> np.ndarray:
  """Per problem: the smallest (top-1 - top-2) log-prob over the positions of the model's own
  greedy response (teacher-forced on its tokens)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from cooper_jax.evaluate import INSTRUCTION_SUFFIX, build_prompts  # pylint: disable=C0415
  from cooper_jax.models.transformer import forward  # pylint: disable=import-outside-toplevel

  prompts = build_prompts(tok, [r["question"] for r in rows], INSTRUCTION_SUFFIX, True)
  fwd = jax.jit(lambda p, t: forward(cfg, p, t, jnp.ones_like(t, bool)))
  out = np.empty(len(rows))
  for i, (prompt, text) in enumerate(zip(prompts, completions)):
    p_ids = tok.encode_prompts([prompt], pad_to_multiple=1)[0][0].tolist()
    c_ids = tok.encode(text)
    lp = jax.nn.log_softmax(fwd(params, jnp.asarray([p_ids + c_ids], jnp.int32))[0], -1)
    top2 = np.sort(np.asarray(lp[len(p_ids) - 1 : len(p_ids) + len(c_ids) - 1]), -1)[:, -2:]
    out[i] = float(np.min(top2[:, 1] - top2[:, 0]))
  return out


def first_difference(a: str, b: str) -> str:
  for x, y in zip(a.splitlines(), b.splitlines()):
    if x != y:
      return f"`{x}` -> `{y}`"
  return "(same lines)"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--runs", nargs="+", required=True, help="training run directories")
  p.add_argument("--out", required=True, help="markdown report")
  p.add_argument("--policy", default=str(ASSETS / "policy"), help="the untrained policy (HF dir)")
  a = p.parse_args(argv)

  from cooper_jax.checkpoint import load_policy_for_eval  # pylint: disable=C0415
  from cooper_jax.data import load_qa  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import RuleVerifier  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  rows, _ = load_qa(str(ASSETS / "data" / "test.jsonl"))
  tok = load_tokenizer(a.policy)
  cfg0, params0 = load_pretrained(a.policy)
  with RuleVerifier(1) as verifier:
    base = greedy_records(cfg0, params0, tok, rows, verifier)
    runs = {}
    for run in a.runs:
      cfg, params, _ = load_policy_for_eval(run)
      runs[run] = greedy_records(cfg, params, tok, rows, verifier)
  margins = greedy_margins(cfg0, params0, tok, rows, [r["completion"] for r in base])
  right0 = np.array([r["correct"] for r in base])
  lines = [
    "# Greedy flips against the untrained policy",
    "",
    f"`python tools/analysis/greedy_flips.py --runs {' '.join(a.runs)} --out {a.out} --policy {a.policy}`",
    "",
    f"Held-out split: {len(rows)} problems; untrained greedy accuracy {right0.mean():.3f}.",
    "",
    "| run | greedy acc | lost | gained |",
    "|---|---|---|---|",
  ]
  lost: dict[int, list[str]] = {}
  for run, recs in runs.items():
    right = np.array([r["correct"] for r in recs])
    for i in np.flatnonzero(right0 & ~right):
      lost.setdefault(int(i), []).append(run)
    lines.append(
      f"| {run} | {right.mean():.3f} | {int(np.sum(right0 & ~right))} | "
      f"{int(np.sum(~right0 & right))} |"
    )
  ok_margins = margins[right0]
  lines += [
    "",
    "Untrained margin (smallest top-1 - top-2 log-prob over its greedy response) over the "
    f"problems it gets right: 10th / 25th / 50th percentile {np.quantile(ok_margins, 0.1):.2f} / "
    f"{np.quantile(ok_margins, 0.25):.2f} / {np.quantile(ok_margins, 0.5):.2f}.",
    "",
    "| problem | lost in runs | untrained margin | margin percentile | chain lines | first change |",
    "|---|---|---|---|---|---|",
  ]
  for i, who in sorted(lost.items(), key=lambda kv: (-len(kv[1]), kv[0])):
    pct = 100 * float(np.mean(ok_margins <= margins[i]))
    n_lines = rows[i]["solution"].count("\n") + 1 if "solution" in rows[i] else "-"
    change = first_difference(base[i]["completion"], runs[who[0]][i]["completion"])
    lines.append(
      f"| {i} | {len(who)} of {len(runs)} | {margins[i]:.2f} | {pct:.0f} | {n_lines} | {change} |"
    )
  Path(a.out).write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
