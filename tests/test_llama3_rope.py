"""Llama-3 RoPE scaling (rope_type "llama3") against Hugging Face transformers.

The reference (tests/fixtures/llama3_tiny/ and llama3_tiny_logits.npz) comes from
tools/fixtures/make_llama3_fixture.py: a small random LlamaForCausalLM with llama3 rope scaling, run by
transformers + torch in float32, each sequence unpadded. Here the sequences run as ONE
left-padded batch through the project's HF-directory loader and forward.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from cooper_jax.models.config import ModelConfig, RopeScaling, from_hf_config, to_hf_config
from cooper_jax.models.tolerance import float32_logit_atol
from cooper_jax.models.transformer import forward, rope_inv_freq
from cooper_jax.prompts import left_pad
from cooper_jax.weights import load_hf_dir

FIXTURES = Path(__file__).parent / "fixtures"
CKPT = FIXTURES / "llama3_tiny"
LOGITS = FIXTURES / "llama3_tiny_logits.npz"
PAD_ID = 0
# inv_freq = theta^(-2i/d) in float32 against float64 (or another float32): the exponent's
# product with ln(theta) (ln 500000 = 13.1) carries ~13 u of absolute rounding, which is
# relative in the power; pow, the division and Llama-3's smoothing add a few u: ~21 u a side.
INV_FREQ_RTOL = 2 * 21 * 2.0**-24

# config.json of meta-llama/Llama-3.2-1B-Instruct, as published.
LLAMA_32_1B_INSTRUCT = {
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": False,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": False,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": True,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": True,
  "vocab_size": 128256,
}


@pytest.fixture(scope="module")
def reference():
  with np.load(LOGITS) as z:
    n = sum(1 for k in z.files if k.startswith("tokens_"))
    return {
      "tokens": [z[f"tokens_{i}"] for i in range(n)],
      "logits": [z[f"logits_{i}"] for i in range(n)],
      "inv_freq": z["inv_freq"],
      "meta": json.loads(str(z["meta_json"])),
    }


@pytest.fixture(scope="module")
def model():
  return load_hf_dir(CKPT)


def _left_pad(rows):
  t = max(len(r) for r in rows) + 3  # every row, the longest included, gets some padding
  tokens, mask, _ = left_pad(rows, PAD_ID, pad_to_multiple=t)
  return tokens, mask


def _max_logit_diff(cfg, params, ref) -> float:
  tokens, mask = _left_pad(ref["tokens"])
  logits = np.asarray(jax.jit(forward, static_argnums=0)(cfg, params, tokens, mask))
  worst = 0.0
  for i, want in enumerate(ref["logits"]):
    got = logits[i, mask[i]]
    assert got.shape == want.shape
    worst = max(worst, float(np.max(np.abs(got - want))))
  return worst


def test_fixture_config_maps_to_llama3_scaling(model):
  cfg, _ = model
  # transformers 5 writes the new-style rope_parameters, with rope_theta inside it.
  assert cfg.rope_theta == 500000.0
  assert cfg.rope_scaling == RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=256
  )
  assert cfg.tie_embeddings and cfg.head_dim == 16 and cfg.n_kv_heads == 2


def test_inv_freq_matches_transformers(model, reference):
  cfg, _ = model
  want = reference["inv_freq"]
  got = np.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
  np.testing.assert_allclose(got, want, rtol=INV_FREQ_RTOL, atol=0)
  # All three regimes occur: kept, smoothed and divided by the factor.
  plain = np.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta))
  ratio = want / plain
  assert np.any(np.isclose(ratio, 1.0))
  assert np.any(np.isclose(ratio, 1 / 32))
  assert np.any((ratio > 1 / 32 + 1e-3) & (ratio < 1 - 1e-3))


def test_logits_match_transformers_left_padded(model, reference):
  cfg, params = model
  diff = _max_logit_diff(cfg, params, reference)
  scale = max(float(np.max(np.abs(x))) for x in reference["logits"])
  atol = float32_logit_atol(cfg, scale, max_position=max(len(t) for t in reference["tokens"]))
  print(f"llama3 rope: max |dlogit| vs HF = {diff:.3e} (bound {atol:.2e})")
  assert diff < atol
  # The bound still catches what this fixture exists for: without the llama3 rope scaling,
  # transformers' own logits move by 11.3 (recorded when the fixture was made).
  assert atol < 1e-3 * reference["meta"]["max_abs_diff_scaled_vs_plain"]


def test_without_scaling_logits_are_far_from_transformers(model, reference):
  # Proves the parity above depends on the scaling being applied.
  cfg, params = model
  diff = _max_logit_diff(cfg.replace(rope_scaling=None), params, reference)
  print(f"plain rope: max |dlogit| vs HF = {diff:.3e}")
  assert diff > 1.0


def test_llama_32_1b_instruct_config():
  cfg = from_hf_config(LLAMA_32_1B_INSTRUCT)
  assert (
    cfg.vocab_size,
    cfg.d_model,
    cfg.n_layers,
    cfg.n_heads,
    cfg.n_kv_heads,
    cfg.head_dim,
    cfg.d_ff,
  ) == (128256, 2048, 16, 32, 8, 64, 8192)
  assert cfg.rope_theta == 500000.0
  assert cfg.tie_embeddings is True
  assert cfg.rms_eps == 1e-5
  assert cfg.max_seq_len == 131072
  assert cfg.family == "llama" and cfg.head == "lm" and not cfg.qkv_bias
  assert cfg.rope_scaling == RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
  )
  assert cfg.bos_id == 128000 and cfg.eos_id == 128001
  hash(cfg)  # a static jit argument


def test_llama_32_inv_freq_against_published_formula():
  # Independent float64 restatement of Meta's apply_scaling (llama-models), at Llama-3.2's
  # head_dim 64: high frequencies kept, low ones / 32, the band blended.
  cfg = from_hf_config(LLAMA_32_1B_INSTRUCT)
  base = 1.0 / (500000.0 ** (np.arange(0, 64, 2) / 64))
  want = []
  for f in base:
    wavelen = 2 * np.pi / f
    if wavelen < 8192 / 4:
      want.append(f)
    elif wavelen > 8192 / 1:
      want.append(f / 32)
    else:
      smooth = (8192 / wavelen - 1) / (4 - 1)
      want.append((1 - smooth) * f / 32 + smooth * f)
  got = np.asarray(rope_inv_freq(64, cfg.rope_theta, cfg.rope_scaling))
  np.testing.assert_allclose(got, np.array(want), rtol=INV_FREQ_RTOL)


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "linear", "longrope"])
def test_unknown_rope_type_is_refused(rope_type):
  hf = dict(LLAMA_32_1B_INSTRUCT, rope_scaling={"rope_type": rope_type, "factor": 4.0})
  with pytest.raises(ValueError, match=rf"rope_scaling.*rope_type.*'{rope_type}'"):
    from_hf_config(hf)
  new_style = {k: v for k, v in LLAMA_32_1B_INSTRUCT.items() if k != "rope_scaling"}
  new_style["rope_parameters"] = {"rope_type": rope_type, "factor": 4.0, "rope_theta": 1e4}
  with pytest.raises(ValueError, match=rf"rope_parameters.*rope_type.*'{rope_type}'"):
    from_hf_config(new_style)


def test_legacy_type_key_and_missing_llama3_keys():
  legacy = dict(LLAMA_32_1B_INSTRUCT, rope_scaling={"type": "yarn", "factor": 4.0})
  with pytest.raises(ValueError, match="'yarn'"):
    from_hf_config(legacy)
  short = dict(LLAMA_32_1B_INSTRUCT, rope_scaling={"rope_type": "llama3", "factor": 8.0})
  with pytest.raises(ValueError, match="low_freq_factor"):
    from_hf_config(short)


@pytest.mark.parametrize(
  "rope",
  [
    {"rope_scaling": None},
    {"rope_scaling": {"rope_type": "default"}},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
  ],
)
def test_default_rope_means_no_scaling(rope):
  hf = {k: v for k, v in LLAMA_32_1B_INSTRUCT.items() if k != "rope_scaling"}
  cfg = from_hf_config(dict(hf, **rope))
  assert cfg.rope_scaling is None and cfg.rope_theta == 500000.0


def test_scaling_survives_export_and_checkpoint_metadata():
  cfg = from_hf_config(LLAMA_32_1B_INSTRUCT)
  # The export's config.json (JSON round trip) maps back to the same config.
  assert from_hf_config(json.loads(json.dumps(to_hf_config(cfg)))) == cfg
  # Checkpoint metadata stores dataclasses.asdict(cfg) as JSON.
  meta = json.loads(json.dumps(dataclasses.asdict(cfg)))
  back = ModelConfig(**meta)
  assert back == cfg and hash(back) == hash(cfg)
  assert to_hf_config(cfg.replace(rope_scaling=None))["rope_scaling"] is None
