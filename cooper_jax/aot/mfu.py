"""Model FLOPs utilisation of policy_step at its roofline time, from the AOT tool's JSON lines.

MFU = model FLOPs / (chips x peak bf16 FLOP/s per chip x roofline_s), the model FLOPs of one
training iteration's policy updates being

  6 x non-embedding params x trained tokens + attention,

trained tokens = rows per update x (max_prompt_len + max_new_tokens) x updates: every position
of the sequence goes through the forward and backward passes (the loss reads only the response
positions, the compute does not skip the prompt). Non-embedding params: every parameter but
the token embedding and, when untied, the LM head (the layers' matmul weights, biases, norms).
Attention: 12 x layers x heads x head_dim x seq per token (QK^T and PV, forward + backward), as
PaLM's appendix B counts it, over all seq x seq (query, key) pairs: no causal halving, which is
also what this implementation computes (it scores every pair and masks).

Not counted: remat's recompute of the layers' forward (cost.train_flops counts it, so the
recorded `flops` are hardware FLOPs, ~4/3 of these with policy.remat) and the LM head's. The
LM head (6 x d x vocab per response token: it runs on the response positions only) is left out
of `mfu` by the non-embedding convention and counted in `mfu_with_head`. `hfu` is the recorded
hardware FLOPs over the same denominator (1.0 when the roofline is compute-bound).
"""

from __future__ import annotations

from cooper_jax.aot.models import model_config
from cooper_jax.aot.topology import CHIP_PEAKS
from cooper_jax.models.config import ModelConfig

# libtpu topology-name prefix -> jax device_kind, the key of topology.CHIP_PEAKS.
TOPOLOGY_DEVICE_KINDS = {
  "v4": "TPU v4",
  "v5e": "TPU v5 lite",
  "v5litepod": "TPU v5 lite",
  "v5p": "TPU v5",
  "v6e": "TPU v6 lite",
}


def chip_peak_flops(topology: str) -> float:
  """Published peak bf16 FLOP/s of one chip of `topology` (e.g. "v5e:2x4": 197e12)."""
  prefix = topology.split(":")[0].lower()
  if prefix not in TOPOLOGY_DEVICE_KINDS:
    raise ValueError(
      f"topology {topology!r}: unknown chip {prefix!r}, expected one of "
      f"{sorted(TOPOLOGY_DEVICE_KINDS)}"
    )
  return CHIP_PEAKS[TOPOLOGY_DEVICE_KINDS[prefix]]["flops"]


def non_embedding_params(cfg: ModelConfig) -> int:
  """Parameters without the token embedding and an untied LM head."""
  table = cfg.vocab_size * cfg.d_model
  untied_head = table if cfg.head == "lm" and not cfg.tie_embeddings else 0
  return cfg.num_params() - table - untied_head


def attention_flops(cfg: ModelConfig, rows: int, seq: int) -> int:
  """Forward + backward attention FLOPs of `rows` sequences of `seq` tokens: 12 L h e seq per
  token (QK^T and PV, 2 FLOPs per multiply-add, backward 2x forward), all seq^2 pairs."""
  return 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq * rows * seq


def lm_head_flops(cfg: ModelConfig, rows: int, head_tokens: int) -> int:
  """Forward + backward FLOPs of the LM head on `head_tokens` positions per row."""
  return 6 * cfg.d_model * cfg.vocab_size * rows * head_tokens if cfg.head == "lm" else 0


def policy_step_model_flops(
  cfg: ModelConfig, rows: int, seq: int, head_tokens: int, updates: int = 1
) -> tuple[float, float]:
  """(model FLOPs, model FLOPs with the LM head) of `updates` policy updates of `rows`
  sequences of `seq` tokens, the head on `head_tokens` positions per row; no remat."""
  per_update = 6 * non_embedding_params(cfg) * rows * seq + attention_flops(cfg, rows, seq)
  head = lm_head_flops(cfg, rows, head_tokens)
  return float(updates * per_update), float(updates * (per_update + head))


def mfu(model_flops: float, chips: int, peak_flops_per_chip: float, seconds: float) -> float:
  return model_flops / (chips * peak_flops_per_chip * seconds)


def policy_step_mfu(row: dict, c) -> dict:
  """MFU of a recorded policy_step row (aot.FnResult.row(), one line of cooper_jax/cli/aot.py's
  or results/aot/paper_summary.py's JSON) at its roofline_s, for the config `c` it was
  compiled from. Updates per iteration: the row's `calls` (ppo_epochs x rows /
  ppo_mini_batch_size), each on ppo_mini_batch_size rows (0: the whole batch)."""
  if row.get("function") != "policy_step":
    raise ValueError(f"expected a policy_step row, got {row.get('function')!r}")
  cfg = model_config(c.policy, "lm")
  ro = c.rollout
  rows = c.policy.ppo_mini_batch_size or ro.prompts_per_step * ro.group_size
  seq = ro.max_prompt_len + ro.max_new_tokens
  model, with_head = policy_step_model_flops(cfg, rows, seq, ro.max_new_tokens, row["calls"])
  peak, chips, secs = chip_peak_flops(row["topology"]), row["chips"], row["roofline_s"]
  hardware = row["flops"] * row["devices"]  # the row's flops are per device
  return dict(
    config=row.get("config"),
    topology=row["topology"],
    chips=chips,
    roofline_s=secs,
    updates=row["calls"],
    tokens=row["calls"] * rows * seq,
    non_embedding_params=non_embedding_params(cfg),
    model_flops=model,
    model_flops_with_head=with_head,
    hardware_flops=hardware,
    mfu=mfu(model, chips, peak, secs),
    mfu_with_head=mfu(with_head, chips, peak, secs),
    hfu=mfu(hardware, chips, peak, secs),
  )


def format_mfu(rows: list[dict]) -> str:
  lines = [
    "| config | topology | chips | roofline s | model PFLOP | + head PFLOP | hardware PFLOP | "
    "MFU | MFU with head | HFU |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['config']} | {r['topology']} | {r['chips']} | {r['roofline_s']:.3f} | "
      f"{r['model_flops'] / 1e15:.3f} | {r['model_flops_with_head'] / 1e15:.3f} | "
      f"{r['hardware_flops'] / 1e15:.3f} | {r['mfu']:.3f} | {r['mfu_with_head']:.3f} | "
      f"{r['hfu']:.3f} |"
    )
  return "\n".join(lines)
