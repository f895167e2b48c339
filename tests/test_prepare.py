"""``python -m xlmeta_jax.data.prepare`` on Beam's DirectRunner: CC-100 ``.xz`` files to
shards, statistics, the vocabulary's sample and seqio's token cache.

The inputs are Leipzig sentences (``../shared/data``) in CC-100's layout, compressed to
``.xz`` (one language also as ``.gz``, one plain, one in two files), with a line that is
not UTF-8, an over-long line and whitespace-only document breaks. Checked against the
one-process code on the same text: the lines and documents of every language, the
counts (``text_files.corpus_stats``), the mixture rates, the vocabulary's line sample
(``line_sample``) and the batches of the on-the-fly pipeline; two workers against one.
"""

from __future__ import annotations

import collections
import errno
import glob
import gzip
import json
import logging
import lzma
import os
import shutil

import numpy as np
import pytest
import reader_documents
from data_toy import cached_documents

pytest.importorskip("apache_beam")
seqio = pytest.importorskip("seqio")

from xlmeta_jax import errors  # noqa: E402
from xlmeta_jax.data import (  # noqa: E402
    feeding,
    folders,
    line_sample,
    prepare,
    prepared,
    tasks,
    text_files,
    token_cache,
    vocabulary,
)
from xlmeta_jax.data import task_names as names  # noqa: E402
from xlmeta_jax.model import mlm, partitioning  # noqa: E402

# Lines per language (af fits one shard: the cache's batches are compared on it).
LINES = {"en": 600, "de": 400, "sw": 300, "af": 40}
LONG = 2000  # --max_line_bytes of the job: one line of each .xz input is longer
SHARD_BYTES = 20_000


def _documents(lines, lang):
    """4 lines a document; a whitespace-only line between some, a CRLF in others."""
    out = []
    for i in range(0, len(lines), 4):
        doc = lines[i:i + 4]
        if lang == "de" and i % 8 == 0:
            doc = [doc[0] + "\r", *doc[1:]]
        out.append(doc)
    return out


