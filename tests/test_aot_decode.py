"""The sampler's decode step (sampling.prefill + decode_step, what `sample` loops over), its
TPU compile against the HBM floor (cooper_jax.aot.decode, cooper_jax/cli/aot_decode.py) and
policy_step's roofline MFU (cooper_jax.aot.mfu). The compiles need libtpu and are skipped
without it."""

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from cooper_jax.config import load_config
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.tolerance import float32_logprob_atol
from cooper_jax.models.transformer import forward, init_params, split_layers
from cooper_jax.prompts import left_pad
from cooper_jax.sampling import SampleOptions, decode_step, prefill, sample

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = "v5e:2x2"  # 4 chips: the tiny config's 4 prompts split over them
needs_libtpu = pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None, reason="libtpu not installed (requirements.txt)"
)

TINY = ModelConfig(
  vocab_size=97,
  d_model=48,
  n_layers=2,
  n_heads=6,
  n_kv_heads=2,
  head_dim=8,
  d_ff=96,
  qkv_bias=True,
  family="qwen2",
)
PAD = 0
ROWS = [[5, 17, 33, 2, 9], [40, 41], [7, 8, 9, 10, 11, 12, 13]]


@pytest.mark.parametrize(
  "kw",
  [
    dict(temperature=0.0),
    dict(temperature=1.0, top_p=0.9, group_size=3),
    dict(temperature=0.7, top_k=5, eos_ids=tuple(range(1, 97, 2))),  # odd ids stop
  ],
  ids=["greedy", "top_p_groups", "top_k_eos"],
)
def test_sample_is_prefill_then_decode_steps(kw):
  """`sample` = prefill + decode_step max_new_tokens times (its while_loop only stops early
  once every row is done, after which a step writes nothing): the step compiled alone for the
  TPU is the sampler's own."""
  kw = dict(kw)
  params = init_params(TINY, jax.random.key(0))
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), params)
  toks, mask, _ = left_pad(ROWS, PAD, pad_to_multiple=8)
  n, rng = 9, jax.random.key(4)
  opts = SampleOptions(max_new_tokens=n, pad_id=PAD, **kw)
  out = sample(params, toks, mask, rng, cfg=TINY, options=opts)
  g = opts.group_size
  state, next_pos = prefill(
    params, toks, mask, cfg=TINY, max_new_tokens=n, pad_id=PAD, group_size=g
  )
  step = jax.jit(functools.partial(decode_step, cfg=TINY, options=opts))
  split = split_layers(params)
  for _ in range(n):
    state = step(split, state, next_pos, rng)
  assert int(state.step) == n and int(state.cache.length) == toks.shape[1] + n
  np.testing.assert_array_equal(state.tokens, out.tokens)
  np.testing.assert_array_equal(state.mask, out.mask)
  # The same step, compiled alone: log-probs within the float32 bound (tolerance.py) at the
  # scale of the whole sequences' logits.
  full = [
    np.concatenate([np.repeat(a, g, 0), np.asarray(b)], 1)
    for a, b in ((toks, out.tokens), (mask, out.mask))
  ]
  scale = float(np.abs(forward(TINY, params, *full)).max())
  atol = float32_logprob_atol(TINY, scale, toks.shape[1] + n)
  np.testing.assert_allclose(state.logprobs, out.logprobs, atol=atol)
  if "eos_ids" in kw:  # every row stops before the end: the while_loop exits early
    assert not np.asarray(out.mask)[:, -1].any(), out.mask


# experiments/tiny.py's policy (random model, float32) on 4 chips, params split over fsdp.
TINY_OVERRIDES = ("rollout.prompts_per_step=4", "mesh.data=1", "mesh.fsdp=-1")


def _tiny_config(*extra):
  return load_config(str(ROOT / "experiments" / "tiny.py"), TINY_OVERRIDES + extra)


