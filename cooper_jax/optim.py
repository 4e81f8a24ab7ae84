"""Optax optimisers from config: global-norm clipping -> the optimizer `optim.name` names, its
learning rate a schedule chosen by name.

Shared by every optimizer: lr, schedule, warmup_steps, total_steps, end_lr_frac, grad_clip.
Each optimizer's own hyperparameters live in a sub-dict named after it (config.optim_config
builds one per OPTIMIZERS entry), so an ablation is one or two overrides:

  --config.policy.optim.schedule=warmup_cosine
  --config.rm.optim.name=lion --config.rm.optim.lion.b1=0.95 --config.rm.optim.lr=1e-6

A new optimizer is one OPTIMIZERS entry: a builder (lr schedule, hyperparameters) -> optax
transformation, and its hyperparameters' defaults (which also fix their types on the command
line). The default, adamw with b1 0.9, b2 0.999, eps 1e-8, weight_decay 0.01, is the reference
code's AdamW.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
  import optax

SCHEDULES = ("constant", "linear_warmup", "warmup_cosine", "warmup_linear_decay")


def make_schedule(oc, default_total_steps: int | None = None) -> optax.Schedule:
  """oc: lr, schedule, warmup_steps, total_steps, end_lr_frac (ConfigDict or anything with
  attrs). An unset (None) total_steps is `default_total_steps`, the run's train.steps."""
  # Imported here, not at the top: config parsing imports this module for its tables only.
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


def _adamw(lr, hp):
  import optax  # pylint: disable=import-outside-toplevel

  return optax.adamw(lr, b1=hp["b1"], b2=hp["b2"], eps=hp["eps"], weight_decay=hp["weight_decay"])


def _lion(lr, hp):
  import optax  # pylint: disable=import-outside-toplevel

  return optax.lion(lr, b1=hp["b1"], b2=hp["b2"], weight_decay=hp["weight_decay"])


def _sgd(lr, hp):
  import optax  # pylint: disable=import-outside-toplevel

  sgd = optax.sgd(lr, momentum=hp["momentum"] or None, nesterov=hp["nesterov"])
  if not hp["weight_decay"]:
    return sgd
  # torch.optim.SGD's weight decay: wd * param joins the gradient before the momentum.
  return optax.chain(optax.add_decayed_weights(hp["weight_decay"]), sgd)


def _adafactor(lr, hp):
  import optax  # pylint: disable=import-outside-toplevel

  return optax.adafactor(
    lr,
    min_dim_size_to_factor=hp["min_dim_size_to_factor"],
    decay_rate=hp["decay_rate"],
    multiply_by_parameter_scale=hp["multiply_by_parameter_scale"],
    clipping_threshold=hp["clipping_threshold"] or None,
    momentum=hp["momentum"] or None,
    eps=hp["eps"],
    factored=hp["factored"],
    weight_decay_rate=hp["weight_decay"] or None,
  )


class Optimizer(NamedTuple):
  build: Callable[[Any, Mapping[str, Any]], Any]  # (lr schedule, hyperparameters) -> optax
  defaults: Mapping[str, Any]  # every hyperparameter, its default and so its type
  note: str


OPTIMIZERS: dict[str, Optimizer] = {
  "adamw": Optimizer(
    _adamw,
    dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01),
    "decoupled weight decay, scaled by the lr (optax.adamw)",
  ),
  "lion": Optimizer(
    _lion,
    dict(b1=0.9, b2=0.99, weight_decay=1e-3),
    "sign updates of size lr: take an lr 3-10x below AdamW's (optax.lion)",
  ),
  "sgd": Optimizer(
    _sgd,
    dict(momentum=0.9, nesterov=False, weight_decay=0.0),
    "heavy-ball momentum (0 = plain SGD); weight_decay joins the gradient, as torch's",
  ),
  "adafactor": Optimizer(
    _adafactor,
    dict(
      decay_rate=0.8,
      clipping_threshold=1.0,
      momentum=0.0,
      eps=1e-30,
      factored=True,
      min_dim_size_to_factor=128,
      multiply_by_parameter_scale=True,
      weight_decay=0.0,
    ),
    "factored second moments (optax.adafactor); clipping_threshold, momentum, weight_decay: "
    "0 = off; weight_decay is per step, not scaled by the lr",
  ),
}

