"""The batch stream the trainer sees: global arrays, exact resume, determinism,
dynamic masking, the offline cache, phase-1 English and the throughput command."""

import functools
import hashlib
import json
import os

import jax
import numpy as np
import pytest

seqio = pytest.importorskip("seqio")
import tensorflow as tf  # noqa: E402
from data_toy import cached_documents, train_toy_vocabulary, write_cc100_dir  # noqa: E402

from xlmeta_jax.data import (  # noqa: E402
    english_pd,
    feeding,
    preprocessors,
    providers,
    tasks,  # noqa: E402
    text_files,  # noqa: E402
    token_cache,
    vocabulary,
)
from xlmeta_jax.data import task_names as names  # noqa: E402
from xlmeta_jax.model import mlm, partitioning  # noqa: E402
from xlmeta_jax.tools import caching, throughput  # noqa: E402

LANGUAGES = ("en", "de", "sw")
VOCAB = 1000
LENGTH = 32
BATCH = 16


@pytest.fixture(scope="module")
def toy(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("feed")
    cc_dir = str(root / "cc100")
    docs = write_cc100_dir(shared_data, cc_dir, languages=LANGUAGES)
    vocab = train_toy_vocabulary(
        cc_dir, str(root / "vocab" / "toy"), languages=LANGUAGES, vocab_size=VOCAB
    )
    return {"root": root, "cc_dir": cc_dir, "docs": docs, "vocab": vocab}


@pytest.fixture(scope="module")
def mesh():
    return partitioning.create_mesh(data=4, fsdp=2, tensor=1)


def _register(toy, **extra):
    settings = {"vocab_path": toy["vocab"], "cc100_dir": toy["cc_dir"],
                "languages": list(LANGUAGES), "shuffle_buffer_size": 64}
    return tasks.register(**{**settings, **extra})


def _host(batch):
    return feeding.batch_to_numpy(batch)


def _iterator(mesh, name=names.CC100_MIXTURE, seed=1, **kw):
    return feeding.make_mlm_iterator(
        name,
        sequence_length=kw.pop("sequence_length", LENGTH),
        global_batch_size=kw.pop("global_batch_size", BATCH),
        mesh=mesh,
        seed=seed,
        **{"features": mlm.FEATURES, **kw},
    )


def _assert_equal_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_global_arrays_exact_resume_and_determinism(toy, mesh, tmp_path):
    _register(toy, languages=["en", "sw"])
    it = _iterator(mesh)
    spec = it.element_spec
    slots = mlm.max_predictions(LENGTH, 0.15)
    assert spec["inputs"].shape == (BATCH, LENGTH) and spec["inputs"].dtype == np.int32
    assert spec["weights"].dtype == np.float32
    assert spec["mlm_positions"].shape == (BATCH, slots)
    first = next(it)
    assert set(first) == set(mlm.FEATURES)
    for name, array in first.items():
        assert isinstance(array, jax.Array)
        assert array.shape == spec[name].shape
        assert array.sharding.is_equivalent_to(
            jax.sharding.NamedSharding(mesh, partitioning.batch_spec(array.ndim)), array.ndim
        )
        # The batch axis is split over data x fsdp = 8 devices.
        assert len({s.index[0].start for s in array.addressable_shards}) == 8
    first = _host(first)
    head = [first] + [_host(next(it)) for _ in range(2)]
    it.save(str(tmp_path / "ckpt" / "data_iterator"))
    tail = [_host(next(it)) for _ in range(4)]

    # Same seed: the same stream from the start.
    again = _iterator(mesh)
    _assert_equal_batches([_host(next(again)) for _ in range(7)], head + tail)
    # Restored (here into an iterator that has moved on): the next batches equal
    # those of the uninterrupted run.
    again.restore(str(tmp_path / "ckpt" / "data_iterator"))
    _assert_equal_batches([_host(next(again)) for _ in range(4)], tail)
    # Another seed: another stream.
    other = _host(next(_iterator(mesh, seed=2)))
    assert not np.array_equal(other["targets"], first["targets"])

    with pytest.raises(FileNotFoundError, match="no data iterator state"):
        again.restore(str(tmp_path / "nothing"))


def test_masks_differ_each_epoch_and_repeat_for_a_seed(toy, mesh, tmp_path):
    """One short document: the stream repeats every T tokens; its masks must not."""
    vocab = seqio.SentencePieceVocabulary(toy["vocab"])
    lines = [line for doc in toy["docs"]["en"] for line in doc]
    # Pick k lines whose token count T (an eos after each line and after the document)
    # has a divisor d: blocks of d + 1 tokens then recur exactly every T / d blocks.
    for k in range(3, 40):
        ids = vocab.encode_tf(tf.constant(lines[:k])).to_list()
        total = sum(len(line) + 1 for line in ids) + 1
        divisors = [d for d in range(15, 48) if total % d == 0 and total // d >= 2]
        if divisors:
            break
    body = divisors[0]
    period = total // body
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "en.txt").write_text("\n".join(lines[:k]) + "\n", encoding="utf-8")
    _register(toy, cc100_dir=str(folder), languages=["en"])

    def blocks(seed):
        it = _iterator(
            mesh, names.cc100_task("en"), seed=seed, sequence_length=body + 1,
            global_batch_size=8, shuffle=False,
        )  # fmt: skip
        n_batches = -(-3 * period // 8)
        out = [_host(next(it)) for _ in range(n_batches)]
        return {k: np.concatenate([b[k] for b in out]) for k in out[0]}

    run = blocks(seed=5)
    same = 0
    for i in range(2 * period):
        np.testing.assert_array_equal(run["targets"][i], run["targets"][i + period])
        same += np.array_equal(run["weights"][i], run["weights"][i + period])
    assert same <= 0.1 * 2 * period  # dynamic masking: new masks every epoch
    again = blocks(seed=5)
    np.testing.assert_array_equal(again["inputs"], run["inputs"])
    np.testing.assert_array_equal(again["weights"], run["weights"])


@pytest.mark.parametrize("eos_after", ["line", "document"])
def test_offline_cache_gives_the_same_batches(toy, mesh, tmp_path, eos_after, own_cache_dirs):
    # New Task objects: seqio's tasks remember the cache folder they first found.
    tasks.register(vocab_path=toy["vocab"])
    _register(toy, eos_after=eos_after)
    task = names.cc100_task("de")
    cache_dir = str(tmp_path / "cache")
    # Text files: the job reads and tokenizes them in Python (the tf.data step's stream).
    assert token_cache.python_reading(seqio.get_mixture_or_task(task)) == eos_after
    out = caching.cache_task(task, cache_dir, num_shards=1)
    assert os.path.exists(os.path.join(out, "COMPLETED"))
    with pytest.raises(text_files.CorpusError, match="already caches split"):
        caching.cache_task(task, cache_dir)
    # Records of whole documents, whatever the convention (reading several shards
    # interleaves whole documents): each ends where a document ends, and they hold every
    # document of the source once.
    per_record = cached_documents(out, eos_after, vocabulary.EOS_ID)
    assert sum(per_record) == len(toy["docs"]["de"])
    with open(seqio.utils.get_cached_stats_path(out, "train")) as f:
        assert json.load(f)["examples"] == len(per_record)
    kw = dict(shuffle=False, num_epochs=1)
    fly = _iterator(mesh, task, **kw)
    cached = _iterator(mesh, task, use_cached=True, cache_dir=cache_dir, **kw)
    _assert_equal_batches(
        [_host(next(cached)) for _ in range(4)], [_host(next(fly)) for _ in range(4)]
    )
    # The cache names the vocabulary that made it; a run with another refuses it.
    info_path = seqio.utils.get_cached_info_path(out, "train")
    with open(info_path) as f:
        info = json.load(f)
    with open(toy["vocab"], "rb") as f:
        assert info["xlmeta_vocabulary"] == {"path": toy["vocab"],
                                             "md5": hashlib.md5(f.read()).hexdigest()}
    info["xlmeta_vocabulary"]["md5"] = "0" * 32
    with open(info_path, "w") as f:
        json.dump(info, f)
    with pytest.raises(text_files.CorpusError, match="tokenized with the vocabulary .* is "
                       "another"):
        _iterator(mesh, task, use_cached=True, cache_dir=cache_dir, **kw)
    info["xlmeta_vocabulary"] = None
    with open(info_path, "w") as f:
        json.dump(info, f)
    # A run with the other convention refuses the cache instead of training on it.
    other = "document" if eos_after == "line" else "line"
    _register(toy, eos_after=other)
    with pytest.raises(text_files.CorpusError, match=f"after each {eos_after}, this run after"):
        _iterator(mesh, task, use_cached=True, cache_dir=cache_dir, **kw)


def test_only_text_files_tokenized_by_our_step_are_read_in_python(toy):
    vocab = vocabulary.load_vocabulary(toy["vocab"])
    features = {"targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32)}
    text = providers.TextLineDocumentsSource(
        {"train": providers.TextFiles((os.path.join(toy["cc_dir"], "de.txt"),))})
    other = seqio.FunctionDataSource(lambda split, shuffle_files: tf.data.Dataset.range(1),
                                     splits=["train"])
    step = functools.partial(preprocessors.tokenize_documents, eos_after="document")
    cases = [  # (source, steps before the cache, the convention read in Python or None)
        (text, [step], "document"),
        (text, [functools.partial(preprocessors.tokenize_documents)], "line"),
        (other, [step], None),                           # not text files: seqio's reading
        (text, [step, preprocessors.add_language], None),  # another step before the cache
        (text, [functools.partial(preprocessors.tokenize_documents, eos_after="document"),
                functools.partial(preprocessors.add_language, language="de")], None),
    ]
    for i, (source, steps, want) in enumerate(cases):
        task = seqio.Task(f"python_reading_case_{i}", source, features,
                          [*steps, seqio.CacheDatasetPlaceholder()])
        assert token_cache.python_reading(task) == want, i


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_cache_overwrite_swaps_in_a_whole_folder_and_keeps_other_splits(
        toy, tmp_path, own_cache_dirs, monkeypatch):
    tasks.register(vocab_path=toy["vocab"])
    _register(toy, eos_after="document")
    task = names.cc100_task("sw")
    cache_dir = tmp_path / "cache"
    out = caching.cache_task(task, str(cache_dir), num_shards=1)
    other = {"validation.tfrecord-00000-of-00001": b"another split", "info.validation.json":
             b"{}"}
    for name, data in other.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    before = _tree(cache_dir)

    def fail(*_, **__):
        raise OSError("disk full")

    # A failed job leaves the old cache byte for byte, and nothing beside it.
    monkeypatch.setattr(token_cache, "_write_file", fail)
    with pytest.raises(Exception, match="disk full"):
        caching.cache_task(task, str(cache_dir), num_shards=1, overwrite=True)
    assert _tree(cache_dir) == before
    # A successful one replaces the split (the same bytes: the job is deterministic) and
    # keeps the other split's files.
    monkeypatch.undo()
    os.remove(os.path.join(out, "train.tfrecord-00000-of-00001"))
    caching.cache_task(task, str(cache_dir), num_shards=1, overwrite=True)
    assert _tree(cache_dir) == before


@pytest.mark.parametrize("eos_after", ["document", "line"])
@pytest.mark.parametrize("sizes, record_tokens, records", [
    ([3, 3, 4], 6, [[3, 3], [4]]),     # a record closes once it holds record_tokens
    ([7, 3], 5, [[7], [3]]),           # a longer document is a record of its own
    ([3, 3, 3], 100, [[3, 3, 3]]),     # the last record may be short
    ([], 5, []),
])
def test_cache_records_are_whole_documents(sizes, record_tokens, records, eos_after):
    eos = vocabulary.EOS_ID
    end = [eos] if eos_after == "document" else [eos, eos]  # a line's eos, then the document's
    stream = np.array([t for i, n in enumerate(sizes) for t in [10 + i] * (n - len(end)) + end],
                      np.int32)
    # The shard's stream in runs of about 2 tokens: documents span runs.
    runs = np.array_split(stream, stream.size // 2) if stream.size else []
    got = token_cache.records_of(runs, eos_after, eos, record_tokens)
    ends = [token_cache.document_ends(r, eos_after, False, eos) for r in got]
    assert [np.diff(e, prepend=-1).tolist() for e in ends] == records
    assert all(e[-1] == r.size - 1 for e, r in zip(ends, got))
    assert all(r.dtype == np.int32 for r in got)
    if got:
        np.testing.assert_array_equal(np.concatenate(got), stream)
    # A record is serialised as seqio's own dict_to_tfexample writes it, byte for byte.
    for r in got:
        assert token_cache.serialized_example({"tokens": r}) == seqio.dict_to_tfexample(
            {"tokens": r}).SerializeToString()


@pytest.mark.parametrize("values", [[], [0, 127, 128, 2**31 - 1], [2**35, -1]])
def test_examples_are_serialised_as_seqio_does_and_the_same_in_every_process(values):
    """seqio's bytes, and for a contrastive row's columns (a scalar among them) the order
    of the entries that ``deterministic`` fixes: without it the protobuf library's order
    of a map's entries varies between processes, and so would a cache's bytes."""
    v = np.array(values, np.int64)
    assert token_cache.serialized_example({"tokens": v}) == seqio.dict_to_tfexample(
        {"tokens": v}).SerializeToString()
    row = {"query": v, "index": np.int32(3), "positive": v[:1], "negative_0": v[::-1]}
    assert token_cache.serialized_example(row) == seqio.dict_to_tfexample(
        row).SerializeToString(deterministic=True)
    keys = [b"index", b"negative_0", b"positive", b"query"]  # in the bytes' order
    at = [token_cache.serialized_example(row).index(k) for k in keys]
    assert at == sorted(at)


@pytest.mark.parametrize("eos", [vocabulary.EOS_ID, 50282])  # ours; ModernBERT's [SEP]
def test_document_ends_of_a_token_stream(eos):
    run = np.array([7, eos, 8, eos, eos, 9, eos])
    np.testing.assert_array_equal(token_cache.document_ends(run, "document", False, eos),
                                  [1, 3, 4, 6])
    np.testing.assert_array_equal(token_cache.document_ends(run, "line", False, eos), [4])
    # A document whose closing eos starts the next run of the stream.
    np.testing.assert_array_equal(
        token_cache.document_ends(np.array([eos, 5]), "line", True, eos), [0])
    # Another vocabulary's eos is an ordinary token here.
    assert not token_cache.document_ends(run, "document", False, eos + 1).size


def test_english_phase1_on_public_domain_text(toy, mesh, shared_data, tmp_path):
    files = english_pd.write_text_files(str(shared_data / "english_pd"), str(tmp_path / "en"))
    assert {os.path.basename(f) for f in files} == {
        "common_library.txt", "speeches.txt", "genesis.txt", "shakespeare.txt"
    }  # fmt: skip
    stats = text_files.corpus_stats(files)
    assert sum(s.documents for s in stats) > 300
    registered = tasks.register(vocab_path=toy["vocab"])
    with pytest.raises(text_files.CorpusError, match="no corpus configured: set ENGLISH_FILES"):
        tasks.check_registered(names.ENGLISH_TEXT_TASK, registered)
    tasks.register(vocab_path=toy["vocab"], english_files=[str(tmp_path / "en" / "*.txt")])
    it = _iterator(mesh, names.ENGLISH_TEXT_TASK, sequence_length=128)
    batch = _host(next(it))
    assert np.all(batch["targets"][:, 0] == vocabulary.BOS_ID)
    sp = seqio.SentencePieceVocabulary(toy["vocab"]).tokenizer
    words = " ".join(sp.decode(row.tolist()) for row in batch["targets"]).split()
    common = sum(w.lower() in {"the", "and", "of", "to", "a", "in", "that"} for w in words)
    assert common / len(words) > 0.1


def test_batch_and_task_errors(toy, mesh):
    _register(toy)
    with pytest.raises(ValueError, match="not divisible by the batch shards"):
        _iterator(mesh, global_batch_size=12)
    with pytest.raises(ValueError, match="xlmeta_cc100_de"):
        _iterator(mesh, name="xlmeta_cc100_deu")


def test_throughput_command(toy, tmp_path, capsys):
    english = tmp_path / "english_pd_missing"
    assert throughput.main(
        [
            "--vocab", toy["vocab"], "--english_pd", str(english),
            "--work_dir", str(tmp_path / "work"), "--sequence_length", "64",
            "--batch_size", "8", "--seconds", "1", "--warmup_batches", "1",
        ]  # fmt: skip
    ) == 0
    out = capsys.readouterr().out
    assert "on the fly" in out and "seqio cache" in out and "tokens/s" in out
    assert "pydoc_topics" in "".join(os.listdir(tmp_path / "work" / "text"))
