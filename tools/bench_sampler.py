"""Sampler throughput: cooper_jax `sample` vs Hugging Face `generate`, as a markdown table.

CPU mode (default), run with the project venv:

    python tools/bench_sampler.py [--batch 16] [--new-tokens 128] [--prompt-len P] [--no-bf16]

Both sides use the real embedded SmolLM2-135M-Instruct weights (float32) and the SAME
left-padded token ids: the first `--batch` GSM8K test questions, chat-templated. Every row is
forced to produce exactly `--new-tokens` tokens (HF: min_new_tokens = max_new_tokens; ours:
eos_ids=()), sampling at temperature 1.0 with no top-k/top-p. HF runs torch on the CPU in the
throwaway reference venv (--torch-python), as a subprocess: torch is never imported here.
Each side gets a warm-up call first, then --reps timed calls of which the best counts (this
2-core VM is noisy: the same HF call varies several-fold); ours is compiled ahead of time
(jit(...).lower(...).compile()) and that compile time is reported separately.

GPU mode (`--gpu`; no torch needed): random bfloat16 weights of the SmolLM2-135M and
Qwen2.5-1.5B shapes, batch 256, 256-token prompts, 512 new tokens, next to the peer's HF
numbers on an H200.
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
TORCH_PY = "/tmp/torchref/venv/bin/python"
EMBEDDED = "smollm2-135m-instruct"

# Peer numbers: HF generate on one H200, new tokens/s at batch 256, prompt 256, 512 new.
PEER_H200 = {"smollm2-135m": 3456.0, "qwen2.5-1.5b": 3755.0}


def gpu_shapes():
  from cooper_jax.models.config import ModelConfig  # pylint: disable=import-outside-toplevel

  common = dict(param_dtype="bfloat16", dtype="bfloat16", max_seq_len=8192)
  return {
    "smollm2-135m": ModelConfig(
      vocab_size=49152,
      d_model=576,
      n_layers=30,
      n_heads=9,
      n_kv_heads=3,
      head_dim=64,
      d_ff=1536,
      rope_theta=10000.0,
      rms_eps=1e-5,
      tie_embeddings=True,
      family="llama",
      **common,
    ),
    "qwen2.5-1.5b": ModelConfig(
      vocab_size=151936,
      d_model=1536,
      n_layers=28,
      n_heads=12,
      n_kv_heads=2,
      head_dim=128,
      d_ff=8960,
      rope_theta=1e6,
      rms_eps=1e-6,
      qkv_bias=True,
      tie_embeddings=True,
      family="qwen2",
      **common,
    ),
  }


# ------------------------------------------------------------------------------ HF (torch venv)
def hf_worker(npz_path: str, out_json: str) -> None:
  """Runs inside the torch venv: loads the GGUF with transformers, times generate()."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from transformers import AutoModelForCausalLM  # pylint: disable=import-outside-toplevel

  z = np.load(npz_path)
  gguf_path, n = str(z["gguf_path"]), int(z["new_tokens"])
  tokens = torch.from_numpy(z["tokens"].astype(np.int64))
  mask = torch.from_numpy(z["mask"].astype(np.int64))
  pad_id, reps = int(z["pad_id"]), int(z["reps"])
  t0 = time.perf_counter()
  model = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
  )
  model.eval()
  load_s = time.perf_counter() - t0

  def gen(n_new, seed):
    torch.manual_seed(seed)
    with torch.inference_mode():
      return model.generate(
        tokens,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_new_tokens=n_new,
        max_new_tokens=n_new,
        pad_token_id=pad_id,
      )

  gen(min(n, 8), 0)  # warm-up
  load = os.getloadavg()[0]
  times = []
  for rep in range(reps):
    t0 = time.perf_counter()
    out = gen(n, 1 + rep)
    times.append(time.perf_counter() - t0)
  secs = min(times)
  produced = int(out.shape[1] - tokens.shape[1])
  with open(out_json, "w", encoding="utf-8") as f:
    json.dump(
      {
        "seconds": secs,
        "all_seconds": times,
        "new_tokens": produced,
        "batch": int(tokens.shape[0]),
        "load_s": load_s,
        "loadavg": load,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
      },
      f,
    )


def run_hf(tokens, mask, pad_id, new_tokens, torch_python, reps) -> dict:
  from cooper_jax.weights import resolve_weights  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as tmp:
    npz, out = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.json")
    np.savez(
      npz,
      tokens=tokens,
      mask=mask,
      pad_id=pad_id,
      new_tokens=new_tokens,
      reps=reps,
      gguf_path=resolve_weights(EMBEDDED),
    )
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", TQDM_DISABLE="1")
    subprocess.run(
      [torch_python, os.path.abspath(__file__), "--hf-worker", npz, out],
      check=True,
      env=env,
      cwd=REPO,
    )
    with open(out, encoding="utf-8") as f:
      return json.load(f)


