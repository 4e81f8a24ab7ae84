"""A few-hundred-token tokenizer for the arithmetic task, saved as a Hugging Face directory.

Same design as SmolLM2's: byte-level BPE whose pre-tokenizer first isolates every digit
(Digits(individual_digits=True), then ByteLevel), ChatML special tokens and chat template.
Why byte-level: all 256 bytes are in the vocabulary, so *any* text (a policy's odd output,
the RM's `<question>...` wrapper) encodes and decode(encode(x)) == x exactly. Why digits
alone: numbers then split the same way wherever they appear, so a tiny model can learn
digit-wise arithmetic instead of memorising number tokens.

The merges are fitted to a corpus of generated problems, worked solutions, wrong solutions,
chat prompts and RM inputs, so frequent words (" apples", " boxed") become single tokens and
sequences stay short: that is what makes sampling on a CPU affordable.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from cooper_jax.prompts import INSTRUCTION_SUFFIX, build_rm_input
from cooper_jax.tasks.arith import generate_rows, make_wrong_solution

# Ids 0-2 as in SmolLM2; a dedicated pad so a pad is never mistaken for an end of turn.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
# An upper bound: the trainer stops once no pair occurs twice (~540 tokens on this corpus).
DEFAULT_VOCAB_SIZE = 640

# SmolLM2-Instruct's ChatML template without its default system message: every prompt token
# is paid for in every rollout on a CPU, and a from-scratch model gains nothing from it.
CHAT_TEMPLATE = (
  "{% for message in messages %}"
  "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def training_corpus(n_rows: int = 3000, seed: int = 12345) -> list[str]:
  """Texts the merges are fitted to: everything the task's models read or write."""
  rows = generate_rows(n_rows, seed)
  rng = np.random.default_rng(seed)
  texts = []
  for r in rows:
    wrong = make_wrong_solution(r, rng)
    texts += [
      "user\n" + r["question"] + INSTRUCTION_SUFFIX + "\nassistant\n" + r["solution"],
      wrong,
      build_rm_input(r["question"], r["answer"], r["solution"]),
    ]
  return texts


def build_raw_tokenizer(
  vocab_size: int = DEFAULT_VOCAB_SIZE, n_rows: int = 3000, seed: int = 12345
) -> RawTokenizer:
  """The `tokenizers` object: byte-level BPE with digit isolation, trained on the task corpus."""
  n_bytes = len(pre_tokenizers.ByteLevel.alphabet())
  if vocab_size < n_bytes + len(SPECIAL_TOKENS):
    raise ValueError(
      f"vocab_size must be >= {n_bytes + len(SPECIAL_TOKENS)} (all bytes + "
      f"special tokens), got {vocab_size}"
    )
  raw = RawTokenizer(models.BPE(fuse_unk=False))
  raw.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]
  )
  raw.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(SPECIAL_TOKENS),
    min_frequency=2,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  raw.train_from_iterator(training_corpus(n_rows, seed), trainer=trainer)
  return raw


def build_small_tokenizer(
  out_dir: str | os.PathLike,
  vocab_size: int = DEFAULT_VOCAB_SIZE,
  n_rows: int = 3000,
  seed: int = 12345,
) -> Path:
  """Builds the tokenizer and saves it as an HF tokenizer directory (atomic replace).

  Load it with `cooper_jax.tokenizer.load_tokenizer(out_dir)`; `save_hf_dir(...,
  tokenizer=...)` copies it into model checkpoints.
  """
  raw = build_raw_tokenizer(vocab_size, n_rows, seed)
  hf = PreTrainedTokenizerFast(
    tokenizer_object=raw,
    bos_token="<|im_start|>",
    eos_token="<|im_end|>",
    unk_token="<|endoftext|>",
    pad_token="<|pad|>",
    chat_template=CHAT_TEMPLATE,
    # Cleanup would turn " ," into "," and break decode(encode(x)) == x.
    clean_up_tokenization_spaces=False,
    model_max_length=512,
  )
  from cooper_jax.io import atomic_dir  # pylint: disable=import-outside-toplevel

  with atomic_dir(out_dir) as tmp:
    hf.save_pretrained(tmp)
  return Path(out_dir)


def main(argv=None) -> None:
  import argparse  # pylint: disable=import-outside-toplevel

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
  a = p.parse_args(argv)
  print(build_small_tokenizer(a.out, a.vocab_size))


if __name__ == "__main__":
  main()