def _write_input(folder, lang, lines):
    """The language's text as bytes, with the lines the reader drops mixed in."""
    docs = _documents(lines, lang)
    parts = []
    for k, doc in enumerate(docs):
        body = [line.encode() for line in doc]
        if k == 3:
            body.insert(1, b"\xff\xfe not UTF-8")
            body.insert(2, b"x" * (LONG + 1))
        parts.append(b"\n".join(body) + (b"\n  \n" if k % 5 == 0 else b"\n\n"))
    return b"".join(parts)


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("prepare")
    source = os.path.join(shared_data, "leipzig_sentences", "sentences")
    inputs, plain = root / "cc100-xz", root / "plain"
    inputs.mkdir()
    plain.mkdir()
    for lang, n in LINES.items():
        with open(os.path.join(source, f"{lang}.txt"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()][:n]
        data = _write_input(inputs, lang, lines)
        (plain / f"{lang}.txt").write_bytes(data)
        if lang == "de":
            (inputs / "de.txt.gz").write_bytes(gzip.compress(data, mtime=0))
        elif lang == "af":
            (inputs / "af.txt").write_bytes(data)
        elif lang == "sw":  # two files of one language, in name order
            cut = data.index(b"\n\n", len(data) // 2) + 2
            (inputs / "sw.txt.0.xz").write_bytes(lzma.compress(data[:cut]))
            (inputs / "sw.txt.1.xz").write_bytes(lzma.compress(data[cut:]))
        else:
            (inputs / f"{lang}.txt.xz").write_bytes(lzma.compress(data))
    out = root / "out"
    flags = [f"--input={inputs}/*", f"--output={out}", f"--shard_bytes={SHARD_BYTES}",
             f"--max_line_bytes={LONG}", "--vocab_sample_lines=700", "--alpha=0.3",
             "--seed=3"]
    assert prepare.main(flags) == 0
    # A vocabulary from the prepared sample alone, then the token cache written with it.
    from xlmeta_jax.data import vocabulary

    vocab = vocabulary.train_vocabulary(None, str(root / "spm" / "toy"), 600, num_threads=2,
                                        print_report=False, prepared_dir=str(out))
    assert prepare.main([*flags, "--overwrite", "--tokenize", f"--vocab={vocab}"]) == 0
    return {"root": root, "inputs": inputs, "plain": plain, "out": out, "flags": flags,
            "vocab": vocab}


def _plain(corpus, lang):
    return str(corpus["plain"] / f"{lang}.txt")


def _shards(corpus, lang, out=None):
    return sorted(glob.glob(os.path.join(out or corpus["out"], f"{lang}.txt-*-of-*.gz")))


def test_shards_keep_every_document_whole_and_every_line(corpus):
    out = corpus["out"]
    assert (out / "COMPLETED").exists() and not (out / prepared.TEMP_DIR).exists()
    for lang in LINES:
        files = _shards(corpus, lang)
        assert files and all(f.endswith(f"-of-{len(files):05d}.gz") for f in files)
        # Every shard ends at a document end and none is cut: the documents of the shards
        # in order are the input's, and so is the multiset of lines.
        assert [d for f in files for d in reader_documents.documents(f, LONG)] == \
            reader_documents.documents(_plain(corpus, lang), LONG)
        got = collections.Counter(t for f in files for t in text_files.iter_paragraphs(f))
        want = collections.Counter(text_files.iter_paragraphs(_plain(corpus, lang), LONG))
        assert got == want and sum(want.values()) == LINES[lang]
        if lang != "af":
            assert len(files) > 1
    # The CC-100 task reads them: {lang}.txt*.
    assert len(text_files.list_text_files(str(out / "sw.txt*"), what="sw")) == len(
        _shards(corpus, "sw"))


def test_statistics_equal_the_counting_pass(corpus, tmp_path):
    stats = json.loads((corpus["out"] / prepared.STATS_FILENAME).read_text())
    languages = stats[text_files.PREPARED_KEY]["languages"]
    for lang in LINES:
        ref = text_files.corpus_stats([_plain(corpus, lang)], max_line_bytes=LONG,
                                      cache_dir=str(tmp_path))[0]
        for key in ("lines", "documents", "text_bytes", "skipped_invalid_utf8",
                    "skipped_long_lines"):
            assert languages[lang][key] == getattr(ref, key), (lang, key)
        # Per shard: exactly what the counting pass finds in it.
        for path in _shards(corpus, lang):
            entry = stats["files"][os.path.basename(path)]
            scan = text_files.scan_text_file(path, LONG)
            assert {k: entry[k] for k in entry} == {
                k: getattr(scan, k) for k in entry}, path
    assert languages["sw"]["inputs"] == sorted(str(p) for p in corpus["inputs"].glob("sw.*"))
    # corpus_stats reads them without counting, even where no host may count.
    files = _shards(corpus, "en")
    got = text_files.corpus_stats(files, max_line_bytes=LONG, count_missing=False)
    assert [s.lines for s in got] == [stats["files"][os.path.basename(f)]["lines"]
                                      for f in files]


@pytest.mark.parametrize("unit", ["tokens", "lines", "bytes"])
def test_mixture_rates_from_prepared_statistics_equal_counting(corpus, tmp_path, unit):
    copy = tmp_path / "copy"  # the same shards without the statistics: counted
    copy.mkdir()
    for lang in LINES:
        for path in _shards(corpus, lang):
            shutil.copy(path, copy)
    rates = []
    for folder in (corpus["out"], copy):
        tasks.register(vocab_path=corpus["vocab"], cc100_dir=str(folder),
                       languages=list(LINES), count_unit=unit, max_line_bytes=LONG)
        rates.append(tasks.language_probabilities(names.CC100_MIXTURE))
    assert rates[0] == rates[1]
    if unit != "tokens":  # in lines and bytes, the input files' own counts
        tasks.register(vocab_path=corpus["vocab"], cc100_dir=str(corpus["plain"]),
                       languages=list(LINES), count_unit=unit, max_line_bytes=LONG,
                       stats_cache_dir=str(tmp_path / "stats"))
        assert tasks.language_probabilities(names.CC100_MIXTURE) == rates[0]


def test_vocabulary_sample_is_line_samples(corpus, tmp_path):
    lines, q, meta = prepared.vocab_sample(str(corpus["out"]))
    want_lines, want_q = line_sample.sample_training_lines(
        {lang: [_plain(corpus, lang)] for lang in LINES}, num_lines=700, alpha=0.3, seed=3,
        max_line_bytes=LONG, stats_cache_dir=str(tmp_path))
    assert q == want_q and lines == want_lines
    assert sum(map(len, lines.values())) == 700 == meta["num_lines"]


def _iterator(task, **kw):
    mesh = partitioning.create_mesh(data=4, fsdp=2, tensor=1)
    return feeding.make_mlm_iterator(task, sequence_length=32, global_batch_size=16,
                                     mesh=mesh, seed=1, features=mlm.FEATURES,
                                     shuffle=False, num_epochs=1, **kw)


def test_token_cache_gives_the_batches_of_the_pipeline(corpus, own_cache_dirs):
    cache = corpus["out"] / prepared.CACHE_DIR
    task = names.cc100_task("af")  # one shard: one stream order to compare
    folder = cache / task
    assert (folder / "COMPLETED").exists()
    info = json.loads((folder / "info.train.json").read_text())
    assert info["xlmeta_eos_after"] == "line" and info["num_shards"] == 1
    for lang in LINES:  # a cache file per shard, every document once, records whole
        per_record = cached_documents(cache / names.cc100_task(lang), "line", vocabulary.EOS_ID)
        assert sum(per_record) == len(reader_documents.documents(_plain(corpus, lang), LONG))
        stats = json.loads((cache / names.cc100_task(lang) / "stats.train.json").read_text())
        assert stats["examples"] == len(per_record)
        assert len(glob.glob(str(cache / names.cc100_task(lang) / "train.tfrecord-*"))) == len(
            _shards(corpus, lang))
    tasks.register(vocab_path=corpus["vocab"])  # new Task objects: no remembered cache
    tasks.register(vocab_path=corpus["vocab"], cc100_dir=str(corpus["out"]),
                   languages=list(LINES), max_line_bytes=LONG)
    fly = _iterator(task)
    cached = _iterator(task, use_cached=True, cache_dir=str(cache))
    for _ in range(3):
        a, b = feeding.batch_to_numpy(next(cached)), feeding.batch_to_numpy(next(fly))
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _listing(folder):
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "**"), recursive=True)):
        if os.path.isfile(path):
            out[os.path.relpath(path, folder)] = path
    return out


