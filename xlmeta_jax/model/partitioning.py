"""Device mesh, logical-axis rules and shardings (t5x conventions).

The mesh has three named axes:

* ``data``   — pure data parallelism (parameters replicated);
* ``fsdp``   — data parallelism with parameters and optimizer state sharded
  along their ``embed`` dimension (ZeRO-3 style);
* ``tensor`` — Megatron-style model parallelism over ``heads``, ``mlp`` and
  ``vocab``.

Logical names are mapped to mesh axes by :data:`LOGICAL_AXIS_RULES`. Flax assigns
each mesh axis at most once per array, in rule order, so activations
``(batch, length, embed)`` shard ``batch`` over ``(data, fsdp)`` and leave
``embed`` whole, while parameters ``(vocab, embed)`` shard ``embed`` over
``fsdp`` — the same rule t5x's ``standard_logical_axis_rules`` relies on.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xlmeta_jax import errors

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("layers", None),
    ("abspos", None),
)


class MeshShapeError(errors.UserError, ValueError):
    """The requested mesh does not fit the available devices."""


def mesh_shape_for(
    data: int = -1, fsdp: int = 1, tensor: int = 1, num_devices: int | None = None
) -> tuple[int, int, int]:
    """Resolves a (data, fsdp, tensor) shape; one entry may be -1 (fill the rest).

    Args:
      data: size of the pure data-parallel axis, or -1.
      fsdp: size of the fully-sharded data-parallel axis, or -1.
      tensor: size of the tensor-parallel axis, or -1.
      num_devices: devices to cover (default: ``jax.device_count()``).

    Returns:
      The resolved ``(data, fsdp, tensor)`` sizes.

    Raises:
      MeshShapeError: see :func:`resolve_shape`.
    """
    return resolve_shape((data, fsdp, tensor), MESH_AXES, num_devices)


def resolve_shape(shape: Sequence[int], axes: Sequence[str],
                  num_devices: int | None = None) -> tuple[int, ...]:
    """Resolves a mesh shape over named ``axes``; one entry may be -1 (fill the rest).

    Also the ``(data, model)`` shape of t5x's mesh (``t5x_model.MeshPartitioner``).

    Raises:
      MeshShapeError: for a shape of another length, a non-integer or non-positive
        size, more than one -1, or a product that does not equal the number of devices.
    """
    n = jax.device_count() if num_devices is None else num_devices
    shape = list(shape)
    names = f"({', '.join(axes)})"
    if len(shape) != len(axes):
        raise MeshShapeError(f"mesh shape {names}={tuple(shape)}: expected {len(axes)} sizes")
    for axis, size in zip(axes, shape):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise MeshShapeError(
                f"mesh shape {names}={tuple(shape)}: {axis} size must be an integer, "
                f"got {size!r}"
            )
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise MeshShapeError(f"mesh shape {names}={tuple(shape)}: at most one -1")
    for axis, size in zip(axes, shape):
        if size == 0 or size < -1:
            raise MeshShapeError(
                f"mesh shape {names}={tuple(shape)}: {axis} size must be >= 1 "
                f"(or -1 to fill), got {size}"
            )
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if n % known:
            raise MeshShapeError(
                f"mesh shape {names}={tuple(shape)}: {n} devices are not divisible by {known}"
            )
        shape[shape.index(-1)] = n // known
    if math.prod(shape) != n:
        raise MeshShapeError(
            f"mesh shape {names}={tuple(shape)} has {math.prod(shape)} devices "
            f"but {n} are available ({jax.default_backend()})"
        )
    return tuple(shape)


def create_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """Builds the ``(data, fsdp, tensor)`` mesh over all (or the given) devices.

    Args:
      data: size of the ``data`` axis (-1: whatever the other two leave).
      fsdp: size of the ``fsdp`` axis.
      tensor: size of the ``tensor`` axis.
      devices: devices to arrange (default: all of ``jax.devices()``).

    Raises:
      MeshShapeError: when the sizes do not fit the devices (see :func:`mesh_shape_for`).
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape_for(data, fsdp, tensor, num_devices=len(devices))
    try:

        dev_array = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # noqa: BLE001 - topology-unaware fallback (e.g. fake CPU devices)
        dev_array = np.asarray(devices).reshape(shape)
    return Mesh(dev_array, MESH_AXES)


