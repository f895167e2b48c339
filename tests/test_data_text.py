"""Language list, alpha rates and the corpus counting pass (no TensorFlow)."""

import gzip
import json
import math
import os

import pytest

from xlmeta_jax import errors
from xlmeta_jax.data import corpora, languages, rates, text_files


def test_language_list_is_xlmr_100():
    assert len(languages.XLMR_LANGUAGES) == 100
    assert len(set(languages.XLMR_LANGUAGES)) == 100
    # CC-100 file names of the script/romanisation variants XLM-R uses.
    for code in ("zh-Hans", "zh-Hant", "hi_rom", "my_zaw", "ur_rom", "en", "sw"):
        assert code in languages.XLMR_LANGUAGES
    # CC-100 languages XLM-R did not use.
    for code in ("zu", "yo", "lg", "tn", "wo"):
        assert code not in languages.XLMR_LANGUAGES
    assert languages.task_suffix("zh-Hans") == "zh_Hans"
    assert languages.mc4_split_name("he") == "iw"
    assert languages.mc4_split_name("hi_rom") == "hi-Latn"
    assert languages.mc4_split_name("ur_rom") is None


@pytest.mark.parametrize(
    "langs, message",
    [
        (["en", "zh"], "'zh' is not one of the 100 XLM-R/CC-100 language codes; did you mean zh-"),
        (["en", "zu"], "'zu' is not one of the 100"),
        (["en", "en"], "listed twice"),
        ([], "empty"),
        ("en", "expected a list"),
    ],
)
def test_unknown_language_is_rejected(langs, message):
    with pytest.raises(languages.UnknownLanguageError, match=message):
        languages.check_languages(langs, what="cc100_corpus.languages")


def test_alpha_probabilities():
    counts = {"en": 1_000_000, "sw": 1_000, "is": 10}
    prop = rates.alpha_probabilities(counts, 1.0)
    total = sum(counts.values())
    for lang, n in counts.items():
        assert prop[lang] == pytest.approx(n / total, rel=1e-12)
    q = rates.alpha_probabilities(counts, 0.3)
    z = sum(n**0.3 for n in counts.values())
    for lang, n in counts.items():
        assert q[lang] == pytest.approx(n**0.3 / z, rel=1e-12)
    # alpha < 1 up-samples the small languages.
    assert q["is"] > prop["is"] and q["en"] < prop["en"]
    assert sum(q.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("alpha", [0, 0.0, -0.3, 1.5, math.nan, "x", None])
def test_alpha_outside_unit_interval_is_rejected(alpha):
    assert rates.alpha_problem(alpha).startswith("alpha must be")
    with pytest.raises(text_files.CorpusError, match="alpha"):
        rates.check_alpha(alpha)
    with pytest.raises(errors.SettingError, match=r"^Corpora\.alpha: alpha must be"):
        corpora.Corpora(alpha=alpha)


def test_counts_must_be_positive():
    with pytest.raises(text_files.CorpusError, match="'de'"):
        rates.alpha_probabilities({"en": 10, "de": 0}, 0.3)
    with pytest.raises(text_files.CorpusError, match="no languages"):
        rates.alpha_probabilities({}, 0.3)


def test_sample_counts_add_up():
    q = rates.alpha_probabilities({"en": 1000, "de": 100, "is": 1}, 0.3)
    draws = rates.sample_counts(q, 1001)
    assert sum(draws.values()) == 1001
    for lang in q:
        assert abs(draws[lang] - q[lang] * 1001) <= 1


def _tricky_file(path, *, gz=False):
    """Paragraphs, blank runs, CRLF, invalid UTF-8, one huge line, no final newline."""
    parts = [
        b"first paragraph of doc one\r\n",
        b"second paragraph \xc3\xa9t\xc3\xa9\n",
        b"\n",
        b"   \n",
        b"\n",
        b"doc two \xff\xfe broken bytes\n",  # invalid UTF-8: skipped
        b"doc two valid line\n",
        b"x" * 5000 + b"\n",  # longer than max_line_bytes=1000: skipped
        b"doc two last line\n",
        b"\n",
        b"\xe2\x82",  # truncated multi-byte sequence alone on a line: skipped
        b"\n",
        b"doc three, no final newline",
    ]
    data = b"".join(parts)
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("block", [7, 1 << 20])
def test_scan_counts_paragraphs_documents_and_skips(tmp_path, monkeypatch, gz, block):
    # A tiny read block makes lines (and the huge one) span many blocks.
    monkeypatch.setattr(text_files, "_READ_BLOCK_BYTES", block)
    path = str(tmp_path / ("c.txt.gz" if gz else "c.txt"))
    _tricky_file(path, gz=gz)
    stats = text_files.scan_text_file(path, max_line_bytes=1000)
    assert stats.lines == 5
    assert stats.documents == 3
    assert stats.skipped_invalid_utf8 == 2
    assert stats.skipped_long_lines == 1
    kept = list(text_files.iter_paragraphs(path, 1000))
    assert kept[0] == "first paragraph of doc one"  # '\r' dropped as TextLineDataset does
    assert kept[1] == "second paragraph été"
    assert kept[-1] == "doc three, no final newline"
    assert stats.text_bytes == sum(len(k.encode()) for k in kept)


def test_corpus_stats_are_cached_next_to_the_data(tmp_path):
    path = tmp_path / "en.txt"
    path.write_text("a b c\n\nd e\n", encoding="utf-8")
    (stats,) = text_files.corpus_stats([str(path)])
    assert (stats.lines, stats.documents) == (2, 2)
    cache = json.loads((tmp_path / "xlmeta_corpus_stats.json").read_text())
    assert cache["files"]["en.txt"]["lines"] == 2
    # Cached: a tampered count is returned as is while the file is unchanged...
    cache["files"]["en.txt"]["lines"] = 99
    (tmp_path / "xlmeta_corpus_stats.json").write_text(json.dumps(cache))
    assert text_files.corpus_stats([str(path)])[0].lines == 99
    # ...and counted again once it changes.
    path.write_text("a b c\n\nd e\nf\n", encoding="utf-8")
    os.utime(path, ns=(1, 1))
    assert text_files.corpus_stats([str(path)])[0].lines == 3


def test_corpus_stats_in_a_given_cache_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "en.txt").write_text("a\n", encoding="utf-8")
    cache_dir = tmp_path / "cache"
    text_files.corpus_stats([str(data / "en.txt")], cache_dir=str(cache_dir))
    assert not (data / "xlmeta_corpus_stats.json").exists()
    assert len(list(cache_dir.glob("*.json"))) == 1


def test_bad_files_are_rejected(tmp_path):
    with pytest.raises(text_files.CorpusError, match="no file matches"):
        text_files.list_text_files([str(tmp_path / "missing*.txt")], what="english")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(text_files.CorpusError, match="empty.txt is empty"):
        text_files.list_text_files([str(tmp_path / "empty.txt")], what="english")
    (tmp_path / "en.txt.xz").write_bytes(b"\xfd7zXZ")
    with pytest.raises(text_files.CorpusError, match="xz -d en.txt.xz"):
        text_files.list_text_files([str(tmp_path / "en.txt.xz")], what="cc100")
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n \n\xff\xfe\n")
    with pytest.raises(text_files.CorpusError,
                       match="blank.txt has no usable text: 1 lines are not"):
        text_files.corpus_stats([str(blank)], cache_dir=str(tmp_path / "c"))