@pytest.mark.slow
def test_two_workers_write_what_one_writes(corpus, tmp_path, capfd):
    other = tmp_path / "two"
    flags = [f if not f.startswith("--output=") else f"--output={other}"
             for f in corpus["flags"]]
    assert prepare.main([*flags, "--tokenize", f"--vocab={corpus['vocab']}",
                         "--direct_num_workers=2",
                         "--direct_running_mode=multi_processing"]) == 0
    # The job's own lines only: none of Beam's workers' or TensorFlow's start-up.
    captured = capfd.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    # (The mixture line of the cache job's tasks goes to the log, pytest's here.)
    assert [line.split(" ")[0] for line in lines
            if not line.startswith("xlmeta_cc100:")] == ["preparing", "wrote"], lines
    one, two = _listing(corpus["out"]), _listing(other)
    assert one.keys() == two.keys()
    for name in one:
        a, b = open(one[name], "rb").read(), open(two[name], "rb").read()
        if name == prepared.STATS_FILENAME:  # the shards' times differ, nothing else
            a, b = (json.loads(x) for x in (a, b))
            for x in (a, b):
                for entry in x["files"].values():
                    entry.pop("mtime_ns")
                for lang in x[text_files.PREPARED_KEY]["languages"].values():
                    lang.pop("inputs")
        assert a == b, name


