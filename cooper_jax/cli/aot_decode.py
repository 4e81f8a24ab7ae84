"""The sampler's decode step compiled for a TPU topology on this host (no TPU needed), against
the HBM floor; and policy_step's MFU at its roofline from recorded AOT results.

Decode step (cooper_jax.aot.decode: XLA's bytes accessed per chip for one step, the floor =
parameter shards + KV cache per chip, their ratio, seconds per step at the chip's HBM bandwidth
and the tokens/s that implies; a markdown table, then one JSON line). The paper's run:

  cooper-aot-decode --config experiments/paper.py:qwen,cooper --topology v5e:2x4 \
      --json_out results/aot/decode_qwen_cooper_v5e-2x4.jsonl

MFU of the recorded policy_step rows (cooper_jax.aot.mfu; the config of each row is read from
its "config" field, e.g. paper.py:qwen,cooper -> experiments/paper.py, else from --config):

  cooper-aot-decode --mfu_from results/aot/paper_all_v5e-2x4.jsonl

Bytes are HBM bytes, counted with v5e's VMEM prefetching off: the tool adds
`--xla_vf_vmem_memory_space_assignment=false` to LIBTPU_INIT_ARGS unless that already holds an
xla_vf_vmem setting, and says which count it used (printed first; "hbm_count" in the JSON row).
Config and `--config.k=v` overrides are parsed by ml_collections' config_flags, as
cooper_jax/cli/aot.py does. Needs libtpu for the compile (requirements.txt). Exit status: 0,
2 bad topology, config or flags.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
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
_JSON_OUT = flags.DEFINE_string("json_out", None, "also write the JSON line(s) to this file")
_MFU_FROM = flags.DEFINE_string(
  "mfu_from", None, "JSON lines of cooper_jax/cli/aot.py or results/aot/paper_summary.py: MFU"
)


def _config_name() -> str:
  name = config_flags.get_config_filename(flags.FLAGS["config"])
  overrides = config_flags.get_override_values(flags.FLAGS["config"])
  return " ".join([name, *(f"--config.{k}={v}" for k, v in sorted(overrides.items()))])


def _row_config(row: dict):
  """The config a recorded row was compiled from: its "config" field (file[:arg], relative to
  the working directory or experiments/), else --config."""
  from cooper_jax.config import load_config  # pylint: disable=import-outside-toplevel

  spec = row.get("config")
  if not spec:
    if _CONFIG.value is None:
      raise ValueError("a row without a 'config' field needs --config")
    return _CONFIG.value
  path, _, arg = spec.partition(":")
  if not Path(path).is_file() and (ROOT / "experiments" / path).is_file():
    path = str(ROOT / "experiments" / path)
  return load_config(f"{path}:{arg}" if arg else path)


def _mfu(path: str) -> list[str]:
  from cooper_jax.aot import mfu  # pylint: disable=import-outside-toplevel

  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  out = [mfu.policy_step_mfu(r, _row_config(r)) for r in rows if r.get("function") == "policy_step"]
  if not out:
    raise ValueError(f"{path}: no policy_step rows")
  print(f"policy_step MFU at its roofline time ({path}; definitions: cooper_jax/aot/mfu.py)")
  print(mfu.format_mfu(out))
  lines = [json.dumps(r) for r in out]
  print("\n".join(lines))
  return lines


def main() -> int:
  if wants_help(__doc__, __name__):
    return 0
  if refuse_unknown_config_keys(Path(__file__).stem):
    return 2
  try:
    flags.FLAGS(sys.argv)
  except Exception as e:  # noqa: BLE001 - flag/config-file errors: bad config, exit 2
    print(f"aot_decode: bad config or flags: {type(e).__name__}: {e}", file=sys.stderr)
    return 2
  lines: list[str] = []
  if _MFU_FROM.value:
    try:
      lines += _mfu(_MFU_FROM.value)
    except (OSError, ValueError, KeyError) as e:
      print(f"aot_decode: --mfu_from: {type(e).__name__}: {e}", file=sys.stderr)
      return 2
  if _TOPOLOGY.value or not _MFU_FROM.value:
    if not _TOPOLOGY.value or _CONFIG.value is None:
      print("aot_decode: --config and --topology are required (or --mfu_from)", file=sys.stderr)
      return 2
    from cooper_jax import aot  # pylint: disable=import-outside-toplevel
    from cooper_jax.aot import decode  # pylint: disable=import-outside-toplevel

    try:
      r = decode.compile_decode_step(_CONFIG.value, _TOPOLOGY.value, config_name=_config_name())
    except (aot.TopologyError, aot.ConfigError, ValueError) as e:
      print(f"aot_decode: {e}", file=sys.stderr)
      return 2
    print(HBM_COUNT)
    print(decode.format_decode(r))
    lines.append(json.dumps({**r.row(), "hbm_count": hbm_count_kind()}))
    print(lines[-1])
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w") as f:
      f.write("".join(line + "\n" for line in lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
