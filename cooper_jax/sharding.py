"""Device mesh (data, fsdp, tensor) and parameter partitioning from a short list of regex rules."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cooper_jax.config import DECODE_WEIGHTS

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch is split over both; fsdp also splits parameters

# (regex searched in the "/"-joined parameter path, spec). First match wins. Layer-stacked
# tensors have a leading layer axis that is never split. Shapes: embed [v, d]; q/k/v [l, d, h, e];
# o [l, h, e, d]; gate/up [l, d, f]; down [l, f, d]; lm_head [d, v]; score [d, 1].
PARAM_RULES: tuple[tuple[str, P], ...] = (
  (r"embed/embedding$", P("tensor", "fsdp")),
  (r"attn/(q|k|v)/kernel$", P(None, "fsdp", "tensor", None)),
  (r"attn/(q|k|v)/bias$", P(None, "tensor", None)),
  (r"attn/o/kernel$", P(None, "tensor", None, "fsdp")),
  (r"mlp/(gate|up)/kernel$", P(None, "fsdp", "tensor")),
  (r"mlp/down/kernel$", P(None, "tensor", "fsdp")),
  (r"lm_head/kernel$", P("fsdp", "tensor")),
  (r"score/kernel$", P("fsdp", None)),
  (r".*", P()),  # norms, scalars (optimizer counts, step)
)


def make_mesh(
  data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 to take the remaining devices.

  Devices are laid out by `jax.make_mesh` (mesh_utils), which on TPU follows the physical
  torus, so the fsdp and tensor collectives run over neighbouring chips; on CPU/GPU it keeps
  `jax.devices()` order (process by process). A multi-slice TPU run (devices of several
  `slice_index`es, joined over the data-center network) splits `data` across slices with
  `mesh_utils.create_hybrid_device_mesh`: only the data-parallel gradient reduction crosses
  DCN; `data` must be a multiple of the number of slices.
  """
  devices = list(devices if devices is not None else jax.devices())
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  for name, size in sizes.items():
    if size == 0 or size < -1:
      raise ValueError(f"mesh.{name} must be positive or -1, got {size}")
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got {free}")
  known = int(np.prod([v for v in sizes.values() if v != -1]))
  if free:
    if len(devices) % known:
      raise ValueError(f"mesh: {len(devices)} devices are not divisible by {known}")
    sizes[free[0]] = len(devices) // known
  total = int(np.prod(list(sizes.values())))
  if total > len(devices):
    raise ValueError(f"mesh {sizes} needs {total} devices, only {len(devices)} available")
  shape = tuple(sizes[a] for a in AXES)
  types = (jax.sharding.AxisType.Auto,) * len(AXES)
  devices = devices[:total]
  n_slices = num_slices(devices)
  if n_slices > 1:
    if sizes["data"] % n_slices:
      raise ValueError(
        f"mesh.data={sizes['data']} must be a multiple of the {n_slices} TPU slices (DCN)"
      )
    grid = mesh_utils.create_hybrid_device_mesh(
      (sizes["data"] // n_slices, sizes["fsdp"], sizes["tensor"]), (n_slices, 1, 1), devices
    )
    return Mesh(grid, AXES, axis_types=types)
  try:
    return jax.make_mesh(shape, AXES, axis_types=types, devices=devices)
  except (AssertionError, ValueError, NotImplementedError) as e:
    # mesh_utils knows no layout for some device sets (e.g. the two cores of a v4 chip listed
    # separately in a compile-only topology): fall back to list order, which is correct, only
    # possibly slower.
    logging.warning("mesh: no topology-aware layout (%s); using device list order", e)
    return Mesh(np.asarray(devices).reshape(shape), AXES, axis_types=types)


def num_slices(devices: Sequence[jax.Device]) -> int:
  """Distinct TPU slices among `devices` (1 off TPU, where slice_index means nothing here)."""
  if not devices or devices[0].platform != "tpu":
    return 1
  return len({getattr(d, "slice_index", 0) for d in devices})


def _path_str(path) -> str:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh, path: str) -> P:
  """Drops mesh axes from dimensions they do not divide (e.g. 9 heads on tensor=2)."""
  spec = tuple(spec) + (None,) * (len(shape) - len(spec))
  if len(spec) > len(shape):
    return P()
  out = []
  for dim, axis in zip(shape, spec):
    size = (
      1
      if axis is None
      else int(np.prod([mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis)]))
    )
    if size > 1 and dim % size:
      logging.debug("sharding: %s dim %d not divisible by %s=%d, replicated", path, dim, axis, size)
      axis = None
    out.append(axis)
  return P(*out)


def tree_specs(tree, mesh: Mesh, rules=PARAM_RULES):
  """PartitionSpec for every leaf of a params (or optimizer-state) pytree."""
  compiled = [(re.compile(pattern), spec) for pattern, spec in rules]

  def spec_for(path, leaf):
    name = _path_str(path)
    shape = tuple(getattr(leaf, "shape", ()))
    for pattern, spec in compiled:
      if pattern.search(name):
        return _fit(spec, shape, mesh, name)
    return P()

  return jax.tree_util.tree_map_with_path(spec_for, tree)