# --------------------------------------------------------------------------------- ours (JAX)
def time_ours(cfg, params, tokens, mask, new_tokens, pad_id, reps=1) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from cooper_jax.sampling import sample  # pylint: disable=import-outside-toplevel

  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  # Compile ahead of time, so compile time is measured on its own, not as a difference of
  # two noisy runs; the timed calls run the very executable `sample` would use.
  t0 = time.perf_counter()
  compiled = sample.lower(
    params,
    tokens,
    mask,
    jax.random.PRNGKey(0),
    cfg=cfg,
    max_new_tokens=new_tokens,
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    eos_ids=(),
    pad_id=pad_id,
  ).compile()
  compile_s = time.perf_counter() - t0
  run = lambda seed: compiled(params, tokens, mask, jax.random.PRNGKey(seed))
  t0 = time.perf_counter()
  jax.block_until_ready(run(0))  # warm-up
  first_s = time.perf_counter() - t0
  load = os.getloadavg()[0]
  times = []
  for rep in range(reps):
    t0 = time.perf_counter()
    out = jax.block_until_ready(run(1 + rep))
    times.append(time.perf_counter() - t0)
  secs = min(times)
  produced = int(np.asarray(out.mask).sum())
  if produced != tokens.shape[0] * new_tokens:
    raise RuntimeError(f"expected {tokens.shape[0] * new_tokens} new tokens, got {produced}")
  return {
    "seconds": secs,
    "all_seconds": times,
    "new_tokens": new_tokens,
    "batch": int(tokens.shape[0]),
    "compile_s": compile_s,
    "first_call_s": first_s,
    "loadavg": load,
  }


def tok_s(r: dict) -> float:
  return r["batch"] * r["new_tokens"] / r["seconds"]


