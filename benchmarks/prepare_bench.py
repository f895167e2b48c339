"""What ``python -m xlmeta_jax.data.prepare`` costs, against today's one-process path.

    python -m benchmarks.prepare_bench [--mb=1024] [--files=4] [--cache_mb=32] \\
        [--startup_mb=50,2000] [--work_dir=DIR]

Prints, on this machine:

1. **prepare** (decompress ``.xz``, split into document-whole gzip shards, count) on
   ``--files`` ``.xz`` files of ``--mb`` MB of text in all, with 1 and with 2 Beam
   workers (``--direct_num_workers=2 --direct_running_mode=multi_processing``): MB of
   text per second of wall time and per CPU-second (the workers' included), and the
   2-worker speed-up. In the same process, the reference: today's path on the same
   text, one process — ``lzma`` decompression, gzip level 1 and the counting pass
   (``text_files.corpus_stats``) — and the counting pass alone.
   The same job on 100 kB gives its fixed part (start, plan, finish), which does not
   grow with the corpus; the speed-up is also printed less that part. The machine's own
   ceiling for it: the same per-file work (``shards.split_file``, no Beam) in 1 process
   and in 2 processes of a ``multiprocessing`` pool, one file at a time each.
2. **the token cache** (``prepare --tokenize``'s job) on ``--cache_mb`` MB of prepared
   text (8 shards per language) with a small vocabulary: tokens per second of wall time
   and per CPU-second, 1 vs 2 workers.
3. **start-up**: seconds from launching ``python -m xlmeta_jax.train`` (tiny model,
   one step) to its first step on 100 languages of prepared text, for each size of
   ``--startup_mb``; and what counting that text would take at the measured rate.

The text is real (Leipzig sentences of 75 languages and the public-domain English of
``../shared/data``, or Python's documentation topics), shuffled into documents of 4
lines and repeated to size.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import lzma
import multiprocessing
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from xlmeta_jax import errors
from xlmeta_jax.data import languages, prepare, shards, text_files, token_cache, vocabulary
from xlmeta_jax.data import task_names as names

_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "..", "shared", "data")


def _pool(shared: str) -> list[str]:
    """Distinct real lines to build text from."""
    lines = []
    leipzig = os.path.join(shared, "leipzig_sentences", "sentences")
    if os.path.isdir(leipzig):
        for name in sorted(os.listdir(leipzig)):
            with open(os.path.join(leipzig, name), encoding="utf-8") as f:
                lines.extend(line.strip() for line in f if line.strip())
    shakespeare = os.path.join(shared, "english_pd", "tinyshakespeare")
    for root, _, found in os.walk(shakespeare):
        for name in sorted(found):
            if name.endswith(".txt"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    lines.extend(line.strip() for line in f if len(line.strip()) > 20)
    if not lines:
        import pydoc_data.topics  # noqa: PLC0415 - only without the shared data

        lines = [line.strip() for text in pydoc_data.topics.topics.values()
                 for line in text.splitlines() if len(line.strip()) > 20]
    return lines


def _text(pool: Sequence[str], nbytes: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out, size, order = [], 0, list(pool)
    while size < nbytes:
        rng.shuffle(order)
        for i in range(0, len(order) - 4, 4):
            doc = ("\n".join(order[i:i + 4]) + "\n\n").encode()
            out.append(doc)
            size += len(doc)
            if size >= nbytes:
                break
    return b"".join(out)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def _timed(result: dict):
    wall, cpu = time.perf_counter(), _cpu()
    yield
    result["wall"], result["cpu"] = time.perf_counter() - wall, _cpu() - cpu


def _quiet_main(argv):
    with contextlib.redirect_stdout(io.StringIO()):
        return prepare.main(argv)


def _workers(n: int) -> list[str]:
    return [] if n == 1 else [f"--direct_num_workers={n}",
                              "--direct_running_mode=multi_processing"]


def _xz_inputs(work: str, name: str, mb: float, files: int, pool) -> tuple[str, list[str]]:
    """``files`` .xz files of ``mb`` MB of text in all, and the same text uncompressed."""
    inputs = os.path.join(work, name)
    os.makedirs(inputs, exist_ok=True)
    plain = []
    for k, lang in enumerate(languages.XLMR_LANGUAGES[:files]):
        data = _text(pool, int(mb * 1_000_000) // files, seed=k)
        plain.append(os.path.join(work, f"{name}_plain_{lang}.txt"))
        with open(plain[-1], "wb") as f:
            f.write(data)
        with open(os.path.join(inputs, f"{lang}.txt.xz"), "wb") as f:
            f.write(lzma.compress(data, preset=1))
    return inputs, plain


def bench_prepare(work: str, mb: int, files: int, pool) -> dict:
    """MB/s of prepare with 1 and 2 workers, and of today's one-process path."""
    inputs, plain = _xz_inputs(work, "xz", mb, files, pool)
    tiny, _ = _xz_inputs(work, "tiny", 0.1, files, pool)
    out = {"text_mb": sum(os.path.getsize(p) for p in plain) / 1e6}
    for n in (1, 2):
        # The same job on 100 kB: what does not grow with the data (start, plan, finish).
        r = {}
        with _timed(r):
            _quiet_main([f"--input={tiny}/*", f"--output={work}/tiny{n}", "--overwrite",
                         *_workers(n)])
        out[f"fixed_{n}"] = r
        r = {}
        with _timed(r):
            _quiet_main([f"--input={inputs}/*", f"--output={work}/out{n}", "--overwrite",
                         *_workers(n)])
        out[f"prepare_{n}"] = r
    for n in (1, 2):  # the machine's ceiling: the same per-file work, n plain processes
        r = {}
        split = functools.partial(_split_one, out=os.path.join(work, f"plain{n}"))
        with _timed(r), multiprocessing.get_context("spawn").Pool(n) as pool_n:
            pool_n.map(split, sorted(os.listdir(inputs)), chunksize=1)
        out[f"plain_{n}"] = r
    ref, count = {}, {}
    with _timed(ref):  # today: xz -dc | gzip -1, then the counting pass, one process
        for k, lang in enumerate(languages.XLMR_LANGUAGES[:files]):
            with lzma.open(os.path.join(inputs, f"{lang}.txt.xz")) as f:
                data = f.read()
            with open(os.path.join(work, f"manual_{k}.txt.gz"), "wb") as g:
                g.write(gzip.compress(data, compresslevel=1))
            text_files.scan_text_file(os.path.join(work, f"manual_{k}.txt.gz"))
    with _timed(count):
        for path in plain:
            text_files.scan_text_file(path)
    out["today"], out["counting"] = ref, count
    return out


