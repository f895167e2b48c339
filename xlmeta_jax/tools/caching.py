"""Offline cache of tokenized text in seqio's cache format, without Apache Beam.

seqio caches a task's examples at its ``CacheDatasetPlaceholder`` with
``seqio/scripts/cache_tasks_main.py``, which needs Apache Beam (not a
dependency here; it works on these tasks where Beam is installed). This module
writes the same layout with a single process — TFRecords of
``seqio.dict_to_tfexample``, ``info.{split}.json``, ``stats.{split}.json`` and
``COMPLETED`` under ``{cache_dir}/{task_name}/`` — which seqio then reads with
``use_cached=True`` (``seqio.add_global_cache_dirs([cache_dir])``).

Examples in the cache are whole tokenized *documents* (each ending in eos; with
``Corpora.eos_after='line'`` every line ends in eos and a document in two), so the
interleaved reading of cache shards never splits a document. ``info.{split}.json``
records the convention (``xlmeta_eos_after``); a run with the other one refuses the
cache.

Command::

  python -m xlmeta_jax.tools.caching --gin_file=gin/data/english_files.gin \\
      --gin.VOCAB_PATH="'/data/vocab.model'" --gin.ENGLISH_FILES="['/data/en/*.txt']" \\
      --task=xlmeta_english_text --cache_dir=/data/seqio_cache --num_shards=16

The gin files name the corpora (``xlmeta_jax.data.corpora.Corpora``); the tasks are
registered with them (``tasks.register``) before caching.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import numpy as np
import seqio
import tensorflow as tf

from xlmeta_jax import errors
from xlmeta_jax.cli import configurables
from xlmeta_jax.data import tasks
from xlmeta_jax.data.vocabulary import EOS_ID


def document_ends(run: np.ndarray, eos_after: str, previous_eos: bool) -> np.ndarray:
    """Indices of ``run`` where a document ends (its last eos).

    Args:
      run: a run of the token stream.
      eos_after: the tasks' ``Corpora.eos_after``.
      previous_eos: whether the token before ``run`` in the stream is eos.
    """
    is_eos = run == EOS_ID
    if eos_after == "document":
        return np.flatnonzero(is_eos)
    before = np.concatenate([[previous_eos], is_eos[:-1]])
    return np.flatnonzero(is_eos & before)


def cache_task(
    task_name: str,
    cache_dir: str,
    *,
    split: str = "train",
    num_shards: int = 1,
    overwrite: bool = False,
) -> str:
    """Tokenizes ``split`` of a task once and writes it in seqio's cache format.

    Args:
      task_name: a registered task with a ``CacheDatasetPlaceholder``.
      cache_dir: the cache root (pass it to ``seqio.add_global_cache_dirs`` or
        ``make_mlm_iterator(cache_dir=...)``).
      split: the split to cache (one per call; other splits of an existing
        cache are kept).
      num_shards: TFRecord files (at least the number of reading processes, so
        each process reads whole files).
      overwrite: replace an existing cache of this split.

    Returns:
      The task's cache folder.
    """
    task = seqio.get_mixture_or_task(task_name)
    if not isinstance(task, seqio.Task) or not task.supports_caching:
        raise ValueError(f"{task_name} is not a task with a CacheDatasetPlaceholder")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    out = os.path.join(cache_dir, seqio.utils.get_task_dir_from_name(task.name))
    prefix = seqio.utils.get_cached_tfrecord_prefix(out, split)
    if tf.io.gfile.glob(f"{prefix}-*") and not overwrite:
        raise FileExistsError(f"{out} already caches split {split!r} (pass overwrite=True)")
    tf.io.gfile.makedirs(out)
    for old in tf.io.gfile.glob(f"{prefix}-*"):
        tf.io.gfile.remove(old)
    corpora = tasks.registered_corpora()
    eos_after = corpora.eos_after if corpora is not None else "line"
    ds = task.source.get_dataset(split=split, shuffle=False)
    ds = task.preprocess_precache(ds)
    writers = [
        tf.io.TFRecordWriter(f"{prefix}-{i:05d}-of-{num_shards:05d}") for i in range(num_shards)
    ]
    documents = tokens = 0
    pending: list[np.ndarray] = []

    def write(doc: np.ndarray) -> None:
        nonlocal documents, tokens
        example = seqio.dict_to_tfexample({"tokens": doc.astype(np.int32)})
        writers[documents % num_shards].write(example.SerializeToString())
        documents += 1
        tokens += int(doc.size)

    previous_eos = False  # whether the stream's last token so far is eos
    try:
        # Elements are runs of the token stream; documents end at an eos ('document') or
        # at the eos that follows a line's eos ('line').
        for ex in ds.as_numpy_iterator():
            run = ex["tokens"]
            ends = document_ends(run, eos_after, previous_eos)
            if run.size:
                previous_eos = bool(run[-1] == EOS_ID)
            start = 0
            for end in ends:
                write(np.concatenate([*pending, run[start : end + 1]]))
                pending, start = [], end + 1
            if start < run.size:
                pending.append(run[start:])
        if pending:  # sources end every document; kept for safety
            write(np.concatenate(pending))
    finally:
        for w in writers:
            w.close()
    if documents == 0:
        raise ValueError(f"{task_name} ({split}) produced no documents to cache")
    info = {
        "num_shards": num_shards,
        "features": {"tokens": {"shape": [None], "dtype": "int32"}},
        "seqio_version": seqio.__version__,
        tasks.CACHE_EOS_KEY: eos_after,
    }
    with tf.io.gfile.GFile(seqio.utils.get_cached_info_path(out, split), "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
    with tf.io.gfile.GFile(seqio.utils.get_cached_stats_path(out, split), "w") as f:
        json.dump({"examples": documents, "tokens_tokens": tokens}, f, indent=2, sort_keys=True)
    with tf.io.gfile.GFile(os.path.join(out, "COMPLETED"), "w") as f:
        f.write("")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m xlmeta_jax.tools.caching`` (see the module docstring)."""
    from xlmeta_jax.cli import flags as gin_cli  # noqa: PLC0415 - gin is absent on hosts that only benchmark

    flags = gin_cli.parse_gin_flags(sys.argv[1:] if argv is None else argv)
    parser = errors.ArgumentParser(
        prog="python -m xlmeta_jax.tools.caching",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Cache a task's tokens in seqio's format (gin flags: --gin_file, "
        "--gin.NAME=VALUE name the corpora)."
    )
    parser.add_argument("--task", required=True, action="append", help="task name (repeatable)")
    parser.add_argument("--cache_dir", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--num_shards", type=int, default=1)
    parser.add_argument("--overwrite", action="store_true")
    errors.add_debug_flag(parser)
    args = parser.parse_args(flags.remaining)
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths)
    for name in args.task:
        configurables.registered(name)
        out = cache_task(
            name, args.cache_dir, split=args.split, num_shards=args.num_shards,
            overwrite=args.overwrite,
        )
        print(f"cached {name} ({args.split}) in {out}")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.caching")
