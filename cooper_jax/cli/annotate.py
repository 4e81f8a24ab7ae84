"""Hybrid annotation (Cooper component 2): triples labelled by Math-Verify and an LLM judge.

Each policy answers each question `--samples` times (chat template + the evaluation
instruction suffix, so completions look like RL rollouts). Every (question, reference,
completion) triple is labelled twice, independently:
  rule label   math-verify against the reference (cooper_jax.rewards.verify.RuleVerifier):
               1 correct, 0 wrong or no answer, -1 when the check itself failed (timeout,
               error, unparseable reference): a failed check is not evidence either way;
  judge label  the LLM judge's yes/no (cooper_jax.rewards.judge.llm_judge), -1 undecided.
Only triples where both labels are decided and equal are kept, as in the paper (65K -> 58.7K).

Outputs (written atomically; BASE is --out without a trailing .jsonl):
  --out            every triple with both labels and an `agree` flag
  BASE.kept.jsonl  the agreeing triples {question, reference, completion, label, rule_label,
                   judge_label, generator, temperature, id}, ready for cooper_jax/cli/pretrain_rm.py
  BASE.stats.json  counts, agreement rate, Cohen's kappa, the rule x judge confusion matrix,
                   rates per generator, verifier status counts, truncation, timings, and the
                   judge's positive control (--judge_control: can it tell a right boxed answer
                   from a wrong one on clean solutions? warned about when it cannot)

  python -m cooper_jax.cli.annotate --policies smollm2-135m-instruct@0.7,smollm2-135m-instruct@1.0 \\
      --judge smollm2-135m-instruct --data gsm8k/train --limit 8 --samples 2 \\
      --max_new_tokens 128 --out runs/annot_smoke.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

logger = logging.getLogger("annotate")
LABELS = (1, 0, -1)  # confusion-matrix order: positive, negative, undecided


# ---------------------------------------------------------------------------------- pure logic
def parse_policies(spec: str, default_temperature: float) -> list[tuple[str, float]]:
  """ "a@0.7,b" -> [("a", 0.7), ("b", default)]. Only a numeric suffix after the last '@' is
  a temperature, so a path that contains '@' still works."""
  out = []
  for item in (s.strip() for s in spec.split(",")):
    if not item:
      continue
    source, temp = item, default_temperature
    if "@" in item:
      head, tail = item.rsplit("@", 1)
      try:
        source, temp = head, float(tail)
      except ValueError:
        pass
    if temp < 0:
      raise ValueError(f"policy {item!r}: temperature must be >= 0")
    out.append((source, temp))
  if not out:
    raise ValueError("--policies names no model")
  return out


def out_paths(out: str) -> dict[str, Path]:
  path = Path(out)
  base = str(path)[: -len(".jsonl")] if path.name.endswith(".jsonl") else str(path)
  return {"all": path, "kept": Path(base + ".kept.jsonl"), "stats": Path(base + ".stats.json")}


def agreement_filter(rule_labels: Sequence[int], judge_labels: Sequence[int]):
  """(kept indexes, stats) for two label vectors with values in {1, 0, -1}.

  Kept: both decided and equal. stats: n, kept, agreement rate over all items and over the
  items both decided, Cohen's kappa on those (raw agreement is inflated when labels are
  skewed: two verifiers that say "wrong" to 90% agree 82% by chance), label balance of the
  kept set, and the confusion matrix confusion["rule=a"]["judge=b"].
  """
  r, j = np.asarray(rule_labels, np.int64), np.asarray(judge_labels, np.int64)
  if r.shape != j.shape or r.ndim != 1:
    raise ValueError(f"label vectors must be 1-D and equal length, got {r.shape}, {j.shape}")
  for name, x in (("rule", r), ("judge", j)):
    if not np.isin(x, LABELS).all():
      raise ValueError(f"{name} labels must be in {LABELS}")
  decided = (r >= 0) & (j >= 0)
  agree = decided & (r == j)
  kept = np.flatnonzero(agree)
  nd = int(decided.sum())
  kappa = None
  if nd:
    po = float(agree.sum()) / nd
    pr, pj = r[decided].mean(), j[decided].mean()
    pe = pr * pj + (1 - pr) * (1 - pj)
    kappa = None if pe >= 1.0 else float((po - pe) / (1 - pe))
  stats = {
    "n": int(r.size),
    "kept": int(kept.size),
    "both_decided": nd,
    "rule_undecided": int((r < 0).sum()),
    "judge_undecided": int((j < 0).sum()),
    "agreement_rate": float(kept.size / r.size) if r.size else None,
    "agreement_rate_decided": float(kept.size / nd) if nd else None,
    "cohen_kappa": kappa,
    "rule_positive_rate": float((r == 1).mean()) if r.size else None,
    "judge_positive_rate": float((j == 1).mean()) if j.size else None,
    "kept_positive": int((r[kept] == 1).sum()),
    "kept_negative": int((r[kept] == 0).sum()),
    "confusion": {
      f"rule={a}": {f"judge={b}": int(((r == a) & (j == b)).sum()) for b in LABELS} for a in LABELS
    },
  }
  return kept, stats


# The same agreement rule where the second annotator is the arith task's own chain check
# (cli/pretrain_rm.py --label rule+chain): (rule label, chain label) of a disagreement -> kind
DISAGREEMENT_KINDS = {(1, 0): "rule_correct_chain_wrong", (0, 1): "rule_wrong_chain_correct"}


def hybrid_label(triples: list[dict], solutions: list[str]) -> tuple[list[dict], list[dict], dict]:
  """Cooper's hybrid annotation (cooper-method.md, component 2) with the arith task's chain
  check (every line of the gold `solution`, in order) in the LLM judge's place: (kept triples,
  dropped triples, stats). A triple's `label` is its rule verdict (0/1); it is kept, with that
  label, where the chain check says the same, else dropped with its `kind`
  (DISAGREEMENT_KINDS) and counted."""
  from cooper_jax.tasks.arith import chain_is_correct  # pylint: disable=import-outside-toplevel

  if len(triples) != len(solutions):
    raise ValueError(f"{len(triples)} triples but {len(solutions)} solutions")
  rule = [int(t["label"]) for t in triples]
  chain = [int(chain_is_correct(t["completion"], s)) for t, s in zip(triples, solutions)]
  kept_idx, agreement = agreement_filter(rule, chain)
  keep = set(kept_idx.tolist())
  kept, dropped = [], []
  for i, (t, r, c) in enumerate(zip(triples, rule, chain)):
    if i in keep:
      kept.append({**t, "rule_label": r, "chain_label": c})
    else:
      row = {k: v for k, v in t.items() if k != "label"}
      dropped.append({**row, "rule_label": r, "chain_label": c, "kind": DISAGREEMENT_KINDS[r, c]})
  stats = {
    "n": len(triples),
    "kept": len(kept),
    "kept_positive": agreement["kept_positive"],
    "dropped": {k: sum(d["kind"] == k for d in dropped) for k in DISAGREEMENT_KINDS.values()},
    "cohen_kappa": agreement["cohen_kappa"],
  }
  return kept, dropped, stats


def format_stats(stats: dict) -> str:
  """Human-readable summary of an annotation run's stats."""
  a = stats["agreement"]
  fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
  lines = [
    f"triples {a['n']}, kept {a['kept']} (positive {a['kept_positive']}, negative "
    f"{a['kept_negative']}); agreement {fmt(a['agreement_rate'])} of all, "
    f"{fmt(a['agreement_rate_decided'])} of both-decided; kappa {fmt(a['cohen_kappa'])}",
    f"undecided: rule {a['rule_undecided']} {stats['rule_status_counts']}, judge "
    f"{a['judge_undecided']} {stats['judge']['undecided_reasons']}",
    "confusion (rows rule, columns judge = 1 / 0 / -1):",
  ]
  for ra in LABELS:
    row = a["confusion"][f"rule={ra}"]
    lines.append(f"  rule={ra:>2}: " + "  ".join(f"{row[f'judge={b}']:>5}" for b in LABELS))
  if stats.get("judge_control"):
    from cooper_jax.rewards.judge import describe_control  # pylint: disable=import-outside-toplevel

    lines.append(describe_control(stats["judge_control"]))
  for g, s in stats["per_generator"].items():
    lines.append(
      f"{g}: n {s['n']}, rule+ {fmt(s['rule_positive_rate'])}, judge+ "
      f"{fmt(s['judge_positive_rate'])}, agree {fmt(s['agreement_rate'])}, kept "
      f"{s['kept']} ({s['kept_positive']}+), truncated {s['truncated']}"
    )
  return "\n".join(lines)