def _tiny_floor_by_hand(c, fsdp: int, tensor: int = 1):
  """Per-device parameter and k+v cache bytes of the tiny config, from sharding.PARAM_RULES:
  the embedding [v, d] split on d over fsdp (tied: it is the LM head too), q/k/v/o and the MLP
  split over fsdp on d (and tensor on heads / d_ff), norms replicated; float32. The cache
  per layer [rows, kv heads, slots, head_dim] split over fsdp on rows (tensor on kv heads)."""
  m = c.policy.random_model
  d, layers, h, k, e, ff, v = (
    m.d_model,
    m.n_layers,
    m.n_heads,
    m.n_kv_heads,
    m.head_dim,
    m.d_ff,
    m.vocab_size,
  )
  split = v * d + layers * (d * e * (2 * h + 2 * k) + 3 * d * ff)
  assert not m.qkv_bias and m.tie_embeddings
  params = 4 * (split // (fsdp * tensor) + (2 * layers + 1) * d)
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  slots = c.rollout.max_prompt_len + c.rollout.max_new_tokens
  cache = 2 * 4 * layers * rows * slots * k * e // (fsdp * tensor)
  return params, cache


@pytest.fixture(scope="module")
def tiny_decode():
  from cooper_jax.aot import decode

  c = _tiny_config()
  return c, decode.compile_decode_step(c, TOPOLOGY, config_name="tiny")


@needs_libtpu
def test_decode_floor_is_params_plus_cache(tiny_decode):
  c, r = tiny_decode
  params, cache = _tiny_floor_by_hand(c, fsdp=4)
  assert (r.chips, r.devices, r.mesh) == (4, 4, {"data": 1, "fsdp": 4, "tensor": 1})
  assert (r.rows, r.cache_slots, r.n_layers) == (16, 272, 2)
  assert r.param_bytes == params == 3_220_736
  assert r.cache_bytes == cache == 557_056
  assert r.floor_bytes == params + cache
  assert r.cache_avg_bytes == pytest.approx(cache * (256 + 16 / 2) / 272)
  assert r.floor_avg_bytes == pytest.approx(params + r.cache_avg_bytes)
  m = c.policy.random_model
  n_params = ModelConfig(**m.to_dict()).num_params()
  assert r.gathered_param_bytes == 4 * n_params  # float32 compute, tensor=1
  # Rates: bytes / v5e's 819 GB/s, the slice's 16 tokens per step.
  assert r.hbm_bw == 819e9
  assert r.step_s == pytest.approx(r.xla_bytes / 819e9)
  assert r.floor_s == pytest.approx(r.floor_bytes / 819e9)
  assert r.tokens_per_s == pytest.approx(16 / r.step_s)
  assert r.floor_tokens_per_s == pytest.approx(16 / r.floor_s)
  # sample's 4 cache segments: the decode takes 16 average steps.
  assert r.cache_segments == 4 and r.floor_bytes < r.xla_bytes_avg <= r.xla_bytes
  assert r.decode_s == pytest.approx(16 * r.xla_bytes_avg / 819e9)
  assert r.ratio_avg == pytest.approx(r.xla_bytes_avg / r.floor_avg_bytes)
  assert r.ratio == pytest.approx(r.xla_bytes / r.floor_bytes)
  assert r.xla_bytes >= r.floor_bytes  # XLA reads at least the floor
  assert r.argument_gib > 0 and r.peak_gib >= r.argument_gib
  assert json.loads(json.dumps(r.row()))["floor_bytes"] == params + cache


@needs_libtpu
def test_replicated_decode_weights_read_the_whole_copy_without_collectives(tiny_decode):
  """rollout.decode_weights=replicated: the floor counts the whole weight copy (float32 here),
  and the compiled step holds no collective (each device decodes its own rows)."""
  from cooper_jax.aot import decode

  c, sharded = tiny_decode
  rep_cfg = _tiny_config("rollout.decode_weights=replicated")
  r = decode.compile_decode_step(rep_cfg, TOPOLOGY, config_name="tiny", cache_segments=1)
  n_params = ModelConfig(**c.policy.random_model.to_dict()).num_params()
  assert r.decode_weights == "replicated" and sharded.decode_weights == "sharded"
  assert r.param_bytes == 4 * n_params == r.gathered_param_bytes
  assert r.cache_bytes == sharded.cache_bytes and r.floor_bytes == 4 * n_params + r.cache_bytes
  assert r.xla_bytes >= r.floor_bytes
  # With tensor=2 the replicated copy is still whole on every device (not split over tensor).
  tp = decode.compile_decode_step(
    _tiny_config("rollout.decode_weights=replicated", "mesh.fsdp=2", "mesh.tensor=2"),
    TOPOLOGY,
    config_name="tiny",
    cache_segments=1,
  )
  assert tp.param_bytes == 4 * n_params == 2 * tp.gathered_param_bytes
  # The compiled step itself: no all-gather / all-reduce with replicated weights, some without.
  from cooper_jax import aot, sharding  # pylint: disable=import-outside-toplevel
  from cooper_jax.aot.models import model_config  # pylint: disable=import-outside-toplevel

  mesh = sharding.make_mesh(**c.mesh, devices=aot.get_topology(TOPOLOGY).devices)
  cfg = model_config(c.policy, "lm")
  texts = {}
  for mode in ("sharded", "replicated"):
    ws = sharding.decode_weights(mesh, mode)
    opts = SampleOptions(max_new_tokens=16, group_size=4, weights_sharding=ws)
    low, _ = decode.lower_decode_step(cfg, mesh, 16, 256, opts)
    texts[mode] = low.compile().as_text()
  assert "all-gather" in texts["sharded"] or "all-reduce" in texts["sharded"]
  assert "all-gather" not in texts["replicated"] and "all-reduce" not in texts["replicated"]


_COLLECTIVES = (
  # an instruction, or a TPU fusion that runs one (an all-reduce whose result is sliced)
  re.compile(
    r"= (\(?[^=]*?\)?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\(.*?op_name=\"([^\"]*)\""
  ),
  re.compile(r"= (\S+) fusion\(.*?calls=%(all-reduce-scatter)[\w.]*,.*?op_name=\"([^\"]*)\""),
)


def _collectives(hlo: str) -> list[tuple[str, tuple[tuple[int, ...], ...], str]]:
  """(kind, result shapes, op_name) of every collective in a compiled module's HLO text."""
  out = []
  for line in hlo.split("\n"):
    for pattern in _COLLECTIVES:
      m = pattern.search(line)
      if m:
        dims = re.findall(r"\w+\[([\d,]*)\]", m.group(1))
        shapes = tuple(tuple(int(x) for x in d.split(",") if x) for d in dims)
        out.append((m.group(2), shapes, m.group(3)))
  return out


@needs_libtpu
def test_mlp_split_decode_moves_no_hidden_activations():
  """rollout.decode_weights=mlp_split (sharding.MLPSplit) on 4 chips: the compiled step moves
  no [rows, d_ff] array between chips, and its MLPs add one all-reduce of [rows, d] each
  (the down projection's partial sums), where the params' own layout (fsdp over d)
  all-reduces the gate and up projections' [rows, d_ff] partial sums at every layer. Its
  floor is the same: the same bytes of weights per chip. (What it saves, on the 7B assistant:
  BUILD.md; here the [16, 49152] logits outweigh the MLPs.)"""
  from cooper_jax import aot, sharding
  from cooper_jax.aot import decode
  from cooper_jax.aot.models import model_config

  c = _tiny_config()
  mesh = sharding.make_mesh(**c.mesh, devices=aot.get_topology(TOPOLOGY).devices)
  cfg = model_config(c.policy, "lm")
  rows, d, ff = 16, cfg.d_model, cfg.d_ff
  assert (mesh.shape["fsdp"], cfg.n_layers, ff) == (4, 2, 128) and d != ff
  found = {}
  for mode in ("sharded", "mlp_split"):
    ws = sharding.decode_weights(mesh, mode)
    opts = SampleOptions(max_new_tokens=16, group_size=4, weights_sharding=ws)
    low, _ = decode.lower_decode_step(cfg, mesh, rows, 256, opts)
    found[mode] = _collectives(low.compile().as_text())
  hidden = lambda cs: [c for c in cs if any(ff in s for s in c[1])]
  assert hidden(found["sharded"]) and not hidden(found["mlp_split"])
  # The down projection's partial sums, one reduction per layer, of at most [rows, d] (XLA
  # fuses the all-reduce with the slice the next layer takes: a reduce-scatter).
  down = [c for c in found["mlp_split"] if "mlp/down" in c[2]]
  assert len(down) == cfg.n_layers
  assert all(k in ("all-reduce", "all-reduce-scatter") for k, _, _ in down)
  assert all(np.prod(s) <= rows * d for _, shapes, _ in down for s in shapes)
  r = {
    m: decode.compile_decode_step(
      _tiny_config(f"rollout.decode_weights={m}"), TOPOLOGY, cache_segments=1
    )
    for m in ("sharded", "mlp_split")
  }
  assert r["mlp_split"].floor_bytes == r["sharded"].floor_bytes
  assert r["mlp_split"].decode_weights == "mlp_split"


def _weight_relayouts(hlo: str) -> list[str]:
  """The copies in a compiled module's HLO text that relay out a weight (op_name params[...])."""
  return [
    line.strip()
    for line in hlo.split("\n")
    if re.search(r"= \S+ copy\(", line) and 'op_name="params[' in line
  ]


@needs_libtpu
def test_decode_step_takes_its_weights_in_the_loops_layouts():
  """In `sample` the weights are the decode loop's invariants, in layouts XLA picks for the
  loop; a stored layout that differs is copied once per call, before the loop. The step
  compiled alone gets the same freedom, so it copies no weight per step. In the default
  (stored) layouts the tiny model's embedding shard, [49152, 16] with its 16-wide rows padded
  to 128 in a TPU tile, comes in column-major and the step copied it for its gather every
  step (on v5e:2x4 the 7B assistant's 0.27 GB of its 3.74 GB). The whole `sample` holds that
  copy outside its decode loop."""
  from cooper_jax import aot, sharding
  from cooper_jax.aot import decode
  from cooper_jax.aot.models import abstract_params, model_config

  c = _tiny_config()
  mesh = sharding.make_mesh(**c.mesh, devices=aot.get_topology(TOPOLOGY).devices)
  cfg = model_config(c.policy, "lm")
  ws = sharding.decode_weights(mesh, "sharded")
  opts = SampleOptions(max_new_tokens=16, group_size=4, weights_sharding=ws)
  low, inputs = decode.lower_decode_step(cfg, mesh, 16, 256, opts)
  assert _weight_relayouts(low.compile().as_text()) == []
  # The same step with its weights pinned to the default layouts: the per-step copy is back.
  step = jax.jit(
    functools.partial(decode_step, cfg=cfg, options=opts),
    donate_argnums=1,
    out_shardings=jax.tree.map(lambda x: x.sharding, inputs[1]),
  )
  pinned = step.lower(*inputs).compile().as_text()
  assert any("embedding" in line for line in _weight_relayouts(pinned))
  # ... and the whole sampler copies it once, in its entry computation, not in its loop.
  u = jax.ShapeDtypeStruct((4, 256), np.int32, sharding=sharding.batch_sharding(mesh))
  m = jax.ShapeDtypeStruct((4, 256), np.bool_, sharding=sharding.batch_sharding(mesh))
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))
  whole = (
    sample.lower(
      abstract_params(cfg, mesh),
      u,
      m,
      key,
      cfg=cfg,
      options=opts.replace(cache_segments=1),
    )
    .compile()
    .as_text()
  )
  entry = whole[whole.index("\nENTRY") :]
  assert any("embedding" in line for line in _weight_relayouts(entry))
  assert len(_weight_relayouts(whole)) == len(_weight_relayouts(entry))


