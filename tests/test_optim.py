"""Optimizers by config (cooper_jax/optim.py): each one's update on a small quadratic against
its formula worked by hand in numpy, the default against the AdamW every recorded run used,
schedule swaps against hand-computed lr sequences, and config errors that name the key."""

import math
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from cooper_jax import config as config_lib
from cooper_jax import optim

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "experiments" / "tiny.py")

# f(p) = 0.5 * sum(A * (p - T)^2), so grad = A * (p - T): steps move p toward T at rates A.
A = np.array([1.0, 4.0, 0.25])
T = np.array([0.5, -1.0, 2.0])
P0 = np.array([2.0, 1.0, -1.0])


def _grad(p):
  return A * (p - T)


def _oc(name, lr=0.1, **hp):
  """An optim config with no clipping and a constant lr, so an update is the optimizer's own."""
  oc = config_lib.optim_config(lr, warmup_steps=0, name=name, **hp)
  oc.update(schedule="constant", grad_clip=0.0)
  return oc


def _run(oc, n, total_steps=None):
  """n steps of make_optimizer(oc) on f from P0: the updates, as float64 numpy arrays."""
  opt = optim.make_optimizer(oc, total_steps)
  p = jnp.asarray(P0, jnp.float32)
  state = opt.init(p)
  out = []
  for _ in range(n):
    u, state = opt.update(jnp.asarray(_grad(np.asarray(p, np.float64)), jnp.float32), state, p)
    out.append(np.asarray(u, np.float64))
    p = optax.apply_updates(p, u)
  return out


def test_default_is_the_reference_adamw_every_recorded_run_used():
  """base_config's optimizers are AdamW b1 0.9, b2 0.999, eps 1e-8, wd 0.01, clip 1.0 (the
  flat optim.b1/b2/eps/weight_decay of configs before optim.name): the same updates, bit for
  bit, as the chain those configs built."""
  c = config_lib.base_config()
  for oc in (c.policy.optim, c.rm.optim):
    assert oc.name == "adamw" and oc.grad_clip == 1.0
    assert dict(oc.adamw) == {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
  oc = c.rm.optim
  old = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(optim.make_schedule(oc, 100), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01),
  )
  new = optim.make_optimizer(oc, 100)
  p = jnp.asarray(P0 * 3, jnp.float32)  # a gradient norm above 1: the clip acts
  s_old, s_new = old.init(p), new.init(p)
  for _ in range(4):
    g = jnp.asarray(_grad(np.asarray(p)), jnp.float32)
    u_old, s_old = old.update(g, s_old, p)
    u_new, s_new = new.update(g, s_new, p)
    np.testing.assert_array_equal(np.asarray(u_new), np.asarray(u_old))
    p = optax.apply_updates(p, u_new)


