"""Fair data for the experiment: language sampling weights from tokens, not lines."""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

from xlmeta_jax.data import line_sample, rates, text_files

seqio = pytest.importorskip("seqio")
from xlmeta_jax.data import task_names as names  # noqa: E402
from xlmeta_jax.data import tasks  # noqa: E402


def _write(path, lines):
    path.write_text("".join(line + "\n" + ("\n" if i % 4 == 3 else "")
                            for i, line in enumerate(lines)))
    return str(path)


def _leipzig(shared_data, lang, n=400):
    with open(shared_data / "leipzig_sentences" / "sentences" / f"{lang}.txt",
              encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:n]


def _exact_tokens(vocab, path):
    lines = list(text_files.iter_paragraphs(path))
    return sum(len(ids) for ids in vocab.tokenizer.encode(lines))


def test_token_estimate_matches_the_exact_count_even_when_lengths_drift(
        toy_cc100, shared_data, tmp_path):
    vocab = seqio.SentencePieceVocabulary(toy_cc100["vocab"])
    de = _leipzig(shared_data, "de")
    # Short lines first, long ones after: a sample from the file's start alone would
    # see only the short ones.
    drifting = [" ".join(line.split()[:3]) for line in de[:200]] + [
        " ".join([line] * 4) for line in de[200:]]
    path = _write(tmp_path / "de.txt", drifting)
    stats = text_files.corpus_stats([path], cache_dir=str(tmp_path / "cache"))
    exact = _exact_tokens(vocab, path)
    estimate = line_sample.estimate_tokens(stats, vocab.tokenizer.encode, sample_lines=100)
    assert estimate == pytest.approx(exact, rel=0.05)
    sample = line_sample.sample_paragraphs(path, 50)
    assert len(sample) == 50 and len(set(sample)) == 50
    assert any(len(s.split()) <= 3 for s in sample) and any(len(s.split()) > 20 for s in sample)


def test_sampling_weights_follow_tokens_and_lines_stay_an_option(toy_cc100, shared_data,
                                                                  tmp_path):
    """Two languages with the same number of lines, one with 4x longer lines: by lines
    they are sampled alike, by tokens the long one gets (its token ratio)^alpha more."""
    folder = tmp_path / "cc100"
    folder.mkdir()
    short = _leipzig(shared_data, "de")
    paths = {"de": _write(folder / "de.txt", short),
             "ru": _write(folder / "ru.txt", [" ".join([line] * 4)
                                              for line in _leipzig(shared_data, "ru")])}
    vocab = seqio.SentencePieceVocabulary(toy_cc100["vocab"])
    exact = {lang: _exact_tokens(vocab, p) for lang, p in paths.items()}
    assert exact["ru"] > 2 * exact["de"]
    settings = dict(vocab_path=toy_cc100["vocab"], cc100_dir=str(folder),
                    languages=["de", "ru"], alpha=0.3, stats_cache_dir=str(tmp_path / "c"))

    tasks.register(**settings, count_unit="lines")
    by_lines = tasks.language_probabilities(names.CC100_MIXTURE)
    assert by_lines == pytest.approx({"de": 0.5, "ru": 0.5})

    tasks.register(**settings)  # tokens: the default
    by_tokens = tasks.language_probabilities(names.CC100_MIXTURE)
    want = rates.alpha_probabilities(exact, 0.3)
    assert by_tokens["ru"] == pytest.approx(want["ru"], abs=0.005)
    assert by_tokens["ru"] / by_tokens["de"] == pytest.approx(
        (exact["ru"] / exact["de"]) ** 0.3, rel=0.02)
    assert np.isclose(sum(by_tokens.values()), 1.0)


def test_token_counting_settings_are_checked(toy_cc100):
    with pytest.raises(text_files.CorpusError,
                       match=r"token_sample_lines: must be an integer > 0, got 0"):
        tasks.register(vocab_path=toy_cc100["vocab"], cc100_dir=toy_cc100["cc_dir"],
                       languages=["de"], token_sample_lines=0)
    from xlmeta_jax.data import corpora

    with pytest.raises(text_files.CorpusError, match="count_unit='tokens' needs the vocabulary"):
        corpora.language_count(corpora.Corpora(), [], encode=None)