def check_mesh_axes(mesh: Mesh) -> None:
    """Raises MeshShapeError unless ``mesh`` has exactly the axes of :data:`MESH_AXES`."""
    if tuple(mesh.axis_names) != MESH_AXES:
        raise MeshShapeError(
            f"mesh axes {tuple(mesh.axis_names)} are not {MESH_AXES}; build the mesh with "
            "partitioning.create_mesh"
        )


def logical_to_mesh_spec(logical: PartitionSpec, rules=LOGICAL_AXIS_RULES) -> PartitionSpec:
    """Maps one PartitionSpec of logical names to mesh axes."""
    return nn.logical_to_mesh_axes(tuple(logical), rules)


def logical_to_mesh_specs(logical_tree, rules=LOGICAL_AXIS_RULES):
    """Maps a pytree of logical PartitionSpecs to mesh PartitionSpecs."""
    return jax.tree.map(
        lambda s: logical_to_mesh_spec(s, rules),
        logical_tree,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def check_divisible(abstract_tree, spec_tree, mesh: Mesh, what: str = "parameter") -> None:
    """Raises a clear error when an array dimension is not divisible by its mesh axes.

    Args:
      abstract_tree: arrays or ShapeDtypeStructs.
      spec_tree: mesh PartitionSpecs, same structure as ``abstract_tree``.
      mesh: the mesh the specs refer to.
      what: what the arrays are, for the message.

    Raises:
      MeshShapeError: naming every array (by its ``/``-joined path) that cannot be split.
    """
    flat_a, _ = jax.tree_util.tree_flatten_with_path(abstract_tree)
    flat_s = jax.tree.leaves(spec_tree, is_leaf=lambda x: isinstance(x, PartitionSpec))
    problems = []
    for (path, leaf), spec in zip(flat_a, flat_s):
        for dim, axes in zip(leaf.shape, tuple(spec)):
            if axes is None:
                continue
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            size = math.prod(mesh.shape[a] for a in axes)
            if dim % size:
                name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
                problems.append(
                    f"{what} {name} of shape {leaf.shape} cannot be sharded as {spec}: "
                    f"dimension {dim} is not divisible by {size}"
                )
                break
    if problems:
        raise MeshShapeError(f"on mesh {dict(mesh.shape)}: " + "; ".join(problems))


def named_shardings(mesh: Mesh, spec_tree):
    """NamedShardings on ``mesh`` for a pytree of mesh PartitionSpecs."""
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        spec_tree,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def batch_spec(ndim: int = 2) -> PartitionSpec:
    """Mesh spec of a batch array: leading dimension over (data, fsdp)."""
    return logical_to_mesh_spec(PartitionSpec("batch", *([None] * (ndim - 1))))


def batch_shards(mesh: Mesh) -> int:
    """Number of ways the batch dimension is split on ``mesh`` (data x fsdp)."""
    return math.prod(mesh.shape[a] for a in ("data", "fsdp"))


def mesh_context(mesh: Mesh):
    """Context binding ``mesh`` for Flax's logical activation constraints.

    Flax applies ``nn.with_logical_constraint`` only under an abstract mesh (the
    legacy ``with mesh:`` context leaves every constraint a silent no-op).
    ``jax.sharding.use_abstract_mesh`` may be entered while tracing, so this works
    inside ``jax.jit`` (``jax.set_mesh`` may not).
    """
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def axis_rules_context(rules=LOGICAL_AXIS_RULES):
    """Context in which ``nn.with_logical_constraint`` uses our rules."""
    return nn.logical_axis_rules(rules)


def with_rules(fn, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
    """``fn`` traced under ``rules`` and ``mesh``: the network's logical activation
    constraints bind to the mesh (wrap a step before ``jax.jit``)."""
    @functools.wraps(fn)
    def wrapped(*a, **k):
        with axis_rules_context(rules), mesh_context(mesh):
            return fn(*a, **k)
    return wrapped
