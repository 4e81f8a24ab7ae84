"""Compile the iteration's functions for a topology and report, per device, XLA's memory
(buffer assignment), what stays resident while each runs, fits, and the analytic roofline."""

from __future__ import annotations

import dataclasses
import hashlib

from cooper_jax import config as config_lib
from cooper_jax import sharding
from cooper_jax.aot.functions import build_functions
from cooper_jax.aot.models import ConfigError
from cooper_jax.aot.topology import (
  CHIP_PEAKS,
  GIB,
  TopologyError,
  count_chips,
  get_topology,
  parse_oom,
  usable_hbm_bytes,
)


@dataclasses.dataclass
class FnResult:
  function: str
  topology: str
  chips: int
  devices: int
  calls: int
  hbm_gib: float
  argument_gib: float | None
  output_gib: float | None
  alias_gib: float | None
  temp_gib: float | None
  peak_gib: float
  resident_gib: float
  fits: bool
  flops: float  # per device, per iteration (all calls)
  bytes: float  # per device, per iteration
  roofline_s: float
  xla_flops: float | None = None  # raw cost_analysis (loop bodies counted once), one call
  xla_bytes: float | None = None
  xla_peak_gib: float | None = None
  # Samplers: XLA's bytes per device of one decode step compiled alone, averaged over the
  # cache segments' steps; `bytes` counts it once per new token on top of the prefill's.
  decode_step_bytes: float | None = None
  error: str | None = None

  def row(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
  topology: str
  device_kind: str
  chips: int
  devices: int
  mesh: dict[str, int]
  peak_flops: float  # per device
  hbm_bw: float  # per device
  hbm_bytes: int  # per device, usable
  persistent: dict[str, int]  # per-device bytes of what stays on the chip all iteration
  results: list[FnResult]

  def header(self) -> str:
    per = self.devices // self.chips
    dev = "chip" if per == 1 else f"device ({per} TensorCores per chip, each its own device)"
    pers = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.persistent.items())
    peaks = CHIP_PEAKS[self.device_kind]
    return (
      f"topology {self.topology}: {self.devices} devices ({self.device_kind}), {self.chips} chips;"
      f" mesh {self.mesh}\n"
      f"per {dev}: HBM {self.hbm_bytes / GIB:.2f} GiB usable, peak "
      f"{self.peak_flops / 1e12:.1f} TFLOP/s bf16, {self.hbm_bw / 1e9:.0f} GB/s "
      f"(published chip peaks, {peaks['source']})\n"
      f"resident all iteration, GiB per device: {pers} "
      f"(total {sum(self.persistent.values()) / GIB:.2f})\n"
      "resident = that total - the function's own persistent arguments + its peak (XLA buffer "
      "assignment: arguments + outputs - aliased + temporaries)\n"
      "FLOPs: analytic matmul count (fwd 2/weight/token, bwd 2x, + remat recompute), per device"
      " per iteration (x calls); bytes: analytic HBM-traffic estimate, except a sampler's decode"
      " steps: the XLA bytes of its decode step compiled alone, per cache segment, x its steps;"
      " roofline = max(FLOPs/peak, bytes/bandwidth)"
    )


def _measure(lowered) -> tuple[tuple[int, int, int, int, int | None, float, float] | None, str]:
  """((arg, out, alias, temp, xla peak, xla flops, xla bytes), "") or (None, OOM message)."""
  try:
    compiled = lowered.compile()
  except Exception as e:  # noqa: BLE001 - an OOM is a result, anything else is re-raised
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return None, str(e)
  m = compiled.memory_analysis()
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  return (
    m.argument_size_in_bytes,
    m.output_size_in_bytes,
    m.alias_size_in_bytes,
    m.temp_size_in_bytes,
    getattr(m, "peak_memory_in_bytes", None),
    ca.get("flops"),
    ca.get("bytes accessed"),
  ), ""


def topology_mesh(c, topology: str):
  """(devices, device kind, chips, mesh): the config's mesh on the TPU topology `topology`.
  Raises TopologyError / ConfigError."""
  devices = list(get_topology(topology).devices)
  kind = devices[0].device_kind
  if kind not in CHIP_PEAKS:
    raise TopologyError(f"topology {topology!r}: no peak figures for device kind {kind!r}")
  try:
    config_lib.validate(c, len(devices))
  except ValueError as e:
    raise ConfigError(f"config on {topology} ({len(devices)} devices): {e}") from e
  try:
    mesh = sharding.make_mesh(**c.mesh, devices=devices)
  except ValueError as e:
    raise ConfigError(
      f"config.mesh {dict(c.mesh)} on {topology} ({len(devices)} devices): {e}"
    ) from e
  return devices, kind, count_chips(devices), mesh


