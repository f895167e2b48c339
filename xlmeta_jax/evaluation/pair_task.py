"""The contrastive run's rows as a seqio task, and their offline token cache.

``xlmeta_embedding_pairs`` is a ``seqio.Task`` like the pretraining ones. Its source reads
the run's training files and parallel text (:class:`RowSource`, through
:mod:`~xlmeta_jax.evaluation.pairs`: every row, in the order the run reads them, with its
``index``; :class:`RowsDataSource`, in shards of consecutive rows); its preprocessors
tokenize every column in batches with the encoder's own tokenizer, then a
``seqio.CacheDatasetPlaceholder``. Features: ``index`` (int32 scalar), ``query``,
``positive`` and ``negative_0`` … ``negative_{k-1}``: ids without special tokens and
untruncated, so one cache serves any ``query_length``/``document_length`` (the run adds
``cls``/``sep`` and cuts, as it does on the fly).

The cache is seqio's own layout, written by seqio's Beam transforms as
``seqio/scripts/cache_tasks_main.py`` writes it (``PreprocessTask``, ``GetInfo``,
``GetStats``, ``WriteJson``; ``COMPLETED`` last; ``--overwrite`` builds beside the old
cache and swaps it in whole), but for the files: row ``i`` goes to file
``i mod n`` in index order, written with TensorFlow's writer (Beam's ``WriteToTFRecord``
needs a CRC32C package that the beam extra does not install, and reshuffles), so two runs
write the same bytes.
Its ``info.train.json`` records the rows (count and SHA-256 of their texts) and the
tokenizer (:meth:`record`); the run refuses a cache of other rows or another tokenizer in
one line. Rows come back in any order and are put in place by ``index``.

Command (the run's own gin files and bindings; nothing is written under MODEL_DIR)::

  python -m xlmeta_jax.tools.caching --gin_file=gin/finetune/embeddings.gin \\
      --gin.INITIAL_CHECKPOINT_PATH=… --gin.MODEL_DIR=… --gin.TRAIN_FILES=… \\
      --cache_dir=/data/seqio_cache

then the run with ``--gin.CACHE_DIR="'/data/seqio_cache'"``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np
import seqio
import tensorflow as tf

from xlmeta_jax.data import beam_runs, hf_tokenizer, seqio_vocabularies, token_cache
from xlmeta_jax.data.task_names import EMBEDDING_PAIRS_TASK
from xlmeta_jax.evaluation import pairs, tokenization

SPLIT = "train"
INDEX = "index"
ROWS_KEY = "xlmeta_rows"
TOKENIZER_KEY = "xlmeta_tokenizer"
# Rows per tokenizer call: the library's batch call, as the pretraining step's.
_BATCH = 256
# Rows per source shard: Beam's unit of work in the cache job.
SHARD_ROWS = 50_000


class CacheError(pairs.PairsError):
    """A token cache that is missing, incomplete, or of other rows or another tokenizer."""


@dataclasses.dataclass(frozen=True)
class RowSource:
    """Where a run's rows come from, and the tokenizer that encodes them (picklable: Beam's
    workers register the task from it)."""

    train_files: tuple[str, ...] = ()
    bitext_dir: str | None = None
    bitext_languages: tuple[str, ...] = ()
    bitext_pivot: str = "eng_Latn"
    bitext_split: str = "devtest"
    # The encoder's tokenizer: load_tokenizer(tokenizer_path, tokenizer_kind).
    tokenizer_path: str = ""
    tokenizer_kind: str | None = None

    def read(self) -> tuple[list[pairs.Pair], dict[str, int]]:
        """Every row (the files in order, then the parallel text) and the count per source.

        Raises:
          PairsError: a malformed line (file and line) or rows of unequal columns.
        """
        rows, sources = [], {}
        for path in self.train_files:
            got = pairs.read_pairs(path)
            sources[path] = len(got)
            rows += got
        if self.bitext_dir is not None:
            got = pairs.bitext_pairs(self.bitext_dir, self.bitext_languages,
                                     pivot=self.bitext_pivot, split=self.bitext_split)
            sources[self.bitext_dir] = len(got)
            rows += got
        pairs.check_columns(rows, "the training rows")
        return rows, sources


def rows_digest(rows: Sequence[pairs.Pair]) -> str:
    """SHA-256 of the rows' texts, in order: what a cache must have been built from."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row.texts(), ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def columns(num_negatives: int) -> tuple[str, ...]:
    """The text columns of rows with ``num_negatives`` hard negatives."""
    return ("query", "positive", *(f"negative_{i}" for i in range(num_negatives)))


