"""VerifyRM-style pretraining of a reference-based reward model with binary cross-entropy.

Input: annotated triples {question, reference, completion, label} (label 1 = correct), either
  --data FILE.jsonl            (e.g. written by the annotation tool), or
  --from_policy DIR            rollouts of a policy on --questions, sampled and scored with the
                               project's evaluator (cooper_jax.evaluate.evaluate_model) and
                               labelled by the rule verifier (exact on the arith task: integer
                               answers in \\boxed{}). The triples are saved for reuse (--data).
                               --label rule+chain: the paper's hybrid annotation, the task's
                               own chain check (arith.chain_is_correct) as the second annotator
                               (the paper's LLM judge): a rollout is kept only where the two
                               agree; disagreements are dropped, counted by kind, and written to
                               OUT_dropped.jsonl (held-out ones are scored as a diagnostic).
The RM starts from --backbone (default: the --from_policy dir) with a fresh zero score head
(`load_pretrained(dir, head="score")`); inputs are built only by
prompts.encode_rm_inputs; training runs through steps.make_rm_step(..., "bce", ...).
Held-out accuracy / precision / recall (sigmoid > 0.5, i.e. logit > 0) are reported before and
after training, on --heldout or on a --heldout_frac split by question (no question in both),
with the pair accuracy (every (correct, wrong) pair of a held-out question: correct scored
higher) and the AUC; errors by kind. --compare RM_DIR,...: other RMs scored on the same held-out
set by the same code; --eval_pairs: the training runs' data.rm_eval_pairs (eval/rm_pair_acc).

To get a deliberately weak RM (for reward-hacking runs), train it little: --steps 300 (a tiny
backbone learns the answer comparison only after ~300-400 updates: before that it is near the
always-"wrong" base rate), or --max_examples 100.

  python -m cooper_jax.cli.pretrain_rm --from_policy runs/small_task/policy \\
      --questions runs/small_task/data/rm.jsonl --out runs/small_task/rm
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SYNTHETIC_SOURCES = ("gold", "wrong_solution")
LABELS = ("rule", "rule+chain")


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--data", help="JSONL of {question, reference, completion, label}")
  src.add_argument("--from_policy", help="policy HF dir whose rollouts are labelled and used")
  p.add_argument("--heldout", default=None, help="held-out triples JSONL (default: split --data)")
  p.add_argument("--heldout_frac", type=float, default=0.2)
  p.add_argument("--backbone", default=None, help="causal LM dir (default: --from_policy)")
  p.add_argument("--out", required=True, help="RM output dir (HF *ForSequenceClassification)")
  p.add_argument(
    "--triples_out",
    default=None,
    help="where --from_policy writes its triples (default OUT_triples.jsonl)",
  )
  p.add_argument("--questions", default=None, help="{question, answer} JSONL for --from_policy")
  p.add_argument("--n_questions", type=int, default=600)
  p.add_argument("--samples", type=int, default=4, help="rollouts per question")
  p.add_argument("--temperature", type=float, default=1.0)
  p.add_argument("--max_new_tokens", type=int, default=96)
  p.add_argument(
    "--label",
    choices=LABELS,
    default="rule",
    help="--from_policy: the rule verdict, or rule+chain: the hybrid label (kept where the "
    "rule verifier and the task's chain check agree; needs arith rows with 'solution')",
  )
  p.add_argument(
    "--synthetic_questions",
    type=int,
    default=400,
    help="--from_policy: questions after the first --n_questions that add a gold "
    "(label 1) and a make_wrong_solution (label 0) triple to TRAINING only "
    "(arith rows; hard negatives, like Cooper's rewritten wrong solutions)",
  )
  p.add_argument("--steps", type=int, default=1200)
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--warmup", type=int, default=20)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--max_examples", type=int, default=None, help="cap on training triples")
  p.add_argument("--max_len", type=int, default=256, help="RM input tokens (keeps the end)")
  p.add_argument(
    "--balance", action="store_true", help="weight classes equally in the loss (for skewed labels)"
  )
  p.add_argument("--eval_every", type=int, default=0, help="held-out eval every N steps")
  p.add_argument(
    "--dropped",
    default=None,
    help="the annotators' disagreements (JSONL): written by --from_policy --label rule+chain "
    "(default OUT_dropped.jsonl), read with --data; the held-out ones are scored",
  )
  p.add_argument("--compare", default="", help="comma-separated RM dirs scored on the held-out set")
  p.add_argument(
    "--eval_pairs", default=None, help="{question, answer, positive, negative} JSONL: pair accuracy"
  )
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  if a.label != "rule" and not a.from_policy:
    p.error(f"--label {a.label} labels rollouts: it needs --from_policy (--data has its labels)")
  if a.from_policy and not a.questions:
    p.error("--from_policy needs --questions")
  if a.data and not a.backbone:
    p.error("--data needs --backbone (the causal LM the RM starts from)")
  if a.steps < 0 or a.batch < 1 or not 0.0 < a.heldout_frac < 1.0:
    p.error("--steps >= 0, --batch >= 1 and 0 < --heldout_frac < 1 are required")
  a.backbone = a.backbone or a.from_policy
  return a


def policy_triples(a) -> tuple[list[dict], list[dict], dict | None]:
  """Rollouts of the policy on the questions, labelled by the rule verifier (--label rule) or
  by the hybrid label (rule+chain): (triples, dropped disagreements, hybrid stats or None)."""
  from cooper_jax.data import load_qa  # pylint: disable=import-outside-toplevel
  from cooper_jax.evaluate import evaluate_dir  # pylint: disable=import-outside-toplevel
  from cooper_jax.rewards.verify import DECIDED  # pylint: disable=import-outside-toplevel

  rows, _ = load_qa(a.questions, limit=a.n_questions)
  if a.label == "rule+chain" and any("solution" not in r for r in rows):
    raise ValueError(f"--label rule+chain: {a.questions} has rows without 'solution' (arith rows)")
  res = evaluate_dir(
    a.from_policy,
    {"rollouts": rows},
    samples=a.samples,
    temperature=a.temperature,
    top_p=1.0,
    max_new_tokens=a.max_new_tokens,
    batch_size=128,
    seed=a.seed,
  )
  by_id = {r.get("id", str(i)): r for i, r in enumerate(rows)}
  triples, solutions, n_undecided = [], [], 0
  for rec in res["records"]["rollouts"]:
    if rec["status"] not in DECIDED:  # a timeout or error is no verdict: not a label
      n_undecided += 1
      continue
    q = by_id[rec["id"]]
    solutions.append(q.get("solution"))
    triples.append(
      {
        "id": f"{rec['id']}-s{rec['sample']}",
        "question": q["question"],
        "reference": str(q["answer"]),
        "completion": rec["completion"],
        "label": int(rec["correct"]),
        "source": "policy_rollout",
      }
    )
  b = res["benchmarks"]["rollouts"]
  print(
    f"rollouts: {b['rollouts']} on {len(rows)} questions, policy accuracy "
    f"{b['accuracy']:.3f}, verifier {b['counts']}, undecided {n_undecided}, "
    f"{b['throughput']['sample_s']:.0f}s sampling",
    flush=True,
  )
  if a.label == "rule":
    return triples, [], None
  from cooper_jax.cli.annotate import hybrid_label  # pylint: disable=import-outside-toplevel

  triples, dropped, stats = hybrid_label(triples, solutions)
  print(f"hybrid label (rule+chain): {stats}", flush=True)
  return triples, dropped, stats


def synthetic_triples(a) -> list[dict]:
  """Gold and one-slip wrong solutions for the questions after the first --n_questions."""
  from cooper_jax.tasks.arith import make_wrong_solution  # pylint: disable=import-outside-toplevel

  if a.synthetic_questions <= 0:
    return []
  with open(a.questions, encoding="utf-8") as f:
    rows = [json.loads(l) for l in f if l.strip()]
  rows = rows[a.n_questions : a.n_questions + a.synthetic_questions]
  if len(rows) < a.synthetic_questions:
    print(
      f"warning: only {len(rows)} questions left for --synthetic_questions {a.synthetic_questions}",
      flush=True,
    )
  rng = np.random.default_rng([a.seed, 5])
  out = []
  for r in rows:
    if "solution" not in r:
      raise ValueError(
        f"{a.questions}: row {r.get('id')!r} has no 'solution'; synthetic "
        "triples need arith rows (or pass --synthetic_questions 0)"
      )
    base = {"question": r["question"], "reference": str(r["answer"])}
    out += [
      {
        **base,
        "id": f"{r.get('id')}-gold",
        "completion": r["solution"],
        "label": 1,
        "source": "gold",
      },
      {
        **base,
        "id": f"{r.get('id')}-wrong",
        "completion": make_wrong_solution(r, rng),
        "label": 0,
        "source": "wrong_solution",
      },
    ]
  return out


def split_by_question(triples, frac: float, seed: int):
  questions = sorted({t["question"] for t in triples})
  rng = np.random.default_rng([seed, 3])
  held = set(rng.permutation(len(questions))[: max(1, int(round(frac * len(questions))))].tolist())
  held_q = {questions[i] for i in held}
  return (
    [t for t in triples if t["question"] not in held_q],
    [t for t in triples if t["question"] in held_q],
  )


def encode(tok, triples, max_len):
  from cooper_jax.prompts import encode_rm_inputs  # pylint: disable=import-outside-toplevel

  return encode_rm_inputs(
    tok,
    [t["question"] for t in triples],
    [t["reference"] for t in triples],
    [t["completion"] for t in triples],
    max_len,
    pad_to_multiple=32,
  )


def _num(x) -> str:
  return "n/a" if x is None else f"{x:.3f}"


def score_triples(score_fn, params, tok, triples, max_len, batch=128) -> np.ndarray:
  """The RM's reward, sigmoid(logit), of each triple (float64 [n])."""
  probs = []
  for s in range(0, len(triples), batch):
    tokens, mask, _ = encode(tok, triples[s : s + batch], max_len)
    probs.append(np.asarray(score_fn(params, tokens, mask)))
  return np.concatenate(probs).astype(np.float64)


