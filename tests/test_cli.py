"""Every console script in pyproject.toml is installed, answers --help with exit status 0, and
its help names the flags a user needs first (a smoke test of the entry points)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# What each command's --help must mention: its required inputs.
NEEDS = {
  "cooper-train": ("--config", "--workdir"),
  "cooper-evaluate": ("--checkpoint", "--model", "--step", "--out"),
  "cooper-study": ("--out", "--seeds", "--conditions"),
  "cooper-aot": ("--config", "--topology"),
  "cooper-aot-decode": ("--config", "--topology", "--mfu_from"),
  "cooper-export": ("--run", "--out"),
  "cooper-pipeline": ("--out", "--size"),
}


def test_every_entry_point_is_listed():
  assert set(SCRIPTS) == set(NEEDS)


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_help(name):
  exe = Path(sys.executable).parent / name
  assert exe.exists(), f"{name} not installed: run tools/setup.sh (pip install -e .)"
  r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120, cwd="/")
  assert r.returncode == 0, r.stderr[-2000:]
  for flag in NEEDS[name]:
    assert flag in r.stdout, f"{name} --help does not mention {flag}:\n{r.stdout[:3000]}"


def test_an_unknown_config_key_is_named_with_what_its_section_holds(tmp_path):
  from cooper_jax.cli import unknown_config_keys

  tiny = str(ROOT / "experiments" / "tiny.py")
  argv = ["--config", tiny, "--config.policy.optim.lr=1e-3", "--config.policy.optim.optimizer=lion"]
  (line,) = unknown_config_keys(argv)
  assert "--config.policy.optim.optimizer: no key 'optimizer' in policy.optim" in line
  assert "lion" in line and "schedule" in line  # what the section does hold
  assert unknown_config_keys([f"--config={tiny}", "--config.rm.optim.name=sgd"]) == []
  # The command refuses it before anything is written (exit 2, no workdir).
  exe = Path(sys.executable).parent / "cooper-train"
  work = tmp_path / "run"
  r = subprocess.run(
    [str(exe), f"--config={tiny}", "--config.train.stepz=3", f"--workdir={work}"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 2 and "no key 'stepz' in train" in r.stderr, r.stderr[-2000:]
  assert not work.exists()


def test_a_bad_config_value_is_one_line_and_writes_nothing(tmp_path):
  """A misspelt optimizer name passes the key check (the key exists) and fails validation: the
  command says which value and what is allowed, without a traceback, before any workdir."""
  exe = Path(sys.executable).parent / "cooper-train"
  work = tmp_path / "run"
  cfg = str(ROOT / "experiments" / "tiny.py")
  r = subprocess.run(
    [str(exe), f"--config={cfg}", "--config.rm.optim.name=lino", f"--workdir={work}"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 1, r.stderr[-2000:]
  assert "config error: config.rm.optim.name='lino': expected one of" in r.stderr
  assert "Traceback" not in r.stderr and not work.exists()
