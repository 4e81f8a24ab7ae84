"""Device mesh (data, fsdp, tensor) and parameter partitioning from a short list of regex rules."""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class MLPSplit:
  """Decode layout "mlp_split" (config rollout.decode_weights, pairs.assistant_decode_weights):
  the MLP's hidden columns split over every device (gate/up kernels [d, f] by columns, down
  [f, d] by rows), its input whole on every device and its output summed over them, one
  all-reduce of [rows, d] per layer; every other weight as the params are. Under fsdp the MLP
  kernels are split over d instead, so every decode step all-reduces the [rows, d_ff] partial
  sums of gate and up, whatever the slice's size (the 7B assistant's 64 rows: 0.27 GB per chip
  per step on v5e:2x4 and on 4x4; BUILD.md). A dimension the devices do not divide stays as
  the params have it."""

  mesh: Mesh

  @property
  def axes(self) -> tuple[str, ...]:
    return tuple(a for a in AXES if self.mesh.shape[a] > 1)

  def _spec(self, name: str, shape: tuple[int, ...]) -> P | None:
    if not self.axes:  # one device
      return None
    if re.search(r"mlp/(gate|up)/kernel$", name):
      return _fit(P(*([None] * (len(shape) - 1)), self.axes), shape, self.mesh, name)
    if re.search(r"mlp/down/kernel$", name):
      return _fit(P(*([None] * (len(shape) - 2)), self.axes, None), shape, self.mesh, name)
    return None

  def weight_shardings(self, split):
    """NamedSharding per MLP kernel of the per-call weight copy (transformer.split_layers;
    stacked [l, ...] leaves too), None for every other leaf."""

    def one(path, x):
      spec = self._spec(_path_str(path), tuple(x.shape))
      return None if spec is None else NamedSharding(self.mesh, spec)

    return jax.tree_util.tree_map_with_path(one, split)

  def place(self, split, put):
    """`split` with put(leaf, sharding) for each MLP kernel (weight_shardings), the other
    leaves as they are."""
    return jax.tree.map(
      lambda x, sh: x if sh is None else put(x, sh), split, self.weight_shardings(split)
    )

  def columns(self, d_ff: int) -> NamedSharding:
    """The MLP's hidden activations [n, d_ff], split as its kernels' columns are."""
    spec = _fit(P(None, self.axes), (1, d_ff), self.mesh, "mlp columns") if self.axes else P()
    return NamedSharding(self.mesh, spec)


def decode_weights(mesh: Mesh, mode: str) -> NamedSharding | MLPSplit | None:
  """sampling.sample's weights_sharding for config rollout.decode_weights (and
  pairs.assistant_decode_weights): "sharded" -> None (the copy stays as the params are),
  "replicated" -> whole on every device, "mlp_split" -> `MLPSplit`."""
  if mode not in DECODE_WEIGHTS:
    raise ValueError(f"rollout.decode_weights={mode!r}: expected one of {DECODE_WEIGHTS}")
  if mode == "mlp_split":
    return MLPSplit(mesh)
  return replicated(mesh) if mode == "replicated" else None


def decode_tree_shardings(tree, mesh: Mesh, mode: str):
  """`tree_shardings` for a model that only decodes (the frozen llm_rewrite assistant), stored
  in decode layout `mode`'s own: under mlp_split the MLP kernels split by their hidden columns,
  so that a sampler call copies nothing (resharding a per-call copy held a second 1.3 GiB of
  the 7B assistant's MLP per chip on v5e:2x4, more than the chip holds); else as PARAM_RULES."""
  shardings = tree_shardings(tree, mesh)
  layout = decode_weights(mesh, mode)
  if not isinstance(layout, MLPSplit):
    return shardings
  return jax.tree.map(
    lambda base, mlp: base if mlp is None else mlp, shardings, layout.weight_shardings(tree)
  )


def place_decode_weights(split, layout: NamedSharding | MLPSplit | None):
  """sampling.sample's per-call weight copy (inside its jit) in `decode_weights`' layout."""
  if layout is None:
    return split
  if isinstance(layout, MLPSplit):
    return layout.place(split, jax.lax.with_sharding_constraint)
  return jax.lax.with_sharding_constraint(split, layout)


def decode_mlp_columns(layout, d_ff: int) -> NamedSharding | None:
  """The MLP's hidden-activation sharding the decode step keeps under `layout` (mlp_split)."""
  return layout.columns(d_ff) if isinstance(layout, MLPSplit) else None