def pair_accuracy(p: np.ndarray, triples) -> dict:
  """Share of (correct, wrong) pairs of the same question, every such pair of each question,
  in which the correct one scores higher (a tie is an error, as eval/rm_pair_acc counts it)."""
  by_q: dict[str, tuple[list, list]] = {}
  for score, t in zip(p, triples):
    by_q.setdefault(t["question"], ([], []))[1 - int(t["label"])].append(score)
  wins = n = n_q = 0
  for pos, neg in by_q.values():
    if pos and neg:
      wins += int((np.asarray(pos)[:, None] > np.asarray(neg)[None, :]).sum())
      n, n_q = n + len(pos) * len(neg), n_q + 1
  return {"pair_acc": wins / n if n else None, "n_pairs": n, "n_pair_questions": n_q}


def heldout_metrics(score_fn, params, tok, triples, max_len, batch=128) -> dict:
  """accuracy / precision / recall at sigmoid > 0.5 and the mean BCE, over all triples, the
  pair accuracy (pair_accuracy) and the AUC. Precision is None when nothing is predicted
  correct, recall None when no triple is correct (undefined, not 0); tp / fp / fn / tn say
  why: fp is a wrong completion scored correct, fn a correct one scored wrong."""
  from cooper_jax.stats import binary_metrics, roc_auc  # pylint: disable=import-outside-toplevel

  p = score_triples(score_fn, params, tok, triples, max_len, batch)
  y = np.asarray([t["label"] for t in triples], bool)
  pred = p > 0.5  # as losses.bce_loss: logit > 0 (a zero head predicts "wrong")
  m = binary_metrics(pred.astype(int), y.astype(int))
  eps = 1e-7
  return {
    "n": int(y.size),
    "positive_rate": float(y.mean()),
    "accuracy": float(np.mean(pred == y)),
    "precision": m["precision"],
    "recall": m["recall"],
    **{k: int(m[k]) for k in ("tp", "fp", "fn", "tn")},
    "predicted_positive_rate": float(pred.mean()),
    "bce": float(-np.mean(y * np.log(p + eps) + (~y) * np.log(1 - p + eps))),
    "auc": roc_auc(p, y.astype(int)),
    **pair_accuracy(p, triples),
  }


