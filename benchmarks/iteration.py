"""Benchmark sections over our whole train loop (`cooper_jax.train.train`): one Cooper iteration
vs one rule-only iteration, and the helpers the GRPO-iteration peers (trl_side.py) share: the
run config by spec, our loop's per-step metrics, the prompts it draws in its order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from benchmarks import harness

REPO = Path(__file__).resolve().parents[1]


def run_config(spec: str, overrides=()):
  """A run config by `file.py[:arg]` relative to the repo, with dotted overrides."""
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel

  path, _, arg = spec.partition(":")
  return load_config(f"{REPO / path}:{arg}" if arg else str(REPO / path), overrides)


def iteration_prompts(c, tokenizer, steps: int) -> list[dict]:
  """The prompts our train loop draws in its first `steps` steps, in order (same data, seed and
  iterator), as text (chat-templated, instruction suffix), ids and reference answer."""
  from cooper_jax.data import PromptIterator, load_qa  # pylint: disable=import-outside-toplevel
  from cooper_jax.prompts import build_prompts  # pylint: disable=import-outside-toplevel

  d = c.data
  rows, _ = load_qa(
    d.train, question_key=d.question_key, answer_key=d.answer_key, on_bad_row=d.on_bad_row
  )
  it = PromptIterator(rows, seed=c.seed)
  drawn = [r for _ in range(steps) for r in it.next_batch(c.rollout.prompts_per_step)]
  texts = build_prompts(tokenizer, [r["question"] for r in drawn], d.prompt_suffix)
  out = []
  for text, r in zip(texts, drawn):
    ids = tokenizer.encode(text)
    if len(ids) > c.rollout.max_prompt_len:  # our loop refuses such a prompt; a peer may take it
      raise ValueError(f"prompt of {len(ids)} tokens > rollout.max_prompt_len")
    out.append({"prompt": text, "answer": r["answer"], "ids": ids})
  return out


TIME_KEYS = ("time/sample_s", "time/verify_s", "time/policy_s", "time/rm_s", "time/step_s")
CONTEXT_KEYS = (
  "response/len_mean",
  "pairs/n_valid",
  "rm/pair_rows",
  "rm_train/updated",
  "rule/acc",
)


def train_metrics(spec: str, mode: str, steps: int, workdir: Path, overrides=()) -> list[dict]:
  """Runs `cooper_jax.train.train` for `steps` steps of `spec` in `mode`; its metrics rows."""
  from cooper_jax import train  # pylint: disable=import-outside-toplevel
  from cooper_jax.metrics import read_metrics  # pylint: disable=import-outside-toplevel

  c = run_config(spec, overrides)
  c.reward_mode = mode
  c.train.steps = steps
  c.train.eval_every = 0
  c.train.checkpoint_every = steps  # one save, after the last step (outside time/step_s)
  train.train(c, str(workdir))
  return [m for m in read_metrics(workdir) if "time/step_s" in m]


def easy_arithmetic(path: Path, n: int = 16) -> Path:
  """A JSONL of one-step sums in GSM8K's row format ("#### <answer>"). SmolLM2-135M-Instruct
  answers some of them rule-correctly within 64 tokens, so Cooper builds pairs and updates its
  RM in the timed steps; on GSM8K itself it gets no rule-correct rollout at cpu_smoke sizes,
  and an iteration without an RM update would leave rm_step's cost out of the ratio."""
  rows = []
  for i in range(n):
    a, b = 2 + i % 7, 1 + (3 * i) % 8
    q = f"What is {a} + {b}?"
    rows.append(json.dumps({"question": q, "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join(rows) + "\n")
  return path


def iteration_section(
  report: harness.Report,
  spec: str,
  runs: int,
  workroot: Path,
  overrides=(),
  run_train: Callable = train_metrics,
  warmup: int = 1,
) -> None:
  """A rule-only and a Cooper run of the same config and seed (so the same first prompts), each
  for `warmup` + runs steps; the warm-up steps compile (policy_step at step 1, usually rm_step
  at the first RM update) and are not timed; run i pairs steady step warmup + i of the modes."""
  rows = {}
  loads = {}
  for mode in ("rule", "cooper"):
    loads[mode] = harness.load1()
    rows[mode] = run_train(spec, mode, warmup + runs, workroot / mode, overrides)
  fig = report.figure(
    key="iteration_cooper_vs_rule",
    label=f"one iteration ({spec}): Cooper s / rule-only s",
    unit="s",
    ours_label="cooper",
    peer_label="rule",
    higher_is_better=False,
    target=1.3,
  )
  fig.notes.append(
    "the two modes run one after the other (rule first), each through cooper_jax.train.train; "
    f"load is the 1-minute load when the cooper run started; steps 1-{warmup} (compilation) "
    "are not used" + (f"; overrides: {', '.join(overrides)}" if overrides else "")
  )
  updated = [bool(x.get("rm_train/updated")) for x in rows["cooper"]]
  table = []
  for i in range(warmup, warmup + runs):
    r, c = rows["rule"][i], rows["cooper"][i]
    if updated[i] and not any(updated[:i]):
      fig.notes.append(f"step {i + 1}: the first RM update, so it includes rm_step compilation")
    fig.add_run(
      c["time/step_s"], r["time/step_s"], loads["cooper"], step=i + 1, rm_update=updated[i]
    )
    for k in TIME_KEYS + CONTEXT_KEYS:
      if k in r or k in c:
        rv, cv = r.get(k), c.get(k)
        diff = f"{cv - rv:+.2f}" if k in TIME_KEYS and rv is not None and cv is not None else ""
        table.append([i + 1, k, _fmt(rv), _fmt(cv), diff])
  n_up = sum(updated[warmup:])
  fig.notes.append(
    f"{n_up} of the {runs} timed Cooper steps updated the RM"
    + (
      ""
      if n_up
      else " (no rule-correct positive, so no pair): rm_step's cost is not in these ratios"
    )
  )
  fig.notes.append(
    "time/policy_s of the train loop also holds the reward computation (the RM forward in "
    "Cooper mode), since the loop times reward + policy update together"
  )
  report.add_table(
    "where the iteration time goes (train loop time/* metrics, seconds)",
    ["step", "metric", "rule", "cooper", "cooper - rule"],
    table,
  )
  report.extras["iteration"] = {"spec": spec, "overrides": list(overrides), "metrics": rows}
  report.save_partial()


def _fmt(v) -> str:
  if v is None:
    return "-"
  return f"{v:.2f}" if isinstance(v, float) else str(v)