def compile_iteration(
  c, topology: str, *, only: tuple[str, ...] | None = None, cache: dict | None = None
) -> Report:
  """Compiles the iteration's functions for `topology` and measures each one.

  `only` restricts to some function names (aot.FUNCTIONS). `cache`, a dict the caller keeps,
  reuses the measurement of a program already compiled for the same topology in this process
  (keyed by its lowered text: the rule/static_rm/cooper variants share the policy's programs).
  Raises TopologyError / ConfigError.
  """
  devices, kind, chips, mesh = topology_mesh(c, topology)
  per_chip = len(devices) / chips
  peaks = CHIP_PEAKS[kind]
  flops_s, bw = peaks["flops"] / per_chip, peaks["hbm_bw"] / per_chip
  hbm = usable_hbm_bytes(devices) or int(peaks["hbm"] / per_chip)
  fns, persistent = build_functions(c, mesh)
  resident_base = sum(persistent.values())
  results = []
  for spec in fns:
    if only and spec.name not in only:
      continue
    lowered = spec.lower()
    if cache is None:
      measured, oom = _measure(lowered)
    else:
      key = (topology, hashlib.sha256(lowered.as_text().encode()).hexdigest())
      if key not in cache:
        cache[key] = _measure(lowered)
      measured, oom = cache[key]
    err, xf, xb, avail, xpeak = None, None, None, None, None
    if measured is not None:
      arg, out, alias, temp, xpeak, xf, xb = measured
      # The TPU runtime allocates the temporaries as one block of temp_size, so the footprint
      # is the buffer-assignment sum; XLA's own peak_memory (a liveness simulation, can be
      # lower) is kept as xla_peak_gib.
      peak = arg + out - alias + temp
    else:
      need, avail = parse_oom(oom)
      arg, out, alias = spec.arg_bytes, None, None
      temp = need
      peak = arg + (need or 0)
      err = oom.splitlines()[0][:300]
    # What else stays on the chip while this runs, plus this function's own footprint.
    resident = resident_base - spec.persistent_arg_bytes + peak
    f_dev = spec.cost.flops / len(devices) * spec.calls
    decode_b, step_b = 0.0, None
    if spec.decode_segments is not None:  # a sampler: its compiled decode steps' bytes
      steps_and_bytes = []
      for n_steps, step_low in spec.decode_segments():
        key = (topology, hashlib.sha256(step_low.as_text().encode()).hexdigest())
        if cache is None or key not in cache:
          step_measured = _measure(step_low)
          if cache is not None:
            cache[key] = step_measured
        else:
          step_measured = cache[key]
        if step_measured[0] is not None:
          steps_and_bytes.append((n_steps, step_measured[0][6]))
      if steps_and_bytes:
        decode_b = sum(n * b for n, b in steps_and_bytes)
        step_b = decode_b / sum(n for n, _ in steps_and_bytes)
    b_dev = (spec.cost.bytes + decode_b) * spec.calls
    g = lambda x: None if x is None else x / GIB
    results.append(
      FnResult(
        function=spec.name,
        topology=topology,
        chips=chips,
        devices=len(devices),
        calls=spec.calls,
        hbm_gib=(avail if err and avail else hbm) / GIB,
        argument_gib=g(arg),
        output_gib=g(out),
        alias_gib=g(alias),
        temp_gib=g(temp),
        peak_gib=peak / GIB,
        resident_gib=resident / GIB,
        fits=err is None and resident <= hbm,  # an OOM compile never fits
        flops=f_dev,
        bytes=b_dev,
        roofline_s=max(f_dev / flops_s, b_dev / bw),
        xla_flops=xf,
        xla_bytes=xb,
        xla_peak_gib=g(xpeak),
        decode_step_bytes=step_b,
        error=err,
      )
    )
  return Report(
    topology=topology,
    device_kind=kind,
    chips=chips,
    devices=len(devices),
    mesh=dict(mesh.shape),
    peak_flops=flops_s,
    hbm_bw=bw,
    hbm_bytes=hbm,
    persistent=persistent,
    results=results,
  )
