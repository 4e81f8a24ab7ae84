"""The GPU mode of benchmarks/run.py: random bfloat16 weights of the SmolLM2-135M and
Qwen2.5-1.5B shapes against Hugging Face numbers recorded on one H200
(../shared/docs/gpu-and-peers.md), and, with --quick on a CPU, a trace of the full-size sampler
and policy step (what a CPU can check of them)."""

from __future__ import annotations

import time
from pathlib import Path

# Hugging Face transformers 5.17 / PyTorch 2.11 on one H200, random bf16 weights
# (../shared/docs/gpu-and-peers.md): generate at batch 256, prompt 256, 512 new tokens, and a
# train step (fwd + bwd + AdamW); SmolLM2's step was measured at 32 x 1024 tokens.
H200_GENERATE = {"smollm2-135m": 3456.0, "qwen2.5-1.5b": 3755.0}
H200_STEP = {"smollm2-135m": 180e3, "qwen2.5-1.5b": 39.6e3}
H200_BF16_PEAK = 989e12  # dense bf16 datasheet FLOP/s, the MFU denominator of the peer numbers


def recorded_peer(rate: float, label: str):
  """A peer side that is a recorded rate: seconds = our token count / that rate."""

  def gen(tokens, mask, pad_id, n, reps):
    b = tokens.shape[0]
    return {"seconds": [b * n / rate], "new_tokens": n, "batch": b, "label": label}

  def step(tokens, prompt_len, adv, reps):
    return {"seconds": [tokens.size / rate], "tokens": int(tokens.size), "label": label}

  return gen, step


def trace_full_shapes(report, shapes, sz_full: dict) -> None:
  """Lowers (traces to StableHLO, no compile) the full-size sampler and policy step of each
  shape from abstract values: the shapes check out without the memory or a GPU."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from benchmarks.sections import one_device_mesh  # pylint: disable=import-outside-toplevel
  from cooper_jax import optim, steps  # pylint: disable=import-outside-toplevel
  from cooper_jax.config import base_config  # pylint: disable=import-outside-toplevel
  from cooper_jax.models.transformer import init_params  # pylint: disable=import-outside-toplevel
  from cooper_jax.sampling import SampleOptions, sample  # pylint: disable=import-outside-toplevel

  out = {}
  b, p, n = sz_full["batch"], sz_full["prompt"], sz_full["new_tokens"]
  rows, sp, sn = sz_full["step"]
  c = base_config()
  c.policy.loss.kl_coef = 0.0
  opt = optim.make_optimizer(c.policy.optim, 100)
  for name, cfg in shapes.items():
    t0 = time.perf_counter()
    params = jax.eval_shape(lambda k, cfg=cfg: init_params(cfg, k), jax.random.key(0))
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
    bools = lambda *s: jax.ShapeDtypeStruct(s, jnp.bool_)
    options = SampleOptions(max_new_tokens=n, eos_ids=())
    sample.lower(params, i32(b, p), bools(b, p), jax.random.key(0), cfg=cfg, options=options)
    step_cfg = cfg.replace(param_dtype="float32", remat="full")
    sparams = jax.eval_shape(lambda k, cfg=step_cfg: init_params(cfg, k), jax.random.key(0))
    state = jax.eval_shape(lambda pr: steps.init_state(pr, opt), sparams)
    batch = {
      "prompt_tokens": i32(rows, sp),
      "prompt_mask": bools(rows, sp),
      "response_tokens": i32(rows, sn),
      "response_mask": bools(rows, sn),
      "advantages": jax.ShapeDtypeStruct((rows,), jnp.float32),
    }
    fn = steps.make_policy_step(step_cfg, c.policy.loss, opt, one_device_mesh(), state, batch)
    fn.lower(state, batch)
    out[name] = {"lowered_s": time.perf_counter() - t0, "params": cfg.num_params()}
    print(f"{name}: full-size sampler and policy_step lower OK ({out[name]['lowered_s']:.1f} s)")
  report.extras["full_shapes_lowered"] = out


def tunix_on_gpu(report, name: str, cfg, sz: dict, args) -> None:
  """tunix's Sampler vs ours on the same random weights of shape `name` (exported to an HF
  directory in the model's dtype), random prompts at the sampler sizes, gate in float32."""
  import tempfile  # pylint: disable=import-outside-toplevel

  import numpy as np  # pylint: disable=import-outside-toplevel

  from benchmarks import sections as S  # pylint: disable=import-outside-toplevel
  from benchmarks import tunix_side  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights.hf_io import save_hf_dir  # pylint: disable=import-outside-toplevel

  def prompts(b, width=sz["prompt"], seed=0):
    tokens, mask, pad = S.random_prompts(b, width, cfg.vocab_size, seed)
    # tunix pads with an id found in no prompt: keep its preferred one out of random ids
    tokens[tokens == tunix_side.PREFERRED_PAD] = tunix_side.PREFERRED_PAD + 1
    return tokens, mask, pad

  params = S.random_params(cfg)
  with tempfile.TemporaryDirectory(prefix="tunix_gpu_", dir=args.workdir) as tmp:
    hf_dir = str(save_hf_dir(cfg, params, Path(tmp) / name))
    gate_tokens, gate_mask, _ = prompts(2, 32, 1)
    tunix_side.tunix_sampler_section(
      report,
      cfg,
      params,
      prompts,
      sz["batches"],
      sz["new_tokens"],
      args.tunix_python,
      hf_dir,
      args.runs,
      sz["reps"],
      gpu=tunix_side.GpuRun(name, cfg.dtype, (gate_tokens, np.asarray(gate_mask))),
    )
  print(f"{name} tunix_sampler done", flush=True)