# Which values a hyperparameter may take, by its name in any optimizer: (test, what it says).
_RANGES = {
  "b1": (lambda v: 0 <= v < 1, "in [0, 1)"),
  "b2": (lambda v: 0 <= v < 1, "in [0, 1)"),
  "momentum": (lambda v: 0 <= v < 1, "in [0, 1) (0 = off)"),
  "decay_rate": (lambda v: v > 0, "> 0"),
  "eps": (lambda v: v > 0, "> 0"),
  "weight_decay": (lambda v: v >= 0, ">= 0"),
  "clipping_threshold": (lambda v: v >= 0, ">= 0 (0 = off)"),
  "min_dim_size_to_factor": (lambda v: v >= 1, ">= 1"),
}


# The keys of an optim config besides the optimizers' sub-dicts (config.optim_config).
SHARED = ("name", "lr", "schedule", "warmup_steps", "total_steps", "end_lr_frac", "grad_clip")


def hyperparameters(oc, where: str = "optim") -> dict[str, Any]:
  """The hyperparameters of the optimizer `oc.name` names: its defaults, updated by the
  sub-dict `oc[oc.name]` where there is one. `where` is oc's config path (config.rm.optim).

  Raises ValueError naming the key for: an unknown name (listing the known ones); a key of a
  sub-dict that is not one of that optimizer's hyperparameters; a value of the wrong type or
  out of range; and, since each would otherwise be ignored, a key of oc that is neither shared
  nor a sub-dict (a flat `optim.b2`, where AdamW's were kept before) and another optimizer's
  hyperparameter set away from its default (`optim.lion.b1=0.95` under name adamw)."""
  known = ", ".join(sorted(OPTIMIZERS))
  stray = sorted(set(oc.keys()) - set(SHARED) - set(OPTIMIZERS))
  if stray:
    raise ValueError(
      f"{where}.{stray[0]}: not an optim key (shared: {', '.join(SHARED)}; an optimizer's "
      f"hyperparameters go in {where}.<name>.<key>, <name> one of {known})"
    )
  name = oc.get("name")
  if name not in OPTIMIZERS:
    raise ValueError(f"{where}.name={name!r}: expected one of {known}")
  for opt in sorted(set(OPTIMIZERS) & set(oc.keys())):
    defaults, given = OPTIMIZERS[opt].defaults, dict(oc[opt] or {})
    for key, value in sorted(given.items()):
      if key not in defaults:
        raise ValueError(
          f"{where}.{opt}.{key}: not a hyperparameter of {opt} "
          f"(its hyperparameters: {', '.join(sorted(defaults))})"
        )
      if opt != name and value != defaults[key]:
        raise ValueError(
          f"{where}.{opt}.{key}={value!r} is set but {where}.name={name!r}: set "
          f"{where}.name={opt} to use it, or leave {opt}'s hyperparameters at their defaults"
        )
  defaults = OPTIMIZERS[name].defaults
  hp = {**defaults, **dict(oc.get(name) or {})}
  for key, value in hp.items():
    kind = type(defaults[key])
    if kind is bool:
      ok = isinstance(value, bool)
    else:  # an int where a float is expected is fine (--config.x.b1=0 parses as one)
      ok = isinstance(value, (int, float) if kind is float else kind)
      ok = ok and not isinstance(value, bool)
    if not ok:
      raise ValueError(f"{where}.{name}.{key} must be a {kind.__name__}, got {value!r}")
    check, says = _RANGES.get(key, (lambda v: True, ""))
    if not check(value):
      raise ValueError(f"{where}.{name}.{key} must be {says}, got {value!r}")
  return {k: float(v) if type(defaults[k]) is float else v for k, v in hp.items()}


def frozen() -> optax.GradientTransformation:
  """The optimizer of a model that is never trained (a static RM): no updates and no state, so
  it holds no optimizer moments on the device."""
  import optax  # pylint: disable=import-outside-toplevel

  return optax.set_to_zero()


def make_optimizer(oc, default_total_steps: int | None = None) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> OPTIMIZERS[oc.name](schedule, oc[oc.name])."""
  import optax  # pylint: disable=import-outside-toplevel

  hp = hyperparameters(oc)
  parts = []
  if oc.grad_clip and oc.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(float(oc.grad_clip)))
  parts.append(OPTIMIZERS[oc.name].build(make_schedule(oc, default_total_steps), hp))
  return optax.chain(*parts)
