"""seqio's offline token cache of registered tasks, written by an Apache Beam job.

The cache holds exactly what the task's steps before its ``CacheDatasetPlaceholder``
produce, one work item per source shard. A task of text files tokenized by our step is
read and tokenized in Python (:func:`python_reading`: the tf.data source and step's own
rules, held equal to them by tests/test_data_pipeline.py, without their cost per
token); any other task through seqio's own Beam transform
(``seqio.beam_utils.PreprocessTask``, as ``seqio/scripts/cache_tasks_main.py`` runs it).
The job writes ``info.{split}.json`` and ``stats.{split}.json`` with seqio's
``GetInfo``, ``GetStats`` and ``WriteJson``; ``COMPLETED`` is written last, once the job
succeeded. seqio reads the cache with ``use_cached=True``.

The TFRecords are written here rather than by seqio's ``WriteExampleTfRecord``,
which reshuffles the examples: the task's elements (runs of up to 256 paragraphs)
are joined back into whole documents in their order, consecutive documents are
grouped into records of about ``RECORD_TOKENS`` tokens (:func:`records_of`: a record
never splits a document), and each cache file holds its records in source order — by
default one file per source shard, with ``num_shards`` records dealt round-robin — so
that an unshuffled cached run reads the batches an uncached one reads, interleaved
cache files never split a document, and two runs of the job write the same files.
Records of many short documents rather than one each: Beam's, the serialisation's and
seqio's statistics' cost per element was most of the job's (FLORES sentences as
documents, 33 tokens each: 0.19x of the tokenizer's own rate per CPU-second, one
record per document; benchmarks/tokenize_speed.py). ``info.{split}.json`` records the
``</s>`` convention (``xlmeta_eos_after``) and the vocabulary (``xlmeta_vocabulary``:
path and md5); a run with another refuses the cache (``tasks.check_cache``).

Workers register the tasks themselves (``setup_fn``) with the driver's
:class:`~xlmeta_jax.data.corpora.Corpora`: from prepared statistics where the corpus
has them, so no worker counts. Users: ``python -m xlmeta_jax.data.prepare --tokenize``
(CC-100) and ``python -m xlmeta_jax.tools.caching`` (any registered task).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Iterator, Sequence

import numpy as np

from xlmeta_jax import files
from xlmeta_jax.data import beam_runs, special_ids, text_files


def document_ends(run: np.ndarray, eos_after: str, previous_eos: bool,
                  eos_id: int) -> np.ndarray:
    """Indices of ``run`` where a document ends (its last eos).

    Args:
      run: a run of the token stream.
      eos_after: the tasks' ``Corpora.eos_after``.
      previous_eos: whether the token before ``run`` in the stream is eos.
      eos_id: the vocabulary's end of a line or document (``SpecialIds.sep``).
    """
    is_eos = run == eos_id
    if eos_after == "document":
        return np.flatnonzero(is_eos)
    before = np.concatenate([[previous_eos], is_eos[:-1]])
    return np.flatnonzero(is_eos & before)


# Tokens a cache record gathers from consecutive whole documents (about the uncached
# source's run of 256 paragraphs of short text).
RECORD_TOKENS = 8192


def records_of(runs: Sequence[np.ndarray], eos_after: str, eos_id: int,
               record_tokens: int = RECORD_TOKENS) -> list[np.ndarray]:
    """A source shard's runs of the token stream, in order, as records of consecutive whole
    documents of at least ``record_tokens`` tokens (the last may be shorter; a longer
    document is a record of its own).

    One pass over the shard's stream: the document ends are found at once and each record
    is cut at the first end that completes it (a per-document loop cost more than the
    records' serialisation on sentence-length documents).
    """
    if not runs:
        return []
    stream = np.concatenate(runs).astype(np.int32, copy=False)
    cuts = document_ends(stream, eos_after, False, eos_id) + 1
    if not cuts.size or cuts[-1] != stream.size:  # sources end every document; kept for safety
        cuts = np.append(cuts, stream.size)
    records, start = [], 0
    while start < stream.size:
        end = int(cuts[min(np.searchsorted(cuts, start + record_tokens), cuts.size - 1)])
        records.append(stream[start:end])
        start = end
    return records


def serialized_example(features: dict[str, np.ndarray]) -> bytes:
    """The tf.Example seqio's ``dict_to_tfexample`` serialises for integer features (the
    cache's ``{"tokens": ...}``, a contrastive row's columns), built straight from the
    arrays (seqio converts through eager TensorFlow ops).

    Serialised ``deterministic``: the protobuf library's order of a map's entries (the
    features) otherwise varies between processes, and two runs of a job must write the
    same bytes. (A varint encoder in numpy was tried: 1.5x faster than this, a gain of
    2% of the cache job, not worth a second serialiser.)
    """
    import tensorflow as tf  # noqa: PLC0415

    return tf.train.Example(features=tf.train.Features(feature={
        k: tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(v).tolist()))
        for k, v in features.items()})).SerializeToString(deterministic=True)


def _register(corpora) -> None:
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio, TensorFlow

    if corpora is not None:
        tasks.register(corpora)


def python_reading(task) -> str | None:
    """The ``</s>`` convention of a task whose cache is read and tokenized in Python, or
    None for a task read through seqio's ``PreprocessTask``.

    A task of text files (:class:`~xlmeta_jax.data.providers.TextLineDocumentsSource`)
    whose one step before its ``CacheDatasetPlaceholder`` is our tokenize step is read
    by :func:`~xlmeta_jax.data.text_files.iter_entries` and tokenized by
    :func:`~xlmeta_jax.data.preprocessors.tokenize_entries`: the same token stream as the
    tf.data source and step without their cost per token (the tf.data source alone cost
    0.52 µs per BPE token, the Python reading 0.04, the tokenizer's calls about 1.8;
    benchmarks/tokenize_speed.py). Any other task, a TFDS source for one, is read as
    seqio reads it.
    """
    import seqio  # noqa: PLC0415

    from xlmeta_jax.data import preprocessors, providers  # noqa: PLC0415 - TensorFlow

    steps = list(task.preprocessors)
    before = steps[:next(i for i, s in enumerate(steps)
                         if isinstance(s, seqio.CacheDatasetPlaceholder))]
    if (isinstance(task.source, providers.TextLineDocumentsSource) and len(before) == 1
            and isinstance(before[0], functools.partial)
            and before[0].func is preprocessors.tokenize_documents and not before[0].args):
        return before[0].keywords.get("eos_after", "line")
    return None


def _tokenized_file(shard, task_name: str, split: str, corpora, eos_after: str):
    """One text file of a task read and tokenized in Python, as ``_keyed`` elements: the
    file's index and its runs of the token stream, in order."""
    import seqio  # noqa: PLC0415

    from xlmeta_jax.data import preprocessors  # noqa: PLC0415 - TensorFlow

    _register(corpora)
    task = seqio.get_mixture_or_task(task_name)
    index, path = shard
    entries = text_files.iter_entries(path, task.source.files_by_split[split].max_line_bytes)
    vocab = task.output_features["targets"].vocabulary
    for i, run in enumerate(preprocessors.tokenize_entries(entries, vocab, eos_after)):
        yield index, (i, run)


