"""Joint checkpoints: round trip, corruption detection, fallback to the previous good step (the
corrupt one moved aside so it can be saved again), async saves, gs:// paths."""

import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cooper_jax import checkpoint
from cooper_jax.checkpoint import (
  CheckpointCorrupt,
  CheckpointStore,
  verify_step_dir,
)
from cooper_jax.paths import as_path, write_text


def _state(scale):
  return {
    "params": {"w": jnp.full((64, 32), scale, jnp.float32), "b": jnp.arange(5.0) * scale},
    "step": jnp.asarray(int(scale), jnp.int32),
  }


def _biggest_file(step_dir):
  return max(
    (f for f in Path(step_dir).rglob("*") if f.is_file() and f.name != "cooper_manifest.json"),
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
  # Moved aside (kept, named in the log), so the run can save step 2 again.
  assert store.steps() == [1]
  aside = list((tmp_path / "ck.corrupt").iterdir())
  assert [d.name.split("-")[0] for d in aside] == ["2"]
  assert any(str(aside[0]) in r.getMessage() for r in caplog.records)
  store.save(2, _state(3.0), _state(3.0), {"k": 3})
  pol, _, meta = store.restore_latest(_state(0.0), _state(0.0))
  assert meta["k"] == 3 and store.steps() == [1, 2]
  store.close()


def test_async_save_writes_manifests(tmp_path):
  store = CheckpointStore(tmp_path / "ck", async_save=True)
  store.save(1, _state(1.0), None, {})
  store.save(2, _state(2.0), None, {})  # waits for step 1 and writes its manifest first
  verify_step_dir(store.step_dir(1))
  store.close()  # finishes step 2
  verify_step_dir(store.step_dir(2))
  store = CheckpointStore(tmp_path / "ck")
  pol, _, meta = store.restore_latest(_state(0.0), None)
  assert meta["step"] == 2
  np.testing.assert_array_equal(pol["params"]["w"], np.full((64, 32), 2.0))
  store.close()


def test_paths_keep_their_scheme(tmp_path, monkeypatch):
  """gs:// survives joins (pathlib.Path would make it gs:/), and the manifest and text
  writes go through epath: checked with epath's mock backend mapping gs:// onto tmp_path."""
  from etils import epath  # pylint: disable=import-outside-toplevel

  run = as_path("gs://bucket/run")
  assert str(run / "checkpoints" / "3") == "gs://bucket/run/checkpoints/3"
  assert str(as_path("rel/dir")) == str(Path("rel/dir").absolute())
  monkeypatch.chdir(tmp_path)

  def local(p):
    return str(p).replace("gs://", str(tmp_path / "gs") + "/")

  names = ("exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rmtree", "stat")
  fns = {name: (lambda fn, p, *a, **k: fn(local(p), *a, **k)) for name in names}
  fns["walk"] = lambda fn, p, *a, **k: (
    (r.replace(str(tmp_path / "gs") + "/", "gs://"), d, f) for r, d, f in fn(local(p), *a, **k)
  )
  with epath.testing.mock_epath(**fns):
    step_dir = run / "checkpoints" / "3"
    step_dir.mkdir(parents=True)
    write_text(step_dir / "a.bin", "0123456789")
    manifest = checkpoint._manifest(step_dir)  # pylint: disable=protected-access
    assert list(manifest) == ["a.bin"]
    write_text(step_dir / checkpoint.MANIFEST, json.dumps(manifest))
    verify_step_dir("gs://bucket/run/checkpoints/3")
    (tmp_path / "gs/bucket/run/checkpoints/3/a.bin").write_text("01234")
    with pytest.raises(CheckpointCorrupt, match="gs://bucket/run/checkpoints/3: a.bin has 5 bytes"):
      verify_step_dir("gs://bucket/run/checkpoints/3")
  assert (tmp_path / "gs/bucket/run/checkpoints/3/cooper_manifest.json").exists()


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
