"""Write tests/fixtures/smollm2_hf_logits.npz: Hugging Face reference logits and greedy text.

Run with the throwaway torch/transformers venv, never the project venv:

    /tmp/torchref/venv/bin/python tools/make_hf_fixture.py [--gguf PATH] [--no-compare]

The embedded SmolLM2-135M-Instruct GGUF is loaded by transformers + torch (its own GGUF
dequantiser and q/k un-permute, float32, eager attention). Four chat-templated prompts of
different lengths (three GSM8K test questions and a short arithmetic question) are run one by
one, UNPADDED. Per prompt i the npz holds:

  tokens_{i}       int32 [t]        prompt ids
  sub_logits_{i}   float32 [t, 256] logits at every position for the fixed id subset `subset_ids`
  top_ids_{i}      int32 [t, 8]     the 8 top-scoring ids at every position
  top_logits_{i}   float32 [t, 8]   their logits
  last_logits_{i}  float32 [v]      full-vocab logits at the last prompt position
  greedy_{i}       int32 [<=24]     HF greedy continuation (do_sample=False), up to and
                                    including the EOS if it stops early

plus `subset_ids`, `eos_ids`, `n_new` and `meta_json` (versions etc.; also written as a
sidecar .json). Prompt ids use the SMOLLM pre-tokenisation (digits isolated, as llama.cpp and
SmolLM2's training) over transformers' GGUF BPE, like tools/make_tokenizer_fixture.py; the
parity test only needs them to be the same ids on both sides.

Unless --no-compare, the project venv then runs tests/test_parity.py's comparison in a
subprocess and prints the max abs differences.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A sibling tool: `python tools/make_hf_fixture.py` puts tools/ on sys.path.
from make_tokenizer_fixture import default_gguf, smollm_pieces  # noqa: E402

OUT = os.path.join(REPO, "tests", "fixtures", "smollm2_hf_logits.npz")
PROJECT_PY = os.path.join(REPO, ".venv", "bin", "python")
N_SUBSET, N_TOP, N_NEW, SEED = 256, 8, 24, 1234
EOS_IDS = (2,)  # <|im_end|>, as the sampler's eos_ids in the parity test
GSM8K_INDICES = (0, 1, 2)
SHORT_QUESTION = "What is 12 * 7 + 5?"


def questions() -> list[str]:
  path = os.path.join(REPO, "data", "gsm8k", "test.jsonl")
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line)["question"] for _, line in zip(range(max(GSM8K_INDICES) + 1), f)]
  return [rows[i] for i in GSM8K_INDICES] + [SHORT_QUESTION]


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--gguf", default=None)
  ap.add_argument("--out", default=OUT)
  ap.add_argument("--no-compare", action="store_true")
  args = ap.parse_args()
  gguf_path = args.gguf or default_gguf()

  import gguf
  import torch
  import transformers
  from transformers import AutoModelForCausalLM, AutoTokenizer

  torch.manual_seed(0)
  d, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
  tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
  t0 = time.time()
  model = AutoModelForCausalLM.from_pretrained(
    d, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
  )
  model.eval()
  print(
    f"loaded HF model in {time.time() - t0:.1f}s: {type(model).__name__}, "
    f"vocab {model.config.vocab_size}, tied {model.config.tie_word_embeddings}"
  )
  specials = list(tok.get_added_vocab())

  def encode(text: str) -> list[int]:
    ids: list[int] = []
    for piece, is_special in smollm_pieces(text, specials):
      ids += (
        [tok.convert_tokens_to_ids(piece)]
        if is_special
        else tok.encode(piece, add_special_tokens=False)
      )
    return ids

  vocab = model.config.vocab_size
  subset = np.sort(np.random.default_rng(SEED).choice(vocab, N_SUBSET, replace=False))
  arrays: dict[str, np.ndarray] = {
    "subset_ids": subset.astype(np.int32),
    "eos_ids": np.asarray(EOS_IDS, np.int32),
    "n_new": np.asarray(N_NEW, np.int32),
  }
  prompts = []
  for i, q in enumerate(questions()):
    text = tok.apply_chat_template(
      [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
    )
    ids = encode(text)
    prompts.append(text)
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
      logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float().numpy()
      gen = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        do_sample=False,
        max_new_tokens=N_NEW,
        eos_token_id=list(EOS_IDS),
        pad_token_id=EOS_IDS[0],
        temperature=None,
        top_p=None,
        top_k=None,
      )
    new = gen[0, len(ids) :].numpy()
    stop = np.flatnonzero(np.isin(new, EOS_IDS))
    new = new[: stop[0] + 1] if stop.size else new
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :N_TOP]
    arrays[f"tokens_{i}"] = np.asarray(ids, np.int32)
    arrays[f"sub_logits_{i}"] = logits[:, subset].astype(np.float32)
    arrays[f"top_ids_{i}"] = top.astype(np.int32)
    arrays[f"top_logits_{i}"] = np.take_along_axis(logits, top, axis=-1).astype(np.float32)
    arrays[f"last_logits_{i}"] = logits[-1].astype(np.float32)
    arrays[f"greedy_{i}"] = new.astype(np.int32)
    print(
      f"prompt {i}: {len(ids)} tokens, greedy {len(new)} new: "
      f"{tok.decode(new, skip_special_tokens=False)!r}"
    )

  meta = {
    "generated_by": "tools/make_hf_fixture.py",
    "gguf_file": name,
    "reference": "transformers AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, "
    "dtype=float32, attn_implementation='eager'), unpadded, one prompt at a "
    "time; greedy = generate(do_sample=False)",
    "prompts": prompts,
    "gsm8k_test_indices": list(GSM8K_INDICES),
    "subset_seed": SEED,
    "n_new": N_NEW,
    "eos_ids": list(EOS_IDS),
    "versions": {
      "python": platform.python_version(),
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "gguf": getattr(gguf, "__version__", "unknown"),
      "numpy": np.__version__,
    },
  }
  arrays["meta_json"] = np.asarray(json.dumps(meta, ensure_ascii=False))
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  np.savez_compressed(args.out, **arrays)
  with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
    json.dump(meta, f, ensure_ascii=False, indent=1)
    f.write("\n")
  print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.2f} MB)")

  if not args.no_compare:
    print("comparing with the JAX model (project venv) ...")
    subprocess.run(
      [PROJECT_PY, os.path.join(REPO, "tests", "test_parity.py"), args.out], check=True, cwd=REPO
    )


if __name__ == "__main__":
  main()
