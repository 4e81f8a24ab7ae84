"""The GPU check: the Cooper loop end to end on the embedded SmolLM2-135M, an evaluation, a
checkpoint and a resume, and the benchmark's GPU mode, in one command that ends within 8
minutes on one H100, with every record in one folder.

  python tools/gpu_check.py --out $OUT          # on the GPU machine (OUT defaults to $OUT)
  python tools/gpu_check.py --config experiments/tiny.py --size as_config --steps 2 \\
      --eval_limit 2 --eval_new_tokens 8 --bench_args="--quick --only checkpoint --runs 1" \\
      --allow_cpu --cap_scale 6 --budget_s 1200 --out /tmp/gc   # tiny, on a CPU (the test)

Stages, each its own process under its own time cap (a stage that fails or runs over leaves
the others' records and is reported failed; the exit status is 1 unless every stage passed):
  env        nvidia-smi, python / jax / flax / optax versions, jax's backend and devices, one
             computation on the default device (a CPU backend fails it unless --allow_cpu);
  rule, static_rm
             `python -m cooper_jax.train --config experiments/smollm2.py:<mode>` for --steps;
  cooper     the same, stopped after step --resume_at (train.stop_after, checkpoint saved);
  resume     the cooper command again in the same workdir: it must resume at --resume_at,
             with starts/1.json saying so and no config change, and end at --steps with every
             step in metrics.jsonl once;
  eval       `python -m cooper_jax.evaluate --checkpoint <the cooper run>` on --eval_limit
             GSM8K test problems;
  bench      `python benchmarks/run.py --gpu --only sampler,policy_step --runs 1 --reps 1`
             (tools/gpu_lease.sh's section 1 at one run), its JSON in bench/.
The whole run stops at --budget_s (default 460 s; a stage with no time left is reported
failed), so it fits 8 minutes by construction.

Writes to --out: gpu_check.md (the summary table), gpu_check.json (every stage's record),
<stage>/log.txt (its stdout and stderr), env/nvidia-smi.txt and env/jax.json, <mode>/ with the
run's metrics.jsonl, config.json and starts/, resume/verdict.json, eval/ (results.json,
table.md, samples.jsonl), bench/bench.json. Checkpoints stay in --workdir (default a new
folder under /tmp): 135M policy + RM + optimizer states are gigabytes.

Sizes (--size gpu): experiments/smollm2.py (the README's main job) with 8 prompts x G=8
rollouts, 256 new tokens, prompts and responses each padded to one width (one sampler and one
policy-step shape; the RM's inputs still come in 64-token widths), bf16 compute, no in-loop
evaluation; 20 steps per mode, cooper stopped at
10 and resumed to 20. The estimate, from the figures recorded on one H200
(results/bench/gpu.md, 2026-12-04; an H100 has ~0.7x its memory bandwidth, and compiles are
host-bound): the 135M sampler decodes a step in 2.5 ms at batch 256 (~3.6 ms on an H100), so
256 new tokens take ~0.9 s; its policy step runs 83k tok/s, so 64 rollouts x 512 tokens take
~0.4 s plus ~0.15 s for the reference pass; verification, the RM's scoring and cooper's
rm_step add ~0.3-0.7 s: ~2 s a rule step, ~2.5 s a cooper step. Per process, start-up
(imports, weights, GSM8K, verifier pool) ~15 s; compiles: sampler 25 s, policy step 10 s,
reference pass ~5 s, the RM's score / rm_step a few s per 64-token width; later processes read
them from the persistent XLA cache. Stages: env 10 s, rule 15 + 40 + 20 x 2 = 95 s, static_rm
15 + 12 + 20 x 2 = 67 s, cooper 15 + 25 + 10 x 2.5 = 65 s, resume 15 + 5 + 10 x 2.5 = 45 s, eval
(64 problems, one greedy batch of 256 tokens) ~45 s, bench ~100 s (the recorded section-1 job
took 128 s at 3 runs x 2 reps, of which compiles ~77 s): ~430 s, 7.2 minutes. Not yet run on a
GPU: the first run's gpu_check.md replaces this estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("env", "rule", "static_rm", "cooper", "resume", "eval", "bench")
TRAIN_MODES = ("rule", "static_rm", "cooper")
# Each stage's cap in seconds: ~1.3-1.5x its estimate in the docstring (--cap_scale scales all).
CAPS_S = dict(env=30, rule=120, static_rm=90, cooper=90, resume=70, eval=70, bench=150)
GRACE_S = 10  # after a cap: SIGTERM (a train stage saves its step), then SIGKILL
GPU_SIZES = (
  "rollout.prompts_per_step=8",
  "rollout.group_size=8",
  "rollout.max_new_tokens=256",
  "rollout.max_prompt_len=256",
  "rollout.prompt_pad_multiple=256",
  "rollout.response_pad_multiple=256",
  "rm.max_len=512",
  "policy.dtype=bfloat16",
  "rm.dtype=bfloat16",
  "train.eval_every=0",
)
BENCH_ARGS = "--gpu --only sampler,policy_step --runs 1 --reps 1 --allow-noisy"
ENV_SNIPPET = """
import json, platform, sys, time
import jax, jax.numpy as jnp, flax, optax
t = time.perf_counter()
x = float(jnp.ones((256, 256)).sum().block_until_ready())
info = dict(python=platform.python_version(), jax=jax.__version__, flax=flax.__version__,
            optax=optax.__version__, backend=jax.default_backend(),
            devices=[f"{d} ({d.device_kind})" for d in jax.devices()],
            device_count=jax.device_count(), first_op_s=time.perf_counter() - t, first_op=x)
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
"""


def parse_args(argv=None):
  ap = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_check"), help="records")
  ap.add_argument("--workdir", default=None, help="run folders (default: a new /tmp folder)")
  ap.add_argument("--config", default="experiments/smollm2.py", help="takes :<reward_mode>")
  ap.add_argument(
    "--size", choices=("gpu", "as_config"), default="gpu", help="gpu: GPU_SIZES overrides"
  )
  ap.add_argument("--steps", type=int, default=20, help="train.steps of each mode")
  ap.add_argument("--resume_at", type=int, default=None, help="cooper stops here (steps // 2)")
  ap.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="[MODE:]KEY=VALUE",
    help="a config override for every train stage, or one mode's (cooper: cooper and resume)",
  )
  ap.add_argument("--eval_benchmarks", default="gsm8k/test")
  ap.add_argument("--eval_limit", type=int, default=64)
  ap.add_argument("--eval_new_tokens", type=int, default=256)
  ap.add_argument("--eval_batch", type=int, default=64)
  ap.add_argument("--bench_args", default=BENCH_ARGS, help="benchmarks/run.py's flags")
  ap.add_argument("--stages", default=",".join(STAGES), help="a comma list of " + ",".join(STAGES))
  ap.add_argument("--budget_s", type=float, default=460.0, help="the whole run's time")
  ap.add_argument("--cap_scale", type=float, default=1.0, help="multiplies every stage's cap")
  ap.add_argument("--allow_cpu", action="store_true", help="pass env on a CPU backend (tests)")
  a = ap.parse_args(argv)
  a.stages = [s for s in a.stages.split(",") if s]
  unknown = sorted(set(a.stages) - set(STAGES))
  if unknown:
    ap.error(f"--stages: unknown {unknown}; choose from {STAGES}")
  a.resume_at = a.steps // 2 if a.resume_at is None else a.resume_at
  if not 0 < a.resume_at < a.steps:
    ap.error(f"--resume_at {a.resume_at} must lie strictly between 0 and --steps {a.steps}")
  return a


def overrides(a, mode: str) -> list[str]:
  """The --config.* flags of one mode's train stages: sizes, steps, then --set in order."""
  sets = list(GPU_SIZES) if a.size == "gpu" else []
  sets.append(f"train.steps={a.steps}")
  for s in a.set:
    key, _, _ = s.partition("=")
    scope, colon, key_only = key.partition(":")
    if colon and scope != mode:
      continue
    sets.append(s.split(":", 1)[1] if colon else s)
  return [f"--config.{s}" for s in sets]


