"""cooper_jax/cli/aot.py / cooper_jax.aot: compiling the training iteration for a TPU topology on
this CPU host (libtpu's compile-only client). Skipped where libtpu is not installed."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from cooper_jax import aot, optim, sharding, steps
from cooper_jax.models.config import ModelConfig, from_hf_config
from experiments.paper import get_config as paper_config

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = "v5e:2x4"

pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None, reason="libtpu not installed (requirements.txt)"
)


@pytest.fixture(scope="module")
def paper_policy_step():
  """experiments/paper.py:qwen,cooper's policy_step on v5e:2x4, compiled once (~1 min)."""
  c = paper_config("qwen,cooper")
  report = aot.compile_iteration(c, TOPOLOGY, only=("policy_step",))
  (r,) = report.results
  return c, report, r


def _policy_step_flops_by_hand(c) -> float:
  """Independent count for Qwen2.5-1.5B: 6 x (matmul weights) x tokens for fwd+bwd, +2x for
  the remat'ed layers (and the chunked LM head), dense attention (QK^T and PV, 2 matmuls,
  both t x t), LM head on the response positions only."""
  d, layers, heads, kv, hd, ff, vocab = 1536, 28, 12, 2, 128, 8960, 151936
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  t = c.rollout.max_prompt_len + c.rollout.max_new_tokens
  n = c.rollout.max_new_tokens
  w_layer = d * hd * heads * 2 + d * hd * kv * 2 + 3 * d * ff  # q, o; k, v; gate, up, down
  layer_fwd = 2 * rows * t * w_layer * layers + 2 * 2 * rows * t * t * heads * hd * layers
  head_fwd = 2 * rows * n * d * vocab
  # fwd + bwd (2x), + remat recompute of the layers, + the head's when chunked (checkpointed)
  return 3 * (layer_fwd + head_fwd) + layer_fwd + (head_fwd if c.policy.logprob_chunk else 0)


def test_policy_step_consistent(paper_policy_step):
  c, report, r = paper_policy_step
  assert (r.function, r.topology, r.chips, r.devices) == ("policy_step", TOPOLOGY, 8, 8)
  assert report.device_kind == "TPU v5 lite"
  assert 15 < r.hbm_gib <= 16
  assert r.peak_gib >= r.argument_gib > 0
  # The policy state (fp32 params + 2 AdamW moments of ~1.54B params) sharded over 8 chips.
  state_gib = 1.54e9 * 4 * 3 / 8 / 2**30
  assert report.persistent["policy_state"] / 2**30 == pytest.approx(state_gib, rel=0.02)
  # Resident = everything else that stays on the chip + this function's footprint.
  others = sum(v for k, v in report.persistent.items() if k != "policy_state") / 2**30
  assert r.resident_gib == pytest.approx(others + r.peak_gib, rel=1e-6)
  expected = _policy_step_flops_by_hand(c) / 8
  assert r.flops == pytest.approx(expected, rel=0.10)
  assert r.roofline_s == pytest.approx(max(r.flops / 197e12, r.bytes / 819e9), rel=1e-6)
  assert r.roofline_s >= r.flops / 197e12 > 1.0  # tens of TFLOP per chip per step
  if not r.fits:
    assert r.resident_gib > r.hbm_gib or r.error


def test_paper_qwen_cooper_policy_step_fits_v5e_2x4(paper_policy_step):
  """The paper config as experiments/paper.py sets it (micro-batching included) must fit a
  v5e:2x4 slice. Adjust here if paper.py's target topology or settings change."""
  _, _, r = paper_policy_step
  assert r.fits, f"policy_step needs {r.resident_gib:.1f} GiB of {r.hbm_gib:.2f} ({r.error})"


ROWS, PROMPT, NEW = 16, 64, 64