# ---------------------------------------------------------------------------------- model work
def control_judge(data: str, n: int, judge_fn, seed: int = 0) -> dict:
  """The judge's positive control (rewards.judge.judge_control) on the first n questions of
  `data`, with a warning when the judge cannot tell a right answer from a wrong one.
  judge_fn: e.g. functools.partial(llm_judge, cfg, params, tokenizer)."""
  from cooper_jax.data import load_qa  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.judge import (  # pylint: disable=import-outside-toplevel
    describe_control,
    judge_control,
  )

  t0 = time.perf_counter()
  rows, report = load_qa(data, limit=n)
  c = judge_control(
    judge_fn, [r["question"] for r in rows], [str(r["answer"]) for r in rows], seed=seed
  )
  c.update(data=str(report.location), data_skipped_bad_rows=report.skipped)
  c["wall_s"] = time.perf_counter() - t0
  if not c["discriminates"]:
    logger.warning("%s", describe_control(c))
  return c


def _load_model(source: str, cache: dict):
  """(cfg, params, tokenizer); keeps the last loaded model so repeated sources load once."""
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  if cache.get("source") != source:
    cache.clear()  # drop the previous model first: two in memory at once may not fit
    cfg, params = load_pretrained(source)
    cache.update(source=source, model=(cfg, params, load_tokenizer(source)))
  return cache["model"]


