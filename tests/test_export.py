"""cooper_jax/cli/export.py: a training run's policy and RM become HF directories our loader (and
transformers) reads back with the checkpoint's exact parameters."""

import json
import os
import subprocess
from pathlib import Path

import jax
import numpy as np
from conftest import train_cmd

from cooper_jax.checkpoint import load_model_from_run
from cooper_jax.cli import export as export_hf
from cooper_jax.weights import load_hf_dir


def test_export_policy_and_rm_round_trip(tmp_path):
  run = tmp_path / "run"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  p = subprocess.run(train_cmd(run, 1), env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  written = export_hf.main(["--run", str(run), "--out", str(tmp_path / "hf")])
  for which, head in (("policy", "lm"), ("rm", "score")):
    out = Path(written[which])
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    cfg, params = load_hf_dir(out)
    want_cfg, want, _ = load_model_from_run(run, which)
    assert cfg.head == head and cfg.n_layers == want_cfg.n_layers
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(want))
  arch = json.loads((Path(written["rm"]) / "config.json").read_text())["architectures"][0]
  assert arch.endswith("ForSequenceClassification")
  gen = json.loads((Path(written["policy"]) / "generation_config.json").read_text())
  assert gen["eos_token_id"] == 2 and gen["pad_token_id"] == 2  # SmolLM2's <|im_end|>
  assert not (Path(written["rm"]) / "generation_config.json").exists()