def _two_layer_setup(mesh):
  """A 2-layer remat'ed Qwen2-like model, its abstract params / AdamW state and abstract
  log-prob and policy batches of ROWS x (PROMPT + NEW) tokens on `mesh`, the paper's loss
  without KL: (cfg, mesh, params, opt, state, lp_batch, batch, loss)."""
  cfg = ModelConfig(
    vocab_size=2048,
    d_model=256,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=64,
    d_ff=1024,
    family="qwen2",
    qkv_bias=True,
    dtype="bfloat16",
    remat="full",
  )
  params = aot.abstract_params(cfg, mesh)
  opt = optim.make_optimizer(paper_config("qwen,rule").policy.optim)
  state = aot.abstract_state(params, opt, mesh)
  shapes = {
    "prompt_tokens": ((ROWS, PROMPT), jnp.int32),
    "prompt_mask": ((ROWS, PROMPT), bool),
    "response_tokens": ((ROWS, NEW), jnp.int32),
    "response_mask": ((ROWS, NEW), bool),
  }
  lp_batch = aot.abstract_batch(mesh, shapes)
  batch = aot.abstract_batch(mesh, dict(shapes, advantages=((ROWS,), jnp.float32)))
  loss = paper_config("qwen,rule").policy.loss
  loss.kl_coef = 0.0
  return cfg, mesh, params, opt, state, lp_batch, batch, loss


def test_analytic_flops_match_xla_loop_body():
  """XLA's cost_analysis counts a scanned layer once. For a 2-layer remat'ed model (the layer
  scan stays a loop; with 1 layer XLA unrolls it and CSEs the remat recompute away, since
  nn.remat runs with prevent_cse=False) XLA's figure must therefore equal the analytic count
  of the same model with ONE layer: fwd + bwd + recompute for policy_step, fwd for the
  log-prob fn (elementwise ops, which the analytic count leaves out, are a few percent here)."""
  cfg, mesh, params, opt, state, lp_batch, batch, loss = _two_layer_setup(
    sharding.make_mesh(data=8, devices=aot.get_topology(TOPOLOGY).devices)
  )
  body_once = cfg.replace(n_layers=1)
  rows, p, n = ROWS, PROMPT, NEW
  step = steps.make_policy_step(cfg, loss, opt, mesh, state, batch)
  xla = step.lower(state, batch).compile().cost_analysis()["flops"]
  assert aot.train_flops(body_once, rows, p + n, n) / 8 == pytest.approx(xla, rel=0.05)
  lp = steps.make_logprob_fn(cfg, mesh, params)
  xla = lp.lower(params, lp_batch).compile().cost_analysis()["flops"]
  assert aot.forward_flops(body_once, rows, p + n, p + n, n) / 8 == pytest.approx(xla, rel=0.05)


def test_shared_prompt_flops_match_xla():
  """Rows sharing their prompt (groups of 4, policy.share_prompt) run its positions once per
  group; the analytic count must follow (~0.7x the unshared forward here). XLA's own count on
  one CPU device (the TPU compiler's pads head_dim 64 to its 128 lanes in the response pass's
  cache-style attention, so it counts more than the matmuls do); a 2-layer scan counts its
  body once, so against the analytic count of one layer, within the 5% of elementwise ops."""
  import jax  # pylint: disable=import-outside-toplevel

  cfg, mesh, params, opt, state, lp_batch, batch, loss = _two_layer_setup(
    sharding.make_mesh(data=1, devices=jax.devices("cpu")[:1])
  )
  body_once = cfg.replace(n_layers=1)
  rows, p, n = ROWS, PROMPT, NEW
  lp = steps.make_logprob_fn(cfg, mesh, params, prompt_group=4)
  xla = lp.lower(params, lp_batch).compile().cost_analysis()["flops"]
  shared = aot.shared_forward_flops(body_once, rows, p, n, n, group=4)
  assert shared == pytest.approx(xla, rel=0.05)
  assert shared < 0.75 * aot.forward_flops(body_once, rows, p + n, p + n, n)
  step = steps.make_policy_step(cfg, loss, opt, mesh, state, batch, prompt_group=4)
  xla = step.lower(state, batch).compile().cost_analysis()["flops"]
  assert aot.train_flops(body_once, rows, p + n, n, group=4) == pytest.approx(xla, rel=0.05)


