"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, eq. 11 and section 3.2), by config
`rollout.dynamic_sampling` (off by default: the loop draws one batch, as before):

A group whose rewards are all equal gets advantage 0 for every rollout (losses.grpo_advantages)
and so carries no policy gradient; it only dilutes the batch. With the filter on, each step
draws batches of rollout.prompts_per_step prompts (each sampled, verified and scored as an
unfiltered step's batch) and keeps the informative groups, in draw order, until it holds
prompts_per_step of them; informative groups beyond that are dropped (verl's recipe/dapo
`batch[:traj_bsz]`). At most `max_batches` batches: if the informative groups still fall
short, the batch is filled with the first flat groups drawn at loss weight 0 (no gradient, out
of every token and row count: the policy trains on the informative groups alone, at the fixed
shapes jit needs). verl raises there instead; here it is counted (`sampling/padded_groups`).

What makes a group flat (`metric`):
- "reward" (default): the reward the policy trains on, the overlong penalty included. In rule
  mode that is the rule verdict; in static_rm and cooper modes the RM score, which is
  continuous: its groups are flat only where the RM gives every rollout the same score (a
  saturated RM), unless `min_std` > 0 also drops groups whose reward std (ddof 0) is below it.
- "rule": the rule verdict whatever the reward (verl's `filter_groups.metric=acc`).
A dropped group is counted by its rule verdicts: all right (`sampling/dropped_all_correct`),
all wrong (`dropped_all_wrong`) or mixed with a flat reward (`dropped_flat`: RM modes only).

The RM update (cooper) builds its pairs from the policy batch's prompts_per_step groups: the
kept groups (and any flat ones padding it), not every group drawn. So the RM step keeps its
shape and its meaning (one step on at most prompts_per_step pairs, comparable with runs
without the filter), the pair generator's cost stays bounded, and the RM learns to judge the
rollouts the policy trains on (the paper: pairs "from the same rollouts"). The price: a group
dropped because the RM scored it flat although the rule verifier found a positive is where
the RM most needs a pair; those are counted (`sampling/dropped_with_positive`), and the kept
groups without a rule-verified positive (no RM pair) as `sampling/kept_no_positive`.

Metrics of a step: the verifier's counts summed over every batch drawn, `rule/acc`,
`reward/mean` and the RM monitors (`rm/*`) averaged over them (every batch holds the same
number of rollouts), so they describe the policy's samples, comparable with unfiltered runs;
`sampling/kept_rule_acc` and `kept_reward_mean` are the policy batch's. One process only
(config.validate_processes). Deterministic: batch k of step t samples with key
fold_in(fold_in(key(seed), t), 0) for k = 0 (an unfiltered step's) and fold_in of that with k
after it; the prompt iterator moves by whole batches, and its position is checkpointed.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from cooper_jax import distributed as dist
from cooper_jax import merge, overlong, sharding
from cooper_jax.prompts import widen_left
from cooper_jax.reward_modes import Rollouts

METRICS = ("reward", "rule")


def enabled(c) -> bool:
  return bool(c.rollout.dynamic_sampling.enable)


def validate(c) -> None:
  ds = c.rollout.dynamic_sampling
  if not isinstance(ds.enable, bool):
    raise ValueError(
      f"config.rollout.dynamic_sampling.enable must be True or False, got {ds.enable!r}"
    )
  n = ds.max_batches
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"config.rollout.dynamic_sampling.max_batches must be an int >= 1, got {n!r}")
  if ds.metric not in METRICS:
    raise ValueError(
      f"config.rollout.dynamic_sampling.metric={ds.metric!r}: expected one of {METRICS}"
    )
  if ds.min_std < 0:
    raise ValueError(f"config.rollout.dynamic_sampling.min_std must be >= 0, got {ds.min_std}")


def flat_groups(values, group: int, min_std: float = 0.0) -> np.ndarray:
  """Which groups of `values` (prompt-major, `group` per prompt) carry no signal: all values
  equal (tested on the values themselves, as grpo_advantages does), or std (ddof 0) < min_std."""
  v = np.asarray(values, np.float64).reshape(-1, group)
  flat = v.max(axis=1) == v.min(axis=1)
  if min_std > 0:
    flat |= v.std(axis=1) < min_std
  return flat


def score_rollouts(run, rows, own, texts, n_total):
  """(Rollouts, the reward source's reward of every rollout of the global batch, metrics):
  the rule verdicts of this process's rollouts (`own`: their rows) and the rewards."""
  c, group = run.c, run.group
  mine = [rows[i] for i in own[::group] // group]
  refs = [r["answer"] for r in mine for _ in range(group)]
  ver = run.verifier.verify(texts, refs, deadline_s=c.verifier.deadline_s)
  ro = Rollouts(
    rows=mine,
    questions=[r["question"] for r in mine for _ in range(group)],
    refs=refs,
    texts=texts,
    correct=np.asarray(ver.correct, bool),
    index=own,
    n_total=n_total,
  )
  keys = list(ver.counts)
  counts = dist.sum_over_processes(np.asarray([ver.counts[k] for k in keys]))
  m = {f"verify/{k}": int(v) for k, v in zip(keys, counts)}
  m["rule/acc"] = float(ro.gather(ro.correct).mean())
  rewards, rm = run.reward.rewards(ro)  # the whole batch's, on every process
  m.update(rm)
  m["reward/mean"] = float(rewards.mean())
  return ro, rewards, m


@dataclasses.dataclass
class Drawn:
  """A step's policy batch chosen from the batches drawn: what an unfiltered step has after
  sampling and scoring (rows, prompt tokens, sampler output, Rollouts, rewards, metrics), and
  each rollout's loss weight (0 for the flat groups that pad a short batch)."""

  rows: list[dict]
  tok: np.ndarray
  mask: np.ndarray
  out: object  # sampling.SampleOutput, [prompts_per_step * G, max_new_tokens] global arrays
  ro: Rollouts
  rewards: np.ndarray
  metrics: dict
  row_weight: np.ndarray


def draw(run, rng) -> Drawn:
  """Batches of prompts_per_step prompts, sampled, verified and scored, until prompts_per_step
  informative groups are held or max_batches are drawn (the module's docstring)."""
  c, g, p = run.c, run.group, run.c.rollout.prompts_per_step
  ds = c.rollout.dynamic_sampling
  n = p * g
  own = np.arange(n)
  key0 = jax.random.fold_in(rng, 0)
  batches, kept, dropped = [], [], []  # kept, dropped: (batch, group) in draw order
  count = dict.fromkeys(("all_correct", "all_wrong", "flat", "with_positive"), 0)
  for k in range(ds.max_batches):
    rows = run.iterator.next_batch(p)
    tok, mask, out = run.rollout(rows, key0 if k == 0 else jax.random.fold_in(key0, k))
    out_tok, out_mask = dist.fetch_local_rows(out.tokens), dist.fetch_local_rows(out.mask)
    run.finish_rm_update()  # the last step's RM update ends before the RM scores anything
    resp_len = out_mask.sum(1)
    texts = [run.tokenizer.decode(out_tok[i][out_mask[i]].tolist()) for i in range(n)]
    ro, rewards, m = score_rollouts(run, rows, own, texts, n)
    signal = rewards + overlong.penalty(resp_len, c) if ds.metric == "reward" else ro.correct
    flat = flat_groups(signal, g, ds.min_std)
    right = ro.correct.reshape(p, g)
    for j in range(p):
      if not flat[j]:
        kept.append((k, j))
        continue
      dropped.append((k, j))
      what = "all_correct" if right[j].all() else "all_wrong" if not right[j].any() else "flat"
      count[what] += 1
      count["with_positive"] += int(right[j].any())
    batches.append((rows, tok, mask, out, ro, rewards, m))
    if len(kept) >= p:
      break
  t = time.perf_counter()
  drawn = len(batches)
  chosen = kept[:p] + dropped[: max(0, p - len(kept))]
  weight = np.repeat((np.arange(p) < min(p, len(kept))).astype(np.float32), g)
  rows_i = np.concatenate([k * n + j * g + np.arange(g) for k, j in chosen])
  width = max(b[1].shape[1] for b in batches)
  pad = run.tokenizer.pad_id
  tok, mask = (
    np.concatenate(x) for x in zip(*(widen_left(b[1], b[2], width, pad) for b in batches))
  )
  outs = [b[3] for b in batches]
  rows_sh = sharding.batch_sharding(run.mesh, 1)
  index = dist.put_global(rows_i.astype(np.int32), sharding.replicated(run.mesh))
  out = type(outs[0])(
    *(
      merge.take_rows(jnp.concatenate(x) if drawn > 1 else x[0], index, rows_sh) for x in zip(*outs)
    )
  )
  rollouts = [b[4] for b in batches]
  pick = lambda get: [get(rollouts[k])[j * g + i] for k, j in chosen for i in range(g)]
  ro = Rollouts(
    rows=[batches[k][0][j] for k, j in chosen],
    questions=pick(lambda r: r.questions),
    refs=pick(lambda r: r.refs),
    texts=pick(lambda r: r.texts),
    correct=np.asarray(pick(lambda r: r.correct), bool),
    index=own,
    n_total=n,
  )
  rewards = np.concatenate([b[5] for b in batches])[rows_i]
  m = merge_metrics([b[6] for b in batches])
  right = ro.correct.reshape(p, g).any(axis=1)
  m.update(
    {
      "sampling/batches_drawn": drawn,
      "sampling/groups_drawn": drawn * p,
      "sampling/informative_frac": len(kept) / (drawn * p),
      "sampling/dropped_all_correct": count["all_correct"],
      "sampling/dropped_all_wrong": count["all_wrong"],
      "sampling/dropped_flat": count["flat"],
      "sampling/dropped_with_positive": count["with_positive"],
      "sampling/kept_surplus": max(0, len(kept) - p),
      "sampling/padded_groups": max(0, p - len(kept)),
      "sampling/kept_no_positive": int((~right[: min(p, len(kept))]).sum()),
      "sampling/kept_rule_acc": float(ro.correct.mean()),
      "sampling/kept_reward_mean": float(rewards.mean()),
      "time/select_s": time.perf_counter() - t,
    }
  )
  return Drawn(ro.rows, tok[rows_i], mask[rows_i], out, ro, rewards, m, weight)


def merge_metrics(per_batch: list[dict]) -> dict:
  """One dict from each drawn batch's: counts (ints) summed, the rest (means, rates) averaged
  over the batches that have the key (every batch holds the same number of rollouts)."""
  out = {}
  for key in dict.fromkeys(k for m in per_batch for k in m):
    vals = [m[key] for m in per_batch if key in m]
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
      out[key] = int(sum(vals))
    else:
      out[key] = float(np.mean(vals))
  return out


def shaped(c, rewards, resp_len, m: dict) -> np.ndarray:
  """The rewards the advantages see: with rollout.overlong's penalty on, the reward source's
  plus the soft overlong punishment (its batch mean into m); else the rewards themselves."""
  if not overlong.penalty_on(c):
    return rewards
  penalty = overlong.penalty(resp_len, c)
  m["response/overlong_penalty_mean"] = float(penalty.mean())
  return rewards + penalty


def row_weight(c, resp_len, drawn: Drawn | None, m: dict) -> np.ndarray | None:
  """Each rollout's policy loss weight: 0 for a response cut at max_new_tokens under
  rollout.overlong.filter (counted in m), and for a flat group that pads a dynamically sampled
  batch. None where every weight is 1: the batch then holds no weights and the policy step is
  the unweighted one, bit for bit (a batch with weights compiles its own step)."""
  weight = overlong.row_weight(resp_len, c)
  if weight is not None:
    m["policy/overlong_masked_rows"] = int((weight == 0).sum())
  if drawn is not None:
    weight = drawn.row_weight if weight is None else weight * drawn.row_weight
  return None if weight is None or weight.all() else weight
