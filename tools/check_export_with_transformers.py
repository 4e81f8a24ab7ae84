"""Check that save_hf_dir exports load in Hugging Face transformers and give the same outputs.

Run with the throwaway torch/transformers venv, never the project venv:

    /tmp/torchref/venv/bin/python tools/check_export_with_transformers.py [--keep DIR]

1. The project venv (a subprocess: `.venv/bin/python this_file --jax-side DIR`) loads the
   embedded SmolLM2-135M-Instruct GGUF, exports it with its tokenizer via save_hf_dir, and runs
   our forward on a left-padded batch of chat prompts. It also builds a tiny random
   Qwen2ForSequenceClassification (q/k/v biases, GQA, pad_token_id set), exports it and scores
   a left-padded batch. Arrays go to DIR/jax_side.npz.
2. Here, transformers loads both exports (AutoModelForCausalLM /
   AutoModelForSequenceClassification, float32, eager attention; missing or unexpected keys are
   an error) and AutoTokenizer loads the exported tokenizer. Reported: tokenizer/template
   agreement, max |dlogit| per prompt run unpadded and as the same left-padded batch, argmax
   agreement, and the reward scores' max |dscore| on the padded batch.

Exits non-zero if a difference exceeds its tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_PY = os.path.join(REPO, ".venv", "bin", "python")
SCORE_ATOL = 1e-4
PAD_MULTIPLE = 16
QUESTIONS = [
  "What is 12 * 7 + 5?",
  "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
  "to her friends in May. How many clips did Natalia sell altogether in April and May?",
  "List three primes:  7, 11 and   13. Which is largest?",
  "Hi",
]
SMOL_DIR, RM_DIR, NPZ = "smollm2_export", "tiny_qwen2_rm_export", "jax_side.npz"


# ------------------------------------------------------------------------ project venv side
def jax_side(work: str) -> None:
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp

  from cooper_jax.models.config import ModelConfig
  from cooper_jax.models.tolerance import float32_logit_atol
  from cooper_jax.models.transformer import forward, init_params
  from cooper_jax.tokenizer import load_tokenizer
  from cooper_jax.weights import load_pretrained, save_hf_dir

  fwd = jax.jit(forward, static_argnums=0)
  out: dict[str, np.ndarray] = {}

  t0 = time.time()
  cfg, params = load_pretrained("smollm2-135m-instruct")
  tok = load_tokenizer("smollm2-135m-instruct")
  save_hf_dir(cfg, params, os.path.join(work, SMOL_DIR), tokenizer=tok)
  texts = [tok.chat_prompt(q) for q in QUESTIONS]
  tokens, mask = tok.encode_prompts(texts, pad_to_multiple=PAD_MULTIPLE)
  logits = np.asarray(fwd(cfg, params, jnp.asarray(tokens), jnp.asarray(mask)))
  print(
    f"[jax] SmolLM2 loaded, exported and run in {time.time() - t0:.1f}s; batch "
    f"{tokens.shape}, pad id {tok.pad_id}",
    flush=True,
  )
  out.update(
    lm_tokens=tokens,
    lm_mask=mask,
    lm_logits=logits,
    lm_texts=np.asarray(json.dumps(texts)),
    lm_pad_id=np.asarray(tok.pad_id),
    # float32 error analysis at these logits' scale (as tests/test_parity.py)
    lm_logit_atol=np.asarray(
      float32_logit_atol(cfg, float(np.abs(logits[mask]).max()), int(mask.sum(1).max()))
    ),
  )

  # A tiny random reward model: every parameter perturbed so biases, norms and head are non-trivial.
  rm_cfg = ModelConfig(
    vocab_size=256,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    d_ff=96,
    rope_theta=1e6,
    rms_eps=1e-6,
    qkv_bias=True,
    family="qwen2",
    head="score",
    max_seq_len=512,
    bos_id=None,
    eos_id=1,
    pad_id=0,
  )
  rm_params = init_params(rm_cfg, jax.random.PRNGKey(0))
  leaves, treedef = jax.tree.flatten(rm_params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  leaves = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  rm_params = jax.tree.unflatten(treedef, leaves)
  save_hf_dir(rm_cfg, rm_params, os.path.join(work, RM_DIR))
  rng = np.random.default_rng(0)
  lengths = [23, 5, 17, 1, 30, 12]
  width = 32
  rm_tokens = np.full((len(lengths), width), rm_cfg.pad_id, np.int32)
  rm_mask = np.zeros((len(lengths), width), bool)
  for i, n in enumerate(lengths):  # real ids avoid the pad id, as HF finds the last non-pad
    rm_tokens[i, width - n :] = rng.integers(1, rm_cfg.vocab_size, n)
    rm_mask[i, width - n :] = True
  scores = np.asarray(fwd(rm_cfg, rm_params, jnp.asarray(rm_tokens), jnp.asarray(rm_mask)))
  out.update(rm_tokens=rm_tokens, rm_mask=rm_mask, rm_scores=scores)
  np.savez(os.path.join(work, NPZ), **out)
  print(
    f"[jax] tiny Qwen2 reward model exported; scores {[round(float(x), 4) for x in scores]}",
    flush=True,
  )


# ----------------------------------------------------------------------- transformers side
def _load(auto_cls, path, torch):
  model, info = auto_cls.from_pretrained(
    path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
  )
  bad = {k: v for k, v in info.items() if v}
  if bad:
    raise SystemExit(f"{path}: transformers loading info not clean: {bad}")
  return model.eval()


def torch_side(work: str) -> bool:
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from transformers import (
    AutoModelForCausalLM,  # pylint: disable=import-outside-toplevel
    AutoModelForSequenceClassification,
    AutoTokenizer,
  )

  torch.manual_seed(0)
  z = dict(np.load(os.path.join(work, NPZ)))
  ok = True
  print(f"torch {torch.__version__}, transformers {transformers.__version__}")

  # --- SmolLM2 causal LM
  smol = os.path.join(work, SMOL_DIR)
  print(f"\nexport {SMOL_DIR}: {sorted(os.listdir(smol))}")
  model = _load(AutoModelForCausalLM, smol, torch)
  tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
  print(
    f"  {type(model).__name__}, vocab {model.config.vocab_size}, tie_word_embeddings "
    f"{model.config.tie_word_embeddings}, lm_head shares the embedding: {tied}"
  )
  ok &= bool(tied) == bool(model.config.tie_word_embeddings)

  tokens, mask, ours = z["lm_tokens"], z["lm_mask"], z["lm_logits"]
  atol = float(z["lm_logit_atol"])
  texts = json.loads(str(z["lm_texts"]))
  hf_tok = AutoTokenizer.from_pretrained(smol)
  same_ids = [
    hf_tok.encode(t, add_special_tokens=False) == tokens[i, mask[i]].tolist()
    for i, t in enumerate(texts)
  ]
  same_tpl = [
    hf_tok.apply_chat_template(
      [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
    )
    == t
    for q, t in zip(QUESTIONS, texts)
  ]
  print(
    f"  AutoTokenizer ({type(hf_tok).__name__}) ids match ours: {same_ids}; chat "
    f"template renders the same: {same_tpl}; pad id {hf_tok.pad_token_id} "
    f"(ours {int(z['lm_pad_id'])})"
  )
  ok &= all(same_ids) and all(same_tpl)

  with torch.no_grad():
    worst = 0.0
    for i in range(len(tokens)):
      ids = torch.tensor(tokens[i, mask[i]][None], dtype=torch.long)
      ref = model(input_ids=ids).logits[0].numpy()
      got = ours[i, mask[i]]
      d = float(np.max(np.abs(got - ref)))
      agree = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
      worst = max(worst, d)
      print(
        f"  prompt {i} ({ids.shape[1]:3d} tokens, unpadded in HF): max |dlogit| {d:.3e} "
        f"(max |logit| {np.abs(ref).max():.1f}), argmax agreement {agree:.3f}"
      )
    am = torch.tensor(mask, dtype=torch.long)
    pos = torch.clamp(am.cumsum(-1) - 1, min=0)
    ref_b = model(
      input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=am, position_ids=pos
    ).logits.numpy()
    d_b = float(np.max(np.abs(ref_b[mask] - ours[mask])))
  print(
    f"  SmolLM2 export: max |dlogit| over all real positions, unpadded HF {worst:.3e}; "
    f"same left-padded batch {tokens.shape} in HF {d_b:.3e} (tolerance {atol:.2e})"
  )
  ok &= worst < atol and d_b < atol

  # --- tiny Qwen2 reward model
  rm_dir = os.path.join(work, RM_DIR)
  rm = _load(AutoModelForSequenceClassification, rm_dir, torch)
  print(
    f"\nexport {RM_DIR}: {type(rm).__name__}, num_labels {rm.config.num_labels}, "
    f"pad_token_id {rm.config.pad_token_id}"
  )
  rt, rmask, rs = z["rm_tokens"], z["rm_mask"], z["rm_scores"]
  with torch.no_grad():
    ids, am = torch.tensor(rt, dtype=torch.long), torch.tensor(rmask, dtype=torch.long)
    pos = torch.clamp(am.cumsum(-1) - 1, min=0)
    with_pos = rm(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, 0].numpy()
    # Without position_ids HF numbers pads too; RoPE is relative, so scores should not move.
    no_pos = rm(input_ids=ids, attention_mask=am).logits[:, 0].numpy()
    single = np.array(
      [rm(input_ids=ids[i : i + 1, rmask[i]]).logits[0, 0].item() for i in range(len(rt))]
    )
  fmt = lambda xs: [round(float(x), 5) for x in xs]
  print(f"  ours {fmt(rs)}\n  HF   {fmt(with_pos)}")
  d_rm = {
    "padded + position_ids": float(np.max(np.abs(with_pos - rs))),
    "padded, default positions": float(np.max(np.abs(no_pos - rs))),
    "each row unpadded": float(np.max(np.abs(single - rs))),
  }
  print(
    "  reward scores max |dscore|: "
    + ", ".join(f"{k} {v:.3e}" for k, v in d_rm.items())
    + f" (tolerance {SCORE_ATOL:g}; score spread {np.ptp(rs):.3f})"
  )
  ok &= max(d_rm.values()) < SCORE_ATOL
  print(f"\n{'PASS' if ok else 'FAIL'}")
  return ok


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--jax-side", metavar="DIR", help=argparse.SUPPRESS)
  ap.add_argument("--keep", metavar="DIR", help="write the exports here and keep them")
  args = ap.parse_args()
  if args.jax_side:
    jax_side(args.jax_side)
    return
  with tempfile.TemporaryDirectory(prefix="export_check_") as tmp:
    work = args.keep or tmp
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"), HF_HUB_OFFLINE="1")
    subprocess.run(
      [PROJECT_PY, os.path.abspath(__file__), "--jax-side", work], check=True, cwd=REPO, env=env
    )
    ok = torch_side(work)
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  main()