def _split_one(name: str, *, out: str) -> None:
    """``prepare``'s work on one input file, without Beam (see bench_prepare)."""
    os.makedirs(out, exist_ok=True)
    shards.split_file(os.path.join(os.path.dirname(out), "xz", name),
                      lambda p: open(p, "rb"), lambda p: open(p, "wb"),  # noqa: SIM115
                      os.path.join(out, name), shard_bytes=prepare.DEFAULT_SHARD_BYTES)


CACHE_SHARDS_PER_LANGUAGE = 8


def bench_cache(work: str, mb: int, files: int, pool, vocab: str) -> dict:
    """Tokens/s of the token cache job on ``mb`` MB of prepared text, 1 vs 2 workers.

    The same job on 0.1 MB (as many shards) gives its fixed part: the workers' start,
    each registering the tasks, and seqio's pipeline per shard.
    """
    out = {}
    for name, size in (("cache", mb), ("cache_fixed", 0.1)):
        for n, r in _cache_runs(work, name, size, files, pool, vocab).items():
            out[f"{name}_{n}"] = r
    return out


def _cache_runs(work: str, name: str, mb: float, files: int, pool, vocab: str) -> dict:
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio and TensorFlow, on use

    inputs, _ = _xz_inputs(work, f"{name}_xz", mb, files, pool)
    folder = os.path.join(work, f"{name}_prepared")
    # Several shards per language, as CC-100's languages have (256 MB each): a task's
    # shards are what its cache job spreads over the workers.
    shard_bytes = max(1, int(mb * 1_000_000) // (files * CACHE_SHARDS_PER_LANGUAGE))
    _quiet_main([f"--input={inputs}/*", f"--output={folder}", "--overwrite",
                 f"--shard_bytes={shard_bytes}"])
    langs = sorted({n.split(".txt")[0] for n in os.listdir(folder) if ".txt-" in n})
    tasks.register(vocab_path=vocab, cc100_dir=folder, languages=langs, count_unit="lines")
    out = {}
    for n in (1, 2):
        r = {}
        with _timed(r), contextlib.redirect_stdout(io.StringIO()):
            dirs = token_cache.cache_tasks([names.cc100_task(lang) for lang in langs],
                                           os.path.join(work, f"{name}{n}"), overwrite=True,
                                           beam_args=_workers(n))
        r["tokens"] = sum(json.load(open(os.path.join(d, "stats.train.json")))["tokens_tokens"]
                          for d in dirs)
        out[n] = r
    return out


def bench_startup(work: str, sizes_mb: Sequence[int], pool, vocab: str) -> dict:
    """Launch-to-first-step seconds of the trainer on 100 prepared languages per size."""
    out = {}
    gin = os.path.join(work, "startup.gin")
    with open(gin, "w") as f:
        f.write("\n".join([
            "import xlmeta_jax.pretrain.trainer", "include 'pretrain.gin'",
            "include 'native/run.gin'", "include 'data/cc100.gin'", "MODEL_DIR = %gin.REQUIRED",
            "xlmeta_jax.pretrain.trainer.train.phases = [@xlmeta_jax.pretrain.trainer.Phase()]",
            "xlmeta_jax.pretrain.trainer.Phase.name = 'xlmr'",
            "xlmeta_jax.pretrain.trainer.Phase.task = 'xlmeta_cc100'",
            "xlmeta_jax.pretrain.trainer.Phase.num_steps = 1",
            "xlmeta_jax.pretrain.trainer.Phase.batch_size = 8",
            "xlmeta_jax.pretrain.trainer.Phase.sequence_length = 32",
            "xlmeta_jax.pretrain.trainer.train.log_every = 1", ""]))
    for mb in sizes_mb:
        inputs = os.path.join(work, f"startup_in_{mb}")
        os.makedirs(inputs, exist_ok=True)
        for k, lang in enumerate(languages.XLMR_LANGUAGES):
            with open(os.path.join(inputs, f"{lang}.txt"), "wb") as f:
                f.write(_text(pool, mb * 1_000_000 // 100, seed=k))
        folder = os.path.join(work, f"startup_{mb}")
        r = {}
        with _timed(r):
            _quiet_main([f"--input={inputs}/*", f"--output={folder}", "--overwrite",
                         *_workers(os.cpu_count() or 1)])
        cmd = [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=models/tiny.gin",
               f"--gin_file={gin}", f"--gin.MODEL_DIR='{work}/startup_run_{mb}'",
               f"--gin.VOCAB_PATH='{vocab}'", f"--gin.CC100_DIR='{folder}'",
               "--gin.LEARNING_RATE=1e-3", "--gin.WARMUP_STEPS=1",
               "--gin.xlmeta_jax.model.network.get_config.vocab_size=4000"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=os.path.dirname(os.path.dirname(
                                    os.path.dirname(os.path.abspath(__file__)))))
        first, counted, lines = None, False, []
        for line in proc.stdout:
            lines.append(line)
            counted |= "counting" in line
            if first is None and "[xlmr] step 1/1" in line:
                first = time.perf_counter() - t0
        proc.wait()
        if proc.returncode or first is None:
            raise RuntimeError(f"the start-up run failed ({proc.returncode}): {' '.join(cmd)}\n"
                               + "".join(lines[-20:]))
        out[mb] = {"first_step": first, "counted": counted, "prepare": r,
                   "text_mb": sum(os.path.getsize(os.path.join(inputs, n))
                                  for n in os.listdir(inputs)) / 1e6}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.prepare_bench`` (see the module docstring)."""
    parser = errors.ArgumentParser(prog="python -m benchmarks.prepare_bench",
                                   description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--mb", type=int, default=1024, help="MB of text for part 1")
    parser.add_argument("--files", type=int, default=4, help=".xz files (languages)")
    parser.add_argument("--cache_mb", type=int, default=32, help="MB of text for part 2")
    parser.add_argument("--startup_mb", default="50,2000",
                        help="comma-separated sizes (MB of prepared text, 100 languages); "
                        "empty: skip part 3")
    parser.add_argument("--shared_data", default=_SHARED)
    parser.add_argument("--work_dir", help="scratch folder (default: a temporary one)")
    errors.add_debug_flag(parser)
    args = parser.parse_args(argv)
    if min(args.mb, args.files, args.cache_mb) <= 0:
        raise errors.UsageError("--mb, --files and --cache_mb must be > 0")
    sizes = [int(s) for s in args.startup_mb.split(",") if s]
    pool = _pool(args.shared_data)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work:
        p = bench_prepare(work, args.mb, args.files, pool)
        mb = p["text_mb"]
        print(f"prepare: {mb:.0f} MB of text in {args.files} .xz files, {os.cpu_count()} cores")
        print(f"{'path':<40} {'wall s':>8} {'MB/s':>8} {'MB/CPU-s':>9}")
        rows = [("prepare, 1 worker", p["prepare_1"]), ("prepare, 2 workers", p["prepare_2"]),
                ("ceiling: split_file, 1 process", p["plain_1"]),
                ("ceiling: split_file, 2 processes", p["plain_2"]),
                ("today: xz -dc, gzip -1, count (1 proc)", p["today"]),
                ("today: the counting pass alone", p["counting"])]
        for name, r in rows:
            print(f"{name:<40} {r['wall']:>8.2f} {mb / r['wall']:>8.1f} {mb / r['cpu']:>9.1f}")
        for n in (1, 2):
            print(f"{f'  of which fixed ({n} worker' + ('s' if n > 1 else '') + ', 100 kB)':<40} "
                  f"{p[f'fixed_{n}']['wall']:>8.2f}")
        speedup = p["prepare_1"]["wall"] / p["prepare_2"]["wall"]
        work_speedup = ((p["prepare_1"]["wall"] - p["fixed_1"]["wall"])
                        / (p["prepare_2"]["wall"] - p["fixed_2"]["wall"]))
        ceiling = p["plain_1"]["wall"] / p["plain_2"]["wall"]
        print(f"2 workers / 1 worker (wall): {speedup:.2f}x, less the fixed part "
              f"{work_speedup:.2f}x; the machine's ceiling (2 / 1 plain processes, same "
              f"work): {ceiling:.2f}x; 1 worker / today per CPU-second: "
              f"{p['today']['cpu'] / p['prepare_1']['cpu']:.2f}x")
        vocab = vocabulary.train_vocabulary(
            {"mix": [os.path.join(work, "xz_plain_*.txt")]}, os.path.join(work, "spm"), 4000,
            num_lines=20000, num_threads=2, print_report=False)
        c = bench_cache(work, args.cache_mb, args.files, pool, vocab)
        title = f"token cache, {args.cache_mb} MB of text"
        print(f"\n{title:<40} {'wall s':>8} {'tok/s':>10} {'tok/CPU-s':>10}")
        for n in (1, 2):
            r = c[f"cache_{n}"]
            print(f"{f'{n} worker' + ('s' if n > 1 else ''):<40} {r['wall']:>8.2f} "
                  f"{r['tokens'] / r['wall']:>10.0f} {r['tokens'] / r['cpu']:>10.0f}")
        print(f"{'  of which fixed (1 / 2 workers, 0.1 MB)':<40} "
              f"{c['cache_fixed_1']['wall']:>8.2f} / {c['cache_fixed_2']['wall']:.2f}")
        net = ((c["cache_1"]["wall"] - c["cache_fixed_1"]["wall"])
               / (c["cache_2"]["wall"] - c["cache_fixed_2"]["wall"]))
        print(f"2 workers / 1 worker (wall): {c['cache_1']['wall'] / c['cache_2']['wall']:.2f}x, "
              f"less the fixed part {net:.2f}x")
        if sizes:
            s = bench_startup(work, sizes, pool, vocab)
            rate = mb / p["counting"]["cpu"]
            print(f"\n{'start-up, 100 languages':<28} {'text MB':>8} {'first step s':>13} "
                  f"{'counted?':>9} {'counting it would take s':>25}")
            for size, r in s.items():
                print(f"{f'{size} MB prepared':<28} {r['text_mb']:>8.0f} {r['first_step']:>13.1f}"
                      f" {'yes' if r['counted'] else 'no':>9} {r['text_mb'] / rate:>25.0f}")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="benchmarks.prepare_bench")
