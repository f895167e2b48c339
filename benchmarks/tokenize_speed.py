"""Tokenization speed of a Hugging Face tokenizer in our pipeline, beside its own ceiling.

    python -m benchmarks.tokenize_speed [--vocab_size=65536] [--languages=40] [--repeat=4]
        [--rounds=3]

Trains a BPE of ``--vocab_size`` pieces (Gemma's id layout, ``hf_tokenizer.train_tokenizer``)
and a SentencePiece model of ours of the same size on FLORES-200 devtest of ``--languages``
languages (../shared/data), then tokenizes that text ``--repeat`` times, in one process, by:

1. **ceiling**: ``tokenizers``' own ``Tokenizer.encode_batch_fast`` on the lines, in batches
   of 4,096 (what the cache job's tokenize step calls per batch), with the library's thread
   pool (``TOKENIZERS_PARALLELISM`` as this process got it) and on one thread (``=false``,
   as our steps set it); ``encode_batch``, which also computes offsets, beside them;
2. **on the fly**: the pretraining tasks' tokenize step, ``preprocessors.tokenize_documents``
   in tf.data with the ``TokenizerVocabulary`` (what every host runs without a cache);
3. **the token cache**: ``token_cache.cache_tasks`` on a registered task of that text, one
   Beam DirectRunner worker in this process (``prepare --tokenize``'s job; it reads the text
   files and tokenizes them in Python, ``text_files.iter_entries`` and
   ``preprocessors.tokenize_entries``, then writes TFRecords), whole and less the job's
   fixed start-up (the same job on a one-document text: pipeline construction, pickling,
   the tokenizer's load), which a corpus of any size pays once; then its parts without
   Beam: the reading alone, the reading with the tokenize step, the step's tokenizer
   calls alone on paragraphs read beforehand, and the records' cutting and serialisation
   (the token figure of all four is the text's); then the same job reading the task as
   seqio reads it (``PreprocessTask``: the tf.data source and tokenize step), the job's
   path before its Python reading, and its tf.data source alone and with the step;
4. **our SentencePiece** through the same tf.data step and the same cache job: what the
   job costs whatever the tokenizer.

Each row runs once per round, every row in turn, ``--rounds`` times; a figure is the row's
best round, in tokens per CPU-second of this process (all its threads; ``resource``'s user
+ system time), and per second of wall time; each also as a ratio of two ceilings' best
CPU rates: ``encode_batch_fast`` (row 1, what our vocabulary calls, the stricter) and
``encode_batch`` (row 3, the ceiling the tokenization goal names); and the range, over the
rounds, of the ratio to row 1 measured in the same round.
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


def _register_english(vocab_path: str, text_dir: str) -> None:
    """Registers the English text task on the benchmark's files, as the cache job and the
    seqio rows read them (one ``</s>`` per document)."""
    from xlmeta_jax.data import corpora, tasks

    tasks.register(corpora.Corpora(vocab_path=vocab_path, english_files=[
        os.path.join(text_dir, "*.txt")], eos_after="document"))


def _cache_tokens(vocab_path: str, text_dir: str, cache_dir: str) -> int:
    import json

    from xlmeta_jax.data import task_names as names
    from xlmeta_jax.data import token_cache

    _register_english(vocab_path, text_dir)
    token_cache.cache_tasks([names.ENGLISH_TEXT_TASK], cache_dir, overwrite=True,
                            beam_args=["--direct_num_workers=1",
                                       "--direct_running_mode=in_memory"])
    stats = os.path.join(token_cache.task_folder(cache_dir, names.ENGLISH_TEXT_TASK),
                         "stats.train.json")
    with open(stats) as f:
        info = json.load(f)
    return int(info["tokens_tokens"])  # seqio counts the ids other than eos and pad


def _job_parts(vocab_path: str, text_dir: str, tokens: int):
    """The cache job's work without Beam, on the same text files: its Python reading alone
    (``text_files.iter_entries``), with its tokenize step (``preprocessors.tokenize_entries``),
    the step's tokenizer calls alone on the paragraphs read beforehand, and the records cut
    from the tokens and serialised (``token_cache.records_of``, ``serialized_example``).
    Each returns ``tokens``, the text's count."""
    from xlmeta_jax.data import preprocessors, text_files, token_cache, vocabulary

    vocab = vocabulary.load_vocabulary(vocab_path)
    paths = sorted(os.path.join(text_dir, n) for n in os.listdir(text_dir))

    def entries():
        for path in paths:
            yield from text_files.iter_entries(path, 1 << 20)

    def reading():
        for _ in entries():
            pass
        return tokens

    def tokenizing():
        for _ in preprocessors.tokenize_entries(entries(), vocab, "document"):
            pass
        return tokens

    texts = [e for e in entries() if e is not None]

    def calls():
        for i in range(0, len(texts), preprocessors._ENTRIES_PER_CALL):
            vocab.encode_batch(texts[i:i + preprocessors._ENTRIES_PER_CALL])
        return tokens

    runs = list(preprocessors.tokenize_entries(entries(), vocab, "document"))

    def writing():
        records = token_cache.records_of(runs, "document", vocab.specials.sep)
        for record in records:
            token_cache.serialized_example({"tokens": record})
        return tokens

    return reading, tokenizing, calls, writing