@needs_libtpu
def test_shared_prompt_decode_reads_each_prompt_once(tiny_decode):
  """rollout.shared_prompt_decode: the cache holds each of the 4 prompts' 256 slots once and
  each of the 16 rows' 16 own slots (counted by hand), and the compiled step reads less than
  the copied-prompt step by at least the copies it no longer holds, less the prompts' share,
  and at least its own floor."""
  from cooper_jax.aot import decode

  c, copied = tiny_decode
  r = decode.compile_decode_step(
    _tiny_config("rollout.shared_prompt_decode=True"), TOPOLOGY, config_name="tiny"
  )
  m = c.policy.random_model
  per_slot = 2 * 4 * m.n_layers * m.n_kv_heads * m.head_dim  # k + v, float32, every layer
  prompts, rows, fsdp = c.rollout.prompts_per_step, 16, 4
  want = per_slot * (prompts * 256 + rows * 16) // fsdp
  assert r.cache_bytes == want < copied.cache_bytes == per_slot * rows * 272 // fsdp
  assert r.cache_avg_bytes == pytest.approx(per_slot * (prompts * 256 + rows * 8) / fsdp)
  assert r.param_bytes == copied.param_bytes
  assert copied.xla_bytes - r.xla_bytes >= (copied.cache_bytes - r.cache_bytes) * 0.9
  assert r.xla_bytes >= r.floor_bytes and r.xla_bytes_avg >= r.floor_avg_bytes
  # With the weights replicated each device decodes its own rows against its own prompts
  # (prompts and rows split alike over the batch devices): the step needs no collective.
  from cooper_jax import aot, sharding  # pylint: disable=import-outside-toplevel
  from cooper_jax.aot.models import model_config  # pylint: disable=import-outside-toplevel

  mesh = sharding.make_mesh(**c.mesh, devices=aot.get_topology(TOPOLOGY).devices)
  opts = SampleOptions(
    max_new_tokens=16,
    group_size=4,
    weights_sharding=sharding.decode_weights(mesh, "replicated"),
    shared_prompt=True,
  )
  low, inputs = decode.lower_decode_step(model_config(c.policy, "lm"), mesh, 16, 256, opts)
  assert inputs[1].cache.prompt_k[0].shape[0] == 4  # one copy per prompt
  text = low.compile().as_text()
  assert not any(
    op in text for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute")
  )


