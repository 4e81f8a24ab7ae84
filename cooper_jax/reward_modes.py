"""The reward modes of a run, one small class each (what differs per step, in one table;
`config.reward_mode` selects one by name through cooper_jax.registry, where others plug in):

| mode       | reward of a rollout              | after the policy step                      |
|------------|----------------------------------|--------------------------------------------|
| rule       | math-verify verdict (0/1)        | nothing                                    |
| rule_chain | ... and every line right (arith) | nothing                                    |
| static_rm  | sigmoid(score) of a frozen RM    | nothing                                    |
| cooper     | sigmoid(score) of the RM         | RM step on pairs from this step's rollouts |

Cooper's pairs: a rule-verified positive and a negative made from it (`pairs.negatives`
"perturb" or "llm_rewrite", the paper), or beyond the paper a rule-rejected rollout of the same
group ("on_policy"); `rm.updates_per_step` RM steps on them (1 in the paper).

The reward at step t comes from the RM as it was before step t's RM update (paper, and the
reference code). The RM modes also log the reward-hacking monitors and, given held-out pairs,
the RM's pair accuracy at every evaluation.

In an N-process run each process holds its own whole groups of rollouts (`Rollouts.index`):
it scores them and builds their pairs; the RM inputs enter the jitted functions as global
arrays; `rewards` returns the whole batch's rewards and every metric is over the whole batch,
so all processes agree (cooper_jax/distributed.py).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from cooper_jax import distributed as dist
from cooper_jax import merge, registry, run_steps, sharding, steps
from cooper_jax.io import read_jsonl
from cooper_jax.metrics import reward_hacking_monitors
from cooper_jax.prompts import encode_rm_inputs, widen_left
from cooper_jax.rewards.pairs import build_on_policy_pairs, build_pairs, pair_records
from cooper_jax.rewards.verify import RuleVerifier, boxed_answer
from cooper_jax.tokenizer import load_tokenizer
from cooper_jax.weights import load_from_config

RM_PAD_MULTIPLE = 64  # RM input widths: a few compiled shapes instead of one per batch


@dataclasses.dataclass
class Rollouts:
  """One step's rollouts on the host: G per prompt, prompt-major."""

  rows: list[dict]  # the step's prompts (question, answer, ...), one per group
  questions: list[str]  # per rollout
  refs: list[str]  # per rollout
  texts: list[str]  # decoded responses
  correct: np.ndarray  # bool, the rule verifier's verdict per rollout
  index: np.ndarray  # row of each rollout in the step's global batch (this process's rows)
  n_total: int  # rollouts in the global batch (all processes)

  def gather(self, local_values) -> np.ndarray:
    """The whole batch's values from every process's values for its own rollouts."""
    return dist.gather_rows(self.index, local_values, self.n_total)


class RuleReward:
  """reward = the rule verifier's verdict; no RM. The interface of every reward source
  (cooper_jax.registry): built as cls(c, mesh, verifier); `state` is what the checkpoint
  holds next to the policy (None: nothing); `trains_rm`: `update` takes optimizer steps on
  `state` (its lr schedule is config.rm.optim)."""

  state = None  # no RM train state to checkpoint
  trains_rm = False

  def __init__(self, c=None, mesh=None, verifier: RuleVerifier | None = None):
    del c, mesh, verifier

  def rewards(self, ro: Rollouts) -> tuple[np.ndarray, dict]:
    """(reward of every rollout of the global batch, metrics)."""
    return ro.gather(ro.correct).astype(np.float32), {}

  def update(self, ro: Rollouts, step: int) -> dict:
    del ro, step
    return {}

  def evaluate(self) -> dict:
    return {}

  def checkpoint_meta(self) -> dict:
    return {}


