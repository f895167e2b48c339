"""Tokens per second of the whole input pipeline on this host, on real text.

Measures ``make_mlm_iterator`` end to end — reading, tokenizing, packing,
masking, batching and assembling global ``jax.Array`` batches — on the English
pretraining task, twice: tokenizing on the fly, and reading tokens from seqio's
offline cache (written first with :mod:`xlmeta_jax.tools.caching`).

Text: ``../shared/data/english_pd`` when present (or ``--english_pd``), else
Python's documentation topics. Vocabulary: ``--vocab`` (use the real one: the
tokenizer's cost grows with the vocabulary), else a small one trained here.

  python -m xlmeta_jax.tools.throughput --vocab=/data/spm/xlmeta.model --seconds=30

Compare the figure with what one accelerator consumes (docs/data.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

import jax

from xlmeta_jax import errors, logs
from xlmeta_jax.data import english_pd as english_pd_lib
from xlmeta_jax.data import feeding, vocabulary
from xlmeta_jax.data import task_names as names
from xlmeta_jax.model import partitioning
from xlmeta_jax.tools import caching

# Tokens per second one accelerator trains on (docs/data.md), for the comparison line.
ACCELERATOR_TOKENS_PER_SECOND = {"H200, base (bf16)": 450_000}

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DEFAULT_ENGLISH_PD = os.path.join(os.path.dirname(_REPO), "shared", "data", "english_pd")


def measure(iterator, *, seconds: float, warmup_batches: int, tokens_per_batch: int) -> dict:
    """Consumes ``iterator`` for ``seconds`` after a warm-up; returns rates."""

    for _ in range(warmup_batches):
        jax.block_until_ready(next(iterator))
    batches = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds or batches == 0:
        jax.block_until_ready(next(iterator))
        batches += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return {
        "batches": batches,
        "seconds": elapsed,
        "tokens_per_second": batches * tokens_per_batch / elapsed,
        # CPU seconds of all of the process's threads: the rate per busy core,
        # meaningful also on a shared machine.
        "tokens_per_cpu_second": batches * tokens_per_batch / max(cpu, 1e-9),
        "cpus_busy": cpu / elapsed,
    }


def run(
    *,
    vocab: str | None,
    english_pd: str | None,
    work_dir: str,
    sequence_length: int,
    batch_size: int,
    seconds: float,
    warmup_batches: int,
    cache_shards: int,
    vocab_size: int,
) -> dict[str, dict]:
    """Runs both measurements; returns ``{"on the fly": ..., "seqio cache": ...}``."""
    import seqio  # noqa: PLC0415 - seqio (TensorFlow) only where data is read

    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio/TensorFlow: its --help stays quiet

    files = english_pd_lib.english_text_files(os.path.join(work_dir, "text"), english_pd)
    if not vocab:
        print(f"training a {vocab_size}-piece vocabulary on {len(files)} files ...", flush=True)
        vocab = vocabulary.train_vocabulary(
            {"en": files},
            os.path.join(work_dir, "vocab", "en"),
            vocab_size,
            alpha=1.0,
            seed=0,
            num_lines=50_000,
            print_report=False,
        )
    tasks.register(vocab_path=vocab, english_files=files, shuffle_buffer_size=1024)
    mesh = partitioning.create_mesh(data=-1, devices=jax.local_devices()[:1])
    tokens_per_batch = batch_size * sequence_length
    results = {}
    common = dict(
        sequence_length=sequence_length,
        global_batch_size=batch_size,
        mesh=mesh,
        seed=0,
    )
    it = feeding.make_mlm_iterator(names.ENGLISH_TEXT_TASK, **common)
    results["on the fly"] = measure(
        it, seconds=seconds, warmup_batches=warmup_batches, tokens_per_batch=tokens_per_batch
    )
    del it
    cache_dir = os.path.join(work_dir, "seqio_cache")
    caching.cache_task(
        names.ENGLISH_TEXT_TASK, cache_dir, num_shards=cache_shards, overwrite=True
    )
    seqio.add_global_cache_dirs([cache_dir])
    it = feeding.make_mlm_iterator(
        names.ENGLISH_TEXT_TASK, use_cached=True, cache_dir=cache_dir, **common
    )
    results["seqio cache"] = measure(
        it, seconds=seconds, warmup_batches=warmup_batches, tokens_per_batch=tokens_per_batch
    )
    results["_info"] = {"files": files, "vocab": vocab}
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m xlmeta_jax.tools.throughput`` (see the module docstring)."""
    parser = errors.ArgumentParser(prog="python -m xlmeta_jax.tools.throughput",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--vocab", help="SentencePiece .model (default: train a small one)")
    parser.add_argument("--english_pd", default=_DEFAULT_ENGLISH_PD)
    parser.add_argument("--work_dir", help="scratch folder (default: a temporary one)")
    parser.add_argument("--sequence_length", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup_batches", type=int, default=5)
    parser.add_argument("--cache_shards", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=8000)
    errors.add_debug_flag(parser)
    args = parser.parse_args(argv)
    logs.quiet_start(import_tensorflow=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = run(
            vocab=args.vocab,
            english_pd=args.english_pd,
            work_dir=args.work_dir or tmp,
            sequence_length=args.sequence_length,
            batch_size=args.batch_size,
            seconds=args.seconds,
            warmup_batches=args.warmup_batches,
            cache_shards=args.cache_shards,
            vocab_size=args.vocab_size,
        )
    info = results.pop("_info")
    print(
        f"input pipeline on {os.cpu_count()} CPUs, L={args.sequence_length}, "
        f"host batch {args.batch_size}, vocabulary {info['vocab']}, "
        f"{len(info['files'])} text files"
    )
    for mode, r in results.items():
        print(
            f"  {mode:<12} {r['tokens_per_second']:>12,.0f} tokens/s "
            f"({r['batches']} batches in {r['seconds']:.1f} s; "
            f"{r['tokens_per_cpu_second']:,.0f} tokens per CPU-second, "
            f"{r['cpus_busy']:.1f} CPUs busy)"
        )
    for name, rate in ACCELERATOR_TOKENS_PER_SECOND.items():
        best = max(r["tokens_per_second"] for r in results.values())
        print(f"  one accelerator ({name}) consumes ~{rate:,} tokens/s: "
              f"this host feeds {best / rate:.2f} of one")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.throughput")
