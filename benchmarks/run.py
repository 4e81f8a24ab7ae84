"""cooper_jax next to its peers, every figure a ratio of two sides measured in the same run.

  python benchmarks/run.py --out results/bench/cpu.json           # CPU, the real SmolLM2-135M
  python benchmarks/run.py --quick --allow-noisy                  # tiny sizes, a smoke check
  python benchmarks/run.py --gpu --out results/bench/gpu.json     # GPU, random 135M/1.5B shapes

CPU sections (`--only` picks some):
  matmul       jax's 2048-cube float32 matmul (the peak the FLOP/s figures divide by) vs
               PyTorch's on the same CPU.
  sampler      cooper_jax `sample` vs HF `generate` (torch, fp32) on the embedded SmolLM2-135M
               (exported with save_hf_dir, so both load the same weights) and the same token
               ids (the first GSM8K test questions, chat-templated, left-padded), batches 16
               and 64, 128 new tokens at temperature 1.0 with EOS disabled on both sides; and
               the sampler's model FLOP/s vs this CPU's 2048-cube float32 matmul in jax.
  decode_floor the sampler's decode step (batches 16 and 64) against this CPU's floors, measured
               in the same run: fp32 weight bytes / streaming read bandwidth (target: at least
               0.5 of it at batch 16), weights + KV cache, and model FLOPs / matmul rate
               (benchmarks/floors.py).
  policy_step  `policy_step` tokens/s vs a PyTorch forward + backward + AdamW on the same
               weights and the same 8 x 256 random tokens (128 prompt + 128 response), fp32,
               best of 3 per run; and its model FLOP/s vs the matmul peak.
  checkpoint   CheckpointStore save / restore of the policy + RM train states vs np.save /
               np.load of the same arrays.
  tunix_sampler  cooper_jax `sample` vs tunix's `Sampler` (google-tunix 0.1.7, JAX too) on the
               same weights, ids and sizes as `sampler`, after a correctness gate (logits within
               1e-3 of ours, 16 greedy tokens equal on two prompts); both processes pinned to 2
               CPUs (benchmarks/tunix_side.py, venv --tunix-python, default /tmp/tunix).
  llamacpp_sampler  cooper_jax `sample` vs llama.cpp's batched decode (llama-cpp-python 0.3.36,
               its low-level API as llama.cpp's `batched` example uses it) on an F32 GGUF of the
               embedded weights, same ids and sizes as `sampler`, after the same correctness
               gate; the original Q4_1 file as a labelled extra; 2 threads a side
               (benchmarks/llamacpp_side.py, venv --llamacpp-python, default /tmp/llamacpp).
               Full mode only (it needs the embedded GGUF).
  iteration    one Cooper iteration vs one rule-only iteration of experiments/smollm2.py
               (cpu_smoke sizes, perturb negatives, same seed so the same prompts), through
               cooper_jax.train.train, with the loop's time/* metrics side by side; trained
               on one-step sums (iteration.easy_arithmetic) so that Cooper's RM update falls in
               the timed steps; 2 warm-up steps (policy_step and rm_step compile).
  trl_iteration  one GRPO iteration of TRL's GRPOTrainer (trl 1.16.0, torch, HF generate) vs one
               rule-only iteration of our train loop: experiments/smollm2.py:cpu_smoke sizes and
               GSM8K prompts (the ones our loop draws, in its order, on both sides), same fp32
               weights, rule reward, KL coefficient, lr and EOS ids; per step and split into
               generation / the rest; after a correctness gate as tunix_sampler's; 2 warm-up
               steps; 2 threads a side (benchmarks/trl_side.py, venv --trl-python, default
               /tmp/trl).
  tunix_iteration  the same rule-only GRPO iterations against tunix's own GRPOLearner (RLCluster,
               vanilla rollout, one CPU device, fp32), same config mapping, prompts, weights,
               rule reward (our verify_one) and gate as trl_iteration
               (benchmarks/tunix_grpo_side.py, venv --tunix-python).

The torch side runs in a throwaway venv (--torch-python, default /tmp/ref/bin/python) as one
long-lived subprocess (benchmarks/torch_side.py), so each run times the peer right before ours.
Timing refuses to start when the 1-minute load average is above 2 (printed) unless
--allow-noisy, which marks the results NOISY. Each ratio is measured --runs times (default 3);
the table shows every run and the worst. --quick: tiny random models and sizes, every code path
(the torch peer too, if its venv exists), for CI-speed smoke checks; its numbers mean nothing.
--gpu: random bfloat16 weights of the SmolLM2-135M and Qwen2.5-1.5B shapes, sampler at batch
256, prompt 256, 512 new tokens, policy_step 16 x 1024, against the recorded HF numbers on one
H200 (../shared/docs/gpu-and-peers.md); `--gpu --quick` runs tiny versions of both shapes and
traces (lowers, without compiling) the full-size sampler and step, which is what a CPU can check
(benchmarks/gpu_mode.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `benchmarks` and `cooper_jax` importable
  sys.path.insert(0, str(REPO))

from benchmarks import (  # noqa: E402
  floors,
  gpu_mode,
  harness,
  iteration,
  llamacpp_side,
  trl_side,
  tunix_grpo_side,
  tunix_side,
)
from benchmarks.torch_side import DEFAULT_TORCH_PYTHON  # noqa: E402

SECTIONS = (
  "matmul",
  "sampler",
  "decode_floor",
  "tunix_sampler",
  "llamacpp_sampler",
  "policy_step",
  "checkpoint",
  "iteration",
  "trl_iteration",
  "tunix_iteration",
)
# each in its own venv
PEER_SECTIONS = ("tunix_sampler", "llamacpp_sampler", "trl_iteration", "tunix_iteration")


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=None, help="JSON path (default results/bench/<name>.json)")
  ap.add_argument("--name", default=None, help="default cpu / gpu (+ _quick)")
  ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke check")
  ap.add_argument("--gpu", action="store_true", help="random 135M / 1.5B shapes, H200 peers")
  ap.add_argument("--runs", type=int, default=3, help="paired runs per ratio; worst reported")
  ap.add_argument("--reps", type=int, default=None, help="timed calls per side per run (best)")
  ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ",".join(SECTIONS))
  ap.add_argument("--allow-noisy", action="store_true", help="time even if load > 2 (NOISY)")
  ap.add_argument("--torch-python", default=DEFAULT_TORCH_PYTHON, help="python of the torch venv")
  ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer (no ratios)")
  ap.add_argument(
    "--tunix-python", default=tunix_side.DEFAULT_TUNIX_PYTHON, help="python of the tunix venv"
  )
  ap.add_argument(
    "--llamacpp-python",
    default=llamacpp_side.DEFAULT_LLAMACPP_PYTHON,
    help="python of the llama-cpp-python venv",
  )
  ap.add_argument(
    "--trl-python", default=trl_side.DEFAULT_TRL_PYTHON, help="python of the TRL venv"
  )
  ap.add_argument("--batches", default=None, help="sampler batches (default 16,64)")
  ap.add_argument("--new-tokens", type=int, default=None, help="sampler new tokens (128)")
  ap.add_argument("--workdir", default=None, help="parent of the scratch directory")
  args = ap.parse_args(argv)
  args.only = [s for s in args.only.split(",") if s]
  unknown = set(args.only) - set(SECTIONS)
  if unknown:
    ap.error(f"--only: unknown sections {sorted(unknown)}; choose from {SECTIONS}")
  if args.runs < 1:
    ap.error("--runs must be >= 1")
  args.name = args.name or ("gpu" if args.gpu else "cpu") + ("_quick" if args.quick else "")
  args.out = args.out or str(REPO / "results" / "bench" / f"{args.name}.json")
  return args


def sizes(args) -> dict:
  """Everything the sizes depend on, in one place per mode."""
  q = args.quick
  if args.gpu:
    s = dict(
      batches=[4] if q else [256],
      prompt=16 if q else 256,
      new_tokens=8 if q else 512,
      step=(2, 16, 16) if q else (16, 512, 512),  # rows, prompt, response
      peak=(256, 3) if q else (8192, 5),
      reps=1 if q else 3,
    )
  else:
    s = dict(
      batches=[2, 4] if q else [16, 64],
      new_tokens=8 if q else 128,
      step=(2, 16, 16) if q else (8, 128, 128),
      peak=(256, 3) if q else (2048, 5),
      sampler_reps=1 if q else 2,
      step_reps=1 if q else 3,
      # (spec, overrides, warm-up steps, train on easy sums so the RM updates: see
      # iteration.easy_arithmetic)
      iteration=("experiments/tiny.py", ("rollout.max_new_tokens=8",), 1, False)
      if q
      else (iteration.SMOLLM2_CONFIG, (), 2, True),
      # (spec, overrides, warm-up steps); GSM8K prompts, not the easy sums: rule-only needs no
      # RM update, and 64 new tokens of a GSM8K answer mostly run to the cap on both sides, so
      # both sides generate about the same number of tokens per step.
      trl_iteration=("experiments/tiny.py", ("rollout.max_new_tokens=8",), 1)
      if q
      else (iteration.SMOLLM2_CONFIG, (), 2),
    )
    s["tunix_iteration"] = s["trl_iteration"]  # the same iterations, against tunix
  if args.batches:
    s["batches"] = [int(b) for b in args.batches.split(",")]
  if args.new_tokens:
    s["new_tokens"] = args.new_tokens
  if args.reps:
    s.update(reps=args.reps, sampler_reps=args.reps, step_reps=args.reps)
  return s


def machine() -> str:
  import jax  # pylint: disable=import-outside-toplevel

  d = jax.devices()[0]
  return (
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
    f"jax {jax.__version__} on {d.platform} ({d.device_kind}), Python {platform.python_version()}"
  )


# ------------------------------------------------------------------------------------- CPU
def torch_peer(args, report):
  from benchmarks.torch_side import TorchPeer  # pylint: disable=import-outside-toplevel

  if args.no_torch:
    return None
  try:
    peer = TorchPeer(args.torch_python)
  except FileNotFoundError as e:
    if not args.quick:
      raise
    print(f"(no PyTorch peer: {e})", flush=True)
    return None
  report.meta["torch"] = peer.info
  return peer


def cpu_mode(args, report) -> None:
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import sections as S  # pylint: disable=import-outside-toplevel
  from cooper_jax import optim, steps  # pylint: disable=import-outside-toplevel
  from cooper_jax.config import base_config  # pylint: disable=import-outside-toplevel
  from cooper_jax.weights import load_pretrained, save_hf_dir  # pylint: disable=import-outside-toplevel

  sz = sizes(args)
  scratch = S.scratch_dir(args.workdir)
  root = Path(scratch.name)
  peer = None
  try:
    if args.quick:
      cfg = S.tiny_cfg()
      params = S.random_params(cfg)
      prompts = lambda b: S.random_prompts(b, 16, cfg.vocab_size)
      model = "tiny random llama"
    else:
      from cooper_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel

      cfg, params = load_pretrained(S.EMBEDDED)
      tok = load_tokenizer(S.EMBEDDED)
      prompts = lambda b: S.gsm8k_prompts(b, tok)
      model = "SmolLM2-135M-Instruct (embedded), fp32"
    report.meta["model"] = model
    n_peak, peak_reps = sz["peak"]
    peak = lambda: S.matmul_peak(n_peak, peak_reps)
    first = peak()
    report.extras["matmul_peak"] = first
    print(
      f"matmul peak: {first['flops_per_s'] / 1e9:.1f} GFLOP/s ({n_peak}-cube float32 in jax, "
      f"best of {peak_reps})",
      flush=True,
    )
    needs_peer = {"matmul", "sampler", "policy_step"} & set(args.only)
    peer = torch_peer(args, report) if needs_peer else None
    hf_dir = None
    if peer is not None:
      hf_dir = str(save_hf_dir(cfg, params, root / "hf"))  # the very weights we run
      if "matmul" in args.only:
        S.matmul_section(
          report, lambda: peer.call("matmul", n=n_peak, reps=peak_reps), peak, args.runs
        )
        print("matmul done", flush=True)

    if "sampler" in args.only:
      gen = None
      if peer is not None:

        def gen(tokens, mask, pad_id, n, reps):
          npz = peer.save_arrays(tokens=tokens, mask=mask, pad_id=pad_id)
          return peer.call("generate", hf_dir=hf_dir, npz=npz, new_tokens=n, reps=reps)

      S.sampler_section(
        report,
        cfg,
        params,
        prompts,
        sz["batches"],
        sz["new_tokens"],
        gen,
        peak,
        args.runs,
        sz["sampler_reps"],
        targets={("hf", 16): 2.0, ("peak", 64): 0.6},
        peer_label=f"HF generate (torch {report.meta['torch']['torch']})" if peer else "HF",
      )
      print("sampler done", flush=True)

    if "decode_floor" in args.only:
      floors.decode_floor_section(
        report,
        cfg,
        params,
        prompts,
        sz["batches"],
        sz["new_tokens"],
        peak,
        args.runs,
        sz["sampler_reps"],
        bandwidth=(lambda: floors.read_bandwidth(1 << 24, 2))
        if args.quick
        else floors.read_bandwidth,
      )
      print("decode_floor done", flush=True)

    if "tunix_sampler" in args.only:
      if hf_dir is None:
        hf_dir = str(save_hf_dir(cfg, params, root / "hf"))
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
        sz["sampler_reps"],
      )
      print("tunix_sampler done", flush=True)

    if "llamacpp_sampler" in args.only:
      if args.quick:
        print("llamacpp_sampler: full mode only (it runs the embedded GGUF), skipped")
      else:
        llamacpp_side.llamacpp_sampler_section(
          report,
          cfg,
          params,
          prompts,
          sz["batches"],
          sz["new_tokens"],
          args.llamacpp_python,
          str(root),
          args.runs,
          sz["sampler_reps"],
        )
        print("llamacpp_sampler done", flush=True)

    policy_state = None
    if "policy_step" in args.only or "checkpoint" in args.only:
      b, p, n = sz["step"]
      data = S.policy_batch(cfg, b, p, n)
      step_peer = None
      if peer is not None:

        def step_peer(tokens, prompt_len, adv, reps):
          npz = peer.save_arrays(tokens=tokens, advantages=adv)
          return peer.call("train_step", hf_dir=hf_dir, npz=npz, prompt_len=prompt_len, reps=reps)

      if "policy_step" in args.only:
        ours = S.policy_step_section(
          report,
          cfg,
          params,
          data,
          step_peer,
          peak,
          args.runs,
          sz["step_reps"],
          target=1.1,
          peer_label="PyTorch fwd+bwd+AdamW",
        )
        policy_state = ours.state
        print("policy_step done", flush=True)
    if peer is not None:
      peer.close()  # its models and optimiser state are not needed any more
      peer = None

    if "checkpoint" in args.only:
      c = base_config()
      if policy_state is None:
        policy_state = steps.init_state(
          S.copy_tree(params), optim.make_optimizer(c.policy.optim, 100)
        )
      if args.quick:
        rm_cfg = cfg.replace(head="score")
        rm_params = S.random_params(rm_cfg)
      else:
        rm_cfg, rm_params = load_pretrained(S.EMBEDDED, head="score")
      rm_state = steps.init_state(rm_params, optim.make_optimizer(c.rm.optim, 100))
      jax.block_until_ready(rm_state)
      S.checkpoint_section(
        report, policy_state, rm_state, args.runs, root, f"{model} + score-head RM, AdamW"
      )
      del rm_state
      print("checkpoint done", flush=True)
    del policy_state, params

    if "iteration" in args.only:
      spec, overrides, warmup, easy = sz["iteration"]
      if easy:
        overrides += (f"data.train={iteration.easy_arithmetic(root / 'easy_sums.jsonl')}",)
      iteration.iteration_section(report, spec, args.runs, root / "train", overrides, warmup=warmup)
      print("iteration done", flush=True)

    if "trl_iteration" in args.only:
      spec, overrides, warmup = sz["trl_iteration"]
      trl_side.trl_iteration_section(
        report, spec, overrides, warmup, args.runs, root / "trl", args.trl_python
      )
      print("trl_iteration done", flush=True)

    if "tunix_iteration" in args.only:
      spec, overrides, warmup = sz["tunix_iteration"]
      tunix_grpo_side.tunix_iteration_section(
        report, spec, overrides, warmup, args.runs, root / "tunix", args.tunix_python
      )
      print("tunix_iteration done", flush=True)
  finally:
    if peer is not None:
      peer.close()
    scratch.cleanup()


# ------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
  args = parse_args(argv)
  if not args.gpu:
    # The CPU mode times the CPU: keep jax off any other backend it may find (and libtpu's
    # start-up probing out of the output).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    peers = [s for s in PEER_SECTIONS if s in args.only]
    if peers:  # both sides of them on CPUS threads: pin before jax starts
      n = tunix_side.CPUS  # == trl_side.CPUS
      print(f"pinned to CPUs {tunix_side.limit_cpus(n)} ({', '.join(peers)}: {n} threads a side)")
  try:
    # Quick mode is a smoke check, never a figure: a busy machine marks it, never stops it.
    loads, noisy = harness.load_gate(args.allow_noisy, refuse=not args.quick)
  except harness.NoisyMachine as e:
    print(f"refusing to time: {e}", file=sys.stderr)
    return 2
  print(
    f"load average at start: {loads[0]:.2f} {loads[1]:.2f} {loads[2]:.2f} (1/5/15 min, "
    f"{os.cpu_count()} cores)" + (" -> NOISY" if noisy else ""),
    flush=True,
  )
  report = harness.Report(
    f"cooper_jax benchmarks ({args.name})",
    {
      "mode": "gpu" if args.gpu else "cpu",
      "quick": args.quick,
      "noisy": noisy,
      "loadavg_start": list(loads),
      "runs": args.runs,
      "sections": args.only,
      "argv": sys.argv[1:] if argv is None else list(argv),
      "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    },
  )
  report.meta["machine"] = machine()
  report.meta["cpus"] = sorted(os.sched_getaffinity(0))
  report.partial_path = args.out
  t0 = time.perf_counter()
  if args.gpu:
    cpu_only = tuple(s for s in PEER_SECTIONS if s != "tunix_sampler")
    gpu_mode.gpu_mode(args, report, sizes(args), cpu_only=cpu_only)
  else:
    cpu_mode(args, report)
  report.meta["wall_s"] = time.perf_counter() - t0
  print()
  print(report.markdown())
  path = report.write_json(args.out)
  print(f"\nwrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