def test_resident_state_as_the_run_holds_it():
  """What stays on the chip, per device, for the paper's configs on v5e:2x4 (no compile): the
  assistant in pairs.assistant_dtype, the co-trained RM with AdamW moments (fp32 params + 2
  moments, 12 B/param), a static RM with none (4 B/param), no RM in rule mode; warmup_cosine
  with total_steps unset follows train.steps."""
  topo = aot.get_topology(TOPOLOGY)
  per_dev = lambda n_params, nbytes: n_params * nbytes / 8 / 2**30
  for mode, keys in (
    ("cooper", {"policy_state", "ref_params", "rm_state", "assistant_params"}),
    ("static_rm", {"policy_state", "ref_params", "rm_state"}),
    ("rule", {"policy_state", "ref_params"}),
  ):
    c = paper_config(f"qwen,{mode}")
    c.policy.optim.schedule = "warmup_cosine"
    mesh = sharding.make_mesh(**c.mesh, devices=topo.devices)
    fns, persistent = aot.build_functions(c, mesh)
    assert set(persistent) == keys, mode
    gib = {k: v / 2**30 for k, v in persistent.items()}
    assert gib["policy_state"] == pytest.approx(per_dev(1.54e9, 12), rel=0.02)
    if mode != "rule":
      rm_bytes = 12 if mode == "cooper" else 4
      assert gib["rm_state"] == pytest.approx(per_dev(1.54e9, rm_bytes), rel=0.02)
  assert c.pairs.assistant_dtype == "bfloat16"
  c = paper_config("qwen,cooper")
  fns, persistent = aot.build_functions(c, sharding.make_mesh(**c.mesh, devices=topo.devices))
  assert persistent["assistant_params"] / 2**30 == pytest.approx(per_dev(7.61e9, 2), rel=0.02)
  # The rollouts run in calls of sample_batch_size rows, as train.Run.rollout samples them.
  c.rollout.sample_batch_size = 256
  fns, _ = aot.build_functions(c, sharding.make_mesh(**c.mesh, devices=topo.devices))
  (sampler,) = [f for f in fns if f.name == "sampler"]
  assert sampler.calls == c.rollout.prompts_per_step * c.rollout.group_size // 256


def test_reference_pass_shares_prompts_in_its_own_micro_batches():
  """paper.py's reference pass runs micro-batches of policy.logprob_micro_batch_size rows
  (no compile here): strided micro-batches of 128 of the 1024 rows hold 2 rows of each group
  of 16, which share one prompt forward, so its FLOPs are those of 512 prompts + 1024
  responses; with the policy step's 32-row micro-batches no row shares."""
  topo = aot.get_topology(TOPOLOGY)
  c = paper_config("qwen,cooper")
  mesh = sharding.make_mesh(**c.mesh, devices=topo.devices)
  cfg = aot.model_config(c.policy, "lm")
  p, n, rows = c.rollout.max_prompt_len, c.rollout.max_new_tokens, 1024
  flops = lambda cc: {f.name: f.cost.flops for f in aot.build_functions(cc, mesh)[0]}
  assert c.policy.logprob_micro_batch_size == 128 and c.policy.micro_batch_size == 32
  by_hand = aot.forward_flops(cfg, rows // 2, p, p, 0) + aot.forward_flops(cfg, rows, n, p + n, n)
  assert flops(c)["ref_logprobs"] == by_hand
  c.policy.logprob_micro_batch_size = 0  # the policy step's 32 rows: 32 micro-batches, no share
  assert flops(c)["ref_logprobs"] == aot.forward_flops(cfg, rows, p + n, p + n, n)


def test_log_prob_passes_counted_as_train_runs_them():
  """The forward-only passes of an iteration (no compile): the reference's under a KL term;
  with a sampler correction and several updates (or rollouts sampled ahead) train.py also
  takes the trainer's own old log-probs, one more pass of the same shapes; without a KL term
  that pass alone; an uncorrected off-policy batch carries the sampler's (no pass)."""
  topo = aot.get_topology(TOPOLOGY)
  c = paper_config("qwen,rule")
  mesh = sharding.make_mesh(**c.mesh, devices=topo.devices)
  calls = lambda cc: {f.name: f.calls for f in aot.build_functions(cc, mesh)[0]}
  assert calls(c)["ref_logprobs"] == 1
  c.policy.ppo_mini_batch_size = c.rollout.prompts_per_step * c.rollout.group_size // 2
  assert calls(c)["ref_logprobs"] == 1  # old_logp = the sampler's
  c.policy.loss.sampler_is.kind = "token_tis"
  assert calls(c)["ref_logprobs"] == 2
  c.policy.loss.kl_coef = 0.0
  assert calls(c)["old_logprobs"] == 1 and "ref_logprobs" not in calls(c)
  c.policy.ppo_mini_batch_size = 0
  c.rollout.off_policy_steps = 1  # one update, sg(logp) itself: no pass
  assert "old_logprobs" not in calls(c)
  c.policy.loss.sampler_is.kind = "none"
  (step,) = [f for f in aot.build_functions(c, mesh)[0] if f.name == "policy_step"]
  assert "old_logp" in step.lower().args_info[0][1]  # the sampler's, carried in the batch


def test_reward_pass_reads_the_weights_once_per_score_micro_batch():
  """The RM reward forward runs rm.score_micro_batch_size rows at a time (128 of 1024 in
  paper.py: 8 passes), not rm_step's micro-batches of rm.micro_batch_size pairs (16: 64)."""
  topo = aot.get_topology(TOPOLOGY)
  c = paper_config("qwen,cooper")
  mesh = sharding.make_mesh(**c.mesh, devices=topo.devices)
  rm_cfg = aot.model_config(c.rm, "score")
  rows, n_dev = 1024, 8
  acts = aot.forward_bytes(rm_cfg, rows, c.rm.max_len, c.rm.max_len, 0, 1)
  w = rm_cfg.num_params() * 4  # fp32 RM parameters
  fns = {f.name: f for f in aot.build_functions(c, mesh)[0]}
  assert (c.rm.score_micro_batch_size, c.rm.micro_batch_size) == (128, 16)
  assert fns["rm_reward"].cost.bytes == pytest.approx(acts / n_dev + 8 * w, rel=0.01)


# Published total parameter counts (Hugging Face model cards / safetensors index).
PUBLISHED_PARAMS = {
  "Qwen/Qwen2.5-1.5B-Instruct": 1.54e9,
  "Qwen/Qwen2.5-Math-1.5B": 1.54e9,
  "Qwen/Qwen2.5-7B-Instruct": 7.61e9,
  "meta-llama/Llama-3.2-1B-Instruct": 1.24e9,
  "HuggingFaceTB/SmolLM2-135M-Instruct": 0.135e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_known_architectures_map(name):
  try:
    cfg = from_hf_config(aot.hf_config_for(name))
  except ValueError as e:  # Llama-3 rope_scaling before models/config.py supports it
    pytest.skip(f"{name}: {e}")
  assert cfg.num_params() == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)
  assert aot.hf_config_for(name.split("/")[-1].lower()) is aot.hf_config_for(name)


def test_unknown_model_is_a_config_error():
  with pytest.raises(aot.ConfigError, match="not-a-model"):
    aot.hf_config_for("org/not-a-model")


def test_parse_oom():
  msg = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (198.14G) exceeds available HBM (15.75G)."
  )
  need, avail = aot.parse_oom(msg)
  assert need == int(198.14 * 2**30) and avail == int(15.75 * 2**30)


