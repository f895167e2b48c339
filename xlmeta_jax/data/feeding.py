"""Feeds the mesh: a phase's global ``jax.Array`` batches, one call (:func:`phase_batches`).

A phase reads a registered seqio task or mixture, or a synthetic stream (``SYNTHETIC``).

**seqio.** Each process reads only its share of the data (seqio ``ShardInfo(index=
process_index, num_shards=process_count)``: by file where there are enough
files, else by document), batches ``global_batch_size / process_count``
examples, and the batches are assembled into global arrays sharded over the
mesh's batch axes (``partitioning.batch_spec``: ``('data', 'fsdp')``). Each
process draws its own mixture sampling, masks and shuffling (seqio's seed is
``seeds.host_seed(seed, process_index)``), so a global batch holds independent
draws from every host rather than the same language sequence H times.
The iterator's position is saved and restored with tf.data's own iterator
checkpointing (``tf.train.Checkpoint``, as ``clu.data.TfDatasetIterator``):
restoring is O(1) and the batches after a restore equal those an uninterrupted
run would have produced.

**Synthetic.** Random, well-formed MLM batches for smoke runs, the multi-process tests
and benchmarks on machines without TensorFlow. Batch ``i`` is a pure function of
``(seed, i)`` and each process materialises only its rows, so the stream is identical
whatever the number of processes.

**The iterator as a checkpoint item.** Each process saves its iterator's state under
``<step>/data/process_<i>-of-<n>``, so a restore on the same process count continues
every host's stream where it stopped. On another count the streams cannot continue: the
trainer refuses, or with ``train.new_process_count='reseed'`` restores the rest and
restarts the streams (:func:`stored_process_count` tells which).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh, NamedSharding

from xlmeta_jax.data import seeds
from xlmeta_jax.errors import CheckpointError
from xlmeta_jax.model import mlm, partitioning

# The task name of a phase that reads the synthetic stream.
SYNTHETIC = "synthetic"


class MLMIterator:
    """Iterator of global MLM batches (dict of ``jax.Array``) with save/restore.

    Create it with :func:`make_mlm_iterator`.
    """

    def __init__(self, dataset, mesh: Mesh, global_batch_size: int, *,
                 use_cached: bool = False):
        """Args:
        dataset: a tf.data.Dataset of this process's batches (dict of tensors).
        mesh: the device mesh; batches are sharded with ``batch_spec``.
        global_batch_size: rows of a global batch (over all processes).
        use_cached: whether it reads seqio's offline token cache; a saved state
          restores only into an iterator that reads the same (tf.data's graph differs).
        """
        self.use_cached = bool(use_cached)
        from clu.data import dataset_iterator  # noqa: PLC0415 - clu imports TensorFlow; only where it is used

        self._iterator = dataset_iterator.TfDatasetIterator(dataset, checkpoint=True)
        self._mesh = mesh
        self._global_batch_size = int(global_batch_size)
        self._spec = {}
        for name, spec in self._iterator.element_spec.items():
            shape = (self._global_batch_size, *spec.shape[1:])
            sharding = NamedSharding(mesh, partitioning.batch_spec(len(shape)))
            self._spec[name] = jax.ShapeDtypeStruct(shape, spec.dtype, sharding=sharding)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, jax.Array]:
        local = next(self._iterator)
        return {
            name: jax.make_array_from_process_local_data(
                spec.sharding, np.asarray(local[name]), spec.shape
            )
            for name, spec in self._spec.items()
        }

    def save(self, filename: str) -> None:
        """Writes this process's iterator state (files ``filename.index``/``.data-*``)."""
        parent = os.path.dirname(filename)
        if parent and "://" not in parent:
            os.makedirs(parent, exist_ok=True)
        self._iterator.save(filename)

    def restore(self, filename: str) -> None:
        """Restores a state written by :meth:`save`; the next batch is the one after it."""
        import tensorflow as tf  # noqa: PLC0415 - TensorFlow only where tf.data runs

        if not tf.io.gfile.exists(f"{filename}.index"):
            raise FileNotFoundError(f"no data iterator state at {filename} (.index missing)")
        self._iterator.restore(filename)

    @property
    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Global shape, dtype and sharding of each feature."""
        return dict(self._spec)


def _keep_tensorflow_off_accelerators() -> None:
    """The input pipeline runs on the host CPU; the accelerators belong to JAX (as t5x)."""
    import tensorflow as tf  # noqa: PLC0415 - TensorFlow only where tf.data runs

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TF already initialised its devices; nothing to change then
        pass


def _check_batch(global_batch_size: int, mesh: Mesh) -> int:
    count = jax.process_count()
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    if global_batch_size % count:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by the {count} processes"
        )
    batch_axes = [a for a in ("data", "fsdp") if a in mesh.shape]
    shards = int(np.prod([mesh.shape[a] for a in batch_axes])) if batch_axes else 1
    if global_batch_size % shards:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by the batch shards of "
            f"mesh {dict(mesh.shape)} (data x fsdp = {shards})"
        )
    return global_batch_size // count


def host_dataset(
    task_or_mixture: str,
    *,
    sequence_length: int,
    seed: int,
    shard=None,
    split: str = "train",
    shuffle: bool = True,
    use_cached: bool = False,
    cache_dir: str | None = None,
    num_epochs: int | None = None,
    passthrough_features=(),
):
    """One host's stream of masked blocks (a tf.data.Dataset of examples, not batched).

    Args:
      task_or_mixture: a registered Task/Mixture name (``tasks.names``).
      sequence_length: L, the block length.
      seed: the stream's seed; the host's own is ``seeds.host_seed(seed, shard.index)``.
      shard: this host's ``seqio.ShardInfo`` (default: this process of
        ``jax.process_count()``).
      split, shuffle, use_cached, cache_dir, num_epochs: as :func:`make_mlm_iterator`.
      passthrough_features: features seqio would drop that the stream keeps (e.g.
        ``["language"]`` of a mixture's blocks, to inspect what a host draws).
    """
    import seqio  # noqa: PLC0415 - seqio (TensorFlow) only where data is read

    if cache_dir:
        seqio.add_global_cache_dirs([cache_dir])
    if shard is None:
        shard = seqio.ShardInfo(index=jax.process_index(), num_shards=jax.process_count())
    provider = seqio.get_mixture_or_task(task_or_mixture)
    if use_cached:
        from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio and TensorFlow, as above

        tasks.check_cache(task_or_mixture, split)
    kwargs = dict(
        sequence_length={"inputs": int(sequence_length), "targets": int(sequence_length)},
        split=split,
        use_cached=use_cached,
        shuffle=shuffle,
        # Mixing, masking and shuffling per host; the shard alone decides what it reads.
        seed=seeds.host_seed(int(seed), shard.index),
        shard_info=shard,
        num_epochs=num_epochs,
        try_in_mem_cache=False,
    )
    if passthrough_features:
        if not isinstance(provider, seqio.Mixture):
            raise ValueError(f"passthrough_features need a mixture; {task_or_mixture} is a task")
        kwargs["passthrough_features"] = list(passthrough_features)
    return provider.get_dataset(**kwargs)


def make_mlm_iterator(
    task_or_mixture: str,
    *,
    sequence_length: int,
    global_batch_size: int,
    mesh: Mesh,
    seed: int,
    split: str = "train",
    shuffle: bool = True,
    use_cached: bool = False,
    cache_dir: str | None = None,
    num_epochs: int | None = None,
    prefetch_batches: int = 2,
    features: tuple[str, ...] = mlm.STEP_FEATURES,
) -> MLMIterator:
    """The MLM batch stream of a seqio task or mixture, as global arrays.

    Args:
      task_or_mixture: a registered Task/Mixture name (``tasks.names``, registered
        by ``tasks.register``), e.g. ``'xlmeta_english_text'`` (phase 1) or
        ``'xlmeta_cc100'`` (phase 2).
      sequence_length: L, the block length.
      global_batch_size: rows per batch over all processes.
      mesh: batches are sharded over its ``('data', 'fsdp')`` axes.
      seed: seeds file order, shuffling, mixing and masking; the same seed gives
        the same batches. Each process folds its index in (:func:`host_dataset`).
      split: dataset split.
      shuffle: shuffle files and blocks (training; the blocks held for shuffling
        are a setting of the tasks, ``tasks.register(shuffle_buffer_size=...)``).
      use_cached: read tokens from seqio's offline cache
        (:mod:`xlmeta_jax.tools.caching`) instead of tokenizing on the fly.
      cache_dir: a cache root to add to seqio's cache folders (else seqio's
        global cache folders are searched).
      num_epochs: passes over the data; None repeats forever (training).
      prefetch_batches: host batches tf.data prepares ahead.
      features: which features to feed (default: what the train step reads).

    Returns:
      An :class:`MLMIterator`.

    Raises:
      ValueError: for a batch size that does not divide over processes or the
        mesh's batch shards (a name that is not registered: seqio's ValueError; the
        trainer names the missing setting first, ``tasks.check_registered``).
    """
    import tensorflow as tf  # noqa: PLC0415 - TensorFlow only where tf.data runs

    host_batch = _check_batch(int(global_batch_size), mesh)
    _keep_tensorflow_off_accelerators()
    ds = host_dataset(task_or_mixture, sequence_length=sequence_length, seed=seed, split=split,
                      shuffle=shuffle, use_cached=use_cached, cache_dir=cache_dir,
                      num_epochs=num_epochs)
    missing = [f for f in features if f not in ds.element_spec]
    if missing:
        raise ValueError(f"{task_or_mixture} does not provide features {missing}")
    ds = ds.map(lambda ex: {f: ex[f] for f in features}, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(host_batch, drop_remainder=True).prefetch(int(prefetch_batches))
    options = tf.data.Options()
    options.deterministic = True
    ds = ds.with_options(options)
    return MLMIterator(ds, mesh, int(global_batch_size), use_cached=use_cached)


def batch_to_numpy(batch: Mapping[str, jax.Array]) -> dict[str, np.ndarray]:
    """Gathers a (fully addressable) global batch to host numpy arrays (tests, tools)."""
    return {k: np.asarray(jax.device_get(v)) for k, v in batch.items()}


# ---------------------------------------------------------------------------------------
# The synthetic stream
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# The iterator as an Orbax checkpoint item: one file set per process
# ---------------------------------------------------------------------------------------


def stored_process_count(step_dir) -> int | None:
    """How many processes wrote a checkpoint's input-iterator states (None: no states)."""
    found = sorted(epath.Path(step_dir).glob("data/process_0-of-*"))
    for path in found:
        count = path.name.split("-of-")[1].split(".")[0]
        if count.isdigit():
            return int(count)
    return None


