"""Benchmark sections over our whole train loop (`cooper_jax.train.train`): one Cooper iteration
vs one rule-only iteration, and the helpers the GRPO-iteration peers (trl_side.py) share: the
run config by spec, our loop's per-step metrics, the prompts it draws in its order.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from benchmarks import harness

REPO = Path(__file__).resolve().parents[1]
SMOLLM2_CONFIG = "experiments/smollm2.py:cpu_smoke"  # the embedded model's run config


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


# ------------------------------------------------------------- GRPO iterations against a peer
PEER_PARTS = (("step", ""), ("generate", ", generation"), ("update", ", all but it"))


def peer_iteration_figures(
  report: harness.Report, key: str, spec: str, name: str, peer_label: str
) -> dict:
  """The three figures of a peer's GRPO iteration (whole step, generation, all but it), seconds
  ours / `name`'s, keyed "step", "generate", "update"."""
  return {
    part: report.figure(
      key=key + ("" if part == "step" else f"_{part}"),
      label=f"one rule-only GRPO iteration ({spec}){what}: cooper_jax s / {name} s",
      unit="s",
      ours_label="cooper_jax train (rule)",
      peer_label=peer_label,
      higher_is_better=False,
    )
    for part, what in PEER_PARTS
  }


def prepare_peer_run(spec: str, overrides, steps: int, workroot: Path, gate: Callable):
  """Loads the policy as our loop does, exports it with its tokenizer for a peer, draws the
  loop's prompts for `steps` steps, and runs `gate(cfg, params, tokens, mask, pad_id, hf_dir)`
  on the first two GSM8K test questions. Returns (config, hf_dir, eos ids, prompts, gate
  figures with "ok")."""
  from benchmarks import sections as S  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_from_config, save_hf_dir  # pylint: disable=import-outside-toplevel

  c = run_config(spec, overrides)
  cfg, params, tok_src = load_from_config(c.policy, "lm", c.seed)
  tok = load_tokenizer(tok_src)
  hf_dir = str(save_hf_dir(cfg, params, workroot / "hf", tokenizer=tok))
  tokens, mask, pad_id = S.gsm8k_prompts(2, tok)
  ok, res = gate(cfg, params, tokens, mask, pad_id, hf_dir)
  res["ok"] = ok
  return c, hf_dir, tok.eos_ids, iteration_prompts(c, tok, steps), res


def pair_steps(ours: list[dict], theirs: list[dict], warmup: int) -> list[dict]:
  """Our train loop's metrics rows and a peer's steps (same prompts at the same step; each with
  step_s, generate_s, generate_calls and a mean response length "len") -> one dict per step
  after `warmup`: per side ("ours", "peer"), seconds of generation, of the rest ("update") and
  of the step, and the mean response length."""
  if len(ours) != len(theirs) or len(ours) <= warmup:
    raise ValueError(f"{len(ours)} of our steps, {len(theirs)} of the peer's, warm-up {warmup}")
  for t in theirs:
    if t["generate_calls"] != 1:
      raise RuntimeError(f"peer step {t['step']}: {t['generate_calls']} generate calls, not 1")
  side = lambda gen, step, n: {"generate": gen, "update": step - gen, "step": step, "len": n}
  return [
    {
      "step": i + 1,
      "ours": side(o["time/sample_s"], o["time/step_s"], o.get("response/len_mean")),
      "peer": side(t["generate_s"], t["step_s"], t.get("len")),
    }
    for i, (o, t) in enumerate(zip(ours, theirs))
    if i >= warmup
  ]


def record_pairs(report, figs: dict, pairs: list[dict], load: float, peer: str, title: str):
  """Adds each paired step as a run of the three figures and a table of both sides' split;
  returns the best step seconds of (ours, the peer's)."""
  table = []
  for p in pairs:
    o, t = p["ours"], p["peer"]
    for part, fig in figs.items():
      fig.add_run(o[part], t[part], load, step=p["step"], ours_len=o["len"], peer_len=t["len"])
    for name, s in (("cooper_jax", o), (peer, t)):
      n = "-" if s["len"] is None else f"{s['len']:.1f}"
      table.append(
        [p["step"], name] + [f"{s[k]:.2f}" for k in ("generate", "update", "step")] + [n]
      )
  report.add_table(title, ["step", "side", "generate", "update", "step", "response length"], table)
  return tuple(min(p[s]["step"] for p in pairs) for s in ("ours", "peer"))


