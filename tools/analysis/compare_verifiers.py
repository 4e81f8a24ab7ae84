"""Precision / recall / F1 / accuracy of the verifiers against gold labels (Table-1 style).

Verifiers: the rule verifier (math-verify, cooper_jax.rewards.verify), the LLM judge
(--judge MODEL, cooper_jax.rewards.judge) and a trained reference-based RM (--rm DIR,
sigmoid(score) > 0.5 on prompts.encode_rm_inputs). "Positive" = the verifier says correct.
Precision is the number Cooper leans on (rule positives become the RM's positive examples),
recall is what an RM is supposed to add. An undecided verdict (rule timeout/error, judge
without yes/no tokens) is counted and scored as a negative, as a reward of 0 would be.
95% CIs: percentile bootstrap over *questions* (all completions of a question are resampled
together; they are not independent), --n_resamples draws; resamples where a metric is
undefined (e.g. no predicted positives) are dropped and counted.

Which gold labels can be trusted (--gold):
  exact_int  Computed here, by code that shares nothing with math-verify: the integer in the
             last \\boxed{...} (or, with no box, the last number in the text; thousands commas
             and "42.0" accepted) compared with the integer reference.
             * Synthetic arithmetic task (cooper_jax/tasks/arith.py): trustworthy. Answers are
               integers by construction and solutions end in \\boxed{N}, so exact integer
               comparison IS the definition of correct. Residual error: a correct value in a
               non-integer form (\\boxed{84/2}, \\boxed{5 \\times 3 = 15}) is gold 0; such boxes
               are counted ("boxed_not_single_number") and listed in the items file.
             * GSM8K: references are integers too, so the code applies, but free-form outputs
               make its strictness and the last-number fallback err more often. Not gold by
               itself.
  label      The file's `label` field, as given. Trustworthy only if its source is (human
             labels, or a task with exact answers). On cooper_jax/cli/annotate.py output it is the
             math-verify/judge agreement label: comparing math-verify or the judge against it
             is circular (both score 100% on the kept set by construction).
  cross      For GSM8K: no human-checked labels of model completions are available offline
             (VerifyBench-style sets cannot be downloaded here). Gold = the items where two
             independent methods agree, exact_int and the file's `label`; the rest is dropped
             and counted. Caveats: (1) dropping disagreements removes exactly the hard items,
             so every verifier's numbers are optimistic; (2) exact_int and math-verify both
             read the last \\boxed{}, so their errors correlate and math-verify's precision and
             recall are overstated the most; (3) if `label` came from annotate.py it already
             contains math-verify's verdict, so read the judge and RM rows, not the rule row.

  python tools/analysis/compare_verifiers.py --data runs/arith/heldout.jsonl --gold exact_int \\
      --rm runs/small_task/rm --judge smollm2-135m-instruct --out runs/compare/arith
Writes OUT.md, OUT.json and OUT.items.jsonl (per-item gold and verdicts), atomically.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from decimal import Decimal, InvalidOperation

import numpy as np

from cooper_jax.io import atomic_write, atomic_write_json, read_completions
from cooper_jax.rewards.verify import last_boxed_span
from cooper_jax.stats import CLASSIFIER_METRICS, binary_metrics, bootstrap_binary_metrics

logger = logging.getLogger("compare_verifiers")

# ---------------------------------------------------------------------------------- exact_int
# A number: optional sign (only where it cannot be a binary minus, i.e. not right after a
# word character or a dot), thousands-grouped or plain digits, optional decimals.
_NUM = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
  span = last_boxed_span(text)
  return None if span is None else text[span[0] : span[1]]


def _clean(text: str) -> str:
  """Undo LaTeX number dressing: \\$, {,} thousands, thin spaces, unicode minus."""
  for a, b in (
    ("{,}", ","),
    ("\\,", ""),
    ("\\!", ""),
    ("\\$", ""),
    ("$", ""),
    ("\u2212", "-"),
    ("\\%", ""),
    ("%", ""),
  ):
    text = text.replace(a, b)
  return text


def _as_int(number: str) -> int | None:
  """ "1,000" -> 1000, "42.0" -> 42, "42.5" -> None."""
  try:
    d = Decimal(number.replace(",", ""))
  except InvalidOperation:
    return None
  return int(d) if d == d.to_integral_value() else None


def reference_int(reference) -> int | None:
  """The integer a reference states, None if it is not exactly one integer."""
  nums = _NUM.findall(_clean(str(reference)).strip())
  rest = _NUM.sub("", _clean(str(reference))).strip()
  return _as_int(nums[0]) if len(nums) == 1 and not rest else None


def extract_int(text: str) -> tuple[int | None, str]:
  """(integer answer or None, how it was found): "boxed", "last_number", or why not:
  "boxed_not_single_number", "not_integer", "no_number"."""
  boxed = last_boxed(text)
  if boxed is not None:
    nums = _NUM.findall(_clean(boxed))
    if len(nums) != 1:
      return None, "boxed_not_single_number"
    value = _as_int(nums[0])
    return value, "boxed" if value is not None else "not_integer"
  nums = _NUM.findall(_clean(text))
  if not nums:
    return None, "no_number"
  value = _as_int(nums[-1])
  return value, "last_number" if value is not None else "not_integer"


def exact_int_label(completion: str, reference) -> int:
  """1 if the completion's integer answer equals the integer reference, else 0.
  Raises ValueError for a reference that is not an integer (no gold possible)."""
  ref = reference_int(reference)
  if ref is None:
    raise ValueError(f"reference {reference!r} is not an integer")
  value, _ = extract_int(completion)
  return int(value is not None and value == ref)


def exact_int_labels(completions, references) -> tuple[np.ndarray, list[str], dict]:
  """Vector form: labels int8 (-1 where the reference is not an integer), how, counts."""
  labels, how = np.zeros(len(completions), np.int8), []
  for i, (c, r) in enumerate(zip(completions, references)):
    if reference_int(r) is None:
      labels[i], h = -1, "ref_not_integer"
    else:
      labels[i], h = exact_int_label(c, r), extract_int(c)[1]
    how.append(h)
  counts = {h: how.count(h) for h in dict.fromkeys(how)}
  return labels, how, counts


# ---------------------------------------------------------------------------------- verifiers
def rm_probs(
  rm_dir: str, questions, references, completions, *, batch_size: int, max_len: int
) -> tuple[np.ndarray, dict]:
  """sigmoid(RM score) per triple, input built only by prompts.encode_rm_inputs."""
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax import sharding, steps  # pylint: disable=import-outside-toplevel
  from cooper_jax.prompts import encode_rm_inputs, padded_batches  # pylint: disable=import-outside-toplevel
  from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  cfg, params = load_pretrained(rm_dir)
  if cfg.head != "score":
    raise ValueError(
      f"{rm_dir}: not a reward model (head={cfg.head!r}); --rm needs a "
      "*ForSequenceClassification directory"
    )
  tok = load_tokenizer(rm_dir)
  # The same reward function training uses (sigmoid of the score head), on one device.
  reward_fn = steps.make_reward_fn(cfg, sharding.make_mesh(devices=jax.devices()[:1]), params)
  n = len(questions)
  probs, n_trunc, t0 = np.zeros(n), 0, time.perf_counter()
  for _, idx, real in padded_batches(np.arange(n), batch_size):
    tokens, mask, cut = encode_rm_inputs(
      tok,
      [questions[i] for i in idx],
      [references[i] for i in idx],
      [completions[i] for i in idx],
      max_len,
      pad_to_multiple=64,
    )
    n_trunc += int(cut[:real].sum())
    probs[idx[:real]] = np.asarray(reward_fn(params, tokens, mask))[:real]
  return probs, {
    "truncated_inputs": n_trunc,
    "max_len": max_len,
    "wall_s": time.perf_counter() - t0,
  }


def gold_labels(items: list[dict], mode: str) -> tuple[np.ndarray, dict]:
  """gold int8 per item, -1 = no gold (dropped, counted in the returned report)."""
  file_label = np.array(
    [-1 if it.get("label") is None else int(it["label"]) for it in items], np.int8
  )
  report = {"mode": mode, "file_label_missing": int((file_label < 0).sum())}
  if mode == "label":
    return file_label, report
  ei, _, counts = exact_int_labels(
    [it["completion"] for it in items], [it["reference"] for it in items]
  )
  report["exact_int_how"] = counts
  if mode == "exact_int":
    return ei, report
  both = (ei >= 0) & (file_label >= 0)
  report["cross_disagree_dropped"] = int((both & (ei != file_label)).sum())
  return np.where(both & (ei == file_label), ei, -1).astype(np.int8), report


def format_markdown(result: dict) -> str:
  pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}"
  cell = lambda m, ci: f"{pct(m)} ({pct(ci[0])}-{pct(ci[1])})" if ci else pct(m)
  g = result["gold"]
  lines = [
    f"Gold: `{g['mode']}` on {result['n_gold']} of {result['n_items']} items "
    f"({result['n_gold_positive']} positive), {result['n_questions']} questions; "
    f"95% CI: question bootstrap, {result['config']['n_resamples']} resamples.",
    "",
    "| verifier | precision | recall | F1 | accuracy | tp/fp/fn/tn | undecided |",
    "|---|---|---|---|---|---|---|",
  ]
  for name, r in result["verifiers"].items():
    m, ci = r["metrics"], r["ci95"]
    lines.append(
      f"| {name} | "
      + " | ".join(cell(m[k], ci[k]) for k in CLASSIFIER_METRICS)
      + f" | {m['tp']}/{m['fp']}/{m['fn']}/{m['tn']} | {m['undecided']} |"
    )
  lines += ["", f"Gold report: `{json.dumps(g)}`"]
  return "\n".join(lines) + "\n"


def run(a) -> dict:

  t_start = time.perf_counter()
  items = read_completions(a.data, limit=a.limit)
  if not items:
    raise ValueError(f"{a.data}: no items")
  n_all = len(items)
  gold, gold_report = gold_labels(items, a.gold)
  sel = np.flatnonzero(gold >= 0)
  if sel.size == 0:
    raise ValueError(f"no item has a gold label under --gold {a.gold} ({gold_report})")
  items = [items[i] for i in sel]
  gold = gold[sel]
  qs, refs, comps = ([it[k] for it in items] for k in ("question", "reference", "completion"))
  groups = [it.get("question_id", it["question"]) for it in items]
  verdicts, extra = {}, {}
  if not a.no_rule:
    from cooper_jax.rewards.verify import RuleVerifier  # pylint: disable=import-outside-toplevel

    with RuleVerifier(a.workers) as v:
      res = v.verify(comps, refs, a.deadline_s)
    verdicts["rule (math-verify)"] = res.labels()
    extra["rule (math-verify)"] = {
      "status_counts": res.counts,
      "worker_restarts": res.worker_restarts,
    }
  if a.judge:
    from cooper_jax.rewards.judge import llm_judge  # pylint: disable=import-outside-toplevel
    from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
    from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

    jcfg, jparams = load_pretrained(a.judge)
    labels, jstats = llm_judge(
      jcfg, jparams, load_tokenizer(a.judge), qs, refs, comps, batch_size=a.batch_size
    )
    jstats.pop("p_yes")
    verdicts[f"LLM judge ({a.judge})"] = labels
    extra[f"LLM judge ({a.judge})"] = jstats
    del jparams
  if a.rm:
    probs, rstats = rm_probs(a.rm, qs, refs, comps, batch_size=a.batch_size, max_len=a.rm_max_len)
    verdicts[f"RM ({a.rm})"] = (probs > 0.5).astype(int)
    extra[f"RM ({a.rm})"] = rstats | {"mean_prob": float(probs.mean())}
  result = {
    "config": vars(a),
    "n_items": n_all,
    "n_gold": int(gold.size),
    "n_gold_positive": int(gold.sum()),
    "n_questions": len(set(groups)),
    "gold": gold_report,
    "verifiers": {},
  }
  for name, pred in verdicts.items():
    result["verifiers"][name] = {
      "metrics": binary_metrics(pred, gold),
      "ci95": bootstrap_binary_metrics(pred, gold, groups, a.n_resamples, a.seed),
      "details": extra[name],
    }
  exact_how = exact_int_labels(comps, refs)[1]

  def write_items(f):
    for i, it in enumerate(items):
      rec = {
        "id": it.get("id", str(i)),
        "gold": int(gold[i]),
        "exact_int_how": exact_how[i],
        "reference": refs[i],
        "completion": comps[i],
      }
      rec.update({name: int(pred[i]) for name, pred in verdicts.items()})
      f.write(json.dumps(rec, ensure_ascii=False) + "\n")

  result["wall_s"] = time.perf_counter() - t_start
  atomic_write(a.out + ".items.jsonl", write_items)
  atomic_write(a.out + ".md", lambda f: f.write(format_markdown(result)))
  atomic_write_json(a.out + ".json", result)
  return result


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--data", required=True, help="JSONL of {question, reference, completion, label}")
  p.add_argument(
    "--gold",
    choices=("label", "exact_int", "cross"),
    default="label",
    help="where gold labels come from (see the module docstring)",
  )
  p.add_argument("--rm", default=None, help="trained RM directory (*ForSequenceClassification)")
  p.add_argument("--judge", default=None, help="LLM judge model source")
  p.add_argument("--no_rule", action="store_true", help="skip the math-verify row")
  p.add_argument("--limit", type=int, default=None, help="first N items")
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--rm_max_len", type=int, default=1024, help="RM input tokens (keeps the end)")
  p.add_argument("--deadline_s", type=float, default=5.0)
  p.add_argument("--workers", type=int, default=None)
  p.add_argument("--n_resamples", type=int, default=1000)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", required=True, help="output prefix: OUT.md, OUT.json, OUT.items.jsonl")
  return p.parse_args(argv)


def main(argv=None) -> dict:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  result = run(parse_args(argv))
  print(format_markdown(result))
  print(f"wrote {result['config']['out']}.md/.json/.items.jsonl in {result['wall_s']:.1f}s")
  return result


if __name__ == "__main__":
  main()