def _keyed(ex, provenance):
    shard_key, index_key = provenance
    tokens = ex["tokens"]
    tokens = tokens.numpy() if hasattr(tokens, "numpy") else np.asarray(tokens)
    return int(ex[shard_key]), (int(ex[index_key]), tokens)


def _dealt(item, eos_after: str, num_shards: int | None, eos_id: int):
    """One source shard's records, keyed by the cache file each goes to."""
    shard, elements = item
    runs = [run for _, run in sorted(elements, key=lambda e: e[0])]
    for j, doc in enumerate(records_of(runs, eos_after, eos_id)):
        out = shard if num_shards is None else (shard + j) % num_shards
        yield out, (shard, j, doc)


def _write_file(item, prefix: str, num_shards: int):
    import tensorflow as tf  # noqa: PLC0415

    out, docs = item
    docs = sorted(docs, key=lambda d: (d[0], d[1]))
    with tf.io.TFRecordWriter(f"{prefix}-{out:05d}-of-{num_shards:05d}") as writer:
        for _, _, doc in docs:
            writer.write(serialized_example({"tokens": doc}))
    for _, _, doc in docs:
        yield {"tokens": doc}


def _write_shards_in_place(prefix: str, num_shards: int, eos_after: str, eos_id: int):
    """A DoFn writing each source shard's cache file where the shard was read.

    With one cache file per source shard no element has to move: every element of a
    shard comes out of one call of the reading DoFn (``_tokenized_file`` or
    ``PreprocessTask``'s), so a DoFn fused after it sees them all in the same bundle. It
    keeps them per shard and writes the shard's file at the bundle's end, instead of a
    ``GroupByKey`` that would send every token between worker processes (a job's
    dominant cost on more than one worker).
    """
    import apache_beam as beam  # noqa: PLC0415
    from apache_beam.transforms import window  # noqa: PLC0415

    class WriteShards(beam.DoFn):
        def start_bundle(self):
            self.runs = {}

        def process(self, item):
            shard, element = item
            self.runs.setdefault(shard, []).append(element)

        def finish_bundle(self):
            for shard, elements in self.runs.items():
                docs = [doc for _, doc in _dealt((shard, elements), eos_after, None, eos_id)]
                for example in _write_file((shard, docs), prefix, num_shards):
                    yield window.GlobalWindows.windowed_value(example)
            self.runs = {}

    return beam.ParDo(WriteShards())