def generate_all(
  cfg,
  params,
  tokenizer,
  questions: list[str],
  *,
  samples: int,
  temperature: float,
  top_p: float,
  max_new_tokens: int,
  batch_size: int,
  rng,
):
  """samples completions per question, question-major: (completions, ended-with-eos flags)."""
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax.prompts import build_prompts, padded_batches  # pylint: disable=import-outside-toplevel
  from cooper_jax.sampling import generate  # pylint: disable=import-outside-toplevel

  prompts = build_prompts(tokenizer, questions)  # chat template + INSTRUCTION_SUFFIX
  order = np.repeat(np.arange(len(questions)), samples)
  completions, ended = [], []
  for bi, idx, real in padded_batches(order, batch_size):
    texts, out = generate(
      cfg,
      params,
      tokenizer,
      [prompts[i] for i in idx],
      jax.random.fold_in(rng, bi),
      max_new_tokens=max_new_tokens,
      temperature=temperature,
      top_p=top_p,
      chat=False,
    )
    toks, mask = np.asarray(out.tokens), np.asarray(out.mask)
    for r in range(real):
      n = int(mask[r].sum())
      completions.append(texts[r])
      ended.append(n > 0 and int(toks[r, n - 1]) in tokenizer.eos_ids)
    logger.info("generated %d / %d", len(completions), order.size)
  return completions, ended


