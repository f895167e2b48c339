"""Tokenization speed of a Hugging Face tokenizer in our pipeline, beside its own ceiling.

    python -m benchmarks.tokenize_speed [--vocab_size=65536] [--languages=40] [--repeat=4]

Trains a BPE of ``--vocab_size`` pieces (Gemma's id layout, ``hf_tokenizer.train_tokenizer``)
and a SentencePiece model of ours of the same size on FLORES-200 devtest of ``--languages``
languages (../shared/data), then tokenizes that text ``--repeat`` times, in one process, by:

1. **ceiling**: ``tokenizers``' own ``Tokenizer.encode_batch_fast`` on the lines, in batches
   of 256 (what ``TokenizerVocabulary.encode_batch`` calls), with the library's thread pool
   (``TOKENIZERS_PARALLELISM`` as this process got it) and on one thread (``=false``, as
   the tf.data step sets it); ``encode_batch``, which also computes offsets, beside them;
2. **on the fly**: the pretraining tasks' tokenize step, ``preprocessors.tokenize_documents``
   in tf.data with the ``TokenizerVocabulary`` (what every host runs without a cache);
3. **the token cache**: ``token_cache.cache_tasks`` on a registered task of that text, one
   Beam DirectRunner worker in this process (``prepare --tokenize``'s job; it reads the text
   files, runs the same step, then writes TFRecords), whole and less the job's fixed
   start-up (the same job on a one-document text: pipeline construction, pickling, the
   tokenizer's load), which a corpus of any size pays once; then its parts without Beam:
   the task's source alone (the text files read into paragraphs), with the tokenize
   step, and the tokenize step's vocabulary calls on the source's elements from a Python
   loop instead of tf.data (the token figure of all three is the text's);
4. **our SentencePiece** through the same tf.data step and the same cache job: what the
   job costs whatever the tokenizer.

Each figure is the better of two runs, in tokens per CPU-second of this process (all its
threads; ``resource``'s user + system time), and per second of wall time; each also as a
ratio of two ceilings' CPU rates: ``encode_batch_fast`` (row 1, what our vocabulary calls,
the stricter) and ``encode_batch`` (row 3, the ceiling the tokenization goal names).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                       "shared", "data")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def _measure(fn) -> tuple[int, float, float]:
    cpu, wall = _cpu(), time.perf_counter()
    tokens = fn()
    return tokens, _cpu() - cpu, time.perf_counter() - wall


def _flores(languages: int) -> list[str]:
    folder = os.path.join(_SHARED, "flores200", "devtest")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".devtest"))[:languages]
    return [line for n in names for line in open(os.path.join(folder, n), encoding="utf-8")
            .read().splitlines() if line.strip()]


def _tf_tokens(vocab, lines, repeat: int):
    """The tokenize step's pipeline on ``lines``; iterating it is what is measured."""
    import seqio
    import tensorflow as tf

    from xlmeta_jax.data import preprocessors

    features = {"targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32)}
    ds = tf.data.Dataset.from_tensor_slices(
        {"text": lines, "ends_document": [True] * len(lines)}).repeat(repeat).batch(256)
    out = preprocessors.tokenize_documents(ds, features, eos_after="document")
    return lambda: sum(int(ex["tokens"].size) for ex in out.as_numpy_iterator()) - len(
        lines) * repeat


def _ceiling_tokens(vocab, lines, repeat: int) -> int:
    return repeat * sum(len(ids) for ids in vocab.encode_batch(lines))


def _cache_tokens(vocab_path: str, text_dir: str, cache_dir: str) -> int:
    import json

    from xlmeta_jax.data import corpora, tasks, token_cache
    from xlmeta_jax.data import task_names as names

    tasks.register(corpora.Corpora(vocab_path=vocab_path, english_files=[
        os.path.join(text_dir, "*.txt")], eos_after="document"))
    token_cache.cache_tasks([names.ENGLISH_TEXT_TASK], cache_dir, overwrite=True,
                            beam_args=["--direct_num_workers=1",
                                       "--direct_running_mode=in_memory"])
    stats = os.path.join(token_cache.task_folder(cache_dir, names.ENGLISH_TEXT_TASK),
                         "stats.train.json")
    with open(stats) as f:
        info = json.load(f)
    return int(info["tokens_tokens"])  # seqio counts the ids other than eos and pad


def _job_parts(vocab_path: str, text_dir: str, tokens: int):
    """The cache job's work without Beam, on the same text files: the task's source alone
    (text files to paragraphs), then with its steps before the cache placeholder (the
    tokenize step). Each returns ``tokens``, the text's count (the source holds text)."""
    import seqio

    from xlmeta_jax.data import corpora, tasks
    from xlmeta_jax.data import task_names as names

    def part(tokenize: bool):
        def run():
            tasks.register(corpora.Corpora(vocab_path=vocab_path, english_files=[
                os.path.join(text_dir, "*.txt")], eos_after="document"))
            task = seqio.get_mixture_or_task(names.ENGLISH_TEXT_TASK)
            ds = task.source.get_dataset(split="train", shuffle=False)
            if tokenize:
                ds = task.preprocess_precache(ds)
            for _ in ds.as_numpy_iterator():
                pass
            return tokens
        return run
    def calls():
        # The tokenize step's vocabulary calls on the source's elements, from a Python loop:
        # what the step costs less tf.data's execution of it (elements read beforehand).
        for element in elements:
            vocab.encode_flat(element["text"])
        return tokens

    tasks.register(corpora.Corpora(vocab_path=vocab_path, english_files=[
        os.path.join(text_dir, "*.txt")], eos_after="document"))
    task = seqio.get_mixture_or_task(names.ENGLISH_TEXT_TASK)
    vocab = task.output_features["targets"].vocabulary
    elements = list(task.source.get_dataset(split="train", shuffle=False).as_numpy_iterator())
    return part(False), part(True), calls


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_size", type=int, default=65536)
    parser.add_argument("--languages", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args(argv)

    from xlmeta_jax.data import hf_tokenizer, vocabulary

    lines = _flores(args.languages)
    work = tempfile.mkdtemp(prefix="tokenize_speed.")
    folder = os.path.join(work, "bpe")
    t0 = time.perf_counter()
    hf_tokenizer.train_tokenizer(folder, lines, args.vocab_size)
    spm = vocabulary.train_sentencepiece(os.path.join(work, "spm"), min(args.vocab_size, 64000),
                                         sentences=lines, num_threads=2)
    print(f"FLORES-200 devtest, {args.languages} languages: {len(lines)} lines x "
          f"{args.repeat}; BPE of {args.vocab_size} ids and SentencePiece of "
          f"{min(args.vocab_size, 64000)} pieces trained in {time.perf_counter() - t0:.0f} s")
    vocab = vocabulary.load_vocabulary(folder)
    ours = vocabulary.load_vocabulary(spm)
    text_dir = os.path.join(work, "text")
    os.makedirs(text_dir)
    with open(os.path.join(text_dir, "flores.txt"), "w", encoding="utf-8") as f:
        f.write("".join(f"{line}\n\n" for line in lines * args.repeat))

    def tokenizers_own(method, parallelism=None):
        def run():
            saved = os.environ.get("TOKENIZERS_PARALLELISM")
            if parallelism is not None:
                os.environ["TOKENIZERS_PARALLELISM"] = parallelism
            n = 0
            for _ in range(args.repeat):
                for i in range(0, len(lines), 256):
                    n += sum(len(e.ids) for e in getattr(vocab.tokenizer, method)(
                        lines[i:i + 256], add_special_tokens=False))
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
            if saved is not None:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
            return n
        return run

    one_doc = os.path.join(work, "one")
    os.makedirs(one_doc)
    with open(os.path.join(one_doc, "one.txt"), "w", encoding="utf-8") as f:
        f.write(lines[0] + "\n")
    startup = {}

    def cache_job(path, name):
        return lambda: _cache_tokens(path, text_dir, os.path.join(work, name))

    def startup_of(path, name):
        _, cpu, wall = _measure(lambda: _cache_tokens(path, one_doc, os.path.join(work, name)))
        startup[name] = (cpu, wall)

    pool = os.environ.get("TOKENIZERS_PARALLELISM", "unset")
    rows = [(f"encode_batch_fast, thread pool ({pool}) = ceiling",
             tokenizers_own("encode_batch_fast")),
            ("encode_batch_fast, one thread", tokenizers_own("encode_batch_fast", "false")),
            ("encode_batch (with offsets), thread pool", tokenizers_own("encode_batch")),
            ("on the fly: tf.data tokenize step", _tf_tokens(vocab, lines, args.repeat)),
            ("token cache: Beam DirectRunner, 1 worker", cache_job(folder, "cache")),
            *zip(("  its source alone: text files to paragraphs",
                  "  its source + tokenize step, without Beam",
                  "  the step's tokenizer calls, from Python"),
                 _job_parts(folder, text_dir, _ceiling_tokens(vocab, lines, args.repeat))),
            ("our SentencePiece: tf.data tokenize step", _tf_tokens(ours, lines, args.repeat)),
            ("our SentencePiece: token cache, 1 worker", cache_job(spm, "cache_spm"))]
    # Warm-up (the tokenizers' thread pool first, as the process got it; TensorFlow's first
    # graph; Beam's first job) outside the figures.
    vocab.tokenizer.encode_batch_fast(lines[:2000], add_special_tokens=False)
    _tf_tokens(vocab, lines[:2000], 1)()
    _tf_tokens(ours, lines[:2000], 1)()
    startup_of(folder, "warm")
    # The tf.data step set TOKENIZERS_PARALLELISM=false where it was unset: rows 1 and 3
    # run as the process got it, the rest with the step's setting.
    os.environ.pop("TOKENIZERS_PARALLELISM", None)
    if pool != "unset":
        os.environ["TOKENIZERS_PARALLELISM"] = pool
    # Two ratio columns: to row 1 (encode_batch_fast, what our vocabulary calls) and to row
    # 3 (encode_batch, the ceiling as the issue of record names it).
    print(f"{'path':48s} {'tokens':>10s} {'tok/CPU-s':>11s} {'tok/s':>11s} {'x fast':>7s} "
          f"{'x encode_batch':>14s}")
    measured = []
    for name, fn in rows:
        # The better of two runs: this shared machine's rates vary between runs.
        tokens, cpu, wall = min((_measure(fn) for _ in range(2)), key=lambda m: m[1])
        measured.append((name, tokens, tokens / cpu, tokens / wall))
        if "cache" in name:
            key = "start_spm" if "SentencePiece" in name else "start"
            startup_of(spm if key == "start_spm" else folder, key)
            s_cpu, s_wall = startup[key]
            measured.append((f"  less its start-up ({s_cpu:.1f} CPU-s)", tokens,
                             tokens / (cpu - s_cpu), tokens / (wall - s_wall)))
    fast, batch = measured[0][2], measured[2][2]
    for name, tokens, rate, wall_rate in measured:
        print(f"{name:48s} {tokens:10d} {rate:11,.0f} {wall_rate:11,.0f} {rate / fast:7.2f} "
              f"{rate / batch:14.2f}")

if __name__ == "__main__":
    main()
