"""Write tests/fixtures/llama3_tiny/ and tests/fixtures/llama3_tiny_logits.npz (Llama-3 RoPE).

Run with a throwaway torch/transformers venv, never the project venv:

    python3.11 -m venv /tmp/ref
    /tmp/ref/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors
    /tmp/ref/bin/python tools/make_llama3_fixture.py

A small random LlamaForCausalLM (fixed seed, float32) with Llama-3.2's rope_scaling
(rope_type "llama3", factor 32, low_freq_factor 1, high_freq_factor 4) is saved with
save_pretrained. original_max_position_embeddings is 256 rather than Llama-3.2's 8192 so that,
at head_dim 16 and rope_theta 5e5, the scaling touches all three regimes (wavelengths ~6 and ~33
kept, ~168 in the smoothing band 64..256, the rest divided by 32) and sequences of a few hundred
positions turn the slowed frequencies by visibly different angles. initializer_range is larger
than Llama's 0.02 so attention is peaked enough for those angles to move the logits.

Each sequence i is run UNPADDED (positions 0..t-1, eager attention); the npz holds

  tokens_{i}   int32 [t]       random ids
  logits_{i}   float32 [t, v]  HF logits at every position
  inv_freq     float32 [e/2]   HF's rotary inverse frequencies (after llama3 scaling)
  meta_json    versions, config and the with/without-scaling logit difference

The parity test runs the sequences as one left-padded batch through the project's loader.
"""

from __future__ import annotations

import json
import os
import platform

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO, "tests", "fixtures", "llama3_tiny")
OUT_NPZ = os.path.join(REPO, "tests", "fixtures", "llama3_tiny_logits.npz")
SEED = 20240925
LENGTHS = (300, 173)
ROPE_SCALING = {
  "rope_type": "llama3",
  "factor": 32.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 256,
}


def make_config(rope_scaling) -> LlamaConfig:
  return LlamaConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=500000.0,
    rope_scaling=rope_scaling,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    initializer_range=0.25,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    attn_implementation="eager",
  )


@torch.no_grad()
def logits_of(model, rows) -> list[np.ndarray]:
  return [model(torch.tensor(r[None], dtype=torch.long)).logits[0].numpy() for r in rows]


def main() -> None:
  torch.manual_seed(SEED)
  model = LlamaForCausalLM(make_config(dict(ROPE_SCALING))).float().eval()
  rng = np.random.default_rng(SEED)
  # Ids from 3 up, so no row contains the bos/eos/pad ids.
  rows = [rng.integers(3, model.config.vocab_size, size=n).astype(np.int32) for n in LENGTHS]
  scaled = logits_of(model, rows)

  # The same weights with plain RoPE: the fixture must make the scaling matter.
  plain = LlamaForCausalLM(make_config(None)).float().eval()
  plain.load_state_dict(model.state_dict())
  unscaled = logits_of(plain, rows)
  diff = max(float(np.max(np.abs(a - b))) for a, b in zip(scaled, unscaled))
  mean_diff = float(
    np.mean(np.concatenate([np.abs(a - b).ravel() for a, b in zip(scaled, unscaled)]))
  )
  scale = max(float(np.max(np.abs(a))) for a in scaled)
  inv_freq = model.model.rotary_emb.inv_freq.numpy().astype(np.float32)
  plain_freq = plain.model.rotary_emb.inv_freq.numpy()
  print(f"inv_freq llama3: {inv_freq}")
  print(f"inv_freq plain:  {plain_freq}")
  print(f"max |logit| {scale:.3f}; max |logit(llama3) - logit(plain)| {diff:.4f}")
  print(f"  mean |logit(llama3) - logit(plain)| {mean_diff:.4f}")
  if diff < 0.1 * scale:
    raise SystemExit("scaling changes the logits too little for a meaningful fixture")

  model.save_pretrained(OUT_DIR, safe_serialization=True)
  meta = {
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "python": platform.python_version(),
    "seed": SEED,
    "lengths": list(LENGTHS),
    "rope_scaling": ROPE_SCALING,
    "max_abs_logit": scale,
    "max_abs_diff_scaled_vs_plain": diff,
    "mean_abs_diff_scaled_vs_plain": mean_diff,
  }
  arrays = {f"tokens_{i}": r for i, r in enumerate(rows)}
  arrays.update({f"logits_{i}": lg.astype(np.float32) for i, lg in enumerate(scaled)})
  np.savez_compressed(OUT_NPZ, inv_freq=inv_freq, meta_json=np.array(json.dumps(meta)), **arrays)
  sizes = {
    os.path.relpath(p, REPO): os.path.getsize(p)
    for p in [OUT_NPZ] + [os.path.join(OUT_DIR, f) for f in sorted(os.listdir(OUT_DIR))]
  }
  print(json.dumps(sizes, indent=2))


if __name__ == "__main__":
  main()