def run(a) -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax.data import load_qa  # pylint: disable=import-outside-toplevel
  from cooper_jax.io import atomic_write, atomic_write_json  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.judge import llm_judge  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import RuleVerifier  # pylint: disable=import-outside-toplevel

  t_start = time.perf_counter()
  policies = parse_policies(a.policies, a.temperature)
  rows, report = load_qa(a.data, limit=a.limit)
  if not rows:
    raise ValueError(f"{a.data}: no rows")
  logger.info(
    "%d questions from %s (skipped %d bad rows)", len(rows), report.location, report.skipped
  )
  questions = [r["question"] for r in rows]
  triples, timings, cache = [], {}, {}
  base = jax.random.key(a.seed)
  for gi, (source, temp) in enumerate(policies):
    gen_name = f"{source}@{temp:g}"
    cfg, params, tok = _load_model(source, cache)
    t0 = time.perf_counter()
    comps, ended = generate_all(
      cfg,
      params,
      tok,
      questions,
      samples=a.samples,
      temperature=temp,
      top_p=a.top_p,
      max_new_tokens=a.max_new_tokens,
      batch_size=a.batch_size,
      rng=jax.random.fold_in(base, gi),
    )
    timings[f"generate[{gen_name}]_s"] = time.perf_counter() - t0
    for k, (c, e) in enumerate(zip(comps, ended)):
      q = k // a.samples
      qid = str(rows[q].get("id", q))
      triples.append(
        {
          "id": f"{qid}#g{gi}s{k % a.samples}",
          "question_id": qid,
          "question": rows[q]["question"],
          "reference": str(rows[q]["answer"]),
          "completion": c,
          "generator": gen_name,
          "temperature": temp,
          "sample": k % a.samples,
          "ended": bool(e),
        }
      )
  cache.clear()

  t0 = time.perf_counter()
  with RuleVerifier(a.workers) as verifier:
    res = verifier.verify(
      [t["completion"] for t in triples], [t["reference"] for t in triples], a.deadline_s
    )
  timings["rule_verify_s"] = time.perf_counter() - t0
  rule = res.labels()

  jcfg, jparams, jtok = _load_model(a.judge, cache)
  judge_fn = functools.partial(
    llm_judge, jcfg, jparams, jtok, batch_size=a.batch_size, max_len=a.judge_max_len
  )
  control = control_judge(a.data, a.judge_control, judge_fn, a.seed) if a.judge_control else None
  judge, jstats = judge_fn(
    [t["question"] for t in triples],
    [t["reference"] for t in triples],
    [t["completion"] for t in triples],
  )
  timings["judge_s"] = jstats["wall_s"]
  p_yes = jstats.pop("p_yes")  # per item: goes into the triples, not the stats file

  kept, agreement = agreement_filter(rule, judge)
  keep = np.zeros(len(triples), bool)
  keep[kept] = True
  for i, t in enumerate(triples):
    t.update(
      rule_label=int(rule[i]),
      rule_status=res.status[i],
      rule_pred=res.pred[i],
      judge_label=int(judge[i]),
      judge_p_yes=p_yes[i],
      agree=bool(keep[i]),
      label=int(rule[i]) if keep[i] else None,
    )
  per_gen = {}
  for g in dict.fromkeys(t["generator"] for t in triples):
    sel = np.array([t["generator"] == g for t in triples])
    _, s = agreement_filter(rule[sel], judge[sel])
    s["truncated"] = int(sum(not t["ended"] for t, m in zip(triples, sel) if m))
    per_gen[g] = s

  paths = out_paths(a.out)
  kept_keys = (
    "question",
    "reference",
    "completion",
    "label",
    "rule_label",
    "judge_label",
    "generator",
    "temperature",
    "id",
  )
  write_lines = lambda recs: (
    lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
  )
  atomic_write(paths["all"], write_lines(triples))
  atomic_write(paths["kept"], write_lines([{k: triples[i][k] for k in kept_keys} for i in kept]))
  timings["wall_s"] = time.perf_counter() - t_start
  stats = {
    "config": vars(a) | {"policies_parsed": policies, "data_location": report.location},
    "data": {"questions": len(rows), "skipped_bad_rows": report.skipped},
    "agreement": agreement,
    "per_generator": per_gen,
    "rule_status_counts": {k: int(v) for k, v in res.counts.items()},
    "rule_worker_restarts": int(res.worker_restarts),
    "judge": jstats,
    "judge_control": control,
    "truncated_completions": int(sum(not t["ended"] for t in triples)),
    "timings": timings,
    "files": {k: str(p) for k, p in paths.items()},
  }
  atomic_write_json(paths["stats"], stats)
  return stats


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--policies",
    required=True,
    help="comma list of model sources, each optionally source@temperature",
  )
  p.add_argument("--data", default="gsm8k/train", help="any cooper_jax.data.load_qa source")
  p.add_argument("--limit", type=int, default=None, help="first N questions")
  p.add_argument("--samples", type=int, default=4, help="completions per question per policy")
  p.add_argument("--judge", required=True, help="judge model source (any causal LM)")
  p.add_argument("--out", required=True, help="FILE.jsonl for all triples")
  p.add_argument("--max_new_tokens", type=int, default=512)
  p.add_argument("--batch_size", type=int, default=8, help="generation and judge batch")
  p.add_argument("--temperature", type=float, default=1.0, help="for policies without @T")
  p.add_argument("--top_p", type=float, default=1.0)
  p.add_argument("--judge_max_len", type=int, default=2048, help="judge prompt tokens")
  p.add_argument(
    "--judge_control",
    type=int,
    default=32,
    help="questions (the first N of --data) for the judge's positive control: a right and a "
    "wrong clean solution each (rewards.judge.judge_control); 0 = off",
  )
  p.add_argument("--deadline_s", type=float, default=5.0, help="math-verify deadline per item")
  p.add_argument("--workers", type=int, default=None, help="math-verify processes")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  if a.samples < 1 or a.batch_size < 1 or a.max_new_tokens < 1:
    p.error("--samples, --batch_size and --max_new_tokens must be >= 1")
  if a.judge_control < 0:
    p.error("--judge_control must be >= 0")
  return a


def main(argv=None) -> dict:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  stats = run(parse_args(argv))
  print(format_stats(stats))
  print("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in stats["timings"].items()))
  print("wrote " + ", ".join(stats["files"].values()))
  return stats


def cli() -> int:
  """Console-script entry point (pyproject.toml): exit status 0 once main returns."""
  main()
  return 0


if __name__ == "__main__":
  main()