def test_bad_topology():
  with pytest.raises(aot.TopologyError, match="v9:1x1"):
    aot.get_topology("v9:1x1")


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run(
    [sys.executable, "-m", "cooper_jax.cli.aot", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_cli_bad_topology_exit_2():
  p = _cli("--config", "experiments/paper.py:qwen,cooper", "--topology", "v9:1x1")
  assert p.returncode == 2, p.stderr
  assert "v9:1x1" in p.stderr and "v5e:2x4" in p.stderr


def test_cli_bad_config_exit_2():
  p = _cli(
    "--config", "experiments/paper.py:qwen,cooper", "--config.no_such_key=1", "--topology", TOPOLOGY
  )
  assert p.returncode == 2, p.stderr
  p = _cli(
    "--config", "experiments/paper.py:qwen,cooper", "--config.mesh.tensor=3", "--topology", TOPOLOGY
  )
  assert p.returncode == 2 and "mesh" in p.stderr, p.stderr
  p = _cli(
    "--config", "experiments/paper.py:qwen,cooper", "--only", "polcy_step", "--topology", TOPOLOGY
  )
  assert p.returncode == 2 and "polcy_step" in p.stderr, p.stderr


def test_cpu_run_without_tpu_noise():
  """With libtpu installed, a process that imports cooper_jax (its __init__ calls
  host_platform.use_cpu_unless_accelerator()) runs on the CPU without jax's TPU-backend message
  or libtpu's warnings."""
  from cooper_jax import host_platform

  if host_platform.accelerator_present():
    pytest.skip("this host has an accelerator")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME")}
  code = (
    "import os\nimport cooper_jax\nprint(os.environ.get('JAX_PLATFORMS'))\n"
    "import jax\nprint(jax.devices()[0].platform)"
  )
  p = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
  )
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == ["cpu", "cpu"]
  assert "tpu" not in p.stderr.lower() and "TPU_ACCELERATOR_TYPE" not in p.stderr, p.stderr