def disagreement_scores(score_fn, params, tok, dropped, max_len) -> dict:
  """The RM on rollouts the annotators disagreed on (never trained on), per kind: how many,
  the mean reward and the share scored correct (> 0.5). rule_correct_chain_wrong is a right
  final answer reached through a wrong line."""
  from cooper_jax.cli.annotate import DISAGREEMENT_KINDS  # pylint: disable=import-outside-toplevel

  out = {}
  for kind in DISAGREEMENT_KINDS.values():
    rows = [d for d in dropped if d["kind"] == kind]
    p = score_triples(score_fn, params, tok, rows, max_len) if rows else np.zeros(0)
    out[kind] = {
      "n": len(rows),
      "mean_score": float(p.mean()) if rows else None,
      "scored_correct": float((p > 0.5).mean()) if rows else None,
    }
  return out


def eval_pairs_accuracy(score_fn, params, tok, path, max_len) -> dict:
  """eval/rm_pair_acc as a training run logs it (reward_modes.StaticRMReward.evaluate) on a
  {question, answer, positive, negative} file: positive scored above negative."""
  from cooper_jax.io import read_jsonl  # pylint: disable=import-outside-toplevel

  rows = [r for _, r in read_jsonl(path)]
  side = lambda k: [
    {"question": r["question"], "reference": str(r["answer"]), "completion": r[k]} for r in rows
  ]
  pos = score_triples(score_fn, params, tok, side("positive"), max_len)
  neg = score_triples(score_fn, params, tok, side("negative"), max_len)
  return {"n": len(rows), "rm_pair_acc": float(np.mean(pos > neg))}


