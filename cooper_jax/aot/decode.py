"""One decode step of the sampler compiled for a TPU topology, against its HBM floor.

The step is cooper_jax.sampling.decode_step, the body of `sample`'s while_loop, jitted alone
with the loop carry (DecodeState) donated as the loop keeps it in place, at the config's
rollout shapes: rows = prompts_per_step x group_size (or rollout.sample_batch_size, the rows of
one sampler call), a static cache of max_prompt_len + max_new_tokens slots in policy.dtype, the
parameters in policy.param_dtype sharded as train.py shards them (sharding.PARAM_RULES on the
config's mesh). The carry is split over data x fsdp on its row axis (replicated when the rows
do not divide), the cache's kv-head axis over tensor when it divides (where the k/v
projections put it).

Reported per chip, one step:
- xla_bytes: XLA's "bytes accessed" (compiled.cost_analysis()) of the step. The step runs its
  layers unrolled (transformer.decode_hidden), so the program is straight-line code and XLA
  counts every layer (a scanned step would count its loop body once). FLOPs likewise
  (xla_flops).
- the floor: bytes any implementation must read per step: this chip's parameter shards (every
  parameter once; an untied input embedding is really read only at the batch's rows) plus its
  live KV cache, either the whole static cache (what today's attention reads: it scores every
  slot and masks) or the average filled part over the decode, prompt + max_new_tokens / 2
  slots. The prompt part counts every row's copy (the sampler copies a prompt's cache to its
  group_size rows), or each prompt once with rollout.shared_prompt_decode (KVCache.prompt_k).
- gathered_floor: the parameters as fsdp reads them: every chip gathers the whole weight set
  (split only over tensor) each step, in the compute dtype (XLA casts the shards before the
  all-gather), plus the whole cache: the floor of this sharding scheme.
- seconds per step = bytes / the chip's HBM bandwidth (topology.CHIP_PEAKS), tokens/s = rows
  per step over that (the slice's rate), and the analytic FLOPs / peak for comparison.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cooper_jax import sharding
from cooper_jax.aot.cost import forward_flops
from cooper_jax.aot.models import (
  ConfigError,
  abstract_params,
  decode_weight_copy,
  device_bytes,
  model_config,
)
from cooper_jax.aot.report import topology_mesh
from cooper_jax.aot.topology import CHIP_PEAKS, GIB
from cooper_jax.models.config import ModelConfig
from cooper_jax.models.transformer import KVCache
from cooper_jax.sampling import DecodeState, SampleOptions, decode_step, prefill, segment_ends


@dataclasses.dataclass
class DecodeStepResult:
  """One decode step on a topology; bytes/FLOPs per chip, one step; rates for the slice."""

  config: str | None
  topology: str
  device_kind: str
  chips: int
  devices: int
  mesh: dict[str, int]
  rows: int  # decode rows (one token each per step)
  prompt_len: int
  new_tokens: int
  cache_slots: int  # prompt_len + new_tokens
  n_layers: int
  decode_weights: str  # rollout.decode_weights: "sharded" or "replicated"
  dtype: str
  param_dtype: str
  hbm_bw: float  # per chip, B/s
  peak_flops: float  # per chip, bf16 FLOP/s
  xla_bytes: float  # cost_analysis of the step, every layer counted, at the whole cache
  xla_bytes_avg: float  # averaged over the decode's steps, each reading its segment's slots
  cache_segments: int  # sampling.sample's cache segments the average is taken over
  xla_flops: float  # the same for XLA's FLOPs
  flops: float  # analytic matmul FLOPs (aot.cost.forward_flops), per chip
  param_bytes: int  # this chip's parameter shards
  gathered_param_bytes: float  # whole weight set / tensor in dtype: what fsdp reads per step
  cache_bytes: int  # the whole static k + v cache on this chip
  cache_avg_bytes: float  # its filled part, averaged over the decode
  floor_bytes: float  # param_bytes + cache_bytes
  floor_avg_bytes: float  # param_bytes + cache_avg_bytes
  gathered_floor_bytes: float  # gathered_param_bytes + cache_bytes
  ratio: float  # xla_bytes / floor_bytes
  ratio_avg: float  # xla_bytes_avg / floor_avg_bytes
  step_s: float  # xla_bytes / hbm_bw
  floor_s: float
  floor_avg_s: float
  gathered_floor_s: float
  compute_s: float  # flops / peak_flops
  tokens_per_s: float  # rows / step_s, the whole slice
  floor_tokens_per_s: float
  floor_avg_tokens_per_s: float
  decode_s: float  # new_tokens x xla_bytes_avg / hbm_bw: one call's decode, every step taken
  argument_gib: float | None = None  # XLA buffer assignment of the full-depth step, per device
  temp_gib: float | None = None
  peak_gib: float | None = None
  shared_prompt: bool = False  # rollout.shared_prompt_decode (G > 1)
  one_pass_draw: bool = False  # rollout.one_pass_draw
  blocked_draw: bool = False  # rollout.blocked_draw

  def row(self) -> dict:
    return dataclasses.asdict(self)


def _axis_if_divides(mesh, axes, dim: int):
  """`axes` (a mesh axis name or tuple of names) if their total size divides `dim`, else None."""
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  size = 1
  for a in names:
    size *= mesh.shape[a]
  return axes if size == 1 or dim % size == 0 else None


def decode_shardings(cfg: ModelConfig, mesh, rows: int, prompts: int | None = None) -> DecodeState:
  """NamedShardings of the decode carry: rows over data x fsdp, kv heads over tensor (the
  cache is per layer [b, k, s, e]); prompts: a shared prompt's cache (KVCache.prompt_k, per
  layer [u, k, p, e]), its prompts over data x fsdp like the rows."""
  b = _axis_if_divides(mesh, sharding.BATCH_AXES, rows)
  kv = _axis_if_divides(mesh, "tensor", cfg.n_kv_heads) if mesh.shape["tensor"] > 1 else None
  ns = lambda *spec: NamedSharding(mesh, P(*spec))
  shared = {}
  if prompts is not None:
    u = _axis_if_divides(mesh, sharding.BATCH_AXES, prompts)
    shared = dict(
      prompt_k=(ns(u, kv, None, None),) * cfg.n_layers,
      prompt_v=(ns(u, kv, None, None),) * cfg.n_layers,
      prompt_mask=ns(u, None),
    )
  return DecodeState(
    step=ns(),
    cache=KVCache(
      k=(ns(b, kv, None, None),) * cfg.n_layers,
      v=(ns(b, kv, None, None),) * cfg.n_layers,
      mask=ns(b, None),
      length=ns(),
      **shared,
    ),
    logits_bv=ns(b, None),
    done_b=ns(b),
    tokens=ns(b, None),
    logprobs=ns(b, None),
    mask=ns(b, None),
  )


def _with(shapes, shardings):
  return jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
  )


def abstract_decode_inputs(
  cfg: ModelConfig,
  mesh,
  rows: int,
  prompt_len: int,
  new_tokens: int,
  group_size: int = 1,
  weights_sharding=None,
  shared_prompt: bool = False,
):
  """(params, state, next_pos_b, rng) as ShapeDtypeStructs with shardings; the state's shapes
  are those `sampling.prefill` makes (rows / group_size prompts of prompt_len tokens; with
  shared_prompt and group_size > 1 each prompt's cache once). params
  are split per layer as `sample` hands them to decode_step (transformer.split_layers), each
  layer's shard the stacked parameter's without its layer axis, or every leaf in
  `weights_sharding` (sample's, rollout.decode_weights)."""
  params = abstract_params(cfg, mesh)
  u = rows // group_size
  tok = jax.ShapeDtypeStruct((u, prompt_len), jnp.int32)
  msk = jax.ShapeDtypeStruct((u, prompt_len), bool)
  fill = functools.partial(
    prefill,
    cfg=cfg,
    max_new_tokens=new_tokens,
    group_size=group_size,
    shared_prompt=shared_prompt and group_size > 1,
  )
  state_shapes, pos_shape = jax.eval_shape(fill, params, tok, msk)
  shardings = decode_shardings(cfg, mesh, rows, u if state_shapes.cache.prompt_k else None)
  state = _with(state_shapes, shardings)
  next_pos = jax.ShapeDtypeStruct(pos_shape.shape, pos_shape.dtype, sharding=shardings.done_b)
  rng = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=sharding.replicated(mesh))
  return decode_weight_copy(params, cfg.jnp_dtype, weights_sharding), state, next_pos, rng


def lower_decode_step(
  cfg: ModelConfig,
  mesh,
  rows: int,
  prompt_len: int,
  options: SampleOptions,
  *,
  read_slots: int | None = None,
):
  """(lowered sampling.decode_step, its abstract inputs) for `rows` rows after prompts of
  prompt_len tokens, with `sample`'s options (options.max_new_tokens the cache's new slots,
  options.group_size rows per prompt): the carry donated and kept in its
  shardings, as the while_loop holds it; the attention reading the first read_slots cache
  slots (default all; with a shared prompt, of the rows' own slots); the weights in
  options.weights_sharding (None: as the params are), in layouts XLA picks (Layout.AUTO). In
  `sample` the weights are the decode loop's invariants: XLA lays them out for the loop and
  copies a stored layout that differs once per call, before it (compiled alone in their
  stored layouts the step copied the 7B assistant's embedding shard at every step, 0.27 of
  its 3.74 GB per chip on v5e:2x4; tests/test_aot_decode.py)."""
  o = options
  inputs = abstract_decode_inputs(
    cfg,
    mesh,
    rows,
    prompt_len,
    o.max_new_tokens,
    o.group_size,
    o.weights_sharding,
    o.shared_prompt,
  )
  step = jax.jit(
    functools.partial(
      decode_step,
      cfg=cfg,
      options=o,
      read_slots=read_slots,
      mlp_columns=sharding.decode_mlp_columns(o.weights_sharding, cfg.d_ff),
    ),
    donate_argnums=1,
    in_shardings=(
      jax.tree.map(lambda x: Format(Layout.AUTO, x.sharding), inputs[0]),
      *jax.tree.map(lambda x: x.sharding, inputs[1:]),
    ),
    out_shardings=jax.tree.map(lambda x: x.sharding, inputs[1]),  # the carry stays as it is
  )
  return step.lower(*inputs), inputs


def _cost(compiled) -> tuple[float, float]:
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return float(ca.get("bytes accessed", 0.0)), float(ca.get("flops", 0.0))


def floor_bytes(
  cfg: ModelConfig,
  mesh,
  rows: int,
  prompt_len: int,
  new_tokens: int,
  group_size=1,
  shared_prompt: bool = False,
):
  """(param bytes, whole-cache bytes, average filled-cache bytes) on one device: its shards of
  the parameters as stored (policy.param_dtype; the sampler's per-call copy in the compute
  dtype is half of that for float32 params and bf16 compute) and of the cache's k and v (the
  cache's valid-slot mask, 1 byte per slot per row, is left out; a shared prompt's keys and
  values counted once per prompt), no compile."""
  _, state, _, _ = abstract_decode_inputs(
    cfg, mesh, rows, prompt_len, new_tokens, group_size, shared_prompt=shared_prompt
  )
  c = state.cache
  if c.prompt_k:  # the rows' own slots fill over the decode; the prompts' are full throughout
    prompt, own = device_bytes((c.prompt_k, c.prompt_v)), device_bytes((c.k, c.v))
    return device_bytes(abstract_params(cfg, mesh)), prompt + own, prompt + own / 2
  cache = device_bytes((c.k, c.v))
  avg = cache * (prompt_len + new_tokens / 2) / (prompt_len + new_tokens)
  return device_bytes(abstract_params(cfg, mesh)), cache, avg


def decode_rows(c) -> int:
  """Rows of one sampler call, as train.Run.rollout makes them."""
  rows = c.rollout.prompts_per_step * c.rollout.group_size
  return c.rollout.sample_batch_size or rows


def compile_decode_step(
  c, topology: str, *, config_name: str | None = None, cache_segments: int | None = None
) -> DecodeStepResult:
  """Compiles the policy's decode step for `topology` at the config's rollout shapes and
  measures it against the floor (module docstring): at the whole cache, and at each of
  `sample`'s cache segments (default rollout.cache_segments; one compile each, each step
  reading its segment's slots) for the average over the decode. Raises TopologyError /
  ConfigError."""
  devices, kind, chips, mesh = topology_mesh(c, topology)
  per_chip = len(devices) / chips
  peaks = CHIP_PEAKS[kind]
  cfg = model_config(c.policy, "lm")
  ro = c.rollout
  weights = ro.decode_weights
  rows, g = decode_rows(c), ro.group_size
  if rows % g:
    raise ConfigError(f"rollout.sample_batch_size={rows} must hold whole groups of {g}")
  p_len, n = ro.max_prompt_len, ro.max_new_tokens
  opts = SampleOptions.from_rollout(
    ro,
    eos_ids=(cfg.eos_id,) if cfg.eos_id is not None else (),
    pad_id=cfg.pad_id or 0,
    mesh=mesh,
    **({} if cache_segments is None else {"cache_segments": cache_segments}),
  )
  before = 0 if opts.shared_prompt else p_len  # cache slots ahead of the rows' own
  full = lower_decode_step(cfg, mesh, rows, p_len, opts)[0].compile()
  raw_bytes, raw_flops = _cost(full)
  mem = full.memory_analysis()
  # Per device -> per chip (v4's compile-only topologies list 2 TensorCores per chip).
  xb, xf = raw_bytes * per_chip, raw_flops * per_chip
  # The decode's steps, segment by segment, each reading its segment's part of the cache.
  ends = segment_ends(n, opts.cache_segments)
  seg_bytes = [
    _cost(lower_decode_step(cfg, mesh, rows, p_len, opts, read_slots=before + e)[0].compile())[0]
    for e in ends[:-1]
  ] + [raw_bytes]
  xb_avg = sum((e - s) * b for e, s, b in zip(ends, [0] + ends[:-1], seg_bytes)) / n * per_chip
  floor = floor_bytes(cfg, mesh, rows, p_len, n, g, opts.shared_prompt)
  par, cache, cache_avg = (x * per_chip for x in floor)
  itemsize = jnp.dtype(cfg.jnp_dtype).itemsize
  gathered = cfg.num_params() * itemsize / mesh.shape["tensor"] * per_chip
  flops = forward_flops(cfg, rows, 1, p_len + n + 1, 1) / chips
  bw, peak = peaks["hbm_bw"], peaks["flops"]
  if weights == "replicated":  # the step reads the whole compute-dtype copy, on every device
    par = cfg.num_params() * itemsize * per_chip
  floor, floor_avg, g_floor = par + cache, par + cache_avg, gathered + cache
  gib = lambda x: None if x is None else x / GIB
  arg, temp = getattr(mem, "argument_size_in_bytes", None), getattr(mem, "temp_size_in_bytes", None)
  out, alias = getattr(mem, "output_size_in_bytes", 0), getattr(mem, "alias_size_in_bytes", 0)
  return DecodeStepResult(
    config=config_name,
    topology=topology,
    device_kind=kind,
    chips=chips,
    devices=len(devices),
    mesh=dict(mesh.shape),
    rows=rows,
    prompt_len=p_len,
    new_tokens=n,
    cache_slots=p_len + n,
    n_layers=cfg.n_layers,
    decode_weights=weights,
    shared_prompt=opts.shared_prompt,
    one_pass_draw=opts.one_pass_draw,
    blocked_draw=opts.blocked_draw,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    hbm_bw=bw,
    peak_flops=peak,
    xla_bytes=xb,
    xla_bytes_avg=xb_avg,
    cache_segments=len(ends),
    xla_flops=xf,
    flops=flops,
    param_bytes=int(par),
    gathered_param_bytes=gathered,
    cache_bytes=int(cache),
    cache_avg_bytes=cache_avg,
    floor_bytes=floor,
    floor_avg_bytes=floor_avg,
    gathered_floor_bytes=g_floor,
    ratio=xb / floor,
    ratio_avg=xb_avg / floor_avg,
    step_s=xb / bw,
    floor_s=floor / bw,
    floor_avg_s=floor_avg / bw,
    gathered_floor_s=g_floor / bw,
    compute_s=flops / peak,
    tokens_per_s=rows * bw / xb,
    floor_tokens_per_s=rows * bw / floor,
    floor_avg_tokens_per_s=rows * bw / floor_avg,
    decode_s=n * xb_avg / bw,
    argument_gib=gib(arg),
    temp_gib=gib(temp),
    peak_gib=None if arg is None or temp is None else (arg + out - alias + temp) / GIB,
  )


def format_decode(r: DecodeStepResult) -> str:
  """A markdown table of one decode step against its floors, with a header."""
  per = r.devices // r.chips
  what = "whole weight copy" if r.decode_weights == "replicated" else "param shards"
  lines = [
    f"decode step of {r.config or 'the config'} on {r.topology}: {r.chips} chips "
    f"({r.device_kind}, {per} device(s) per chip), mesh {r.mesh}; {r.rows} rows x "
    f"{r.cache_slots} cache slots ({r.prompt_len} prompt + {r.new_tokens} new), {r.n_layers} "
    f"layers, compute {r.dtype}, params {r.param_dtype}, decode weights {r.decode_weights}"
    f"{', shared prompts' if r.shared_prompt else ''}"
    f"{', one-pass draw' if r.one_pass_draw else ''}"
    f"{', blocked draw' if r.blocked_draw else ''}; chip HBM {r.hbm_bw / 1e9:.0f} GB/s, "
    f"peak {r.peak_flops / 1e12:.0f} TFLOP/s",
    f"XLA bytes accessed per chip {r.xla_bytes / 1e9:.4g} GB (every layer counted: the step "
    f"runs its layers unrolled); memory: arguments {r.argument_gib or 0:.4g} GiB, temporaries {r.temp_gib or 0:.4g} GiB "
    "per device",
    "",
    "| per chip, one decode step | GB | x floor | ms / step | tokens/s (slice) |",
    "|---|---|---|---|---|",
  ]
  rows: list[tuple[str, float, float]] = [
    ("XLA bytes accessed, whole cache", r.xla_bytes, r.step_s),
    (
      f"XLA bytes accessed, avg over the decode ({r.cache_segments} cache segments)",
      r.xla_bytes_avg,
      r.xla_bytes_avg / r.hbm_bw,
    ),
    (f"floor: {what} + whole static cache", r.floor_bytes, r.floor_s),
    (f"floor: {what} + filled cache (avg)", r.floor_avg_bytes, r.floor_avg_s),
    ("fsdp floor: gathered params + whole cache", r.gathered_floor_bytes, r.gathered_floor_s),
  ]
  for name, b, s in rows:
    lines.append(
      f"| {name} | {b / 1e9:.4g} | {b / r.floor_bytes:.2f} | {s * 1e3:.4g} | {r.rows / s:,.0f} |"
    )
  lines.append(
    f"| compute: {r.flops / 1e12:.4g} TFLOP / peak | - | - | {r.compute_s * 1e3:.4g} | "
    f"{r.rows / r.compute_s:,.0f} |"
  )
  lines.append(
    f"\nparams {r.param_bytes / 1e9:.4g} GB/chip (gathered {r.gathered_param_bytes / 1e9:.4g}), "
    f"cache {r.cache_bytes / 1e9:.4g} GB/chip (filled avg {r.cache_avg_bytes / 1e9:.4g}); "
    f"XLA / floor {r.ratio:.2f} (whole cache), {r.ratio_avg:.2f} (avg over the decode / filled "
    f"avg); {r.new_tokens} steps at the XLA figures: {r.decode_s:.4g} s"
  )
  return "\n".join(lines)
