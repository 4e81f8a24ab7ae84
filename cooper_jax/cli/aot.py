"""Compile one training iteration for a TPU topology on this host (no TPU needed) and report
per-chip memory, whether it fits, FLOPs, bytes and a roofline time for every jitted function.

  cooper-aot --config experiments/paper.py:qwen,cooper --topology v5e:2x4
  cooper-aot --config experiments/paper.py:qwen,cooper --topology v5e:4x4 \
      --config.mesh.fsdp=-1 --config.policy.micro_batch_size=64 --json

Bytes are HBM bytes, counted with v5e's VMEM prefetching off: the tool adds
`--xla_vf_vmem_memory_space_assignment=false` to LIBTPU_INIT_ARGS unless that already holds an
xla_vf_vmem setting, and says which count it used (the header; "hbm_count" in each JSON row).
Config and `--config.k=v` overrides are parsed by ml_collections' config_flags, as
cooper_jax.train does. Needs libtpu (requirements.txt). Exit status: 0 all fit, 1 something does
not fit, 2 bad topology or config. Library: the cooper_jax.aot package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Compile-only, bytes as HBM bytes: set before jax is imported (cli/hbm_count.py).
from cooper_jax.cli.hbm_count import compile_only_environment, hbm_count_kind  # noqa: E402

HBM_COUNT = compile_only_environment()

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from cooper_jax.cli import refuse_unknown_config_keys, wants_help  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "experiment config file[:variant]", lock_config=True
)
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU topology, e.g. v5e:2x4, v4:2x2x1, v5p:2x2x1")
_JSON = flags.DEFINE_bool("json", False, "one JSON object per function per line")
_JSON_OUT = flags.DEFINE_string(
  "json_out", None, "also write the JSON lines to this file (one compile, both outputs)"
)
_ONLY = flags.DEFINE_list("only", None, "compile only these functions (e.g. policy_step)")

COLUMNS = (
  ("function", "function", "{}"),
  ("calls", "calls", "{}"),
  ("arg GiB", "argument_gib", "{:.2f}"),
  ("out GiB", "output_gib", "{:.2f}"),
  ("temp GiB", "temp_gib", "{:.2f}"),
  ("peak GiB", "peak_gib", "{:.2f}"),
  ("resident GiB", "resident_gib", "{:.2f}"),
  ("HBM GiB", "hbm_gib", "{:.2f}"),
  ("fits", "fits", "{}"),
  ("TFLOP/chip", "flops", "{:.2f}"),
  ("GB/chip", "bytes", "{:.1f}"),
  ("roofline s", "roofline_s", "{:.3f}"),
)


def format_table(results, persistent_note: str = "") -> str:
  def cell(r, key, fmt):
    v = getattr(r, key)
    if v is None:
      return "-"
    if key == "fits":
      return "yes" if v else "NO"
    if key == "flops":
      return fmt.format(v / 1e12)
    if key == "bytes":
      return fmt.format(v / 1e9)
    return fmt.format(v)

  rows = [[h for h, _, _ in COLUMNS]] + [[cell(r, k, f) for _, k, f in COLUMNS] for r in results]
  widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
  lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
  lines.insert(1, "-+-".join("-" * w for w in widths))
  for r in results:
    if r.error:
      lines.append(f"{r.function}: {r.error}")
  return "\n".join(lines) + persistent_note


def main() -> int:
  if wants_help(__doc__, __name__):
    return 0
  if refuse_unknown_config_keys(Path(__file__).stem):
    return 2
  try:
    flags.FLAGS(sys.argv)
  except Exception as e:  # noqa: BLE001 - flag/config-file errors: bad config, exit 2
    print(f"aot_compile: bad config or flags: {type(e).__name__}: {e}", file=sys.stderr)
    return 2
  if not _TOPOLOGY.value or _CONFIG.value is None:
    print("aot_compile: --config and --topology are required", file=sys.stderr)
    return 2
  from cooper_jax import aot  # pylint: disable=import-outside-toplevel

  c = _CONFIG.value
  only = tuple(_ONLY.value or ())
  unknown = sorted(set(only) - set(aot.FUNCTIONS))
  if unknown:
    print(f"aot_compile: --only {unknown}: expected some of {aot.FUNCTIONS}", file=sys.stderr)
    return 2
  try:
    report = aot.compile_iteration(c, _TOPOLOGY.value, only=only or None)
  except (aot.TopologyError, aot.ConfigError, ValueError) as e:
    print(f"aot_compile: {e}", file=sys.stderr)
    return 2
  lines = [json.dumps({**r.row(), "hbm_count": hbm_count_kind()}) for r in report.results]
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      f.write("".join(line + "\n" for line in lines))
  if _JSON.value:
    print("\n".join(lines))
  else:
    print(HBM_COUNT)
    print(report.header())
    print(format_table(report.results))
  return 0 if all(r.fits for r in report.results) else 1


if __name__ == "__main__":
  sys.exit(main())