def rm_scorecard(score_fn, params, tok, a, held_rows, held_dropped) -> dict:
  """Everything this tool measures an RM by, for the trained RM and each --compare RM alike."""
  card = {"heldout": heldout_metrics(score_fn, params, tok, held_rows, a.max_len)}
  if held_dropped:
    card["disagreements"] = disagreement_scores(score_fn, params, tok, held_dropped, a.max_len)
  if a.eval_pairs:
    card["eval_pairs"] = eval_pairs_accuracy(score_fn, params, tok, a.eval_pairs, a.max_len)
  return card


def describe_card(name: str, card: dict) -> str:
  h = card["heldout"]
  line = (
    f"{name}: pair acc {_num(h['pair_acc'])} ({h['n_pairs']} pairs), AUC {_num(h['auc'])}, "
    f"acc {h['accuracy']:.3f}, fp {h['fp']} fn {h['fn']} of {h['n']}"
  )
  for kind, d in card.get("disagreements", {}).items():
    line += f"; {kind} {d['n']} scored correct {_num(d['scored_correct'])}"
  if "eval_pairs" in card:
    line += f"; eval/rm_pair_acc {card['eval_pairs']['rm_pair_acc']:.3f}"
  return line


def main(argv=None) -> dict:
  a = parse_args(argv)
  t_start = time.perf_counter()
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax import optim, sharding, steps  # pylint: disable=import-outside-toplevel
  from cooper_jax.io import (
    atomic_write_json,
    read_completions,
    read_jsonl,
    write_jsonl,
  )
  from cooper_jax.supervised import adamw_warmup_cosine, train_supervised  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained, save_hf_dir  # pylint: disable=import-outside-toplevel

  out = Path(a.out)
  hybrid = None
  if a.from_policy:
    triples, dropped, hybrid = policy_triples(a)
    triples += synthetic_triples(a)
    triples_path = Path(a.triples_out or out.parent / f"{out.name}_triples.jsonl")
    write_jsonl(triples_path, triples)
    print(f"wrote {len(triples)} triples to {triples_path}")
    if hybrid is not None:
      write_jsonl(a.dropped or out.parent / f"{out.name}_dropped.jsonl", dropped)
  else:
    triples = read_completions(a.data, require_label=True)
    dropped = [r for _, r in read_jsonl(a.dropped)] if a.dropped else []
  rollout_s = time.perf_counter() - t_start
  # Synthetic rows (gold / constructed wrong) only ever train: the held-out set is what the RM
  # will score during RL, model outputs, not the generator's own text.
  extra = [t for t in triples if t.get("source") in SYNTHETIC_SOURCES]
  triples = [t for t in triples if t.get("source") not in SYNTHETIC_SOURCES]
  if a.heldout:
    train_rows, held_rows = triples, read_completions(a.heldout, require_label=True)
  else:
    train_rows, held_rows = split_by_question(triples, a.heldout_frac, a.seed)
  train_questions = {t["question"] for t in train_rows}
  held_dropped = [d for d in dropped if d["question"] not in train_questions]
  train_rows = train_rows + extra
  rng = np.random.default_rng([a.seed, 4])
  if a.max_examples is not None and a.max_examples < len(train_rows):
    train_rows = [train_rows[i] for i in rng.permutation(len(train_rows))[: a.max_examples]]
  if not train_rows or not held_rows:
    raise ValueError(
      f"need training and held-out triples, got {len(train_rows)} and {len(held_rows)}"
    )
  labels = np.asarray([t["label"] for t in train_rows], np.float32)
  print(
    f"train {len(train_rows)} triples ({labels.mean():.1%} positive), held-out {len(held_rows)}",
    flush=True,
  )

  tok = load_tokenizer(a.backbone)
  cfg, params = load_pretrained(a.backbone, head="score")
  if cfg.pad_id is None:
    cfg = cfg.replace(pad_id=tok.pad_id)  # HF's SequenceClassification needs it on export
  opt = optim.make_optimizer(adamw_warmup_cosine(a.lr, a.warmup, max(a.steps, 1)))
  mesh = sharding.make_mesh()
  state = sharding.shard_tree(steps.init_state(params, opt), mesh)
  score_fn = steps.make_reward_fn(cfg, mesh, state["params"])
  before = heldout_metrics(score_fn, state["params"], tok, held_rows, a.max_len)
  print(f"held-out before: {before}", flush=True)

  # Class weights: each class carries half the loss when --balance (else all rows weigh 1).
  pos = max(float(labels.mean()), 1e-6)
  w_pos, w_neg = (0.5 / pos, 0.5 / max(1.0 - pos, 1e-6)) if a.balance else (1.0, 1.0)
  n_truncated = 0

  def encode_batch(idx):
    nonlocal n_truncated
    chunk = [train_rows[j] for j in idx]
    tokens, mask, n_cut = encode(tok, chunk, a.max_len)  # widths are multiples of 32
    n_truncated += int(n_cut.sum())
    y = np.asarray([t["label"] for t in chunk], np.float32)
    return {
      "tokens": tokens,
      "mask": mask,
      "labels": y,
      "weight": np.where(y > 0, w_pos, w_neg).astype(np.float32),
    }

  state, log, train_s = train_supervised(
    state,
    n_rows=len(train_rows),
    steps=a.steps,
    batch_size=a.batch,
    rng=rng,  # continues the stream the --max_examples subset was drawn from
    encode=encode_batch,
    make_step=lambda state, batch: steps.make_rm_step(cfg, "bce", opt, mesh, state, batch),
    describe=lambda m: (
      f"loss {m['loss']:.4f} acc {m['accuracy']:.3f} grad_norm {m['grad_norm']:.2f} "
      f"skipped {int(m['n_skipped'])} {m['elapsed_s']:.0f}s"
      + (f" heldout acc {m['heldout']['accuracy']:.3f}" if "heldout" in m else "")
    ),
    log_every=25,
    eval_every=a.eval_every,
    evaluate=lambda state: {
      "heldout": heldout_metrics(score_fn, state["params"], tok, held_rows, a.max_len)
    },
  )
  params = jax.device_get(state["params"])
  card = rm_scorecard(score_fn, params, tok, a, held_rows, held_dropped)
  after = card["heldout"]
  save_hf_dir(cfg, params, out, tokenizer=tok)
  wall_s = time.perf_counter() - t_start
  compare = {}
  for rm_dir in filter(None, a.compare.split(",")):
    other_cfg, other = load_pretrained(rm_dir, head="score")
    other_fn = steps.make_reward_fn(other_cfg, mesh, other)
    compare[rm_dir] = rm_scorecard(
      other_fn, other, load_tokenizer(rm_dir), a, held_rows, held_dropped
    )
  print(describe_card(str(out), card), flush=True)
  for rm_dir, other_card in compare.items():
    print(describe_card(rm_dir, other_card), flush=True)
  report = {
    "args": vars(a),
    "hybrid_label": hybrid,
    "n_train": len(train_rows),
    "n_heldout": len(held_rows),
    "n_heldout_dropped": len(held_dropped),
    "train_positive_rate": float(labels.mean()),
    "n_truncated_inputs": n_truncated,
    "heldout_before": before,
    "heldout_after": after,
    "scorecard": card,
    "compare": compare,
    "train_log": log,
    "rollout_s": rollout_s,
    "train_s": train_s,
    "wall_s": wall_s,
    "compare_s": time.perf_counter() - t_start - wall_s,
  }
  atomic_write_json(out / "rm_report.json", report)
  print(
    f"saved {out}; held-out after: acc {after['accuracy']:.3f} precision "
    f"{_num(after['precision'])} recall {_num(after['recall'])} (n {after['n']}, "
    f"{after['positive_rate']:.1%} positive); train {train_s:.0f}s, wall "
    f"{report['wall_s']:.0f}s",
    flush=True,
  )
  return report


def cli() -> int:
  """Console-script entry point (pyproject.toml): exit status 0 once main returns."""
  main()
  return 0


if __name__ == "__main__":
  main()