def test_files_are_read_side_by_side_when_shuffling(tmp_path):
    """With shuffle, neighbouring elements come from different files, each element ends a
    document, and every paragraph is read exactly once."""
    from xlmeta_jax.data import providers

    paths = []
    for f in range(3):
        path = tmp_path / f"f{f}.txt"
        path.write_text("".join("\n".join(f"file{f} doc{d} para{i}" for i in range(300)) + "\n\n"
                                for d in range(3)))
        paths.append(str(path))
    source = providers.TextLineDocumentsSource({"train": providers.TextFiles(tuple(paths))})
    elements = list(source.get_dataset("train", shuffle=True, seed=1).as_numpy_iterator())
    first_files = [e["text"][0].decode().split()[0] for e in elements[:3]]
    assert sorted(first_files) == ["file0", "file1", "file2"]
    assert all(e["ends_document"][-1] for e in elements)
    paragraphs = [t.decode() for e in elements
                  for t, end in zip(e["text"], e["ends_document"]) if not end]
    assert len(paragraphs) == len(set(paragraphs)) == 3 * 3 * 300
    # Within a file, paragraphs keep their order.
    file0 = [p for p in paragraphs if p.startswith("file0")]
    assert file0 == [f"file0 doc{d} para{i}" for d in range(3) for i in range(300)]
    # Without shuffling, files are read one after the other.
    plain = list(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert [e["text"][0].decode()[:5] for e in plain][:4] == ["file0"] * 4


def test_mixture_languages_hold_blocks_in_proportion_to_their_rate(toy_cc100):
    tasks.register(vocab_path=toy_cc100["vocab"], cc100_dir=toy_cc100["cc_dir"],
                   languages=["en", "de", "ja", "af"], count_unit="lines",
                   shuffle_buffer_size=1000)
    q = tasks.language_probabilities(names.CC100_MIXTURE)
    for lang, share in q.items():
        task = seqio.get_mixture_or_task(names.cc100_task(lang))
        assert task.shuffle_buffer_size == max(16, int(np.ceil(1000 * share)))
    assert seqio.get_mixture_or_task(names.cc100_task("en")).shuffle_buffer_size > 300


def test_corpus_preparation_appears_whole_or_not_at_all(shared_data, tmp_path, monkeypatch):
    # A failure after the text is written (here: in vocabulary training) must leave neither
    # MODEL_DIR/corpus nor a temporary folder, so the next run does not take half-written
    # files for a prepared corpus.
    from xlmeta_jax.data import experiment_corpus as corpus
    from xlmeta_jax.data import vocabulary

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vocabulary, "train_vocabulary", fail)
    with pytest.raises(KeyboardInterrupt):
        corpus.prepare_shared_corpus(model_dir=str(tmp_path), shared_data_dir=str(shared_data),
                                     languages=["de"], vocab_size=300)
    assert list(tmp_path.iterdir()) == []


def test_built_whole_replaces_a_folder_only_on_success(tmp_path):
    from xlmeta_jax import files

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with files.built_whole(str(folder)) as tmp:
            (pathlib.Path(tmp) / "new.txt").write_text("new")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert [p.name for p in folder.iterdir()] == ["old.txt"]
    with files.built_whole(str(folder) + "/") as tmp:
        (pathlib.Path(tmp) / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert [p.name for p in folder.iterdir()] == ["new.txt"]
    # Through a link (a folder on another disk): the folder it points to is replaced and
    # the link stays.
    (tmp_path / "link").symlink_to(folder)
    with files.built_whole(str(tmp_path / "link")) as tmp:
        (pathlib.Path(tmp) / "newer.txt").write_text("newer")
    assert (tmp_path / "link").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "link"]
    assert [p.name for p in folder.iterdir()] == ["newer.txt"]


def test_built_whole_keeps_the_old_folder_until_the_new_one_is_in_place(tmp_path,
                                                                        monkeypatch):
    """The old folder is renamed aside, not deleted, before the new one moves in: a
    failure of that move puts it back, and it is deleted only once the new one is there."""
    from xlmeta_jax import files

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "old.txt").write_text("old")
    rename, seen = os.rename, []

    def failing_second(src, dst):
        seen.append(os.path.basename(dst))
        if len(seen) == 2:  # the new folder into place, after the old one moved aside
            assert not folder.exists()
            raise KeyboardInterrupt
        rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_second)
    with pytest.raises(KeyboardInterrupt):
        with files.built_whole(str(folder)) as tmp:
            (pathlib.Path(tmp) / "new.txt").write_text("new")
    monkeypatch.setattr(os, "rename", rename)
    assert seen[1] == "corpus" and seen[2] == "corpus"  # aside, in (failed), back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert [p.name for p in folder.iterdir()] == ["old.txt"]

    removed, rmtree = [], shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda path, **kw: (
        removed.append((path, sorted(os.listdir(folder)))), rmtree(path, **kw)))
    with files.built_whole(str(folder)) as tmp:
        (pathlib.Path(tmp) / "new.txt").write_text("new")
    # The old folder went only when the new one was in place.
    assert removed[0][1] == ["new.txt"] and removed[0][0].endswith(".old")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    assert [p.name for p in folder.iterdir()] == ["new.txt"]