def gpu_mode(args, report, sz: dict, cpu_only=()) -> None:
  """The GPU sections at sizes `sz` (run.sizes); `cpu_only` sections are named and skipped."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from benchmarks import sections as S  # pylint: disable=import-outside-toplevel

  if jax.default_backend() != "gpu":
    print(f"WARNING: jax backend is {jax.default_backend()!r}, not 'gpu'; peers are an H200")
  shapes = S.gpu_shapes()
  for name in cpu_only:
    if name in args.only:
      print(f"{name}: CPU mode only, skipped")
  if args.quick:
    full = dict(batch=256, prompt=256, new_tokens=512, step=(16, 512, 512))
    trace_full_shapes(report, shapes, full)
    tiny = dict(
      vocab_size=1024, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128
    )
    shapes = {k: v.replace(**tiny) for k, v in shapes.items()}
  n_peak, peak_reps = sz["peak"]
  dtype = jnp.float32 if args.quick else jnp.bfloat16  # bf16 matmuls crawl on a CPU
  peak = lambda: S.matmul_peak(n_peak, peak_reps, dtype)
  report.extras["matmul_peak"] = peak()
  for name, cfg in shapes.items():
    gen = recorded_peer(H200_GENERATE[name], "HF generate, H200 (recorded)")[0]
    step = recorded_peer(H200_STEP[name], "PyTorch step, H200 (recorded)")[1]
    if "tunix_sampler" in args.only:
      tunix_on_gpu(report, name, cfg, sz, args)
    if "sampler" in args.only:
      params = S.random_params(cfg)
      S.sampler_section(
        report,
        cfg,
        params,
        lambda b, cfg=cfg: S.random_prompts(b, sz["prompt"], cfg.vocab_size),
        sz["batches"],
        sz["new_tokens"],
        gen,
        peak,
        args.runs,
        sz["reps"],
        name=name,
        targets={("hf", 256): 30.0},
        peer_label="HF generate H200 (recorded)",
      )
      del params
    if "policy_step" not in args.only:
      continue
    b, p, n = sz["step"]
    step_cfg = cfg.replace(param_dtype="float32", remat="full")  # mixed precision, as the paper
    sparams = S.random_params(step_cfg)
    S.policy_step_section(
      report,
      step_cfg,
      sparams,
      S.policy_batch(step_cfg, b, p, n),
      step,
      peak,
      args.runs,
      sz["reps"],
      name=name,
      peer_label="PyTorch step H200 (recorded)",
    )
    del sparams
    # MFU against the datasheet peak (how the peer numbers were quoted), from the same runs.
    vs_peak = report.figures[-1]
    mfu = report.figure(
      key=f"{name}_policy_step_mfu",
      label=f"{name} policy_step: MFU (model FLOP/s / 989 TFLOP/s bf16 datasheet)",
      unit="GFLOP/s",
      ours_label="policy_step",
      peer_label="datasheet",
      target=0.45 if name == "qwen2.5-1.5b" else None,
    )
    for r in vs_peak.runs:
      mfu.add_run(r["ours"], H200_BF16_PEAK / 1e9, r["load1"])
  for f in report.figures:
    if f.peer_label.endswith("(recorded)"):
      f.notes.append("peer side is a recorded number (../shared/docs/gpu-and-peers.md), not rerun")
  report.meta["absolute_targets"] = "sampler >= 100k new tok/s (135M), 60k (1.5B) on an H200"