def cpu_prompts(batch: int, prompt_len: int | None):
  """Left-padded ids of the first `batch` GSM8K test questions, chat-templated."""
  path = os.path.join(REPO, "data", "gsm8k", "test.jsonl")
  with open(path, encoding="utf-8") as f:
    questions = [json.loads(line)["question"] for _, line in zip(range(batch), f)]
  if len(questions) < batch:
    raise SystemExit(f"only {len(questions)} GSM8K test questions available")
  try:
    from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel

    tok = load_tokenizer(EMBEDDED)
    texts = [tok.chat_prompt(q) for q in questions]
    tokens, mask = tok.encode_prompts(texts, pad_to_multiple=16)
    pad_id, source = tok.pad_id, "cooper_jax.tokenizer"
  except ImportError:  # the project tokenizer is optional here; fall back to transformers'
    from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

    from cooper_jax.weights import resolve_weights  # pylint: disable=import-outside-toplevel

    g = resolve_weights(EMBEDDED)
    hf = AutoTokenizer.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g))
    rows = [
      hf.apply_chat_template(
        [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
      )
      for q in questions
    ]
    rows = [list(r["input_ids"]) if isinstance(r, dict) else list(r) for r in rows]
    width = -(-max(map(len, rows)) // 16) * 16
    pad_id, source = hf.pad_token_id if hf.pad_token_id is not None else 2, "transformers GGUF"
    tokens = np.full((batch, width), pad_id, np.int32)
    mask = np.zeros((batch, width), bool)
    for i, r in enumerate(rows):
      tokens[i, width - len(r) :], mask[i, width - len(r) :] = r, True
  if prompt_len is not None:
    if prompt_len < tokens.shape[1] and mask[:, : tokens.shape[1] - prompt_len].any():
      raise SystemExit(
        f"--prompt-len {prompt_len} is shorter than the longest prompt "
        f"({int(mask.sum(1).max())} tokens)"
      )
    extra = prompt_len - tokens.shape[1]
    tokens = np.pad(tokens, ((0, 0), (max(extra, 0), 0)), constant_values=pad_id)[:, -prompt_len:]
    mask = np.pad(mask, ((0, 0), (max(extra, 0), 0)))[:, -prompt_len:]
  return np.asarray(tokens, np.int32), np.asarray(mask, bool), int(pad_id), source


def cpu_mode(args) -> None:
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel

  batch, n = args.batch or 16, args.new_tokens or 128
  tokens, mask, pad_id, tok_source = cpu_prompts(batch, args.prompt_len)
  lens = mask.sum(1)
  print(
    f"# CPU: SmolLM2-135M-Instruct (embedded GGUF, Q4_1 dequantised), batch {batch}, "
    f"prompts {int(lens.min())}-{int(lens.max())} tokens left-padded to {tokens.shape[1]} "
    f"({tok_source}), {n} new tokens forced, temperature 1.0; jax {jax.__version__} "
    f"on {jax.devices()[0].platform}, {os.cpu_count()} CPU cores",
    flush=True,
  )
  rows = []
  hf = None
  if not args.no_hf:
    hf = run_hf(tokens, mask, pad_id, n, args.torch_python, args.reps)
    rows.append(
      (f"HF generate, torch {hf['torch']} CPU float32 ({hf['threads']} threads)", hf, None)
    )
    print(f"HF: {tok_s(hf):.1f} tok/s", flush=True)
  cfg, params = load_pretrained(EMBEDDED)
  ours = time_ours(cfg, params, tokens, mask, n, pad_id, args.reps)
  rows.append(("cooper_jax sample, float32", ours, ours["compile_s"]))
  print(f"ours f32: {tok_s(ours):.1f} tok/s", flush=True)
  if not args.no_bf16:
    try:
      import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

      cfg16 = cfg.replace(param_dtype="bfloat16", dtype="bfloat16")
      p16 = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params)
      r16 = time_ours(cfg16, p16, tokens, mask, n, pad_id, args.reps)
      rows.append(("cooper_jax sample, bfloat16 params+compute", r16, r16["compile_s"]))
      print(f"ours bf16: {tok_s(r16):.1f} tok/s", flush=True)
    except Exception as e:  # noqa: BLE001 - an extra row only
      print(f"(bfloat16 row skipped: {type(e).__name__}: {e})")
  print()
  print("| sampler | new tok/s | best timed s (all) | compile s | vs HF | load avg |")
  print("|---|---:|---:|---:|---:|---:|")
  for name, r, comp in rows:
    ratio = f"{tok_s(r) / tok_s(hf):.2f}x" if hf else "-"
    comp_s = "-" if comp is None else f"{comp:.1f}"
    all_s = ", ".join(f"{t:.1f}" for t in r["all_seconds"])
    print(
      f"| {name} | {tok_s(r):,.1f} | {r['seconds']:.2f} ({all_s}) | {comp_s} | {ratio} | "
      f"{r['loadavg']:.1f} |"
    )
  print(
    f"\nload avg = 1-minute load average when timing began, on {os.cpu_count()} cores: "
    "anything well above the core count means other processes shared the CPU."
  )


def gpu_mode(args) -> None:
  import jax  # pylint: disable=import-outside-toplevel

  from cooper_jax.models.transformer import init_params  # pylint: disable=import-outside-toplevel

  batch, n, p = args.batch or 256, args.new_tokens or 512, args.prompt_len or 256
  backend = jax.default_backend()
  if backend != "gpu":
    print(f"WARNING: jax backend is {backend!r}, not 'gpu'; peer numbers are for an H200")
  print(
    f"# {backend}: {jax.devices()[0].device_kind}, random bfloat16 weights, batch {batch}, "
    f"prompt {p}, {n} new tokens forced, temperature 1.0; jax {jax.__version__}",
    flush=True,
  )
  shapes = gpu_shapes()
  names = args.shapes.split(",") if args.shapes else list(shapes)
  rows = []
  for name in names:
    cfg = shapes[name]
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size, size=(batch, p), dtype=np.int32)
    mask = np.ones((batch, p), bool)
    r = time_ours(cfg, params, tokens, mask, n, pad_id=0, reps=args.reps)
    rows.append((name, cfg, r))
    print(f"{name}: {tok_s(r):,.0f} tok/s", flush=True)
    del params
  print()
  print("| shape | params | ours new tok/s | timed s | compile s | HF H200 new tok/s | ours/HF |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for name, cfg, r in rows:
    peer = PEER_H200.get(name)
    ratio = f"{tok_s(r) / peer:.2f}x" if peer else "-"
    print(
      f"| {name} | {cfg.num_params() / 1e9:.3f}B | {tok_s(r):,.0f} | {r['seconds']:.2f} | "
      f"{r['compile_s']:.1f} | {peer:,.0f} | {ratio} |"
    )


def main() -> None:
  if len(sys.argv) == 4 and sys.argv[1] == "--hf-worker":
    hf_worker(sys.argv[2], sys.argv[3])
    return
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--gpu", action="store_true", help="random-weight shapes, peer H200 numbers")
  ap.add_argument("--batch", type=int, default=None, help="default 16 (CPU) / 256 (GPU)")
  ap.add_argument("--new-tokens", type=int, default=None, help="default 128 (CPU) / 512 (GPU)")
  ap.add_argument(
    "--prompt-len",
    type=int,
    default=None,
    help="GPU: prompt length (default 256); CPU: left-pad prompts to this width",
  )
  ap.add_argument("--shapes", default=None, help="GPU: comma list of " + ",".join(PEER_H200))
  ap.add_argument(
    "--reps", type=int, default=2, help="timed repetitions after the warm-up; the best is reported"
  )
  ap.add_argument("--no-hf", action="store_true", help="CPU: skip the HF row")
  ap.add_argument("--no-bf16", action="store_true", help="CPU: skip the bfloat16 row")
  ap.add_argument("--torch-python", default=TORCH_PY, help="python of the torch venv")
  args = ap.parse_args()
  sys.path.insert(0, REPO)
  (gpu_mode if args.gpu else cpu_mode)(args)


if __name__ == "__main__":
  main()
