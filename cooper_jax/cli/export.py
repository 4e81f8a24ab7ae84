"""Export a training run's policy and RM as Hugging Face safetensors directories.

  cooper-export --run runs/qwen_cooper --out exports/qwen_cooper [--step 200] \
      [--dtype bfloat16]

Writes OUT/policy (`*ForCausalLM`: config.json, generation_config.json, model.safetensors,
tokenizer files) and, when the run trained or used an RM, OUT/rm (`*ForSequenceClassification`
with num_labels=1, tokenizer files). The checkpoint step's manifest is verified before
anything is read; each directory is written atomically.
"""

from __future__ import annotations

import argparse

from cooper_jax.checkpoint import load_model_from_run
from cooper_jax.tokenizer import load_tokenizer
from cooper_jax.weights import save_hf_dir


def export_run(run: str, out: str, step: int | None = None, dtype: str | None = None) -> dict:
  """{"policy": dir, "rm": dir or None}: the exported directories."""
  written = {}
  for which in ("policy", "rm"):
    try:
      cfg, params, tok_src = load_model_from_run(run, which, step)
    except ValueError as e:
      if which == "rm" and "has no RM" in str(e):  # a rule-reward run: nothing to export
        written[which] = None
        continue
      raise
    tok = load_tokenizer(tok_src)
    # Special ids the tokenizer knows and the config may lack (a random model's): the RM's
    # *ForSequenceClassification needs pad, `generate` needs eos.
    ids = {"pad_id": tok.pad_id, "eos_id": tok.eos_id, "bos_id": tok.bos_id}
    cfg = cfg.replace(**{k: v for k, v in ids.items() if getattr(cfg, k) is None})
    written[which] = str(save_hf_dir(cfg, params, f"{out}/{which}", tokenizer=tok, dtype=dtype))
  return written


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--run", required=True, help="training workdir (or its checkpoints/ dir)")
  p.add_argument("--out", required=True)
  p.add_argument("--step", type=int, default=None, help="default: the newest step")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
  a = p.parse_args(argv)
  written = export_run(a.run, a.out, a.step, a.dtype)
  for which, path in written.items():
    print(f"{which}: {path or 'none (rule-reward run)'}")
  return written


def cli() -> int:
  """Console-script entry point (pyproject.toml): exit status 0 once main returns."""
  main()
  return 0


if __name__ == "__main__":
  main()