def run_stage(name: str, cmd: list[str], out: Path, cap_s: float, deadline: float) -> dict:
  """Runs cmd (its own process group) with stdout and stderr in <out>/<name>/log.txt, for at
  most min(cap, time left): {status, exit, wall_s, cmd}; status 'ok' only for exit 0."""
  d = out / name
  d.mkdir(parents=True, exist_ok=True)
  limit = min(cap_s, deadline - time.monotonic() - GRACE_S)
  rec = {"cmd": shlex.join(cmd), "cap_s": cap_s, "exit": None, "wall_s": 0.0}
  if limit < 5:
    rec["status"] = "failed: budget spent before it started"
    return rec
  env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
  print(f"[{name}] {rec['cmd']} (limit {limit:.0f} s)", flush=True)
  t0 = time.monotonic()
  with open(d / "log.txt", "w") as log:
    proc = subprocess.Popen(
      cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
      rec["exit"] = proc.wait(timeout=limit)
      rec["status"] = "ok" if rec["exit"] == 0 else f"failed: exit {rec['exit']}"
    except subprocess.TimeoutExpired:
      for sig in (signal.SIGTERM, signal.SIGKILL):  # the step finishes and saves, or is cut
        try:
          os.killpg(proc.pid, sig)
        except ProcessLookupError:
          break
        try:
          rec["exit"] = proc.wait(timeout=GRACE_S)
          break
        except subprocess.TimeoutExpired:
          continue
      rec["status"] = f"failed: over its limit of {limit:.0f} s"
  rec["wall_s"] = round(time.monotonic() - t0, 1)
  print(f"[{name}] {rec['status']} in {rec['wall_s']} s", flush=True)
  return rec


def step_rows(workdir: Path, first: int = 1, last: int | None = None) -> list[dict]:
  """metrics.jsonl's step rows (those with time/step_s) with first <= step <= last."""
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  return [
    r
    for r in rows
    if "time/step_s" in r and r["step"] >= first and (last is None or r["step"] <= last)
  ]


def step_figures(rows: list[dict]) -> dict:
  """Steps, the first step's time (compiles), steps/s and new tok/s over the steps after it
  (none for a single step), rule accuracy of the first and last step, verifier failures."""
  if not rows:
    return {"steps": 0}
  steady = rows[1:]
  secs = sum(r["time/step_s"] for r in steady)
  bad = sum(r.get(f"verify/{k}", 0) for r in rows for k in ("timeout", "error", "ref_parse_error"))
  return {
    "steps": len(rows),
    "step_range": [rows[0]["step"], rows[-1]["step"]],
    "first_step_s": round(rows[0]["time/step_s"], 2),
    "steps_per_s": round(len(steady) / secs, 3) if secs else None,
    "new_tokens_per_s": round(sum(r["rollout/new_tokens"] for r in steady) / secs, 1)
    if secs
    else None,
    "rule_acc_first": rows[0]["rule/acc"],
    "rule_acc_last": rows[-1]["rule/acc"],
    "verifier_timeouts_errors": int(bad),
    # where a step's time goes (means over the steps after the first)
    "split_s": {
      k: round(sum(r.get(f"time/{k}_s", 0.0) for r in steady) / len(steady), 3)
      for k in ("sample", "verify", "policy", "rm")
    }
    if steady
    else None,
  }


def copy_run_records(workdir: Path, dest: Path) -> None:
  """The run's small records (not its checkpoints or TensorBoard files) into dest."""
  dest.mkdir(parents=True, exist_ok=True)
  for f in ("metrics.jsonl", "config.json"):
    if (workdir / f).exists():
      shutil.copy2(workdir / f, dest / f)
  if (workdir / "starts").is_dir():
    shutil.copytree(workdir / "starts", dest / "starts", dirs_exist_ok=True)


def train_stage(a, name: str, mode: str, out: Path, runs: Path, deadline: float, stop_at=0):
  wd = runs / mode
  cmd = [sys.executable, "-m", "cooper_jax.train", "--config", f"{a.config}:{mode}"]
  cmd += ["--workdir", str(wd), *overrides(a, mode)]
  if stop_at:
    cmd.append(f"--config.train.stop_after={stop_at}")
  rec = run_stage(name, cmd, out, CAPS_S[name] * a.cap_scale, deadline)
  first = a.resume_at + 1 if name == "resume" else 1
  expected = a.steps - a.resume_at if name == "resume" else stop_at or a.steps
  rec.update(step_figures(step_rows(wd, first, stop_at or None)))
  copy_run_records(wd, out / mode)
  if rec["status"] == "ok" and rec["steps"] != expected:  # exit 0 is not enough
    rec["status"] = f"failed: {rec['steps']} of {expected} steps in metrics.jsonl"
  return rec


def resume_checks(a, wd: Path, log: Path) -> dict:
  """Whether the resume stage resumed the cooper run where it stopped and finished it."""
  k, n = a.resume_at, a.steps

  def start(i):
    p = wd / "starts" / f"{i}.json"
    return json.loads(p.read_text()) if p.exists() else None

  s0, s1, s2 = start(0), start(1), start(2)
  config = wd / "config.json"
  steps = [r["step"] for r in step_rows(wd)]
  text = log.read_text() if log.exists() else ""
  checks = {
    f"checkpoint {k} saved by the stopped run": (wd / "checkpoints" / str(k)).is_dir(),
    f"starts/0.json at step 0, starts/1.json at step {k}, no third start": bool(
      s0 and s1 and s0["step"] == 0 and s1["step"] == k and s2 is None
    ),
    "starts/1.json: no config change; config.json is the first start's": bool(
      s0 and s1 and s1["changed"] == {} and config.exists()
    )
    and json.loads(config.read_text()) == s0["config"],
    f"log: resumed at step {k}": re.search(rf"resumed from \S+ at step {k}\b", text) is not None,
    f"metrics.jsonl: steps 1..{n} once each": steps == list(range(1, n + 1)),
    f"checkpoint {n} saved": (wd / "checkpoints" / str(n)).is_dir(),
  }
  return {"verdict": all(checks.values()), "checks": checks}


def env_stage(a, out: Path, deadline: float) -> dict:
  d = out / "env"
  d.mkdir(parents=True, exist_ok=True)
  smi = shutil.which("nvidia-smi")
  lines = []
  if smi:
    for args in (
      ["--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv"],
      [],
    ):
      r = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
      lines.append(r.stdout + r.stderr)
  (d / "nvidia-smi.txt").write_text("\n".join(lines) if smi else "nvidia-smi: not found\n")
  cmd = [sys.executable, "-c", ENV_SNIPPET, str(d / "jax.json")]
  rec = run_stage("env", cmd, out, CAPS_S["env"] * a.cap_scale, deadline)
  rec["nvidia_smi"] = lines[0].strip().splitlines()[-1] if smi and lines[0].strip() else None
  info = json.loads((d / "jax.json").read_text()) if (d / "jax.json").exists() else {}
  rec.update({k: info[k] for k in ("jax", "backend", "devices") if k in info})
  if rec["status"] == "ok" and info.get("backend") != "gpu" and not a.allow_cpu:
    rec["status"] = f"failed: jax's backend is {info.get('backend')!r}, not 'gpu'"
  return rec


def bench_figures(path: Path) -> list[dict]:
  """(label, ours and peer of the worst run, worst ratio) of each figure in the bench JSON."""
  report = json.loads(path.read_text())
  out = []
  for f in report["figures"]:
    runs = f.get("runs") or [{}]
    sign = 1 if f["higher_is_better"] else -1  # the worst run: the lowest speed-up
    worst = min(runs, key=lambda r: sign * (r.get("ratio") or 0.0))
    out.append(
      dict(
        label=f["label"],
        ours=worst.get("ours"),
        peer=worst.get("peer"),
        peer_label=f["peer_label"],
        worst_ratio=f.get("worst_ratio"),
      )
    )
  return out


def fmt(v, spec=".3g"):
  return "-" if v is None else format(v, spec)


def write_summary(a, out: Path, records: dict, wall_s: float) -> Path:
  env = records.get("env", {})
  lines = [
    f"# GPU check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
    "",
    f"Device: {env.get('nvidia_smi') or '-'}; jax {env.get('jax', '-')} on "
    f"{env.get('backend', '-')} {env.get('devices', '-')}. Config {a.config} (size {a.size}), "
    f"{a.steps} steps a mode, cooper stopped at {a.resume_at} and resumed. Wall {wall_s:.0f} s "
    f"of a {a.budget_s:.0f} s budget.",
    "",
    "| stage | status | wall s | steps | first step s | steps/s after it | new tok/s | "
    "rule acc first -> last | verifier timeouts+errors |",
    "|---|---|---:|---:|---:|---:|---:|---|---:|",
  ]
  for name in STAGES:
    r = records.get(name)
    if r is None:
      continue
    acc = f"{r['rule_acc_first']:.3f} -> {r['rule_acc_last']:.3f}" if r.get("steps") else "-"
    lines.append(
      f"| {name} | {r['status']} | {r['wall_s']:.1f} | {r.get('steps', '-')} | "
      f"{fmt(r.get('first_step_s'))} | {fmt(r.get('steps_per_s'))} | "
      f"{fmt(r.get('new_tokens_per_s'), '.0f')} | {acc} | {r.get('verifier_timeouts_errors', '-')} |"
    )
  if "resume" in records and "checks" in records["resume"]:
    res = records["resume"]
    lines += ["", f"## Resume: {'PASS' if res['verdict'] else 'FAIL'}", ""]
    lines += [f"- {'ok' if ok else 'FAILED'}: {what}" for what, ok in res["checks"].items()]
  table = out / "eval" / "table.md"
  if "eval" in records and table.exists():
    lines += ["", f"## Evaluation ({records['eval'].get('checkpoint')})", "", table.read_text()]
  if records.get("bench", {}).get("figures"):
    lines += ["", "## Benchmark (bench/bench.json; worst run)", ""]
    lines += ["| figure | ours | peer | ratio |", "|---|---:|---|---:|"]
    for f in records["bench"]["figures"]:
      lines.append(
        f"| {f['label']} | {fmt(f['ours'], ',.4g')} | {f['peer_label']}: "
        f"{fmt(f['peer'], ',.4g')} | {fmt(f['worst_ratio'])} |"
      )
  failed = [n for n, r in records.items() if r["status"] != "ok"]
  lines += ["", f"Result: {'FAILED: ' + ', '.join(failed) if failed else 'every stage passed'}"]
  path = out / "gpu_check.md"
  path.write_text("\n".join(lines) + "\n")
  return path


def main(argv=None) -> int:
  a = parse_args(argv)
  out = Path(a.out).resolve()
  out.mkdir(parents=True, exist_ok=True)
  runs = Path(a.workdir or tempfile.mkdtemp(prefix="gpu_check_runs_")).resolve()
  runs.mkdir(parents=True, exist_ok=True)
  t0 = time.monotonic()
  deadline = t0 + a.budget_s
  records: dict[str, dict] = {}
  for name in [s for s in STAGES if s in a.stages]:
    if name == "env":
      rec = env_stage(a, out, deadline)
    elif name in ("rule", "static_rm"):
      rec = train_stage(a, name, name, out, runs, deadline)
    elif name == "cooper":
      rec = train_stage(a, name, "cooper", out, runs, deadline, stop_at=a.resume_at)
    elif name == "resume":
      wd = runs / "cooper"
      if not (wd / "checkpoints" / str(a.resume_at)).is_dir():
        rec = {"status": f"failed: no checkpoint {a.resume_at} from the cooper stage"}
        rec["wall_s"] = 0.0
      else:
        rec = train_stage(a, name, "cooper", out, runs, deadline)
      rec.update(resume_checks(a, wd, out / "resume" / "log.txt"))
      if rec["status"] == "ok" and not rec["verdict"]:
        rec["status"] = "failed: resume checks (below)"
      (out / "resume").mkdir(parents=True, exist_ok=True)
      (out / "resume" / "verdict.json").write_text(json.dumps(rec, indent=1) + "\n")
    elif name == "eval":
      # The cooper run's newest checkpoint; the rule run's where cooper left none.
      ckpt = next(
        (runs / m for m in ("cooper", "rule") if any((runs / m / "checkpoints").glob("[0-9]*"))),
        runs / "cooper",
      )
      cmd = [sys.executable, "-m", "cooper_jax.evaluate", "--checkpoint", str(ckpt)]
      cmd += ["--benchmarks", a.eval_benchmarks, "--limit", str(a.eval_limit)]
      cmd += ["--max_new_tokens", str(a.eval_new_tokens), "--batch_size", str(a.eval_batch)]
      cmd += ["--out", str(out / "eval"), "--label", f"{ckpt.name} run, newest checkpoint"]
      cmd += ["--dtype", "bfloat16"] if a.size == "gpu" else []
      rec = run_stage(name, cmd, out, CAPS_S[name] * a.cap_scale, deadline)
      rec["checkpoint"] = str(ckpt)
      results = out / "eval" / "results.json"
      if rec["status"] == "ok" and not results.exists():
        rec["status"] = "failed: no eval/results.json"
    else:  # bench
      path = out / "bench" / "bench.json"
      cmd = [sys.executable, "benchmarks/run.py", *shlex.split(a.bench_args)]
      cmd += ["--out", str(path), "--workdir", str(runs)]
      rec = run_stage(name, cmd, out, CAPS_S[name] * a.cap_scale, deadline)
      if path.exists():
        rec["figures"] = bench_figures(path)
        rec["partial"] = json.loads(path.read_text())["meta"].get("partial", False)
      if rec["status"] == "ok" and (not path.exists() or rec["partial"]):
        rec["status"] = "failed: no complete bench/bench.json"
    records[name] = rec
    (out / "gpu_check.json").write_text(
      json.dumps({"args": vars(a), "workdir": str(runs), "stages": records}, indent=1) + "\n"
    )
  summary = write_summary(a, out, records, time.monotonic() - t0)
  print(summary.read_text(), flush=True)
  return 0 if all(r["status"] == "ok" for r in records.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
