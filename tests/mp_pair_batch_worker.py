"""One process of tests/test_multiprocess.py's RM pair-batch check (not a test on its own).

  python tests/mp_pair_batch_worker.py <process_id> <num_processes> <port> <out.json>

Every process builds the tiny config's Cooper RM on a mesh over all processes' devices and
takes the same RM step twice from the same state: on its compacted pair rows
(`CooperReward._pair_batch`: valid pairs first, bucketed row count) and on the layout with one
row per prompt (invalid rows as empty texts). It writes the row counts and the largest
parameter difference between the two updates.
"""

import json
import sys
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cooper_jax import distributed as dist  # noqa: E402
from cooper_jax import sharding, steps  # noqa: E402
from cooper_jax.config import load_config  # noqa: E402
from cooper_jax.models.tolerance import float32_gradient_roundoff  # noqa: E402
from cooper_jax.prompts import encode_rm_inputs, widen_left  # noqa: E402
from cooper_jax.reward_modes import RM_PAD_MULTIPLE, CooperReward  # noqa: E402
from cooper_jax.rewards.pairs import PairBatch  # noqa: E402

VALID = [False, True, False, False, True, False, False, False]  # 8 prompts, 4 per process


def pairs_of(rows, valid_of=VALID) -> PairBatch:
  """Pairs for the prompts `rows`: a sum, its right and wrong answer where valid_of says."""
  valid = [valid_of[i] for i in rows]
  right = [f"{i} + {i} = {2 * i}. \\boxed{{{2 * i}}}" for i in rows]
  wrong = [f"{i} + {i} = {2 * i + 1}. \\boxed{{{2 * i + 1}}}" for i in rows]
  return PairBatch(
    questions=[f"What is {i} + {i}?" for i in rows],
    references=[str(2 * i) for i in rows],
    positives=[t if v else "" for t, v in zip(right, valid)],
    negatives=[t if v else "" for t, v in zip(wrong, valid)],
    valid=np.asarray(valid, bool),
    positive_index=np.where(valid, np.asarray(rows), -1),
    drop_reason=[None if v else "no_positive" for v in valid],
  )


def all_prompts_rows(rm, pairs) -> dict:
  """This process's rows of the layout before compaction: one per prompt, invalid ones with
  empty texts, at the width all processes agree on."""
  n = len(pairs.questions)
  tok, mask, _ = encode_rm_inputs(
    rm.tokenizer,
    pairs.questions * 2,
    pairs.references * 2,
    pairs.positives + pairs.negatives,
    rm.c.rm.max_len,
    pad_to_multiple=RM_PAD_MULTIPLE,
  )
  tok, mask = widen_left(tok, mask, dist.max_over_processes(tok.shape[1]), rm.tokenizer.pad_id)
  return {
    "pos_tokens": tok[:n],
    "pos_mask": mask[:n],
    "neg_tokens": tok[n:],
    "neg_mask": mask[n:],
    "valid": pairs.valid.astype(np.float32),
  }


def main():
  pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
  jax.distributed.initialize(f"localhost:{port}", num_processes=nproc, process_id=pid)
  c = load_config(str(ROOT / "experiments" / "tiny.py"))
  mesh = sharding.make_mesh(data=-1)
  rm = CooperReward(c, mesh, verifier=None)
  n_total = len(VALID)
  rows = dist.local_rows(sharding.batch_sharding(mesh, 1), n_total)
  pairs = pairs_of(rows.tolist())
  compact, _ = rm._pair_batch(pairs, n_total, rows)  # pylint: disable=protected-access
  params = {}
  full = {
    k: dist.put_local_rows(v, sharding.batch_sharding(mesh, v.ndim), (n_total,) + v.shape[1:])
    for k, v in all_prompts_rows(rm, pairs).items()
  }
  for name, batch in (("all", full), ("compact", compact)):
    state = jax.tree.map(lambda x: x.copy(), rm.state)  # rm_step donates its state
    step = steps.make_rm_step(rm.cfg, "bt", rm.opt, mesh, state, batch)
    state, m = step(state, batch)
    params[name] = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), state["params"])
    params[name + "_n_valid"] = float(m["n_valid"])
  diffs = jax.tree.leaves(
    jax.tree.map(lambda a, b: float(np.abs(a - b).max()), params["all"], params["compact"])
  )
  moved = jax.tree.leaves(
    jax.tree.map(
      lambda a, b: float(np.abs(a - np.asarray(b.addressable_data(0))).max()),
      params["all"],
      rm.state["params"],
    )
  )
  # The gradients of both batches (before Adam's normalisation, which can turn a rounding
  # difference of a near-zero gradient into a visible fraction of lr).
  grads = []
  grad_fn = jax.jit(jax.grad(lambda p, b: steps.rm_loss_fn(rm.cfg, "bt", p, b)[0].value))
  for batch in (full, compact):  # global arrays: arguments, not closed over
    g = grad_fn(rm.state["params"], batch)
    grads.append(jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), g))
  grad_diff = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), *grads))
  result = {
    "grad_diff": max(grad_diff),
    "grad_scale": max(float(np.abs(x).max()) for x in jax.tree.leaves(grads[0])),
    # The worst-case float32 bound of a gradient entry's path, a fraction of the largest.
    "grad_roundoff": float32_gradient_roundoff(
      rm.cfg, 2 * full["pos_tokens"].shape[0], full["pos_tokens"].shape[1]
    ),
    "lr": float(c.rm.optim.lr),
    "process": pid,
    "compact_rows": int(compact["valid"].shape[0]),
    "n_valid": [params["all_n_valid"], params["compact_n_valid"]],
    "max_diff": max(diffs),
    "max_moved": max(moved),
  }
  Path(f"{out}.{pid}").write_text(json.dumps(result))


if __name__ == "__main__":
  main()
