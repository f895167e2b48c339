"""A deterministic synthetic MLM batch stream with the data iterator's interface.

Used by smoke runs, the multi-process test and benchmarks on machines without
TensorFlow. Batch ``i`` of the stream is a pure function of ``(seed, i)``, and each
process materialises only its rows of the global batch, so the stream is identical
whatever the number of processes.
"""

from __future__ import annotations

import json

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from xlmeta_jax import losses, partitioning


class SyntheticMLMIterator:
    """Infinite iterator of global MLM batches (``losses.synthetic_mlm_batch``)."""

    def __init__(
        self,
        *,
        sequence_length: int,
        global_batch_size: int,
        mesh: Mesh,
        seed: int,
        vocab_size: int,
    ):
        if global_batch_size % jax.process_count():
            raise ValueError(
                f"global_batch_size={global_batch_size} is not divisible by the "
                f"{jax.process_count()} processes"
            )
        self._length = sequence_length
        self._batch = global_batch_size
        self._seed = seed
        self._vocab = vocab_size
        self._index = 0
        self._sharding = NamedSharding(mesh, partitioning.batch_spec(2))

    def __iter__(self):
        return self

    def _global_numpy(self, index: int):
        rng = np.random.default_rng([self._seed, index])
        return losses.synthetic_mlm_batch(rng, self._batch, self._length, self._vocab)

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