@dataclasses.dataclass(frozen=True)
class IterationPeer:
  """How a GRPO-iteration peer plugs into `peer_iteration_section` (built in
  trl_side.trl_iteration_section and tunix_grpo_side.tunix_iteration_section)."""

  key: str  # the section's name and its figures' key prefix
  name: str  # in notes and tables: "TRL"
  library: str  # what runs: "TRL GRPOTrainer"
  open: Callable  # python -> its worker client (FileNotFoundError without the venv)
  versions: Callable  # worker info -> " (trl 1.16.0, torch 2.13.0)"
  gate: Callable  # (worker, cfg, params, tokens, mask, pad_id, hf_dir) -> (ok, figures)
  make_config: Callable  # (our run config, steps) -> the worker's iteration config
  setting: Callable  # (worker info, worker answer) -> where and how the worker ran
  runs_as: str  # how its steps run: "one trainer.train"
  not_matched: tuple


def peer_iteration_section(
  report: harness.Report,
  p: IterationPeer,
  spec: str,
  overrides,
  warmup: int,
  runs: int,
  workroot: Path,
  python: str,
  run_train: Callable | None = None,
) -> None:
  """`warmup` + `runs` GRPO iterations in the peer's worker, then as many rule-only iterations
  of our train loop (`run_train`, default train_metrics) on the same config, prompts and
  weights; run i pairs step warmup + i of both into three figures (step, generation, the
  rest). No timing unless the gate passes; without the venv the figures stay empty ("peer not
  run"). The worker's `iteration` gets the prompts file, its config, our EOS ids and our
  verify.py (the rule reward), and is closed before our side runs."""
  overrides = tuple(overrides)
  try:
    peer = p.open(python)
  except FileNotFoundError as e:
    print(f"(no {p.name} peer: {e})", flush=True)
    peer = None
  try:
    label = p.library
    if peer is not None:
      report.meta[p.name.lower()] = peer.info
      label += p.versions(peer.info)
    figs = peer_iteration_figures(report, p.key, spec, p.name, label)
    extras = report.extras.setdefault(p.key, {"spec": spec, "overrides": list(overrides)})
    if peer is None:
      return report.refuse(p.key, figs.values(), f"peer not run (no {p.name} venv)")
    c, hf_dir, eos_ids, prompts, res = prepare_peer_run(
      spec, overrides, warmup + runs, workroot, lambda *a: p.gate(peer, *a)
    )
    if not report.gate(p.key, figs.values(), p.name, res["ok"], res, "last_position"):
      return None
    kw = p.make_config(c, warmup + runs)
    load = harness.load1()
    path = os.path.join(peer.tmp.name, "prompts.json")
    with open(path, "w", encoding="utf-8") as f:
      json.dump(prompts, f)
    theirs = peer.call(
      "iteration",
      hf_dir=hf_dir,
      prompts=path,
      config=kw,
      eos_ids=list(eos_ids),
      verify_py=str(REPO / "cooper_jax" / "rewards" / "verify.py"),  # the worker's rule reward
    )
    info = peer.info
    peer.close()  # its models and optimizer state are not needed while ours runs
    peer = None
    rows = (run_train or train_metrics)(spec, "rule", warmup + runs, workroot / "ours", overrides)
    best = record_pairs(
      report,
      figs,
      pair_steps(rows, theirs["steps"], warmup),
      load,
      p.name,
      f"{p.library} vs cooper_jax, one iteration (seconds; response length: mean tokens)",
    )
    r = c.rollout
    skipped = {0: "", 1: "; step 1"}.get(warmup, f"; steps 1-{warmup}")
    skipped += " (warm-up: compilation) not used" if warmup else ""
    figs["step"].notes += [
      f"{r.prompts_per_step} prompts x G={r.group_size}, up to {r.max_new_tokens} new tokens, "
      f"temperature {r.temperature}, fp32; {p.setting(info, theirs)}; the same prompts at "
      f"each step on both sides{skipped}",
      f"best of the {runs} timed steps: ours {best[0]:.2f} s, {p.name} {best[1]:.2f} s (ratio "
      f"{best[0] / best[1]:.2f})",
      f"{p.name}'s steps all run first ({p.runs_as}), then ours (one train loop); load: the "
      f"1-minute load before {p.name}'s run; update = step - generation (reward, reference "
      "log-probs, loss, backward, clip, AdamW)",
      "not matched: " + "; ".join(p.not_matched),
    ]
    extras.update(config=kw, peer=theirs, our_metrics=rows)
    report.save_partial()
  finally:
    if peer is not None:
      peer.close()