def _seqio_parts(vocab_path: str, text_dir: str, tokens: int):
    """The same work as seqio reads it, without Beam: the task's tf.data source alone, and
    with its tokenize step (``task.preprocess_precache``). Each returns ``tokens``."""
    import seqio

    from xlmeta_jax.data import task_names as names

    def part(tokenize: bool):
        def run():
            _register_english(vocab_path, text_dir)
            task = seqio.get_mixture_or_task(names.ENGLISH_TEXT_TASK)
            ds = task.source.get_dataset(split="train", shuffle=False)
            if tokenize:
                ds = task.preprocess_precache(ds)
            for _ in ds.as_numpy_iterator():
                pass
            return tokens
        return run

    return part(False), part(True)


def _through_seqio(fn):
    """``fn`` with every task cached as seqio reads it (``PreprocessTask``: the tf.data
    source and tokenize step), the job's path before its Python reading."""
    from xlmeta_jax.data import token_cache

    def run():
        python_reading = token_cache.python_reading
        token_cache.python_reading = lambda task: None
        try:
            return fn()
        finally:
            token_cache.python_reading = python_reading
    return run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab_size", type=int, default=65536)
    parser.add_argument("--languages", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from xlmeta_jax.data import hf_tokenizer, preprocessors, vocabulary

    per_call = preprocessors._ENTRIES_PER_CALL
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

    def tokenizers_own(method, parallelism):
        """``method`` with ``TOKENIZERS_PARALLELISM`` as given (None: unset), then set back
        to ``false``, as our steps set it for every other row."""
        def run():
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
            if parallelism is not None:
                os.environ["TOKENIZERS_PARALLELISM"] = parallelism
            n = 0
            for _ in range(args.repeat):
                for i in range(0, len(lines), per_call):
                    n += sum(len(e.ids) for e in getattr(vocab.tokenizer, method)(
                        lines[i:i + per_call], add_special_tokens=False))
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            return n
        return run

    one_doc = os.path.join(work, "one")
    os.makedirs(one_doc)
    with open(os.path.join(one_doc, "one.txt"), "w", encoding="utf-8") as f:
        f.write(lines[0] + "\n")

    def cache_job(path, name, text=text_dir):
        return lambda: _cache_tokens(path, text, os.path.join(work, name))

    # Rows 1 and 3 run as the process got TOKENIZERS_PARALLELISM (the library's thread pool
    # unless it was set false); the rest with our steps' setting, false.
    pool = os.environ.get("TOKENIZERS_PARALLELISM")
    # (name, what is measured, the job's fixed start-up where it is a cache job)
    rows = [(f"encode_batch_fast, thread pool ({pool or 'unset'}) = ceiling",
             tokenizers_own("encode_batch_fast", pool), None),
            ("encode_batch_fast, one thread", tokenizers_own("encode_batch_fast", "false"), None),
            ("encode_batch (with offsets), thread pool", tokenizers_own("encode_batch", pool),
             None),
            ("on the fly: tf.data tokenize step", _tf_tokens(vocab, lines, args.repeat), None),
            ("token cache: Beam DirectRunner, 1 worker", cache_job(folder, "cache"),
             cache_job(folder, "start", one_doc)),
            *((name, fn, None) for name, fn in zip(
                ("  its reading alone: text files to paragraphs",
                 "  its reading + tokenize step, without Beam",
                 "  its tokenizer calls alone",
                 "  its records' cutting + serialisation alone"),
                _job_parts(folder, text_dir, _ceiling_tokens(vocab, lines, args.repeat)))),
            ("token cache read as seqio reads (tf.data)",
             _through_seqio(cache_job(folder, "cache_tf")),
             _through_seqio(cache_job(folder, "start_tf", one_doc))),
            *((name, fn, None) for name, fn in zip(
                ("  its source alone: text files to paragraphs",
                 "  its source + tokenize step, without Beam"),
                _seqio_parts(folder, text_dir, _ceiling_tokens(vocab, lines, args.repeat)))),
            ("our SentencePiece: tf.data tokenize step", _tf_tokens(ours, lines, args.repeat),
             None),
            ("our SentencePiece: token cache, 1 worker", cache_job(spm, "cache_spm"),
             cache_job(spm, "start_spm", one_doc))]
    # Warm-up (the tokenizers' thread pool first, as the process got it; TensorFlow's first
    # graph; Beam's first job) outside the figures.
    vocab.tokenizer.encode_batch_fast(lines[:2000], add_special_tokens=False)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tf_tokens(vocab, lines[:2000], 1)()
    _tf_tokens(ours, lines[:2000], 1)()
    cache_job(folder, "warm", one_doc)()
    # Rounds of every row in turn: this shared machine's speed drifts over minutes, so a
    # row's best round and each round's ratio to that round's ceiling are what compare.
    rounds = {}  # name -> [(tokens, cpu, wall)] per round
    startups = {}  # the start-up row's name -> its CPU-s per round
    for _ in range(args.rounds):
        for name, fn, start in rows:
            tokens, cpu, wall = _measure(fn)
            rounds.setdefault(name, []).append((tokens, cpu, wall))
            if start is not None:
                _, s_cpu, s_wall = _measure(start)
                rounds.setdefault(f"  less its start-up ({name})", []).append(
                    (tokens, cpu - s_cpu, wall - s_wall))
                startups.setdefault(f"  less its start-up ({name})", []).append(s_cpu)
    # Two ratio columns: to row 1 (encode_batch_fast, what our vocabulary calls) and to row
    # 3 (encode_batch, the ceiling as the issue of record names it); then the range of the
    # ratio to row 1 over the rounds.
    print(f"{args.rounds} rounds; the best round of each row:")
    print(f"{'path':48s} {'tokens':>10s} {'tok/CPU-s':>11s} {'tok/s':>11s} {'x fast':>7s} "
          f"{'x encode_batch':>14s} {'x fast by round':>16s}")
    names = list(rounds)
    fast, batch = rounds[names[0]], rounds[names[2]]
    for name in names:
        tokens, cpu, wall = min(rounds[name], key=lambda m: m[1])
        best = min(m[1] for m in fast)
        by_round = [f[1] / m[1] for m, f in zip(rounds[name], fast)]
        label = (f"  less its start-up ({min(startups[name]):.1f} CPU-s)"
                 if name in startups else name)
        print(f"{label:48s} {tokens:10d} {tokens / cpu:11,.0f} {tokens / wall:11,.0f} "
              f"{best / cpu:7.2f} {min(m[1] for m in batch) / cpu:14.2f} "
              f"{min(by_round):7.2f}-{max(by_round):.2f}")


if __name__ == "__main__":
    main()
