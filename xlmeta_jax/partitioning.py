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

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

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


class MeshShapeError(ValueError):
    """The requested mesh does not fit the available devices."""


def mesh_shape_for(
    data: int = -1, fsdp: int = 1, tensor: int = 1, num_devices: int | None = None
) -> tuple[int, int, int]:
    """Resolves a (data, fsdp, tensor) shape; one entry may be -1 (fill the rest).

    Raises:
      MeshShapeError: if the product does not equal the number of devices.
    """
    n = jax.device_count() if num_devices is None else num_devices
    shape = [data, fsdp, tensor]
    if shape.count(-1) > 1:
        raise MeshShapeError(f"mesh shape (data, fsdp, tensor)={tuple(shape)}: at most one -1")
    if any(s == 0 or s < -1 for s in shape):
        raise MeshShapeError(f"mesh shape (data, fsdp, tensor)={tuple(shape)}: sizes must be >= 1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if n % known:
            raise MeshShapeError(
                f"mesh shape (data, fsdp, tensor)={tuple(shape)}: {n} devices are not "
                f"divisible by {known}"
            )
        shape[shape.index(-1)] = n // known
    if math.prod(shape) != n:
        raise MeshShapeError(
            f"mesh shape (data, fsdp, tensor)={tuple(shape)} has {math.prod(shape)} devices "
            f"but {n} are available ({jax.default_backend()})"
        )
    return tuple(shape)


def create_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """Builds the ``(data, fsdp, tensor)`` mesh over all (or the given) devices."""
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape_for(data, fsdp, tensor, num_devices=len(devices))
    try:
        from jax.experimental import mesh_utils

        dev_array = mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # noqa: BLE001 - topology-unaware fallback (e.g. fake CPU devices)
        dev_array = np.asarray(devices).reshape(shape)
    return Mesh(dev_array, MESH_AXES)


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
    """Raises a clear error when an array dimension is not divisible by its mesh axes."""
    flat_a, _ = jax.tree_util.tree_flatten_with_path(abstract_tree)
    flat_s = jax.tree.leaves(spec_tree, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (path, leaf), spec in zip(flat_a, flat_s):
        for dim, axes in zip(leaf.shape, tuple(spec)):
            if axes is None:
                continue
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            size = math.prod(mesh.shape[a] for a in axes)
            if dim % size:
                name = jax.tree_util.keystr(path)
                raise MeshShapeError(
                    f"{what} {name} of shape {leaf.shape} cannot be sharded as {spec} on mesh "
                    f"{dict(mesh.shape)}: dimension {dim} is not divisible by {size}"
                )


def named_shardings(mesh: Mesh, spec_tree):
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        spec_tree,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def batch_spec(ndim: int = 2) -> PartitionSpec:
    """Mesh spec of a batch array: leading dimension over (data, fsdp)."""
    return logical_to_mesh_spec(PartitionSpec("batch", *([None] * (ndim - 1))))


def axis_rules_context(rules=LOGICAL_AXIS_RULES):
    """Context in which ``nn.with_logical_constraint`` uses our rules."""
    return nn.logical_axis_rules(rules)