@needs_libtpu
def test_decode_floor_with_tensor_parallel():
  """tensor=2 splits the kv heads of the cache (and the heads / d_ff of the weights)."""
  from cooper_jax import aot, sharding
  from cooper_jax.aot import decode
  from cooper_jax.aot.models import model_config

  c = _tiny_config("mesh.fsdp=2", "mesh.tensor=2")
  devices = aot.get_topology(TOPOLOGY).devices
  mesh = sharding.make_mesh(**c.mesh, devices=devices)
  cfg = model_config(c.policy, "lm")
  par, cache, _ = decode.floor_bytes(cfg, mesh, 16, 256, 16, 4)
  want_par, want_cache = _tiny_floor_by_hand(c, fsdp=2, tensor=2)
  assert cache == want_cache
  # The embedding [v, d] is split over (tensor, fsdp) too, so the hand count holds.
  assert par == want_par


@needs_libtpu
def test_cache_segments_read_less_on_average():
  """512 new tokens after 256: sample's 4 segments read 384, 512, 640 and 768 slots, so the
  average step reads less than the whole-cache step, by at least the cache bytes the
  segments leave out, (768 - 576) / 768 of the cache. (The TPU layout pads the slot axis of
  this tiny model's cache, head_dim 16, to 128s, so finer segments read the same.)"""
  from cooper_jax.aot import decode

  r = decode.compile_decode_step(_tiny_config("rollout.max_new_tokens=512"), TOPOLOGY)
  assert r.cache_segments == 4 and r.cache_slots == 768
  saved = r.cache_bytes * (768 - 576) / 768
  assert r.xla_bytes - r.xla_bytes_avg >= saved > 0
  assert r.ratio_avg == pytest.approx(r.xla_bytes_avg / r.floor_avg_bytes)


