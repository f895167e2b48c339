"""Checksums of checkpointed arrays: a damaged byte in an array file is named, not trained on.

Orbax's array files (TensorStore, zstd-compressed chunks) carry no checksum: a flipped
byte inside a compressed chunk usually still decompresses, into other numbers (NaN
weights exported, a fine-tune that diverges). So every save records a checksum per
array of the train state in the checkpoint's JSON metadata item, and every read of a
checkpoint compares the values it restored against them.

Why a checksum of the *values*, computed on device, rather than a CRC of the bytes of
each shard on the host: on a multi-host mesh no process holds a whole parameter, and a
per-shard checksum ties the record to the mesh it was written from, while checkpoints
are read back on other meshes (fine-tuning and export on one device). A reduction over
the global array runs under ``jit`` like any other sharded computation, every process
gets the same two words without gathering anything, and the result does not depend on
how the array is sharded (integer addition modulo 2**32 is associative and commutative).

The checksum of an array of n elements, viewed as unsigned words ``w[i]`` (its bit
pattern, widened to 32 bits), is the pair::

    a = sum((2*i + 1) * w[i])           mod 2**32
    b = sum(mix(w[i] + i * 0x9E3779B9)) mod 2**32   (mix: a bijective 32-bit finaliser)

A change of one element (any flipped bit or byte of it) changes ``a`` for certain: the
difference of the element is non-zero and below 2**32, and an odd factor is invertible
modulo 2**32. ``b`` adds 32 more bits, non-linear in the values, against errors that
change several elements.

Checkpoints of ``python -m t5x.train`` have no metadata item of ours: their record is a
JSON file next to them, ``<run>/xlmeta_checksums/checkpoint_<step>.json``
(:func:`t5x_record_path`), written before t5x starts writing the step (see
``xlmeta_jax.interop.t5x.checksums``).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from xlmeta_jax import files
from xlmeta_jax.errors import CheckpointError

# The algorithm's name, stored with the checksums: a later change of the algorithm
# must not make every existing checkpoint look damaged.
ALGORITHM = "wsum32-mix32-v1"
# Folder of a t5x run directory holding the records of its checkpoints.
T5X_RECORDS = "xlmeta_checksums"


def _words(x: jax.Array) -> jax.Array:
    """The bit pattern of ``x`` as a flat uint32 vector (one word per element of <= 4 bytes)."""
    x = jnp.ravel(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = x.dtype.itemsize
    if size == 8:
        return jnp.ravel(jax.lax.bitcast_convert_type(x, jnp.uint32))
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _mix(h: jax.Array) -> jax.Array:
    # murmur3's 32-bit finaliser: a bijection, so distinct inputs stay distinct.
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _pair(x: jax.Array) -> jax.Array:
    w = _words(x)
    i = jnp.arange(w.size, dtype=jnp.uint32)
    a = jnp.sum(w * (2 * i + 1), dtype=jnp.uint32)
    b = jnp.sum(_mix(w + i * jnp.uint32(0x9E3779B9)), dtype=jnp.uint32)
    return jnp.stack([a, b])


@jax.jit
def _pairs(leaves: list) -> jax.Array:
    # One compiled program for all arrays of a tree: one dispatch, one transfer.
    return jnp.stack([_pair(x) for x in leaves])


def _part(key) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def name_of(entry: str, path) -> str:
    """An array's name as Orbax names its files: ``params.embed.embedding``, ``opt_state.0.mu.x``.

    The same whatever container types a restore builds (a NamedTuple's field or the dict
    key Orbax reads it back as), so a checkpoint restored onto its metadata tree, as
    fine-tuning and export do, is checked like one restored onto the train state.
    """
    return ".".join([entry, *(_part(k) for k in path)])


def _flat(tree: dict) -> list[tuple[str, jax.Array]]:
    """``(name, array)`` of every array leaf of ``{entry: pytree}``."""
    out = []
    for entry in sorted(tree):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree[entry]):
            if hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
                out.append((name_of(entry, path), leaf))
    return out


def _entries(state) -> dict:
    """A train state (a dataclass) or a dict of its entries as ``{entry: pytree}``."""
    if dataclasses.is_dataclass(state):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return dict(state)


def of_entries(state) -> dict[str, str]:
    """Checksums of every array of a train state, or of ``{entry: pytree}`` (some entries).

    Returns:
      ``{array name: 16 hex digits}``; the same on every process of a multi-host run.
    """
    named = _flat(_entries(state))
    if not named:
        return {}
    pairs = np.asarray(jax.device_get(_pairs([x for _, x in named])))
    return {name: f"{int(a):08x}{int(b):08x}" for (name, _), (a, b) in zip(named, pairs)}


def record(state) -> dict:
    """What a checkpoint's metadata stores: the algorithm and each array's checksum."""
    return {"algorithm": ALGORITHM, "arrays": of_entries(state)}


def damaged(stored: dict | None, restored) -> list[str]:
    """Names of the arrays of ``restored`` that differ from the ``stored`` record or lack one.

    Args:
      stored: :func:`record`'s output as read back from the checkpoint; None (or another
        algorithm) for a checkpoint written before checksums were recorded: nothing to check.
      restored: ``{entry: pytree}`` as read; only the arrays read are checked (a partial
        restore of ``params`` checks the parameters).
    """
    if not stored or stored.get("algorithm") != ALGORITHM:
        return []
    expected = stored.get("arrays") or {}
    actual = of_entries(restored)
    # An array the record does not name (an entry renamed or dropped) has lost its check:
    # the record is damaged, as the array would be.
    return [name for name, value in actual.items() if expected.get(name) != value]


def verify(step_dir, stored: dict | None, restored) -> None:
    """Raises naming the first array of ``restored`` that differs from its ``stored`` checksum.

    Raises:
      CheckpointError: one line naming the checkpoint and the damaged array.
    """
    bad = damaged(stored, restored)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        recorded = (stored.get("arrays") or {})
        what = ("differs from the checksum recorded when it was saved" if bad[0] in recorded
                else "has no checksum in the record saved with it")
        raise CheckpointError(f"checkpoint {step_dir} is damaged: array {bad[0]}{more} {what}")


def t5x_record_path(step_dir) -> epath.Path:
    """Where the record of t5x's ``<run>/checkpoint_<step>`` lives: ``<run>/xlmeta_checksums/``.

    Beside the step rather than inside it: t5x's Orbax manager writes the step into a
    temporary folder and renames it when a background save finishes, so a file written
    before the save starts (the only moment the values are at hand) cannot be inside.
    """
    step_dir = epath.Path(step_dir)
    return step_dir.parent / T5X_RECORDS / f"{step_dir.name}.json"


def write_t5x_record(step_dir, stored: dict) -> None:
    """Writes :func:`record`'s output for t5x's checkpoint ``step_dir``, whole."""
    path = t5x_record_path(step_dir)
    text = json.dumps(stored, indent=1, sort_keys=True)
    if "://" in os.fspath(path):  # an object store writes an object whole
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    os.makedirs(path.parent, exist_ok=True)
    files.write_atomic(path, text)


def read_t5x_record(step_dir) -> dict | None:
    """The record of t5x's checkpoint ``step_dir``; None when it has none (written before).

    Raises:
      CheckpointError: the record exists but is not readable JSON.
    """
    path = t5x_record_path(step_dir)
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError, OSError) as e:
        raise CheckpointError(
            f"checkpoint checksums {path} are corrupted ({type(e).__name__}); the "
            f"checkpoint {step_dir} cannot be checked"
        ) from None
    if not isinstance(stored, dict):
        raise CheckpointError(f"checkpoint checksums {path} are corrupted (not a JSON object)")
    return stored