class EncoderVocabulary(seqio_vocabularies.BatchEncodingTf, seqio.Vocabulary):
    """The encoder's tokenizer (any kind :func:`tokenization.load_tokenizer` reads: ours,
    fairseq's XLM-R layout, a ``tokenizer.json``) as a seqio vocabulary, in its own ids."""

    def __init__(self, path: str, kind: str | None = None):
        super().__init__(extra_ids=0)
        self.tokenizer = tokenization.load_tokenizer(path, kind)

    def __repr__(self):
        return f"EncoderVocabulary({self.tokenizer!r})"

    def __eq__(self, other):
        return isinstance(other, EncoderVocabulary) and self.record() == other.record()

    def __hash__(self):
        return hash(json.dumps(self.record(), sort_keys=True))

    def record(self) -> dict:
        return self.tokenizer.record()

    def encode_batch(self, texts) -> list[list[int]]:
        return self.tokenizer.encode_batch(list(texts))

    def _encode(self, s: str) -> list[int]:
        return self.encode_batch([s])[0]

    @property
    def eos_id(self) -> int:
        return self.tokenizer.sep_id

    @property
    def unk_id(self) -> int:
        return self.tokenizer.unk_id

    @property
    def _base_vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def _decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def _decode_tf(self, ids):
        return tf.numpy_function(
            lambda r: self.tokenizer.decode([int(i) for i in r]).encode("utf-8"), [ids],
            tf.string, stateful=False)


class RowsDataSource(seqio.DataSource):
    """The rows of a :class:`RowSource` as ``{index, query, positive, negative_i}`` strings,
    in shards of ``SHARD_ROWS`` consecutive rows (Beam's cache job reads one per work item;
    ``shard_info`` takes every ``num_shards``-th shard)."""

    def __init__(self, source: RowSource, num_rows: int, num_negatives: int):
        super().__init__(splits=(SPLIT,), num_input_examples={SPLIT: num_rows})
        self.row_source, self.num_rows = source, num_rows
        self.names = columns(num_negatives)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return False

    def list_shards(self, split: str) -> list[str]:
        return [f"rows {start}-{min(start + SHARD_ROWS, self.num_rows) - 1}"
                for start in range(0, max(self.num_rows, 1), SHARD_ROWS)]

    def get_dataset(self, split: str = SPLIT, shuffle: bool = True, seed=None,
                    shard_info: seqio.ShardInfo | None = None, *, sequence_length=None,
                    use_cached: bool = False, num_epochs: int | None = 1) -> tf.data.Dataset:
        # In order whatever `shuffle` says: the run orders the batches (pairs.BatchOrder).
        del shuffle, seed, sequence_length, use_cached, num_epochs
        shards = range(len(self.list_shards(split)))
        if shard_info is not None:
            shards = shards[shard_info.index::shard_info.num_shards]
        names, source = self.names, self.row_source

        def generate():
            rows, _ = source.read()
            for shard in shards:
                # Chunks of rows, unbatched in tf.data: a generator's cost is per element.
                end = min((shard + 1) * SHARD_ROWS, len(rows))
                for start in range(shard * SHARD_ROWS, end, _BATCH):
                    chunk = rows[start:min(start + _BATCH, end)]
                    yield (np.arange(start, start + len(chunk), dtype=np.int32),
                           *(np.array([r.texts()[c] for r in chunk], object)
                             for c in range(len(names))))

        signature = (tf.TensorSpec([None], tf.int32),
                     *(tf.TensorSpec([None], tf.string) for _ in names))
        ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
        return ds.map(tf.autograph.experimental.do_not_convert(
            lambda i, *texts: {INDEX: i, **dict(zip(names, texts))})).unbatch()


def tokenize_rows(dataset: tf.data.Dataset, output_features) -> tf.data.Dataset:
    """Every text column to its ids (no special tokens), ``_BATCH`` rows per tokenizer call."""
    names = [k for k in output_features if k != INDEX]

    @tf.autograph.experimental.do_not_convert
    def tokenize(batch):
        # Padded, with each row's length: dense elements after unbatch (a ragged row
        # costs Beam's per-example read several times a dense one).
        out = {INDEX: batch[INDEX]}
        for name in names:
            ids = output_features[name].vocabulary.encode_tf(batch[name])
            out[name], out[f"{name}.length"] = ids.to_tensor(), ids.row_lengths()
        return out

    @tf.autograph.experimental.do_not_convert
    def cut(ex):
        return {INDEX: ex[INDEX], **{n: ex[n][:ex[f"{n}.length"]] for n in names}}

    return (dataset.batch(_BATCH).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch().map(cut, num_parallel_calls=tf.data.AUTOTUNE))


