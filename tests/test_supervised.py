"""cooper_jax.supervised: the shared SFT / RM-pretraining loop, driven by a fake step that
records what it was given (row order, logged steps, one compile per width, live state)."""

import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import optim
from cooper_jax.supervised import adamw_warmup_cosine, epoch_order, train_supervised


class Recorder:
  """encode / make_step / evaluate for train_supervised; the state is the number of steps."""

  def __init__(self):
    self.batches, self.compiled, self.evaluated = [], [], []

  def encode(self, idx):
    # Two widths, chosen by the first row, so the cache sees repeats and a second width.
    width = 32 if idx[0] % 2 == 0 else 64
    return {"tokens": np.zeros((len(idx), width), np.int32), "idx": np.array(idx)}

  def make_step(self, state, batch):
    self.compiled.append((batch["tokens"].shape[1], int(state)))

    def step(state, batch):
      self.batches.append(batch["idx"])
      # Device arrays, like a jitted step's: the loop must fetch and convert them.
      return state + 1, {"loss": jnp.float32(state + 1) / 2, "rows": jnp.int32(len(batch["idx"]))}

    return step

  def evaluate(self, state):
    self.evaluated.append(int(state))
    return {"heldout": {"accuracy": 0.5}}


def run(rec, seed=7, **kw):
  args = dict(
    n_rows=10,
    steps=7,
    batch_size=4,
    encode=rec.encode,
    make_step=rec.make_step,
    describe=lambda m: f"loss {m['loss']:.2f}",
    log_every=3,
  )
  args.update(kw)
  return train_supervised(0, rng=np.random.default_rng(seed), **args)


def test_rows_follow_rng_permutations_and_every_row_is_seen_once_per_epoch():
  rec = Recorder()
  state, _, _ = run(rec)
  assert state == 7
  seen = np.concatenate(rec.batches)
  assert [len(b) for b in rec.batches] == [4] * 7
  # 7 * 4 = 28 rows need three epochs of 10; batches run across epoch boundaries.
  ref = np.random.default_rng(7)
  expected = np.concatenate([ref.permutation(10) for _ in range(3)])
  np.testing.assert_array_equal(seen, expected[:28])
  for e in range(2):
    assert sorted(seen[e * 10 : (e + 1) * 10].tolist()) == list(range(10))
  assert len(set(seen[20:].tolist())) == 8  # the partial third epoch repeats no row


def test_order_continues_the_callers_generator():
  # pretrain_rm draws its --max_examples subset first; the order must come after that draw.
  rng = np.random.default_rng(3)
  rng.permutation(50)
  order = epoch_order(rng, 10, 5, 4)
  ref = np.random.default_rng(3)
  ref.permutation(50)
  np.testing.assert_array_equal(order, np.concatenate([ref.permutation(10) for _ in range(2)]))
  assert rng.integers(1 << 30) == ref.integers(1 << 30)  # nothing else was drawn


def test_zero_steps_still_draws_one_epoch_and_logs_nothing():
  rng, ref = np.random.default_rng(1), np.random.default_rng(1)
  rec = Recorder()
  state, log, _ = train_supervised(
    "s",
    n_rows=5,
    steps=0,
    batch_size=2,
    rng=rng,
    encode=rec.encode,
    make_step=rec.make_step,
    describe=str,
    log_every=1,
  )
  assert state == "s" and log == [] and rec.batches == [] and rec.compiled == []
  ref.permutation(5)
  assert rng.integers(1 << 30) == ref.integers(1 << 30)


def test_logged_steps_metrics_and_evaluation(capsys):
  rec = Recorder()
  _, log, seconds = run(rec, steps=10, log_every=3, eval_every=5, evaluate=rec.evaluate)
  # Every 3rd, every 5th, and the last; evaluation on 5 only (the caller evaluates the end).
  assert [m["step"] for m in log] == [3, 5, 6, 9, 10]
  assert rec.evaluated == [5]
  assert [("heldout" in m) for m in log] == [False, True, False, False, False]
  for m in log:
    assert m["loss"] == m["step"] / 2 and m["rows"] == 4.0
    assert type(m["loss"]) is float and type(m["rows"]) is float
    assert 0.0 <= m["elapsed_s"] <= seconds
  lines = capsys.readouterr().out.splitlines()
  assert lines == [f"step {s}/10 loss {s / 2:.2f}" for s in (3, 5, 6, 9, 10)]


def test_no_eval_steps_without_eval_every():
  rec = Recorder()
  _, log, _ = run(rec, steps=7, log_every=3)
  assert [m["step"] for m in log] == [3, 6, 7]
  with pytest.raises(ValueError, match="evaluate"):
    run(Recorder(), eval_every=2)


def test_one_compile_per_width_from_the_live_state():
  rec = Recorder()
  run(rec, steps=12)
  widths = [32 if b[0] % 2 == 0 else 64 for b in rec.batches]
  assert set(widths) == {32, 64} and len(rec.batches) == 12
  assert sorted(w for w, _ in rec.compiled) == sorted(set(widths))
  # Each width is built from the state current at its first batch, not the initial one.
  for w, state in rec.compiled:
    assert state == widths.index(w)


def test_adamw_warmup_cosine_recipe():
  oc = adamw_warmup_cosine(1e-2, 5, 100)
  a = oc.adamw
  assert (oc.name, oc.schedule, a.b1, a.b2, a.eps, a.weight_decay, oc.grad_clip) == (
    "adamw",
    "warmup_cosine",
    0.9,
    0.95,
    1e-8,
    0.01,
    1.0,
  )
  sched = optim.make_schedule(oc)
  assert float(sched(0)) == 0.0
  assert float(sched(5)) == pytest.approx(1e-2)
  assert float(sched(100)) == pytest.approx(1e-3)  # end_lr_frac 0.1