def test_adamw_by_hand():
  b1, b2, eps, wd, lr = 0.9, 0.999, 1e-8, 0.01, 0.1
  got = _run(_oc("adamw", lr), 2)
  p, m, v = P0.copy(), 0.0, 0.0
  for t, u in enumerate(got, 1):
    g = _grad(p)
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    want = -lr * ((m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p)
    np.testing.assert_allclose(u, want, rtol=1e-5)
    p = p + want


def test_lion_by_hand():
  """Lion (Chen et al. 2023, alg. 2): u = -lr (sign(b1 m + (1 - b1) g) + wd p), then
  m = b2 m + (1 - b2) g. lr 2.5 overshoots, so gradients flip sign and with b2 0.5 the
  momentum, not the gradient, decides some steps' signs (checked below: not signSGD)."""
  b1, b2, wd, lr = 0.9, 0.5, 0.1, 2.5
  got = _run(_oc("lion", lr, b1=b1, b2=b2, weight_decay=wd), 4)
  p, m, momentum_won = P0.copy(), np.zeros(3), False
  for u in got:
    g = _grad(p)
    c = b1 * m + (1 - b1) * g
    momentum_won |= bool(np.any(np.sign(c) != np.sign(g)))
    want = -lr * (np.sign(c) + wd * p)
    m = b2 * m + (1 - b2) * g
    np.testing.assert_allclose(u, want, rtol=1e-5)
    p = p + want
  assert momentum_won


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_by_hand(nesterov):
  """Heavy ball: t = g + mu t, u = -lr t (nesterov: u = -lr (g + mu t)); weight decay joins the
  gradient first, as torch.optim.SGD's."""
  mu, wd, lr = 0.8, 0.05, 0.1
  got = _run(_oc("sgd", lr, momentum=mu, nesterov=nesterov, weight_decay=wd), 3)
  p, tr = P0.copy(), np.zeros(3)
  for u in got:
    g = _grad(p) + wd * p
    tr = g + mu * tr
    want = -lr * (g + mu * tr if nesterov else tr)
    np.testing.assert_allclose(u, want, rtol=1e-5)
    p = p + want


def test_plain_sgd_is_momentum_zero():
  (u,) = _run(_oc("sgd", 0.1, momentum=0.0), 1)
  np.testing.assert_allclose(u, -0.1 * _grad(P0), rtol=1e-6)


def test_adafactor_by_hand():
  """A vector (below min_dim_size_to_factor: unfactored): v = rho_t v + (1 - rho_t)(g^2 + eps)
  with rho_t = 1 - (t + 1)^-0.8 from t = 0; u = g / sqrt(v), divided by max(1, rms(u) / 1.0),
  times lr and max(rms(p), 1e-3) (the parameter scale), negated (Shazeer & Stern 2018)."""
  lr, eps = 0.1, 1e-30
  got = _run(_oc("adafactor", lr), 3)
  p, v = P0.copy(), np.zeros(3)
  for t, u in enumerate(got):
    g = _grad(p)
    rho = 1 - (t + 1) ** -0.8
    v = rho * v + (1 - rho) * (g * g + eps)
    r = g / np.sqrt(v)
    r = r / max(1.0, np.sqrt(np.mean(r * r)) / 1.0)
    want = -lr * r * max(np.sqrt(np.mean(p * p)), 1e-3)
    np.testing.assert_allclose(u, want, rtol=1e-5)
    p = p + want
  # Not an Adam step in disguise: the parameter scale makes the size depend on |p|.
  assert not np.allclose(np.abs(got[0]), lr)


def _lrs(schedule, n=12, lr=1.0, warmup=4, total=10):
  """The lr of each of n steps, read back from plain SGD's update -lr * g (lr small enough
  that no coordinate lands on its minimum, where g = 0)."""
  oc = _oc("sgd", lr * 1e-2, momentum=0.0)
  oc.update(schedule=schedule, warmup_steps=warmup)
  got = _run(oc, n, total_steps=total)
  p, out = P0.copy(), []
  for u in got:
    out.append(float(np.mean(-u / _grad(p))) * 1e2)
    p = p + u
  return out


def test_schedule_swap_changes_the_lr_sequence_as_computed_by_hand():
  w, total = 4, 10
  cos = [
    t / w if t < w else 0.5 * (1 + math.cos(math.pi * (t - w) / (total - w))) for t in range(12)
  ]
  lin = [t / w if t < w else max(0.0, 1 - (t - w) / (total - w)) for t in range(12)]
  want = {
    "constant": [1.0] * 12,
    "linear_warmup": [min(t / w, 1.0) for t in range(12)],
    "warmup_cosine": [x if t <= total else 0.0 for t, x in enumerate(cos)],
    "warmup_linear_decay": lin,
  }
  assert set(want) == set(optim.SCHEDULES)
  for name, lrs in want.items():
    np.testing.assert_allclose(_lrs(name), lrs, atol=1e-6, err_msg=name)


def test_every_optimizer_is_in_the_config_and_runs_from_the_command_line():
  """Each OPTIMIZERS entry has its sub-dict in base_config (so its hyperparameters are
  settable flags) and validates and steps when named."""
  c = config_lib.base_config()
  assert set(optim.OPTIMIZERS) == {"adamw", "adafactor", "lion", "sgd"}
  for name, spec in optim.OPTIMIZERS.items():
    assert dict(c.rm.optim[name]) == dict(spec.defaults)
    c = config_lib.load_config(TINY, [f"rm.optim.name={name}", f"policy.optim.name={name}"])
    config_lib.validate(c)
    (u,) = _run(c.rm.optim, 1, c.train.steps)
    assert np.all(np.isfinite(u)) and np.any(u != 0)
  c = config_lib.load_config(TINY, ["rm.optim.name=lion", "rm.optim.lion.b1=0.95"])
  config_lib.validate(c)
  assert optim.hyperparameters(c.rm.optim) == {"b1": 0.95, "b2": 0.99, "weight_decay": 1e-3}


@pytest.mark.parametrize(
  "overrides,needle",
  [
    (
      ["rm.optim.name=loin"],
      r"config\.rm\.optim\.name='loin': expected one of adafactor, adamw, lion, sgd",
    ),
    (
      ["policy.optim.name=lion", "policy.optim.lion.b1=1.0"],
      r"config\.policy\.optim\.lion\.b1 must be in \[0, 1\)",
    ),
    (
      ["rm.optim.lion.b1=0.95"],
      r"config\.rm\.optim\.lion\.b1=0\.95 is set but config\.rm\.optim\.name='adamw'",
    ),
    (
      ["rm.optim.name=sgd", "rm.optim.sgd.momentum=-0.1"],
      r"config\.rm\.optim\.sgd\.momentum must be in",
    ),
    (
      ["rm.optim.name=adafactor", "rm.optim.adafactor.eps=0.0"],
      r"config\.rm\.optim\.adafactor\.eps must be > 0",
    ),
  ],
)
def test_validate_names_the_optim_key(overrides, needle):
  c = config_lib.load_config(TINY, overrides)
  with pytest.raises(ValueError, match=needle):
    config_lib.validate(c)


@pytest.mark.parametrize(
  "key", ["policy.optim.optimizer=lion", "rm.optim.lion.beta1=0.9", "rm.optim.b1=0.9"]
)
def test_unknown_optim_keys_fail_at_parse_time_naming_the_key(key):
  with pytest.raises(KeyError, match=key.split("=")[0].replace(".", r"\.")):
    config_lib.load_config(TINY, [key])


def test_hand_built_configs_are_checked_too():
  """A config built in code (no type lock) gets the same errors: an unknown hyperparameter
  listing the known ones, a flat AdamW key as the configs before optim.name had, a type."""
  oc = config_lib.optim_config(1e-3)
  oc.sgd.beta = 0.9
  with pytest.raises(ValueError, match=r"optim\.sgd\.beta: not a hyperparameter of sgd "):
    optim.make_optimizer(oc)
  oc = config_lib.optim_config(1e-3)
  oc.b2 = 0.95
  with pytest.raises(ValueError, match=r"optim\.b2: not an optim key .*optim\.<name>\.<key>"):
    optim.make_optimizer(oc)
  oc = config_lib.optim_config(1e-3, name="sgd").to_dict()
  oc = ml_collections.ConfigDict(oc, type_safe=False)
  oc.sgd.nesterov = 1
  with pytest.raises(ValueError, match=r"optim\.sgd\.nesterov must be a bool"):
    optim.make_optimizer(oc)
  with pytest.raises(ValueError, match="not a hyperparameter of lion"):
    config_lib.optim_config(1e-3, name="lion", eps=1e-8)