def _damaged(folder, name, data):
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("case, name, expected", [
    ("damaged", "en.txt.xz", "damaged .xz"),
    ("truncated", "en.txt.xz", "truncated"),
    ("language", "zh.txt.xz", "zh-Hans"),
    ("not_xz", "en.txt.xz", "not an .xz file"),
    ("empty_xz", "en.txt.xz", "has no usable text"),
    ("empty_file", "en.txt", "has no usable text"),
    ("blank_only", "en.txt", "has no usable text"),
    ("half_not_utf8", "en.txt", "not valid UTF-8"),
])
def test_bad_inputs_name_the_file_and_leave_nothing(corpus, tmp_path, capsys, caplog, case,
                                                    name, expected):
    """One worker (the default runner) as quiet as two: the one line, and nothing Beam logs
    about the failed bundle (its traceback)."""
    text = (corpus["plain"] / "en.txt").read_bytes()
    good = lzma.compress(text)
    data = {"damaged": good[:200] + bytes(64) + good[264:],
            "truncated": good[: len(good) // 2],
            "language": good,
            "not_xz": b"plain text, not xz\n",
            "empty_xz": lzma.compress(b""),
            "empty_file": b"",
            "blank_only": b"  \n\n \t\n",
            "half_not_utf8": b"\n".join(b"\xff" + line if i % 2 else line
                                        for i, line in enumerate(text.split(b"\n")))}[case]
    folder = _damaged(tmp_path / "in", name, data)
    out = tmp_path / "out"
    code = errors.run_command(prepare.main, [f"--input={folder}/*", f"--output={out}"],
                              prog="xlmeta_jax.data.prepare")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(folder / name) in err[0] or (case == "language" and "'zh'" in err[0]), err
    assert expected in err[0], err
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not out.exists()


@pytest.mark.slow
def test_two_workers_say_a_bad_input_in_one_line(corpus, tmp_path, capfd):
    """The workers' own lines (a failed bundle's traceback) are not printed around it."""
    good = lzma.compress((corpus["plain"] / "en.txt").read_bytes())
    folder = _damaged(tmp_path / "in", "en.txt.xz", good[: len(good) // 2])
    (folder / "de.txt.xz").write_bytes(lzma.compress((corpus["plain"] / "de.txt").read_bytes()))
    out = tmp_path / "out"
    code = errors.run_command(prepare.main, [
        f"--input={folder}/*", f"--output={out}", "--direct_num_workers=2",
        "--direct_running_mode=multi_processing"], prog="xlmeta_jax.data.prepare")
    captured = capfd.readouterr()
    assert code == 2 and captured.err.strip().splitlines() == [
        f"xlmeta_jax.data.prepare: error: {folder / 'en.txt.xz'}: truncated (it ends before "
        "its compressed stream does: Compressed file ended before the end-of-stream marker "
        "was reached)"], captured.err
    assert captured.out.strip().splitlines() == [
        f"preparing 2 files of 2 languages into {out}"], captured.out
    assert not out.exists()


def test_output_in_the_way_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    flags = [f"--input={corpus['inputs']}/en.txt.xz", f"--output={out}"]
    for extra, words in (([], "is not empty"), (["--overwrite"], "did not write")):
        code = errors.run_command(prepare.main, flags + extra, prog="prepare")
        err = capsys.readouterr().err
        assert code == 2 and words in err and "notes.txt" in err
    assert os.listdir(out) == ["notes.txt"]


def test_the_cache_alone_needs_a_prepared_folder(corpus, tmp_path, capsys):
    """--tokenize without --input adds a cache to a prepared folder, and only there."""
    vocab = f"--vocab={corpus['vocab']}"
    for flags, words in (
            ([f"--output={tmp_path}"], "--input is required"),
            ([f"--output={tmp_path}", "--tokenize", vocab], "is not a folder this command "
             "prepared"),
            ([f"--output={corpus['out']}", "--tokenize", vocab], "holds a token cache already"),
            ([f"--output={corpus['out']}", "--tokenize", vocab, "--overwrite",
              "--languages=en,fr"], "holds no shards of ['fr']")):
        code = errors.run_command(prepare.main, flags, prog="prepare")
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and words in err[0], (flags, err)
    assert (corpus["out"] / prepared.CACHE_DIR / names.cc100_task("en") / "COMPLETED").exists()


# --------------------------------------------------------------------------- nothing lost


def _manifest(folder):
    """Every file under ``folder`` by its sha1 (what "left exactly as it was" compares)."""
    from errors_fixtures import digest

    return digest(folder)


def _siblings_gone(out):
    for suffix in (prepared.NEW_SUFFIX, prepared.OLD_SUFFIX):
        assert not os.path.exists(f"{out}{suffix}"), suffix
    for name in (prepared.NEW_CACHE_DIR, prepared.OLD_CACHE_DIR, prepared.TEMP_DIR):
        assert not (out / name).exists(), name


def _interrupt_after(calls):
    """A stand-in that raises KeyboardInterrupt (what SIGINT raises) on its ``calls``-th call
    and does the real work before that."""
    count = [0]

    def wrap(real):
        def fn(*args, **kwargs):
            count[0] += 1
            if count[0] == calls:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return fn
    return wrap


def _cut_input(corpus, folder):
    good = lzma.compress((corpus["plain"] / "en.txt").read_bytes())
    folder.mkdir()
    (folder / "en.txt.xz").write_bytes(good[: len(good) // 2])
    (folder / "de.txt.xz").write_bytes(lzma.compress((corpus["plain"] / "de.txt").read_bytes()))
    return folder


@pytest.mark.parametrize("case, code, part", [
    # A truncated input passes the header check; the job fails on it.
    ("full_bad_input", 2, "truncated"),
    ("full_interrupted_in_the_job", 130, "interrupted"),
    # Ctrl-C while the entries swap: the moves made are undone.
    ("full_interrupted_in_the_swap", 130, "interrupted"),
    ("cache_interrupted_in_the_job", 130, "interrupted"),
    ("cache_interrupted_in_the_swap", 130, "interrupted"),
])
def test_overwrite_keeps_the_old_folder_until_the_new_one_is_complete(
        corpus, tmp_path, capsys, monkeypatch, case, code, part):
    out = tmp_path / "out"
    shutil.copytree(corpus["out"], out)
    before = _manifest(out)
    vocab = f"--vocab={corpus['vocab']}"
    if case == "full_bad_input":
        inputs = _cut_input(corpus, tmp_path / "in")
        argv = [f"--input={inputs}/*", f"--output={out}", "--overwrite"]
    elif case.startswith("full"):
        argv = [*[f for f in corpus["flags"] if not f.startswith("--output=")],
                f"--output={out}", "--overwrite", "--tokenize", vocab]
        if case == "full_interrupted_in_the_job":  # the token cache job, half-written
            monkeypatch.setattr(token_cache, "cache_tasks", _interrupt_after(1)(None))
        else:  # the third entry of the new folder moving in
            monkeypatch.setattr(folders, "move", _interrupt_after(
                len(os.listdir(out)) + 3)(folders.move))
    else:
        argv = [f"--output={out}", "--tokenize", vocab, "--overwrite"]
        if case == "cache_interrupted_in_the_job":
            real = token_cache.cache_tasks

            def half(task_names, cache_dir, **kw):  # writes one task's cache, then Ctrl-C
                real(task_names[:1], cache_dir, **kw)
                raise KeyboardInterrupt
            monkeypatch.setattr(token_cache, "cache_tasks", half)
        else:  # the new cache's second task moving in, after the old tasks moved aside
            monkeypatch.setattr(folders, "move", _interrupt_after(
                len(os.listdir(out / prepared.CACHE_DIR)) + 2)(folders.move))
    got = errors.run_command(prepare.main, argv, prog="xlmeta_jax.data.prepare")
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code and len(err) == 1 and part in err[0], err
    if case == "full_bad_input":
        assert str(tmp_path / "in" / "en.txt.xz") in err[0]
    assert _manifest(out) == before
    _siblings_gone(out)


def test_overwrite_replaces_the_whole_folder_and_leaves_no_trace(corpus, tmp_path):
    """The swap's success path: the new folder's entries, and nothing of the old one's
    that the new job did not write (here the token cache)."""
    out = tmp_path / "out"
    shutil.copytree(corpus["out"], out)
    assert (out / prepared.CACHE_DIR).exists()
    flags = [f for f in corpus["flags"] if not f.startswith("--output=")]
    assert prepare.main([*flags, f"--output={out}", "--overwrite"]) == 0
    assert not (out / prepared.CACHE_DIR).exists()
    want = {k: v for k, v in _manifest(corpus["out"]).items()
            if not k.startswith(prepared.CACHE_DIR) and k != prepared.STATS_FILENAME}
    got = {k: v for k, v in _manifest(out).items() if k != prepared.STATS_FILENAME}
    assert got == want
    _siblings_gone(out)


# The command in a process of its own, whose token cache job sends the process a real
# SIGINT once it has written one language's cache.
_SIGINT_DRIVER = """
import os, signal, sys, threading
# As a shell starts a command: SIGINT raises KeyboardInterrupt, unblocked. A process
# inherits an ignored or blocked SIGINT from its parent (the test worker), and Python then
# keeps it ignored: the signal below would never arrive and pause() would wait forever.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
from xlmeta_jax import errors
from xlmeta_jax.data import prepare, token_cache
real = token_cache.cache_tasks
def half(task_names, cache_dir, **kw):
    real(task_names[:1], cache_dir, **kw)
    # To the main thread, where Python runs the handler: a signal to the process may be
    # taken by another thread, and pause() below would then wait for a second one.
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    signal.pause()  # the handler raises KeyboardInterrupt before this returns
token_cache.cache_tasks = half
errors.exit_with(prepare.main, prog="xlmeta_jax.data.prepare")
"""


@pytest.mark.parametrize("mode", ["full", "cache"])
def test_sigint_during_overwrite_leaves_the_old_folder(corpus, tmp_path, mode):
    import subprocess
    import sys

    from errors_fixtures import env

    out = tmp_path / "out"
    shutil.copytree(corpus["out"], out)
    before = _manifest(out)
    argv = [f"--output={out}", "--tokenize", f"--vocab={corpus['vocab']}", "--overwrite"]
    if mode == "full":
        argv += [f for f in corpus["flags"] if not f.startswith("--output=")]
    done = subprocess.run([sys.executable, "-c", _SIGINT_DRIVER, *argv], env=env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == errors.EXIT_INTERRUPTED, done.stderr
    # (The cache job's mixture line is the job's own log.)
    assert [line for line in done.stderr.strip().splitlines()
            if not line.startswith("xlmeta_cc100:")] == ["xlmeta_jax.data.prepare: interrupted"]
    assert _manifest(out) == before
    _siblings_gone(out)


@pytest.mark.parametrize("case, parts", [
    ("same_text_twice", ["'en' twice", "en.txt.xz", "en.txt "]),
    ("unknown_option", ["--workers=0", "neither this command nor Apache Beam"]),
    ("negative_workers", ["--direct_num_workers", "-1"]),
    ("bad_beam_value", ["--direct_running_mode", "'bogus'"]),
    ("vocab_not_a_model", ["toy.vocab", "not a SentencePiece .model"]),
    ("vocab_empty", ["empty.model", "not a SentencePiece .model"]),
    ("read_only_output", ["{out}", "read-only file system"]),
])
def test_bad_prepare_inputs_are_one_line(corpus, tmp_path, capsys, caplog, monkeypatch, case,
                                        parts):
    """One line naming the flag, file or value, exit 2, nothing written, nothing logged."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    data = (corpus["plain"] / "en.txt").read_bytes()
    (inputs / "en.txt.xz").write_bytes(lzma.compress(data))
    out = tmp_path / "out"
    argv = [f"--input={inputs}/*", f"--output={out}"]
    if case == "same_text_twice":  # decompressed by hand beside its .xz
        (inputs / "en.txt").write_bytes(data)
    elif case == "unknown_option":
        argv.append("--workers=0")
    elif case == "negative_workers":
        argv.append("--direct_num_workers=-1")
    elif case == "bad_beam_value":
        argv.append("--direct_running_mode=bogus")
    elif case.startswith("vocab"):
        vocab = str(corpus["vocab"])
        if case == "vocab_not_a_model":
            vocab = vocab.replace(".model", ".vocab")
        else:
            vocab = tmp_path / "empty.model"
            vocab.write_bytes(b"")
        argv += ["--tokenize", f"--vocab={vocab}"]
    else:
        def read_only(path, exist_ok=False):
            raise OSError(errno.EROFS, "Read-only file system", path)
        monkeypatch.setattr(os, "makedirs", read_only)
    code = errors.run_command(prepare.main, argv, prog="xlmeta_jax.data.prepare")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == errors.EXIT_USER_ERROR and len(err) == 1, err
    for part in parts:
        assert part.format(out=out) in err[0], (part, err[0])
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not out.exists()


# Imported at start-up by the command and by each of its Beam workers (PYTHONPATH): the
# first input file being cut sends the process group SIGINT, as Ctrl-C at a terminal does.
_CTRL_C_HOOK = """
import os, signal, time
from xlmeta_jax.data import shards
real = shards.split_file
def split_file(*args, **kwargs):
    os.killpg(os.getpgrp(), signal.SIGINT)
    time.sleep(600)  # the driver stops the job; a worker is stopped by the driver
    return real(*args, **kwargs)
shards.split_file = split_file
"""


@pytest.mark.parametrize("workers", [[], ["--direct_num_workers=2",
                                          "--direct_running_mode=multi_processing"]],
                         ids=["one_worker", "two_workers"])
def test_ctrl_c_in_the_middle_says_interrupted(corpus, tmp_path, workers):
    """Exit 130, the one line and nothing else (no worker's or thread's traceback), nothing
    written, no worker left running."""
    import subprocess
    import sys

    from errors_fixtures import env

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_CTRL_C_HOOK)
    environ = env()
    environ["PYTHONPATH"] = f"{hook}{os.pathsep}{environ['PYTHONPATH']}"
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "xlmeta_jax.data.prepare", f"--input={corpus['inputs']}/*",
         f"--output={out}", *workers], env=environ, capture_output=True, text=True,
        timeout=300, start_new_session=True)
    assert done.returncode == errors.EXIT_INTERRUPTED, done.stderr
    assert done.stderr.strip().splitlines() == ["xlmeta_jax.data.prepare: interrupted"]
    assert not out.exists()