def chain_checked(ro: Rollouts, group_size: int, what: str) -> tuple[np.ndarray, int]:
  """The rule verdicts, and-ed with every computation line being right (the arithmetic task's
  own checker, `tasks.arith.chain_is_correct`, against the row's `solution`), and how many
  rule-correct rollouts the check refused (summed over processes); `what` names the setting in
  the error for a row without a solution."""
  from cooper_jax.tasks.arith import chain_is_correct  # pylint: disable=import-outside-toplevel

  ok = np.asarray(ro.correct, bool).copy()
  for i in np.flatnonzero(ok):
    row = ro.rows[i // group_size]
    if "solution" not in row:
      raise ValueError(
        f"{what} needs a 'solution' in every data row; row {row.get('id', i // group_size)!r} "
        "has none"
      )
    ok[i] = chain_is_correct(ro.texts[i], row["solution"])
  return ok, int(dist.sum_over_processes(np.asarray([int(ro.correct.sum() - ok.sum())]))[0])


class RuleChainReward(RuleReward):
  """reward = the rule verdict and a right chain (`chain_checked`): the arithmetic task's
  precise reward, beyond the paper. What a rule reward that also pays for right answers
  reached through wrong lines does to the policy is its difference from `rule`."""

  def __init__(self, c, mesh=None, verifier: RuleVerifier | None = None):
    super().__init__(c, mesh, verifier)
    self.group = c.rollout.group_size

  def rewards(self, ro: Rollouts) -> tuple[np.ndarray, dict]:
    ok, refused = chain_checked(ro, self.group, "reward_mode='rule_chain'")
    return ro.gather(ok).astype(np.float32), {"reward/chain_refused": refused}


class StaticRMReward(RuleReward):
  """reward = sigmoid(score) of the reference-based RM, which stays as loaded."""

  def __init__(self, c, mesh, verifier: RuleVerifier | None = None):
    del verifier
    self.c, self.mesh = c, mesh
    self.cfg, params, tok_src = load_from_config(c.rm, "score", c.seed + 1)
    self.tokenizer = load_tokenizer(tok_src)
    self.opt = self.optimizer(c)
    self.state = sharding.shard_tree(steps.init_state(params, self.opt), mesh)
    self.reward_fn = run_steps.reward_fn(c, self.cfg, mesh, params)
    self.eval_pairs = (
      _read_rows(c.data.rm_eval_pairs, ("question", "answer", "positive", "negative"))
      if c.data.rm_eval_pairs
      else None
    )
    probe = c.data.rm_probe
    self.probe = _read_rows(probe, ("question", "answer", "response")) if probe else None
    self._eval_inputs = {}  # the held-out sets' RM inputs, encoded once (`_held_out_scores`)
    self._eval_memo = (None, {})  # (the state evaluate() scored, its metrics)

  @staticmethod
  def optimizer(c):
    """Frozen: no optimizer state (AdamW moments would take two more copies of the RM)."""
    return run_steps.rm_optimizer(c, trains_rm=False)

  def score(self, questions, refs, texts, n_total: int | None = None) -> tuple[np.ndarray, int]:
    """(reward in (0, 1) per text, number of RM inputs cut to rm.max_len). n_total=None: the
    texts are the same on every process (held-out pairs); else they are this process's rows
    of a batch of n_total, and the rewards returned are those rows'. With
    rm.merge_duplicate_rows equal (question, reference, text) rows are scored once."""
    return self._score_inputs(self._inputs(questions, refs, texts, n_total))

  def _inputs(self, questions, refs, texts, n_total):
    """`score`'s RM inputs: (tokens, mask: global arrays; each text's row, or None; which
    inputs were cut to rm.max_len; n_total)."""
    slot = None
    if self.c.rm.merge_duplicate_rows:
      n = len(texts)
      keep, slot = merge.distinct_items(list(zip(questions, refs, texts)))
      n_dev = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
      if n_total is None:
        rows = merge.padded_rows(len(keep), n, n_dev)
      else:  # this process's rows; every process then pads to the largest count
        procs = dist.process_count()
        rows = dist.max_over_processes(merge.padded_rows(len(keep), n, max(1, n_dev // procs)))
        n_total = rows * procs
      questions, refs, texts = zip(*(keep + keep[:1] * (rows - len(keep))))
    tok, mask, cut = encode_rm_inputs(
      self.tokenizer, questions, refs, texts, self.c.rm.max_len, pad_to_multiple=RM_PAD_MULTIPLE
    )
    bs = sharding.batch_sharding(self.mesh)
    if n_total is None:
      tok, mask = dist.put_global(tok, bs), dist.put_global(mask, bs)
    else:
      width = dist.max_over_processes(tok.shape[1])  # one width for the global array
      tok, mask = (
        dist.put_local_rows(x, bs, (n_total, width))
        for x in widen_left(tok, mask, width, self.tokenizer.pad_id)
      )
    return tok, mask, slot, cut, n_total

  def _score_inputs(self, inputs) -> tuple[np.ndarray, int]:
    tok, mask, slot, cut, n_total = inputs
    r = self.reward_fn(self.state["params"], tok, mask)
    r = dist.fetch(r) if n_total is None else dist.fetch_local_rows(r)
    if slot is not None:
      return r[slot], int(cut[slot].sum())
    return r, int(cut.sum())

  def rewards(self, ro: Rollouts) -> tuple[np.ndarray, dict]:
    r, n_trunc = self.score(ro.questions, ro.refs, ro.texts, ro.n_total)
    r, correct = ro.gather(r), ro.gather(ro.correct)
    m = reward_hacking_monitors(r, correct, self.c.rollout.group_size)
    m["rm/inputs_truncated"] = int(dist.sum_over_processes(n_trunc))
    return r, m

  def evaluate(self) -> dict:
    """RM on held-out (positive, negative) pairs: pair accuracy and classifier accuracy; on the
    probe (wrong responses with one pattern): mean reward and the share scored above 0.5.
    Scored again only when the RM state changed since the last call (an RM step, a restore):
    a frozen RM's numbers are computed once per run."""
    if self._eval_memo[0] is self.state:
      return dict(self._eval_memo[1])
    m = {}
    if self.eval_pairs:
      r = self._held_out_scores("pairs")
      pos, neg = r[: len(self.eval_pairs)], r[len(self.eval_pairs) :]
      m["eval/rm_pair_acc"] = float(np.mean(pos > neg))
      m["eval/rm_cls_acc"] = float(np.mean(np.concatenate([pos > 0.5, neg <= 0.5])))
    if self.probe:
      r = self.probe_scores()
      m["eval/rm_probe_score"] = float(np.mean(r))
      m["eval/rm_probe_above_half"] = float(np.mean(r > 0.5))
    self._eval_memo = (self.state, m)
    return dict(m)

  def probe_scores(self) -> np.ndarray:
    """The RM's reward on each probe response (the same on every process)."""
    return self._held_out_scores("probe")

  def _held_out_scores(self, which: str) -> np.ndarray:
    """The current RM's rewards on a held-out set ("pairs": every positive, then every
    negative; "probe"), its inputs encoded at the first call."""
    if which not in self._eval_inputs:
      if which == "pairs":
        rows = self.eval_pairs * 2
        texts = [p["positive"] for p in self.eval_pairs] + [p["negative"] for p in self.eval_pairs]
      else:
        rows, texts = self.probe, [p["response"] for p in self.probe]
      q, a = [p["question"] for p in rows], [str(p["answer"]) for p in rows]
      self._eval_inputs[which] = self._inputs(q, a, texts, None)
    return self._score_inputs(self._eval_inputs[which])[0]

  def checkpoint_meta(self) -> dict:
    return {"rm_model": dataclasses.asdict(self.cfg)}


class CooperReward(StaticRMReward):
  """The RM reward, and after each policy step one RM step on (positive, negative) pairs built
  from the step's own rollouts (rule-verified positive, generated negative)."""

  trains_rm = True

  def __init__(self, c, mesh, verifier: RuleVerifier):
    super().__init__(c, mesh)
    self.verifier = verifier
    # None (on_policy): the group's own rule-rejected rollouts, no generator.
    generator = registry.resolve("pairs.negatives", c.pairs.negatives)
    self.negatives = None if generator is None else generator.from_config(c, mesh)
    self._rm_steps = {}  # one jitted rm_step per pair-row count (see pair_rows)
    self._pair_records = []

  @staticmethod
  def optimizer(c):
    return run_steps.rm_optimizer(c, trains_rm=True)

  def update(self, ro: Rollouts, step: int) -> dict:
    """One RM step on pairs from this process's groups (every process takes part).

    A step with no valid pair takes no RM step: params, AdamW moments and the lr schedule
    (which counts only the steps taken) stay as they are. The reference runs its optimizer and
    scheduler step anyway: a zero gradient, but AdamW's momentum and weight decay still move
    the weights (docs/parity.md)."""
    c = self.c
    group = c.rollout.group_size
    first_prompt = int(ro.index[0]) // group
    # One process: the draws of a 1-process run as before. N: each process its own stream.
    seed = [c.seed, step] if dist.process_count() == 1 else [c.seed, step, first_prompt]
    args = ([r["question"] for r in ro.rows], [r["answer"] for r in ro.rows], ro.texts)
    rng = np.random.default_rng(seed)
    positive_ok, n_refused = self._positive_ok(ro)
    if self.negatives is None:
      pairs, stats = build_on_policy_pairs(
        *args, ro.correct, group, strategy=c.pairs.positive, rng=rng, positive_ok=positive_ok
      )
    else:
      pairs, stats = build_pairs(
        *args,
        positive_ok,
        group,
        self.negatives,
        self.verifier,
        strategy=c.pairs.positive,
        rng=rng,
        max_tries=c.pairs.max_tries,
        deadline_s=c.verifier.deadline_s,
        accept_no_answer=c.pairs.accept_no_answer,
        seed=(c.seed, step),
        prompt_ids=ro.index[::group] // group,
      )
    prompt_ids = ro.index[::group] // group
    # pairs.jsonl: this process's first train.save_pairs prompts (the primary's are written
    # once the step's update has joined: Run.finish_rm_update).
    self._pair_records = pair_records(pairs, step + 1, prompt_ids, c.train.save_pairs)
    reasons = list(stats["rejects"])
    counts = [stats["n_valid"], stats["n_prompts"], stats["negative_tries"]]
    counts += [stats["dropped_no_positive"], stats["dropped_max_tries"]]
    counts = dist.sum_over_processes(np.asarray(counts + [stats["rejects"][k] for k in reasons]))
    n_valid, n_prompts, tries, rejects = int(counts[0]), int(counts[1]), counts[2], counts[5:]
    m = {
      "pairs/positives_chain_dropped": n_refused if c.pairs.positive_check == "rule+chain" else 0,
      "pairs/positives_unboxed_dropped": n_refused if c.pairs.positive_check == "rule+boxed" else 0,
      "pairs/valid_rate": n_valid / n_prompts if n_prompts else 0.0,
      "pairs/n_valid": n_valid,
      "pairs/negative_tries": int(tries),
      # prompts without a pair: no positive, or no negative accepted (on_policy: none in group)
      "pairs/no_positive": int(counts[3]),
      "pairs/no_negative": int(counts[4]),
    }
    m.update({f"pairs/reject_{k}": int(v) for k, v in zip(reasons, rejects)})
    if n_valid > 0:
      rb, n_trunc = self._pair_batch(pairs, n_prompts, ro.index[::group] // group)
      m["rm/pair_inputs_truncated"] = int(dist.sum_over_processes(n_trunc))
      n_rows = int(rb["valid"].shape[0])
      m["rm/pair_rows"] = n_rows
      if n_rows not in self._rm_steps:
        self._rm_steps[n_rows] = run_steps.rm_step(c, self.cfg, self.opt, self.mesh, self.state, rb)
      per_update = []
      for _ in range(c.rm.updates_per_step):  # 1 = the paper; K > 1 reuses the pairs K times
        self.state, rmm = self._rm_steps[n_rows](self.state, rb)
        per_update.append(jax.device_get(rmm))
      # the first update's metrics: the RM on fresh pairs, before it has fitted them
      m.update({f"rm_train/{k}": v for k, v in per_update[0].items()})
    m["rm_train/updated"] = float(n_valid > 0)
    return m

  def pop_pair_records(self) -> list[dict]:
    """pairs.jsonl rows of the last update (once)."""
    rows, self._pair_records = self._pair_records, []
    return rows

  def _positive_ok(self, ro: Rollouts) -> tuple[np.ndarray, int]:
    """Which rollouts may be a pair's positive, and how many rule-correct ones the chain check
    refused (summed over processes). pairs.positive_check "rule": the rule verdict (the paper);
    "rule+chain": also every computation line right (`chain_checked`), the precise-positives
    variant; "rule+boxed": also the answer stated in a non-empty \\boxed{} (`verify.boxed_answer`:
    math-verify reads an answer-less text's last number, while a rewriter's negatives box theirs,
    a format cue the RM can learn; tools/analysis/pair_format.py)."""
    check = self.c.pairs.positive_check
    if check == "rule":
      return ro.correct, 0
    if check == "rule+chain":
      return chain_checked(ro, self.c.rollout.group_size, "pairs.positive_check='rule+chain'")
    ok = np.asarray(ro.correct, bool) & np.array([boxed_answer(t) for t in ro.texts], bool)
    refused = int(ro.correct.sum() - ok.sum())
    return ok, int(dist.sum_over_processes(np.asarray([refused]))[0])

  def _pair_batch(self, pairs, n_total: int, prompt_index: np.ndarray):
    """This process's valid pairs first, then as few invalid rows as the bucketed row count
    needs (`pair_rows`), so rm_step's cost follows the valid pairs, not the prompts.
    Positives and negatives are tokenised together, so both halves share one width (agreed by
    all processes); each process puts the same number of rows into the global arrays."""
    mine = dist.local_rows(sharding.batch_sharding(self.mesh, 1), n_total)
    if not np.array_equal(mine, prompt_index):
      raise ValueError(f"pair rows {mine.tolist()} are not this process's prompts")
    valid = np.asarray(pairs.valid, bool)
    n_local, procs = len(mine), dist.process_count()
    shards = n_local * self.mesh.shape["data"] * self.mesh.shape["fsdp"] // n_total
    unit = self.c.rm.micro_batch_size // procs if self.c.rm.micro_batch_size else shards
    rows = pair_rows(dist.max_over_processes(int(valid.sum())), n_local, unit)
    keep = np.argsort(~valid, kind="stable")[:rows]  # valid first, each group in order
    questions = [pairs.questions[i] for i in keep]
    refs = [pairs.references[i] for i in keep]
    pos = [pairs.positives[i] if valid[i] else "" for i in keep]
    neg = [pairs.negatives[i] if valid[i] else "" for i in keep]
    tok, mask, cut = encode_rm_inputs(
      self.tokenizer,
      questions * 2,
      refs * 2,
      pos + neg,
      self.c.rm.max_len,
      pad_to_multiple=RM_PAD_MULTIPLE,
    )
    width = dist.max_over_processes(tok.shape[1])
    tok, mask = widen_left(tok, mask, width, self.tokenizer.pad_id)
    batch = {
      "pos_tokens": tok[:rows],
      "pos_mask": mask[:rows],
      "neg_tokens": tok[rows:],
      "neg_mask": mask[rows:],
      "valid": valid[keep].astype(np.float32),
    }
    n_global = rows * procs
    batch = {
      k: dist.put_local_rows(
        v, sharding.batch_sharding(self.mesh, v.ndim), (n_global,) + v.shape[1:]
      )
      for k, v in batch.items()
    }
    return batch, int(cut.sum())


def pair_rows(k_max: int, n_local: int, unit: int) -> int:
  """Rows per process of an RM pair batch: the most valid pairs any process has (k_max),
  rounded up to `unit` times a power of two (a few compiled shapes), at most n_local (the
  prompts). unit: the process's row shards, or its share of rm.micro_batch_size."""
  if unit < 1 or n_local % unit:
    raise ValueError(f"pair rows: unit {unit} must divide this process's {n_local} prompts")
  blocks = 1
  while blocks * unit < k_max:
    blocks *= 2
  return min(n_local, blocks * unit)


def make_reward_mode(c, mesh, verifier: RuleVerifier) -> RuleReward:
  """The reward source `config.reward_mode` names (cooper_jax.registry)."""
  return registry.resolve("reward_mode", c.reward_mode)(c, mesh, verifier)


def _read_rows(path: str, keys: tuple[str, ...]) -> list[dict]:
  """A JSONL file's rows, each checked for `keys` (the file and line named if one lacks any)."""
  rows = read_jsonl(path)
  for n, p in rows:
    missing = set(keys) - set(p)
    if missing:
      raise ValueError(f"{path}: line {n}: missing {sorted(missing)}")
  if not rows:
    raise ValueError(f"{path}: no rows")
  return [p for _, p in rows]