def register(source: RowSource, num_rows: int, num_negatives: int) -> seqio.Task:
    """Registers (or replaces) ``xlmeta_embedding_pairs`` for ``source``'s ``num_rows``
    rows; returns it."""
    vocab = EncoderVocabulary(source.tokenizer_path, source.tokenizer_kind)
    features = {INDEX: seqio.Feature(seqio.PassThroughVocabulary(size=0), add_eos=False,
                                     dtype=tf.int32, rank=0)}
    for name in columns(num_negatives):
        features[name] = seqio.Feature(vocab, add_eos=False, dtype=tf.int32)
    seqio.TaskRegistry.remove(EMBEDDING_PAIRS_TASK)
    return seqio.TaskRegistry.add(
        EMBEDDING_PAIRS_TASK,
        source=RowsDataSource(source, num_rows, num_negatives),
        preprocessors=[tokenize_rows, seqio.CacheDatasetPlaceholder()],
        output_features=features,
        shuffle_buffer_size=None)


def _task_folder(cache_dir: str) -> str:
    return os.path.join(cache_dir, seqio.utils.get_task_dir_from_name(EMBEDDING_PAIRS_TASK))


def _as_arrays(ex: dict) -> dict[str, np.ndarray]:
    return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in ex.items()}


def _write_file(item, prefix: str, num_shards: int) -> int:
    """One cache file: its rows in index order (two runs write the same bytes)."""
    shard, examples = item
    with tf.io.TFRecordWriter(f"{prefix}-{shard:05d}-of-{num_shards:05d}") as writer:
        for ex in sorted(examples, key=lambda e: int(e[INDEX])):
            writer.write(token_cache.serialized_example(ex))
    return shard


def _with_record(info: dict, rows: dict, tokenizer: dict) -> dict:
    return {**info, ROWS_KEY: rows, TOKENIZER_KEY: tokenizer}


