"""``python -m xlmeta_jax.tools.caching``: seqio's offline token cache of any registered task.

The gin files name the corpora (``xlmeta_jax.data.corpora.Corpora``); the tasks are
registered with them (``tasks.register``), then cached by the Apache Beam job of
:mod:`xlmeta_jax.data.token_cache` (seqio's ``beam_utils`` transforms; the layout
``{cache_dir}/{task}/{split}.tfrecord-*``, ``info.*.json``, ``stats.*.json``,
``COMPLETED``), which seqio reads with ``use_cached=True``. It runs on Beam's local
engine unless Beam options say otherwise (``--runner``, ``--direct_num_workers``, ...).
CC-100 folders are cached by ``python -m xlmeta_jax.data.prepare --tokenize``.

Examples in the cache are whole tokenized *documents* (each ending in eos; with
``Corpora.eos_after='line'`` every line ends in eos and a document in two), in source
order; ``info.{split}.json`` records the convention (``xlmeta_eos_after``) and a run
with the other one refuses the cache.

Command::

  python -m xlmeta_jax.tools.caching --gin_file=gin/data/english_files.gin \\
      --gin.VOCAB_PATH="'/data/vocab.model'" --gin.ENGLISH_FILES="['/data/en/*.txt']" \\
      --task=xlmeta_english_text --cache_dir=/data/seqio_cache --num_shards=16

With a contrastive run's gin flags (``gin/finetune/embeddings.gin``) and no ``--task`` it
caches that run's rows in its encoder's tokenizer (``xlmeta_embedding_pairs``,
:mod:`xlmeta_jax.evaluation.pair_task`); the run reads them with ``--gin.CACHE_DIR``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from xlmeta_jax import errors, files, logs
from xlmeta_jax.cli import configurables, evaluation_runs
from xlmeta_jax.data import beam_runs, token_cache
from xlmeta_jax.evaluation import embedding_config, embedding_run


def cache_task(
    task_name: str,
    cache_dir: str,
    *,
    split: str = "train",
    num_shards: int | None = None,
    overwrite: bool = False,
    beam_args: Sequence[str] = (),
) -> str:
    """Tokenizes ``split`` of a registered task once and writes it in seqio's cache format.

    Args:
      task_name: a registered task with a ``CacheDatasetPlaceholder``.
      cache_dir: the cache root (pass it to ``seqio.add_global_cache_dirs`` or
        ``make_mlm_iterator(cache_dir=...)``).
      split: the split to cache (one per call; other splits of an existing
        cache are kept).
      num_shards: cache files (at least the number of reading processes, so each
        process reads whole files); None: one per source file.
      overwrite: replace an existing cache of this split.
      beam_args: Beam's pipeline options.

    Returns:
      The task's cache folder.
    """
    return token_cache.cache_tasks([task_name], cache_dir, split=split, num_shards=num_shards,
                                   overwrite=overwrite, beam_args=beam_args)[0]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m xlmeta_jax.tools.caching`` (see the module docstring)."""
    from xlmeta_jax.cli import flags as gin_cli  # noqa: PLC0415 - gin is absent on hosts that only benchmark

    flags = gin_cli.parse_gin_flags(sys.argv[1:] if argv is None else argv)
    parser = errors.ArgumentParser(
        prog="python -m xlmeta_jax.tools.caching",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Cache a task's tokens in seqio's format on Apache Beam (gin flags: "
        "--gin_file, --gin.NAME=VALUE name the corpora; other options are Beam's)."
    )
    parser.add_argument("--task", action="append", default=[],
                        help="task name (repeatable; none with a contrastive run's gin "
                        "files: its rows)")
    parser.add_argument("--cache_dir", required=True, type=files.path_flag("--cache_dir"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--num_shards", type=int, default=None,
                        help="cache files per task (default: one per source file)")
    parser.add_argument("--overwrite", action="store_true")
    errors.add_debug_flag(parser)
    args, beam_args = parser.parse_known_args(flags.remaining)
    beam_runs.check_options(beam_args)
    logs.quiet_start(import_tensorflow=True)
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths)
    if evaluation_runs.bound_task() == embedding_config.TASK:
        if args.task:
            raise errors.UserError(f"--task={args.task[0]}: a contrastive run's gin files "
                                   "cache its own rows; leave --task out")
        config = evaluation_runs.embeddings_config()
        out = embedding_run.cache_rows(config, args.cache_dir, overwrite=args.overwrite,
                                       num_shards=args.num_shards, beam_args=beam_args)
        print(f"cached the contrastive run's rows in {out}")
        return 0
    if not args.task:
        raise errors.UserError("--task: name a task to cache (or give a contrastive run's "
                               "gin files)")
    for name in args.task:
        # Registered for its own corpus (and only that is counted), then cached.
        configurables.registered(name)
        out = cache_task(name, args.cache_dir, split=args.split, num_shards=args.num_shards,
                         overwrite=args.overwrite, beam_args=beam_args)
        print(f"cached {name} ({args.split}) in {out}")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.caching")