def _with_convention(info: dict, eos_after: str, vocab: dict | None) -> dict:
    from xlmeta_jax.data import tasks  # noqa: PLC0415

    return {**info, tasks.CACHE_EOS_KEY: eos_after,
            **({tasks.CACHE_VOCAB_KEY: vocab} if vocab else {})}


def task_folder(cache_dir: str, task_name: str) -> str:
    """Where seqio looks for ``task_name``'s cache under ``cache_dir``."""
    import seqio  # noqa: PLC0415

    return os.path.join(cache_dir, seqio.utils.get_task_dir_from_name(task_name))


def add_task(pipeline, task, out: str, *, split: str, eos_after: str, corpora,
             num_shards: int | None = None, vocab: dict | None = None) -> None:
    """Adds the job writing ``split`` of one task's cache into the folder ``out``.

    ``vocab`` (``tasks.vocabulary_record``) is recorded in the info beside the ``</s>``
    convention: a run reading the cache checks both.
    """
    import apache_beam as beam  # noqa: PLC0415
    import seqio  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    from seqio import beam_utils  # noqa: PLC0415

    tf.io.gfile.makedirs(out)
    files = num_shards or len(task.source.list_shards(split))
    prefix = seqio.utils.get_cached_tfrecord_prefix(out, split)
    label = task.name
    eos_id = special_ids.of(task.output_features["targets"].vocabulary).sep
    convention = python_reading(task)
    if convention is not None:  # a work item per file, as PreprocessTask's per source shard
        elements = (
            pipeline
            | f"{label}_files" >> beam.Create(list(enumerate(task.source.list_shards(split))))
            | f"{label}_read" >> beam.FlatMap(_tokenized_file, task_name=task.name, split=split,
                                              corpora=corpora, eos_after=convention))
    else:
        elements = (
            pipeline
            | f"{label}_read" >> beam_utils.PreprocessTask(
                task, split, setup_fn=functools.partial(_register, corpora),
                add_provenance=True)
            | f"{label}_key" >> beam.Map(_keyed, provenance=(
                beam_utils.SOURCE_SHARD_ID_PROVENANCE_KEY,
                beam_utils.ID_WITHIN_SHARD_PROVENANCE_KEY)))
    if num_shards is None:  # a file per source shard: written where the shard was read
        docs = elements | f"{label}_write" >> _write_shards_in_place(prefix, files, eos_after,
                                                                     eos_id)
    else:  # documents dealt over other files: they move
        docs = (elements
                | f"{label}_by_source_shard" >> beam.GroupByKey()
                | f"{label}_documents" >> beam.FlatMap(_dealt, eos_after=eos_after,
                                                       num_shards=num_shards, eos_id=eos_id)
                | f"{label}_by_file" >> beam.GroupByKey()
                | f"{label}_write" >> beam.FlatMap(_write_file, prefix=prefix,
                                                   num_shards=files))
    _ = (docs
         | f"{label}_info" >> beam_utils.GetInfo(files)
         | f"{label}_convention" >> beam.Map(_with_convention, eos_after=eos_after,
                                             vocab=vocab)
         | f"{label}_write_info" >> beam_utils.WriteJson(
             seqio.utils.get_cached_info_path(out, split)))
    _ = (docs
         | f"{label}_stats" >> beam_utils.GetStats({"tokens": task.output_features["targets"]})
         | f"{label}_write_stats" >> beam_utils.WriteJson(
             seqio.utils.get_cached_stats_path(out, split)))