@needs_libtpu
def test_every_layer_is_counted():
  """The step runs its layers unrolled, so XLA's bytes grow by one layer's worth per layer (a
  scanned step would count its loop body once: no growth with depth), and at least by that
  layer's floor (its parameter shards and cache)."""
  from cooper_jax.aot import decode

  r1, r2, r3 = (
    decode.compile_decode_step(
      _tiny_config(f"policy.random_model.n_layers={n}"), TOPOLOGY, cache_segments=1
    )
    for n in (1, 2, 3)
  )
  layer = r2.xla_bytes - r1.xla_bytes
  assert r3.xla_bytes - r2.xla_bytes == pytest.approx(layer, rel=0.02)
  assert layer >= r2.floor_bytes - r1.floor_bytes > 0
  assert r3.xla_flops - r2.xla_flops == pytest.approx(r2.xla_flops - r1.xla_flops, rel=0.02)
  assert r3.cache_segments == 1 and r3.xla_bytes_avg == r3.xla_bytes


def test_mfu_of_a_hand_made_row():
  from cooper_jax.aot import mfu

  c = _tiny_config()  # random model: v 49152, d 64, 2 layers, 4 heads (2 kv) of 16, ff 128
  row = dict(
    function="policy_step",
    config="tiny",
    topology="v5e:2x4",
    chips=8,
    devices=8,
    calls=2,
    flops=3.0e12,
    roofline_s=0.01,
  )
  c.policy.ppo_mini_batch_size = 8  # 16 rows -> 2 updates of 8 rows
  got = mfu.policy_step_mfu(row, c)
  # Non-embedding: 2 x (q,o 64x4x16 + k,v 64x2x16 = 12288; MLP 3x64x128 = 24576; 2 norms 128)
  # + final norm 64 (tied head: nothing else).
  n = 2 * (12288 + 24576 + 128) + 64
  assert got["non_embedding_params"] == n == 74_048
  tokens = 2 * 8 * (256 + 16)
  attn = 2 * 8 * 12 * 2 * 4 * 16 * 272 * 272  # updates x rows x 12 L h e seq^2
  model = 6 * n * tokens + attn
  assert got["tokens"] == tokens
  assert got["model_flops"] == model
  assert got["mfu"] == pytest.approx(model / (8 * 197e12 * 0.01))
  head = 6 * 64 * 49152 * 8 * 16 * 2  # the LM head on 16 response positions, 2 updates
  assert got["mfu_with_head"] == pytest.approx((model + head) / (8 * 197e12 * 0.01))
  assert got["hfu"] == pytest.approx(3.0e12 * 8 / (8 * 197e12 * 0.01))
  assert mfu.mfu(1e15, 4, 275e12, 2.0) == pytest.approx(1e15 / (4 * 275e12 * 2.0))
  for topo, peak in (("v5e:2x4", 197e12), ("v4:2x2x1", 275e12), ("v5p:2x2x1", 459e12)):
    assert mfu.chip_peak_flops(topo) == peak
  with pytest.raises(ValueError, match="rm_step"):
    mfu.policy_step_mfu(dict(row, function="rm_step"), c)


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run(
    [sys.executable, "-m", "cooper_jax.cli.aot_decode", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_cli_mfu_from_recorded_rows(tmp_path):
  src = ROOT / "results" / "aot" / "paper_all_v5e-2x4.jsonl"
  if not src.is_file():
    pytest.skip("no recorded results")
  out = tmp_path / "mfu.jsonl"
  p = _cli("--mfu_from", str(src), "--json_out", str(out))
  assert p.returncode == 0, p.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert {r["config"] for r in rows} >= {"paper.py:qwen,cooper", "paper.py:llama,rule"}
  (qwen,) = [r for r in rows if r["config"] == "paper.py:qwen,cooper"]
  # 6 x 1.31e9 non-embedding params x 1024 x 1024 tokens + attention, over 8 x 197e12 x 8.06 s.
  assert qwen["mfu"] == pytest.approx(0.69, abs=0.01)
  assert 0 < qwen["mfu"] < qwen["mfu_with_head"] <= qwen["hfu"] <= 1.0 + 1e-9
  assert "| paper.py:qwen,cooper | v5e:2x4 |" in p.stdout


@needs_libtpu
def test_cli_decode_tiny_and_errors(tmp_path):
  out = tmp_path / "decode.jsonl"
  args = [f"--config.{o}" for o in TINY_OVERRIDES]
  p = _cli("--config", "experiments/tiny.py", *args, "--topology", TOPOLOGY, "--json_out", str(out))
  assert p.returncode == 0, p.stderr
  (row,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert row["floor_bytes"] == 3_220_736 + 557_056 and row["topology"] == TOPOLOGY
  assert "| XLA bytes accessed, whole cache |" in p.stdout and "floor" in p.stdout
  p = _cli("--config", "experiments/tiny.py", *args, "--topology", "v9:1x1")
  assert p.returncode == 2 and "v9:1x1" in p.stderr, p.stderr
  p = _cli("--config", "experiments/tiny.py", "--topology", TOPOLOGY)  # 2 prompts on 4 chips
  assert p.returncode == 2 and "divisible" in p.stderr, p.stderr
  p = _cli("--topology", TOPOLOGY)
  assert p.returncode == 2 and "--config" in p.stderr, p.stderr


@needs_libtpu
def test_iteration_roofline_counts_the_compiled_decode_step(tiny_decode):
  """cooper_jax/cli/aot.py's sampler bytes: the prefill's analytic bytes + max_new_tokens x the
  XLA bytes of the decode step compiled alone (the step cooper_jax/cli/aot_decode.py measures), not an
  analytic guess at which of weights or activations XLA moves."""
  from cooper_jax import aot
  from cooper_jax.aot.functions import build_functions
  from cooper_jax.aot.report import topology_mesh

  c, step = tiny_decode
  (r,) = aot.compile_iteration(c, TOPOLOGY, only=("sampler",)).results
  # The same programs as aot_decode's, segment by segment (v5e: one device per chip).
  assert step.cache_segments == c.rollout.cache_segments > 1
  assert r.decode_step_bytes == pytest.approx(step.xla_bytes_avg)
  assert r.decode_step_bytes < step.xla_bytes  # earlier segments read fewer cache slots
  _, _, _, mesh = topology_mesh(c, TOPOLOGY)
  (spec,) = [f for f in build_functions(c, mesh)[0] if f.name == "sampler"]
  segments = spec.decode_segments()
  assert sum(n for n, _ in segments) == c.rollout.max_new_tokens == step.new_tokens
  want = (spec.cost.bytes + step.new_tokens * step.xla_bytes_avg) * spec.calls
  assert r.bytes == pytest.approx(want) and r.roofline_s >= r.bytes / 819e9 * (1 - 1e-9)
  assert spec.cost.bytes < step.new_tokens * step.xla_bytes_avg  # the decode dominates
