"""The AOT tools count bytes the documented way by themselves: v5e's VMEM prefetching off
(LIBTPU_INIT_ARGS=--xla_vf_vmem_memory_space_assignment=false) unless the user set it, and
their output says which count it is."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cooper_jax.cli.hbm_count import VMEM_FLAG, hbm_count_kind, use_hbm_count

ROOT = Path(__file__).resolve().parents[1]
TINY = ("--config", "experiments/tiny.py", "--config.rollout.prompts_per_step=4")
TINY += ("--config.mesh.data=1", "--config.mesh.fsdp=-1", "--topology", "v5e:2x2")


def test_flag_added_once_and_other_arguments_kept():
  env = {}
  assert "this tool added" in use_hbm_count(env)
  assert env["LIBTPU_INIT_ARGS"] == VMEM_FLAG and hbm_count_kind(env) == "vmem_prefetch_off"
  assert "as given" in use_hbm_count(env)  # a second call adds nothing
  assert env["LIBTPU_INIT_ARGS"] == VMEM_FLAG
  env = {"LIBTPU_INIT_ARGS": "--xla_tpu_foo=1"}
  use_hbm_count(env)
  assert env["LIBTPU_INIT_ARGS"].split() == ["--xla_tpu_foo=1", VMEM_FLAG]


def test_a_users_own_setting_stands_and_is_labelled():
  env = {"LIBTPU_INIT_ARGS": "--xla_vf_vmem_memory_space_assignment=true"}
  line = use_hbm_count(env)
  assert env["LIBTPU_INIT_ARGS"] == "--xla_vf_vmem_memory_space_assignment=true"
  assert "prefetching on" in line and "not comparable" in line
  assert hbm_count_kind(env) == "vmem_prefetch_on"


def _decode(extra_env):
  env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
  env.update(extra_env, PYTHONPATH=str(ROOT))
  p = subprocess.run(
    [sys.executable, "-m", "cooper_jax.cli.aot_decode", *TINY],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert p.returncode == 0, p.stderr
  row = json.loads(p.stdout.strip().splitlines()[-1])
  return row, p.stdout + p.stderr


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed")
def test_decode_cli_counts_hbm_bytes_without_being_told():
  auto, auto_out = _decode({})
  off, off_out = _decode({"LIBTPU_INIT_ARGS": VMEM_FLAG})
  on, on_out = _decode({"LIBTPU_INIT_ARGS": "--xla_vf_vmem_memory_space_assignment=true"})
  # The flag matters on this program (prefetched buffers counted three times) ...
  assert on["xla_bytes"] > 1.5 * off["xla_bytes"]
  # ... and the tool, given nothing, counts as the documented command does.
  assert auto["xla_bytes"] == off["xla_bytes"]
  assert auto["xla_bytes_avg"] == off["xla_bytes_avg"]
  assert auto["hbm_count"] == "vmem_prefetch_off" == off["hbm_count"]
  assert on["hbm_count"] == "vmem_prefetch_on"
  assert "this tool added" in auto_out and "prefetching on" in on_out
