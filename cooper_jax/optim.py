"""Optax optimisers from config: AdamW + global-norm clipping + a schedule chosen by name.

An ablation swaps the schedule with one override, e.g. `--config.policy.optim.schedule=warmup_cosine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
  import optax

SCHEDULES = ("constant", "linear_warmup", "warmup_cosine", "warmup_linear_decay")


def make_schedule(oc, default_total_steps: int | None = None) -> optax.Schedule:
  """oc: lr, schedule, warmup_steps, total_steps, end_lr_frac (ConfigDict or anything with
  attrs). An unset (None) total_steps is `default_total_steps`, the run's train.steps."""
  # Imported here, not at the top: config parsing imports this module for SCHEDULES only.
  import optax  # pylint: disable=import-outside-toplevel

  total = oc.total_steps if oc.total_steps is not None else default_total_steps
  if total is None and oc.schedule in ("warmup_cosine", "warmup_linear_decay"):
    raise ValueError(f"optim.schedule={oc.schedule!r} needs total_steps (or the run's steps)")
  lr, warm, total = float(oc.lr), int(oc.warmup_steps), int(total or 0)
  end = lr * float(oc.end_lr_frac)
  if oc.schedule == "constant":
    return optax.constant_schedule(lr)
  if oc.schedule == "linear_warmup":  # verl's default: linear warm-up, then constant
    return optax.linear_schedule(0.0, lr, max(warm, 1)) if warm else optax.constant_schedule(lr)
  if oc.schedule == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warm, max(total, warm + 1), end)
  if oc.schedule == "warmup_linear_decay":
    return optax.join_schedules(
      [
        optax.linear_schedule(0.0, lr, max(warm, 1)),
        optax.linear_schedule(lr, end, max(total - warm, 1)),
      ],
      [warm],
    )
  raise ValueError(f"optim.schedule={oc.schedule!r}: expected one of {SCHEDULES}")


def frozen() -> optax.GradientTransformation:
  """The optimizer of a model that is never trained (a static RM): no updates and no state, so
  it holds no AdamW moments on the device."""
  import optax  # pylint: disable=import-outside-toplevel

  return optax.set_to_zero()


def make_optimizer(oc, default_total_steps: int | None = None) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> AdamW(schedule, b1, b2, eps, weight_decay)."""
  import optax  # pylint: disable=import-outside-toplevel

  parts = []
  if oc.grad_clip and oc.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(float(oc.grad_clip)))
  parts.append(
    optax.adamw(
      make_schedule(oc, default_total_steps),
      b1=float(oc.b1),
      b2=float(oc.b2),
      eps=float(oc.eps),
      weight_decay=float(oc.weight_decay),
    )
  )
  return optax.chain(*parts)