def cache(source: RowSource, cache_dir: str, *, overwrite: bool = False,
          num_shards: int | None = None, beam_args: Sequence[str] = ()) -> str:
    """Tokenizes ``source``'s rows once into seqio's cache under ``cache_dir``.

    Args:
      source: the run's rows and tokenizer.
      cache_dir: the cache root (the run's ``CACHE_DIR``).
      overwrite: replace an existing cache.
      num_shards: cache files (None: one per 100,000 rows, at least one).
      beam_args: Beam's pipeline options (default: the DirectRunner's engine).

    Returns:
      The task's cache folder.

    Raises:
      CacheError: a cache is there and ``overwrite`` is not set.
      PairsError: a malformed row.
    """
    import apache_beam as beam  # noqa: PLC0415 - the beam extra, only for the cache job
    from seqio import beam_utils  # noqa: PLC0415 - needs apache_beam

    rows, _ = source.read()
    num_negatives = len(rows[0].negatives)
    task = register(source, len(rows), num_negatives)
    out = _task_folder(cache_dir)
    if tf.io.gfile.exists(out) and tf.io.gfile.listdir(out) and not overwrite:
        raise CacheError(f"{out} already holds a token cache (pass --overwrite to replace it)")
    num_files = num_shards or max(1, -(-len(rows) // 100_000))
    recorded_rows = {"count": len(rows), "sha256": rows_digest(rows)}
    tokenizer = task.output_features["query"].vocabulary.record()

    # Built beside the old cache and swapped in whole (a bucket: rewritten in place,
    # COMPLETED last): a failed or interrupted build leaves the old one as it was.
    with token_cache.rebuilt_split(out, SPLIT) as folder:
        prefix = seqio.utils.get_cached_tfrecord_prefix(folder, SPLIT)

        def build(pipeline):
            examples = (
                pipeline
                | "read" >> beam_utils.PreprocessTask(
                    task, SPLIT, setup_fn=functools.partial(register, source, len(rows),
                                                            num_negatives))
                | "arrays" >> beam.Map(_as_arrays))
            _ = (examples
                 | "by_file" >> beam.Map(lambda ex: (int(ex[INDEX]) % num_files, ex))
                 | "group" >> beam.GroupByKey()
                 | "write" >> beam.Map(_write_file, prefix=prefix, num_shards=num_files))
            _ = (examples
                 | "info" >> beam_utils.GetInfo(num_files)
                 | "record" >> beam.Map(_with_record, rows=recorded_rows, tokenizer=tokenizer)
                 | "write_info" >> beam_utils.WriteJson(
                     seqio.utils.get_cached_info_path(folder, SPLIT)))
            _ = (examples
                 | "stats" >> beam_utils.GetStats(task.output_features)
                 | "write_stats" >> beam_utils.WriteJson(
                     seqio.utils.get_cached_stats_path(folder, SPLIT)))

        beam_runs.run(build, beam_args, tensorflow=True)
    return out


def check_cache(cache_dir: str, rows: Sequence[pairs.Pair], tokenizer_record: dict) -> None:
    """Refuses, in one line, a cache under ``cache_dir`` that is not of these rows and
    tokenizer, or is incomplete.

    Raises:
      CacheError: naming the folder and what differs.
    """
    out = _task_folder(cache_dir)
    info_path = seqio.utils.get_cached_info_path(out, SPLIT)
    rebuild = ("build it with python -m xlmeta_jax.tools.caching and this run's gin flags "
               "plus --cache_dir")
    if not (tf.io.gfile.exists(os.path.join(out, "COMPLETED"))
            and tf.io.gfile.exists(info_path)):
        raise CacheError(f"CACHE_DIR {cache_dir} holds no complete token cache of "
                         f"{EMBEDDING_PAIRS_TASK} ({out}): {rebuild}")
    with tf.io.gfile.GFile(info_path) as f:
        info = json.load(f)
    made_of = info.get(ROWS_KEY, {})
    if made_of.get("count") != len(rows) or made_of.get("sha256") != rows_digest(rows):
        raise CacheError(f"the token cache {out} holds {made_of.get('count')} other rows than "
                         f"this run's {len(rows)} (the training files or parallel text "
                         f"changed): {rebuild} --overwrite")
    made_with = info.get(TOKENIZER_KEY) or {}
    if not hf_tokenizer.same_tokenizer(made_with, tokenizer_record):
        raise CacheError(
            f"the token cache {out} was tokenized with "
            f"{hf_tokenizer.describe(made_with, 'another tokenizer')}, not "
            f"{hf_tokenizer.describe(tokenizer_record, 'the encoder')}: {rebuild} --overwrite")


def _place(out: np.ndarray, rows: np.ndarray, values: np.ndarray, splits: np.ndarray,
           cls: int, sep: int) -> None:
    """Writes ``cls ids sep`` of each row into ``out[rows]``, the ids cut to fit: the
    tokenizers' ``single``, for a batch at once."""
    width = out.shape[1] - 2
    kept = np.minimum(np.diff(splits), width)
    column = np.arange(width)[None, :]
    inside = column < kept[:, None]
    block = out[rows]
    block[:, 0] = cls
    block[:, 1:-1][inside] = values[(splits[:-1, None] + column)[inside]]
    block[np.arange(len(rows)), kept + 1] = sep
    out[rows] = block


def token_arrays(source: RowSource, rows: Sequence[pairs.Pair], lengths: dict[str, int],
                 pad_id: int, *, cache_dir: str | None = None) -> dict[str, np.ndarray]:
    """Every column as one ``[rows, length]`` id array, through the task.

    Args:
      source: the run's rows and tokenizer.
      rows: every row ``source`` reads, in order (checked against a cache).
      lengths: tokens per column, special tokens included (``query``; the rest).
      pad_id: the encoder's pad id.
      cache_dir: read the token cache there (:func:`check_cache` first); None: tokenize.
    """
    task = register(source, len(rows), len(rows[0].negatives))
    tokenizer = task.output_features["query"].vocabulary.tokenizer
    if cache_dir is not None:
        check_cache(cache_dir, rows, tokenizer.record())
    names = columns(len(rows[0].negatives))
    out = {name: np.full((len(rows), lengths.get(name, lengths["document"])), pad_id, np.int32)
           for name in names}
    seen = np.zeros(len(rows), bool)
    # seqio finds a task's cache among its global cache folders: this one alone while the
    # dataset is built (another folder of the process may hold an older cache of the task).
    searched = list(seqio.utils.get_global_cache_dirs())
    seqio.utils.set_global_cache_dirs([cache_dir] if cache_dir is not None else searched)
    try:
        ds = task.get_dataset(sequence_length=None, split=SPLIT,
                              use_cached=cache_dir is not None, shuffle=False, num_epochs=1)
    finally:
        seqio.utils.set_global_cache_dirs(searched)
    for batch in ds.ragged_batch(1024):
        indices = batch[INDEX].numpy()
        for name in names:
            _place(out[name], indices, batch[name].flat_values.numpy(),
                   batch[name].row_splits.numpy(), tokenizer.cls_id, tokenizer.sep_id)
        seen[indices] = True
    if not seen.all():
        raise CacheError(f"{EMBEDDING_PAIRS_TASK} gave {int(seen.sum())} of {len(rows)} rows")
    return out
