"""Text <-> token ids for the policy and reward models, without torch.

Sources: a Hugging Face checkpoint directory, a GGUF file (tokenizer rebuilt from its
metadata with the `tokenizers` library), the embedded SmolLM2 name, or a hub repo id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer
from transformers import PreTrainedTokenizerFast

from cooper_jax.prompts import left_pad

# Tokens that end an assistant turn or a document, whichever the vocabulary has. Stopping
# on the document end too keeps a model that skips <|im_end|> from running to max length.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")

# GGUF tokenizer.ggml.token_type values (llama.cpp llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4

# llama.cpp pre-tokenizer names whose rule is "isolate every \p{N}, then the GPT-2 regex",
# i.e. HF's Sequence[Digits(individual_digits=True), ByteLevel]. transformers' own GGUF
# loader does not know "smollm" and drops the digit step, which changes ids wherever a
# whitespace run precedes a number ("  7" -> [256, 39] here vs [216, 216, 39] there).
_DIGIT_SPLIT_PRES = frozenset({"smollm", "starcoder", "refact"})
_PLAIN_GPT2_PRES = frozenset({"gpt2", "default"})


class Tokenizer:
  """A `PreTrainedTokenizerFast` plus the ids and batching the rest of the code needs."""

  def __init__(self, hf: PreTrainedTokenizerFast, extra_eos_ids: Sequence[int] = ()):
    if hf.eos_token_id is None:
      raise ValueError("tokenizer has no eos token; generation could never stop")
    if hf.pad_token_id is None:
      # Pads are masked out everywhere, so any real id works; eos is the usual choice.
      hf.pad_token = hf.eos_token
    self.hf = hf
    self.bos_id: int | None = hf.bos_token_id
    self.eos_id: int = hf.eos_token_id
    self.pad_id: int = hf.pad_token_id
    vocab = hf.get_vocab()
    ends = [self.eos_id, *extra_eos_ids, *(vocab[t] for t in _END_TOKENS if t in vocab)]
    self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in ends))
    self.vocab_size: int = len(hf)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    return self.hf.decode(
      [int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=skip_special_tokens
    )

  def batch_decode(self, rows, skip_special_tokens: bool = True) -> list[str]:
    return [self.decode(r, skip_special_tokens=skip_special_tokens) for r in rows]

  def chat_prompt(self, user_text: str, system: str | None = None) -> str:
    """The model's chat template rendered up to the start of the assistant turn."""
    if not self.hf.chat_template:
      raise ValueError("tokenizer has no chat template")
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": user_text})
    return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

  def encode_prompts(
    self, texts: Sequence[str], max_len: int | None = None, pad_to_multiple: int = 1
  ) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded (tokens int32 [B, P], mask bool [B, P]); mask is False on pads.

    Left padding puts every prompt's last token in column P-1, so generation appends at
    the same position for all rows. P is the longest prompt rounded up to
    `pad_to_multiple` (fewer distinct shapes to compile), capped at `max_len`. Prompts
    are never truncated: cutting the front of a question silently changes the task.
    Special tokens are not added; rendered chat prompts already carry them.
    """
    if not texts:
      raise ValueError("encode_prompts needs at least one prompt")
    if pad_to_multiple < 1:
      raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
    rows = [self.encode(t) for t in texts]
    for i, r in enumerate(rows):
      if not r:
        raise ValueError(f"prompt {i} encodes to no tokens")
      if max_len is not None and len(r) > max_len:
        raise ValueError(f"prompt {i} has {len(r)} tokens, more than max_len={max_len}")
    tokens, mask, _ = left_pad(rows, self.pad_id, max_len, pad_to_multiple)
    return tokens, mask


def _gguf_fields(path: str) -> dict:
  import gguf  # pylint: disable=import-outside-toplevel

  reader = gguf.GGUFReader(path)
  return {
    k: f.contents()
    for k, f in reader.fields.items()
    if k.startswith("tokenizer.") or k == "general.architecture"
  }


def _byte_level_pre_tokenizer(pre: str):
  if pre in _DIGIT_SPLIT_PRES:
    return pre_tokenizers.Sequence(
      [
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
      ]
    )
  if pre in _PLAIN_GPT2_PRES:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  # Each llama.cpp pre-tokenizer is its own regex; guessing one would give plausible but
  # wrong ids that no error would ever surface.
  raise NotImplementedError(
    f"GGUF tokenizer.ggml.pre={pre!r} is not supported "
    f"(supported: {sorted(_DIGIT_SPLIT_PRES | _PLAIN_GPT2_PRES)})"
  )


def tokenizer_from_gguf(path: str | os.PathLike) -> Tokenizer:
  """Rebuilds a byte-level BPE tokenizer from GGUF metadata alone."""
  path = os.fspath(path)
  meta = _gguf_fields(path)
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise NotImplementedError(
      f"{path}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
    )
  if meta.get("tokenizer.ggml.add_bos_token") or meta.get("tokenizer.ggml.add_eos_token"):
    # Encoding never adds special tokens here; a model that expects them would be fed
    # prompts it was not trained on, so refuse rather than silently differ.
    raise NotImplementedError(f"{path}: GGUF asks for automatic BOS/EOS, which is not supported")
  tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
  vocab = {t: i for i, t in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError(f"{path}: GGUF vocabulary has duplicate tokens")
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]

  # No unk_token: bytes missing from the vocab (SmolLM2 lacks 21, e.g. 0x04, 0xF1) are
  # dropped, as transformers' GGUF loader and the HF SmolLM2 tokenizer do.
  raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
  raw.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
  raw.decoder = decoders.ByteLevel()
  # Registering control/user tokens makes them match whole in text (`<|im_start|>` is one
  # id, not 6 pieces); they are already in the vocab, so their ids do not change.
  types = list(meta.get("tokenizer.ggml.token_type", []))
  raw.add_special_tokens(
    [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
  )
  raw.add_tokens(
    [
      AddedToken(t, special=False, normalized=False)
      for t, k in zip(tokens, types)
      if k == _USER_DEFINED
    ]
  )

  def token(key: str) -> str | None:
    i = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if i is None else tokens[int(i)]

  hf = PreTrainedTokenizerFast(
    tokenizer_object=raw,
    bos_token=token("bos"),
    eos_token=token("eos"),
    unk_token=token("unknown"),
    pad_token=token("padding"),
    chat_template=meta.get("tokenizer.chat_template"),
    # Cleanup would turn " ," into "," and break decode(encode(x)) == x.
    clean_up_tokenization_spaces=False,
  )
  return Tokenizer(hf)


def _generation_eos_ids(path: Path) -> list[int]:
  """eos ids from generation_config.json (e.g. Llama 3 stops on several)."""
  try:
    eos = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
  except (OSError, ValueError):
    return []
  return [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]


def tokenizer_from_dir(path: str | os.PathLike) -> Tokenizer:
  """A Hugging Face checkpoint directory with tokenizer.json (and tokenizer_config.json)."""
  path = Path(path)
  if not (path / "tokenizer.json").is_file():
    raise FileNotFoundError(f"{path}: no tokenizer.json (only fast tokenizers are supported)")
  # PreTrainedTokenizerFast, not AutoTokenizer: it loads tokenizer.json as written. With
  # transformers 5, AutoTokenizer on SmolLM2's tokenizer_class "GPT2Tokenizer" rebuilds
  # a plain ByteLevel pre-tokenizer and silently loses the digit split.
  hf = PreTrainedTokenizerFast.from_pretrained(
    os.fspath(path), local_files_only=True, clean_up_tokenization_spaces=False
  )
  return Tokenizer(hf, _generation_eos_ids(path))


def load_tokenizer(source: str | os.PathLike) -> Tokenizer:
  """From an HF directory, a .gguf file, "smollm2-135m-instruct", or a hub repo id."""
  # Imported here: cooper_jax.weights pulls in JAX, which a tokenizer alone does not need.
  from cooper_jax.weights import resolve_weights  # pylint: disable=import-outside-toplevel

  source = os.fspath(source)
  path = resolve_weights(source)
  if path.endswith(".gguf"):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"GGUF file not found: {path}")
    return tokenizer_from_gguf(path)
  if os.path.isdir(path):
    return tokenizer_from_dir(path)
  if os.path.exists(path):
    raise ValueError(f"{path}: not a checkpoint directory or a .gguf file")
  try:  # a hub repo id, for users with hub access; snapshot_download fails fast offline
    from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel

    local = snapshot_download(
      path,
      allow_patterns=[
        "tokenizer*",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template*",
        "generation_config.json",
      ],
    )
  except Exception as e:  # noqa: BLE001 - re-raised with the source named
    raise FileNotFoundError(
      f"tokenizer source {source!r} could not be found locally (not a directory, a .gguf "
      f"file, or 'smollm2-135m-instruct'), and fetching it from the Hugging Face hub "
      f"failed: {e}"
    ) from e
  return tokenizer_from_dir(local)


__all__ = ["Tokenizer", "load_tokenizer", "tokenizer_from_dir", "tokenizer_from_gguf"]