def tree_shardings(tree, mesh: Mesh, rules=PARAM_RULES):
  return jax.tree.map(
    lambda s: NamedSharding(mesh, s),
    tree_specs(tree, mesh, rules),
    is_leaf=lambda x: isinstance(x, P),
  )


def shard_tree(tree, mesh: Mesh, rules=PARAM_RULES):
  return jax.device_put(tree, tree_shardings(tree, mesh, rules))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading (batch) axis split over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


# Decode layout "split": per weight, its primary dimension (heads, MLP columns, vocabulary)
# and its other one (q/k/v input rows, o/down output columns). The primary one is split over
# every device where their count divides it: each device computes its slice of the output.
# Else over `tensor` (where the cache's kv heads are) with the other dimension over (data,
# fsdp), else the other dimension over every device; XLA then adds partial sums over devices.
# Either way a decode step moves activations ([rows, width]) between devices, not weights.
# Per-layer shapes (transformer.split_layers drops the layer axis): q/k/v [d, h, e], their bias
# [h, e], o [h, e, d], gate/up [d, f], down [f, d], embed [v, d], lm_head [d, v]; norms whole.
SPLIT_DECODE_DIMS: tuple[tuple[str, tuple[int, ...]], ...] = (
  (r"attn/(q|k|v)/kernel$", (1, 0)),
  (r"attn/(q|k|v)/bias$", (0,)),
  (r"attn/o/kernel$", (0, 2)),
  (r"mlp/(gate|up)/kernel$", (1, 0)),
  (r"mlp/down/kernel$", (0, 1)),
  (r"embed/embedding$", (0, 1)),
  (r"lm_head/kernel$", (1, 0)),
)


class SplitDecodeWeights:
  """rollout.decode_weights = "split": the decode's weight copy split over every device of the
  mesh (SPLIT_DECODE_DIMS), so the weight bytes a device reads per step fall as 1/devices,
  where "sharded" lets XLA gather every weight to every device at each step (fsdp splits the
  contraction dimension) and "replicated" holds the whole copy on each. Rows stay split over
  (data, fsdp) as the batch is, kv heads over tensor as the cache is; XLA moves activations
  between layouts. Hashable: a static argument of the jitted sampler."""

  def __init__(self, mesh: Mesh):
    self.mesh = mesh
    used = lambda names: tuple(a for a in names if mesh.shape[a] > 1)
    self.all, self.tensor, self.rest = used(AXES), used(("tensor",)), used(BATCH_AXES)

  def __eq__(self, other):
    return isinstance(other, SplitDecodeWeights) and other.mesh == self.mesh

  def __hash__(self):
    return hash(("SplitDecodeWeights", self.mesh))

  def _size(self, axes) -> int:
    return int(np.prod([self.mesh.shape[a] for a in axes])) if axes else 1

  def spec(self, path: str, shape: tuple[int, ...]) -> P:
    """The PartitionSpec of one per-layer weight (module comment above SPLIT_DECODE_DIMS)."""
    dims = next((d for pattern, d in SPLIT_DECODE_DIMS if re.search(pattern, path)), None)
    if dims is None or not self.all:
      return P()
    first, other = dims[0], dims[1:]
    options = [((first, self.all),)]
    if other:
      options += [((first, self.tensor), (other[0], self.rest)), ((other[0], self.all),)]
    else:
      options.append(((first, self.tensor),))
    for option in options:
      if all(shape[d] % self._size(axes) == 0 for d, axes in option):
        spec = [None] * len(shape)
        for d, axes in option:
          spec[d] = (axes[0] if len(axes) == 1 else axes) if axes else None
        return P(*spec)
    return P()

  def shardings(self, tree):
    """A NamedSharding for every leaf of `tree` (weights as split_layers makes them)."""
    return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(self.mesh, self.spec(_path_str(path), tuple(x.shape))), tree
    )


def decode_weights(mesh: Mesh, mode: str):
  """sampling.sample's weights_sharding for config rollout.decode_weights: "sharded" -> None
  (the copy stays as the params are), "replicated" -> whole on every device, "split" ->
  SplitDecodeWeights (split over every device)."""
  if mode not in DECODE_WEIGHTS:
    raise ValueError(f"rollout.decode_weights={mode!r}: expected one of {DECODE_WEIGHTS}")
  if mode == "split":
    return SplitDecodeWeights(mesh)
  return replicated(mesh) if mode == "replicated" else None


def decode_weight_shardings(tree, weights_sharding):
  """What `tree` (the decode's weights) is constrained to: weights_sharding itself (one
  sharding for every leaf) or, for SplitDecodeWeights, its per-leaf shardings."""
  if isinstance(weights_sharding, SplitDecodeWeights):
    return weights_sharding.shardings(tree)
  return weights_sharding
