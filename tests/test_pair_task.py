"""The contrastive rows' seqio task and token cache: the ids the tokenizer gives, through the
task on the fly and through the cache (any row order in the files, the same arrays), the
cache's files the same bytes when built twice, and a cache of other rows or another
tokenizer refused in one line."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("seqio")
pytest.importorskip("apache_beam")

from xlmeta_jax.evaluation import pair_task, pairs, tokenization  # noqa: E402

LENGTHS = {"query": 12, "document": 20}


@pytest.fixture(scope="module")
def rows_file(english_lines, tmp_path_factory) -> pathlib.Path:
    """300 rows with two hard negatives each; one text with characters beyond ASCII."""
    path = tmp_path_factory.mktemp("pair_rows") / "rows.jsonl"
    lines = english_lines[:600]
    with path.open("w", encoding="utf-8") as f:
        for i in range(300):
            query = lines[i] if i != 7 else "Ünïcödé — ça va? 東京"
            f.write(json.dumps({"query": query, "positive": lines[i + 1],
                                "negatives": [lines[i + 2], lines[i + 300]]},
                               ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="module")
def gemma_folder(english_lines, tmp_path_factory) -> pathlib.Path:
    from tests import hf_toy

    return hf_toy.tokenizer_folder(tmp_path_factory.mktemp("gemma_tok"), "gemma",
                                   english_lines[:3000])


def _source(rows_file, path, kind=None, **kw) -> pair_task.RowSource:
    return pair_task.RowSource(train_files=(str(rows_file),), tokenizer_path=str(path),
                               tokenizer_kind=kind, **kw)


def _reference(tokenizer, rows) -> dict[str, np.ndarray]:
    """What the run fed the step before the task existed: encode_batch, then cls/sep."""
    out = {}
    for name in pair_task.columns(len(rows[0].negatives)):
        texts = [r.texts()[pair_task.columns(2).index(name)] for r in rows]
        length = LENGTHS["query" if name == "query" else "document"]
        ids = np.full((len(rows), length), tokenizer.pad_id, np.int32)
        for i, row in enumerate(tokenizer.encode_batch(texts)):
            row = tokenizer.single(row, length)
            ids[i, :len(row)] = row
        out[name] = ids
    return out


@pytest.mark.parametrize("layout", ["ours", "fairseq", "gemma"])
def test_the_task_gives_the_tokenizers_ids(layout, rows_file, english_spm, gemma_folder,
                                           own_cache_dirs):
    path, kind = {"ours": (english_spm, None), "fairseq": (english_spm, "fairseq"),
                  "gemma": (gemma_folder, None)}[layout]
    source = _source(rows_file, path, kind)
    rows, _ = source.read()
    tokenizer = tokenization.load_tokenizer(path, kind)
    got = pair_task.token_arrays(source, rows, LENGTHS, tokenizer.pad_id)
    want = _reference(tokenizer, rows)
    assert sorted(got) == sorted(want) == ["negative_0", "negative_1", "positive", "query"]
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Truncated rows end in sep; the longest query was cut.
    assert (got["query"][:, -1] != tokenizer.pad_id).any()
    # The seqio vocabulary decodes as the tokenizer does, in Python and in TensorFlow.
    vocab = pair_task.EncoderVocabulary(str(path), kind)
    ids = vocab.encode_tf(rows[7].query)
    assert vocab.decode_tf(ids).numpy().decode() == tokenizer.decode(list(ids.numpy())) \
        == vocab.decode(vocab.encode(rows[7].query))


@pytest.fixture(scope="module")
def built_cache(rows_file, english_spm, tmp_path_factory) -> pathlib.Path:
    """The rows' cache in 3 files, read as 5 source shards of 64 rows (Beam's work items)."""
    cache_dir = tmp_path_factory.mktemp("pair_cache")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pair_task, "SHARD_ROWS", 64)
        pair_task.cache(_source(rows_file, english_spm), str(cache_dir), num_shards=3)
    return cache_dir


def test_the_source_shards_cover_every_row_once(rows_file, english_spm, monkeypatch):
    import seqio

    monkeypatch.setattr(pair_task, "SHARD_ROWS", 64)
    source = pair_task.RowsDataSource(_source(rows_file, english_spm), 300, 2)
    assert source.list_shards("train") == [
        "rows 0-63", "rows 64-127", "rows 128-191", "rows 192-255", "rows 256-299"]
    rows, _ = _source(rows_file, english_spm).read()
    seen = []
    for index in range(2):
        for ex in source.get_dataset(shard_info=seqio.ShardInfo(index, 2)).as_numpy_iterator():
            assert ex["query"].decode() == rows[ex["index"]].query
            assert ex["negative_1"].decode() == rows[ex["index"]].negatives[1]
            seen.append(int(ex["index"]))
    assert sorted(seen) == list(range(300)) and seen[:64] == list(range(64))


def test_the_cache_gives_the_same_arrays_and_the_same_bytes_twice(
        built_cache, rows_file, english_spm, tmp_path, own_cache_dirs):
    source = _source(rows_file, english_spm)
    rows, _ = source.read()
    pad = tokenization.load_tokenizer(english_spm).pad_id
    fly = pair_task.token_arrays(source, rows, LENGTHS, pad)
    # Another cache of the task in a folder seqio already searches is not the one read.
    import seqio

    other, few = tmp_path / "other", tmp_path / "few.jsonl"
    few.write_text('{"query": "q", "positive": "p", "negatives": ["a", "b"]}\n', "utf-8")
    pair_task.cache(_source(few, english_spm), str(other))
    seqio.add_global_cache_dirs([str(other)])
    cached = pair_task.token_arrays(source, rows, LENGTHS, pad, cache_dir=str(built_cache))
    for name in fly:
        np.testing.assert_array_equal(cached[name], fly[name], err_msg=name)
    assert seqio.utils.get_global_cache_dirs() == [str(other)]
    folder = built_cache / "xlmeta_embedding_pairs"
    info = json.loads((folder / "info.train.json").read_text())
    assert info["xlmeta_rows"] == {"count": 300, "sha256": pair_task.rows_digest(rows)}
    assert info["num_shards"] == 3 and (folder / "COMPLETED").is_file()
    stats = json.loads((folder / "stats.train.json").read_text())
    assert stats["examples"] == 300
    assert stats["query_tokens"] == sum(
        len(ids) for ids in tokenization.load_tokenizer(english_spm).encode_batch(
            [r.query for r in rows]))

    again = tmp_path / "again"
    pair_task.cache(source, str(again), num_shards=3)
    for f in sorted(folder.glob("train.tfrecord-*")):
        assert (again / folder.name / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("case,message", [
    ("missing", "holds no complete token cache of xlmeta_embedding_pairs"),
    ("other_rows", "holds 300 other rows than this run's 301 (the training files or "
                   "parallel text changed)"),
    ("other_tokenizer", "was tokenized with another tokenizer (sentencepiece, 1000 ids"),
    ("exists", "already holds a token cache (pass --overwrite to replace it)"),
])
def test_a_cache_that_does_not_fit_the_run_is_refused(
        case, message, built_cache, rows_file, english_spm, tmp_path, own_cache_dirs):
    source, cache_dir = _source(rows_file, english_spm), str(built_cache)
    if case == "missing":
        cache_dir = str(tmp_path)
    elif case == "other_rows":
        more = tmp_path / "rows.jsonl"
        more.write_text(rows_file.read_text(encoding="utf-8")
                        + '{"query": "q", "positive": "p", "negatives": ["a", "b"]}\n',
                        encoding="utf-8")
        source = _source(more, english_spm)
    elif case == "other_tokenizer":
        source = _source(rows_file, english_spm, "fairseq")
    rows, _ = source.read()
    with pytest.raises(pairs.PairsError) as e:
        if case == "exists":
            pair_task.cache(source, cache_dir)
        else:
            pair_task.token_arrays(source, rows, LENGTHS, 0, cache_dir=cache_dir)
    line = str(e.value)
    assert message in line and "\n" not in line, line


def test_a_failed_overwrite_leaves_the_old_cache_byte_for_byte(
        built_cache, rows_file, english_spm, tmp_path, monkeypatch):
    import shutil

    cache_dir = tmp_path / "cache"
    shutil.copytree(built_cache, cache_dir)
    before = {p.relative_to(cache_dir): p.read_bytes()
              for p in sorted(cache_dir.rglob("*")) if p.is_file()}

    def fail(*_, **__):
        raise OSError("disk full")

    monkeypatch.setattr(pair_task, "_write_file", fail)
    with pytest.raises(Exception, match="disk full"):
        pair_task.cache(_source(rows_file, english_spm), str(cache_dir), overwrite=True)
    after = {p.relative_to(cache_dir): p.read_bytes()
             for p in sorted(cache_dir.rglob("*")) if p.is_file()}
    assert after == before
    assert [p.name for p in cache_dir.iterdir()] == ["xlmeta_embedding_pairs"]
