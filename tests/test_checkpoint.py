"""Joint checkpoints: round trip, corruption detection, fallback to the previous good step."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax.checkpoint import CheckpointCorrupt, CheckpointStore, verify_step_dir


def _state(scale):
  return {
    "params": {"w": jnp.full((64, 32), scale, jnp.float32), "b": jnp.arange(5.0) * scale},
    "step": jnp.asarray(int(scale), jnp.int32),
  }


def _biggest_file(step_dir):
  return max(
    (f for f in step_dir.rglob("*") if f.is_file() and f.name != "cooper_manifest.json"),
    key=lambda f: f.stat().st_size,
  )


def test_round_trip_both_models_and_meta(tmp_path):
  store = CheckpointStore(tmp_path / "ck")
  store.save(3, _state(1.0), _state(2.0), {"data_iterator": {"epoch": 1, "index": 7}})
  pol, rm, meta = store.restore(3, _state(0.0), _state(0.0))
  np.testing.assert_array_equal(pol["params"]["w"], np.ones((64, 32)))
  np.testing.assert_array_equal(rm["params"]["b"], np.arange(5.0) * 2)
  assert meta["data_iterator"] == {"epoch": 1, "index": 7} and meta["step"] == 3
  store.close()


def test_truncated_file_is_detected_and_previous_step_used(tmp_path, caplog):
  store = CheckpointStore(tmp_path / "ck")
  store.save(1, _state(1.0), _state(1.0), {"k": 1})
  store.save(2, _state(2.0), _state(2.0), {"k": 2})
  victim = _biggest_file(store.step_dir(2))
  data = victim.read_bytes()
  victim.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointCorrupt, match=victim.name):
    verify_step_dir(store.step_dir(2))
  with caplog.at_level(logging.ERROR):
    pol, _, meta = store.restore_latest(_state(0.0), _state(0.0))
  assert meta["step"] == 1 and meta["k"] == 1
  np.testing.assert_array_equal(pol["params"]["w"], np.ones((64, 32)))
  assert any("step 2 is unusable" in r.getMessage() for r in caplog.records)
  store.close()


def test_bitflip_same_size_is_detected(tmp_path):
  store = CheckpointStore(tmp_path / "ck")
  store.save(1, _state(1.0), None, {})
  victim = _biggest_file(store.step_dir(1))
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0xFF
  victim.write_bytes(bytes(data))
  with pytest.raises(CheckpointCorrupt, match="sha256"):
    store.restore(1, _state(0.0), None)
  with pytest.raises(CheckpointCorrupt, match="no usable checkpoint"):
    store.restore_latest(_state(0.0), None)
  store.close()


def test_unfinished_save_has_no_manifest(tmp_path):
  store = CheckpointStore(tmp_path / "ck")
  store.save(1, _state(1.0), None, {})
  (store.step_dir(1) / "cooper_manifest.json").unlink()
  with pytest.raises(CheckpointCorrupt, match="save did not finish"):
    verify_step_dir(store.step_dir(1))
  store.close()


def test_restore_keeps_target_sharding(tmp_path):
  from cooper_jax import sharding  # pylint: disable=import-outside-toplevel

  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  target = {"params": {"layers": {"mlp": {"up": {"kernel": jnp.zeros((2, 8, 16))}}}}}
  target = sharding.shard_tree(target, mesh)
  store = CheckpointStore(tmp_path / "ck")
  store.save(1, jax.tree.map(lambda x: x + 1, target), None, {})
  pol, _, _ = store.restore(1, target, None)
  leaf = pol["params"]["layers"]["mlp"]["up"]["kernel"]
  assert leaf.sharding.spec == target["params"]["layers"]["mlp"]["up"]["kernel"].sharding.spec
  np.testing.assert_array_equal(leaf, np.ones((2, 8, 16)))
  store.close()