def _process_file(directory: epath.Path) -> str:
    return os.fspath(directory / f"process_{jax.process_index()}-of-{jax.process_count()}")


class DataIteratorHandler(ocp.CheckpointHandler):
    """Saves/restores any iterator with ``save(filename)`` / ``restore(filename)``.

    Runs synchronously inside the (possibly async) manager's save: the iterator
    keeps moving after ``save`` returns, so its state must be captured now.
    """

    def save(self, directory: epath.Path, args: DataIteratorSave):
        directory = epath.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        args.iterator.save(_process_file(directory))

    def restore(self, directory: epath.Path, args: DataIteratorRestore):
        directory = epath.Path(directory)
        name = _process_file(directory)
        if not list(directory.glob(os.path.basename(name) + "*")):
            raise CheckpointError(
                f"no input-iterator state {name}*: the checkpoint was written by a run with "
                "another process count, or is incomplete"
            )
        args.iterator.restore(name)
        return args.iterator

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    iterator: Any


# ---------------------------------------------------------------------------------------
# A phase's batches: the one call of the trainer
# ---------------------------------------------------------------------------------------


def phase_batches(source: str, *, sequence_length: int, global_batch_size: int, mesh: Mesh,
                  seed: int, masking: mlm.Masking, packed: bool, vocab_size: int,
                  use_cached: bool | None = None,
                  feeder: Callable[..., Any] = make_mlm_iterator):
    """A phase's iterator of global batches (with ``save``/``restore``).

    Args:
      source: ``SYNTHETIC``, or the registered seqio task or mixture the phase reads
        (``Phase.registered_source``).
      sequence_length: L.
      global_batch_size: rows per batch over all processes.
      mesh: batches are sharded over its ``('data', 'fsdp')`` axes.
      seed: the phase's stream seed (each process folds its index in).
      masking: the phase's masking (the synthetic stream's prediction slots; a seqio
        source masks as its registration says).
      packed: rows packed from documents (their segment ids and positions are fed).
      vocab_size: synthetic tokens are drawn below it.
      use_cached: read seqio's offline token cache (None: the feeder's default).
      feeder: builds a seqio source's iterator (:func:`make_mlm_iterator`, or the
        command line's binding of its options).
    """
    features = mlm.step_features(packed)
    if source == SYNTHETIC:
        return SyntheticMLMIterator(sequence_length=sequence_length,
                                    global_batch_size=global_batch_size, mesh=mesh, seed=seed,
                                    vocab_size=vocab_size, masking=masking, features=features)
    cached = {} if use_cached is None else {"use_cached": use_cached}
    return feeder(source, sequence_length=sequence_length, global_batch_size=global_batch_size,
                  mesh=mesh, seed=seed, features=features, **cached)