def cache_tasks(task_names: Sequence[str], cache_dir: str, *, split: str = "train",
                num_shards: int | None = None, overwrite: bool = False,
                beam_args: Sequence[str] = ()) -> list[str]:
    """Caches registered tasks in one Beam job; returns their cache folders.

    Args:
      task_names: registered tasks with a ``CacheDatasetPlaceholder``
        (:func:`xlmeta_jax.data.tasks.register` registered them).
      cache_dir: the cache root (``make_mlm_iterator(cache_dir=...)``).
      split: the split to cache (other splits of an existing cache are kept).
      num_shards: cache files per task (None: one per source shard).
      overwrite: replace an existing cache of this split. On a local disk the task's
        folder is built beside the old one and swapped in whole once the job succeeded,
        so a failed or interrupted job leaves the old cache as it was; a bucket's
        (``gs://``) is rewritten in place, ``COMPLETED`` last.
      beam_args: Beam's pipeline options (default: the DirectRunner's engine).

    Raises:
      CorpusError: a task cannot be cached, or is cached already without ``overwrite``.
    """
    import seqio  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio and TensorFlow, on use

    corpora = tasks.registered_corpora()
    eos_after = corpora.eos_after if corpora is not None else "line"
    vocab = (tasks.vocabulary_record(corpora.vocab_path)
             if corpora is not None and corpora.vocab_path else None)
    if num_shards is not None and num_shards < 1:
        raise text_files.CorpusError(f"num_shards must be >= 1, got {num_shards}")
    chosen = []
    for name in task_names:
        task = seqio.get_mixture_or_task(name)
        if not isinstance(task, seqio.Task) or not task.supports_caching:
            raise text_files.CorpusError(f"{name} is not a task with a CacheDatasetPlaceholder")
        out = task_folder(cache_dir, task.name)
        prefix = seqio.utils.get_cached_tfrecord_prefix(out, split)
        if tf.io.gfile.glob(f"{prefix}-*") and not overwrite:
            raise text_files.CorpusError(
                f"{out} already caches split {split!r} (pass --overwrite to replace it)")
        chosen.append((task, out, prefix))
    with contextlib.ExitStack() as swaps:
        building = [(task, swaps.enter_context(rebuilt_split(out, split)))
                    for task, out, _ in chosen]

        def build(pipeline):
            for task, folder in building:
                add_task(pipeline, task, folder, split=split, eos_after=eos_after,
                         corpora=corpora, num_shards=num_shards, vocab=vocab)

        beam_runs.run(build, beam_args, tensorflow=True)
    return [out for _, out, _ in chosen]


@contextlib.contextmanager
def rebuilt_split(out: str, split: str) -> Iterator[str]:
    """Yields the folder to write ``split`` of the cache folder ``out`` into; once the
    block succeeded, ``COMPLETED`` is written and the cache is in place.

    On a local disk the folder is built beside ``out`` (the other splits' files linked in)
    and swapped in whole: a failed or interrupted job leaves the old cache as it was. A
    bucket (``gs://``) has no folder rename: the split's old files go first and
    ``COMPLETED`` comes last.
    """
    import seqio  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    def completed(folder: str) -> None:
        with tf.io.gfile.GFile(os.path.join(folder, "COMPLETED"), "w") as f:
            f.write("")

    if "://" in out:
        prefix = seqio.utils.get_cached_tfrecord_prefix(out, split)
        for old in [*tf.io.gfile.glob(f"{prefix}-*"), os.path.join(out, "COMPLETED")]:
            if tf.io.gfile.exists(old):
                tf.io.gfile.remove(old)
        tf.io.gfile.makedirs(out)
        yield out
        completed(out)
        return
    with files.built_whole(out) as tmp:
        _link_other_splits(out, tmp, split)
        yield tmp
        completed(tmp)


def _link_other_splits(old: str, new: str, split: str) -> None:
    """Hard-links (or copies) into ``new`` the files of ``old`` that are not ``split``'s."""
    import seqio  # noqa: PLC0415

    if not os.path.isdir(old):
        return
    prefix = os.path.basename(seqio.utils.get_cached_tfrecord_prefix(old, split))
    own = {os.path.basename(seqio.utils.get_cached_info_path(old, split)),
           os.path.basename(seqio.utils.get_cached_stats_path(old, split)), "COMPLETED"}
    for name in os.listdir(old):
        path = os.path.join(old, name)
        if name in own or name.startswith(f"{prefix}-") or not os.path.isfile(path):
            continue
        try:
            os.link(path, os.path.join(new, name))
        except OSError:  # a file system without hard links
            shutil.copy2(path, os.path.join(new, name))
