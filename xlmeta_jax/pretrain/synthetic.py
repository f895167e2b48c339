"""Synthetic MLM batches: one random batch, and a deterministic stream of them.

Used by smoke runs, the multi-process test and benchmarks on machines without
TensorFlow. Batches follow :mod:`xlmeta_jax.model.mlm`: the masking rate sets the
selected share and the prediction slots. Batch ``i`` of the stream is a pure
function of ``(seed, i)``, and each process materialises only its rows of the
global batch, so the stream is identical whatever the number of processes.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from xlmeta_jax.model import mlm, partitioning


def mlm_batch(
    rng: np.random.Generator,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    masking: mlm.Masking = mlm.DEFAULT_MASKING,
    mask_id: int = 4,
    num_special: int = 5,
    pad_id: int = 0,
    bos_id: int = 3,
) -> dict[str, np.ndarray]:
    """A random, well-formed MLM batch with every feature of ``mlm.FEATURES``.

    Tokens are drawn from the non-special range; each row starts with ``bos_id``;
    ``round(masking.rate * (length - 1))`` positions (never position 0) are
    selected and replaced by ``mask_id``, filled left-to-right into the
    ``mlm.max_predictions(length, masking.rate)`` slots (unused slots weighted 0).
    """
    slots = mlm.max_predictions(length, masking.rate)
    targets = rng.integers(num_special, vocab_size, size=(batch_size, length), dtype=np.int32)
    targets[:, 0] = bos_id
    inputs = targets.copy()
    positions = np.zeros((batch_size, slots), np.int32)
    mlm_targets = np.full((batch_size, slots), pad_id, np.int32)
    mlm_weights = np.zeros((batch_size, slots), np.float32)
    weights = np.zeros((batch_size, length), np.float32)
    n_select = min(slots, int(round(masking.rate * (length - 1))))
    for b in range(batch_size):
        sel = np.sort(rng.choice(np.arange(1, length), size=n_select, replace=False))
        positions[b, :n_select] = sel
        mlm_targets[b, :n_select] = targets[b, sel]
        mlm_weights[b, :n_select] = 1.0
        weights[b, sel] = 1.0
        inputs[b, sel] = mask_id
    batch = {
        "inputs": inputs,
        "targets": targets,
        "weights": weights,
        "mlm_positions": positions,
        "mlm_targets": mlm_targets,
        "mlm_weights": mlm_weights,
    }
    return {k: batch[k] for k in mlm.FEATURES}


def packed_features(batch_size: int, length: int) -> dict[str, np.ndarray]:
    """``mlm.PACKED_FEATURES`` of rows that each hold one document (what packed rows hold
    where no document ends), for synthetic streams of a run with packed rows."""
    return {"segment_ids": np.ones((batch_size, length), np.int32),
            "positions": np.broadcast_to(np.arange(length, dtype=np.int32),
                                         (batch_size, length)).copy()}


class SyntheticMLMIterator:
    """Infinite iterator of global MLM batches (:func:`mlm_batch`) with save/restore."""

    def __init__(
        self,
        *,
        sequence_length: int,
        global_batch_size: int,
        mesh: Mesh,
        seed: int,
        vocab_size: int,
        masking: mlm.Masking = mlm.DEFAULT_MASKING,
        features: tuple[str, ...] = mlm.STEP_FEATURES,
    ):
        """Args:
        sequence_length: L.
        global_batch_size: rows per batch over all processes.
        mesh: batches are sharded over its ``('data', 'fsdp')`` axes.
        seed: the stream's seed.
        vocab_size: tokens are drawn below it.
        masking: the masking rate (and so the prediction slots).
        features: what each batch holds (default: what the train step reads).
        """
        if global_batch_size % jax.process_count():
            raise ValueError(
                f"global_batch_size={global_batch_size} is not divisible by the "
                f"{jax.process_count()} processes"
            )
        self._length = sequence_length
        self._batch = global_batch_size
        self._seed = seed
        self._vocab = vocab_size
        self._masking = masking
        self._features = tuple(features)
        self._index = 0
        self._sharding = NamedSharding(mesh, partitioning.batch_spec(2))

    def __iter__(self):
        return self

    def _global_numpy(self, index: int):
        rng = np.random.default_rng([self._seed, index])
        batch = mlm_batch(rng, self._batch, self._length, self._vocab, masking=self._masking)
        if set(mlm.PACKED_FEATURES) & set(self._features):
            batch.update(packed_features(self._batch, self._length))
        return {k: batch[k] for k in self._features}

    def __next__(self):
        batch = self._global_numpy(self._index)
        self._index += 1
        n, i = jax.process_count(), jax.process_index()
        rows = self._batch // n
        out = {}
        for k, v in batch.items():
            local = v[i * rows : (i + 1) * rows]
            out[k] = jax.make_array_from_process_local_data(self._sharding, local, v.shape)
        return out

    @property
    def element_spec(self):
        return {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype)
            for k, v in self._global_numpy(0).items()
        }

    def save(self, filename: str) -> None:
        with open(filename + ".json", "w") as f:
            json.dump({"index": self._index, "seed": self._seed}, f)

    def restore(self, filename: str) -> None:
        with open(filename + ".json") as f:
            state = json.load(f)
        if state["seed"] != self._seed:
            raise ValueError(
                f"{filename}.json was written with seed {state['seed']}, not {self._seed}"
            )
        self._index = int(state["index"])
