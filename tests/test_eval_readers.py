"""Readers of ../shared/data: counts from the READMEs, splits, clear errors, sanity."""

import collections

import numpy as np
import pytest

from xlmeta_jax.evaluation import readers, scorers


def test_tydiqa_counts_match_readme(shared_data):
    counts = {
        lang: len(readers.load_eval("tydiqa", lang, shared_data))
        for lang in readers.get_task("tydiqa").languages
    }
    assert counts == {
        "ar": 921, "bn": 113, "en": 440, "fi": 782, "id": 565, "ko": 276, "ru": 812,
        "sw": 499, "te": 669,
    }
    assert len(readers.load_train("tydiqa", shared_data)) == 3696


def test_mlqa_and_xquad_counts(shared_data):
    mlqa = {lang: len(readers.load_eval("mlqa", lang, shared_data)) for lang in ("en", "zh")}
    assert mlqa == {"en": 1148, "zh": 504}
    assert len(readers.load_eval("xquad", "th", shared_data)) == 1190


def test_xnli_heldout_split_is_disjoint_and_parallel(shared_data):
    train = readers.load_train("xnli", shared_data)
    en_eval = readers.load_eval("xnli", "en", shared_data)
    de_eval = readers.load_eval("xnli", "de", shared_data)
    assert len(train) + len(en_eval) == 2490
    # The split falls between premises: no training premise is evaluated.
    assert not {e.text_a for e in train} & {e.text_a for e in en_eval}
    # Every language is evaluated on the same (translated) lines.
    assert [e.label for e in de_eval] == [e.label for e in en_eval]
    assert de_eval[0].id == f"xnli-de-{len(train)}"


def test_majority_label_xnli_is_chance(shared_data):
    for lang in ("en", "zh", "sw"):
        labels = [e.label for e in readers.load_eval("xnli", lang, shared_data)]
        majority = collections.Counter(labels).most_common(1)[0][0]
        acc = scorers.accuracy(labels, [majority] * len(labels))["accuracy"]
        assert 33.0 <= acc <= 36.0, acc


def test_tagging_readers(shared_data):
    panx = readers.load_eval("panx", "zh", shared_data)
    assert len(panx) == 10000
    assert all(len(e.tokens) == len(e.tags) for e in panx)
    ud = readers.load_eval("udpos", "ko", shared_data)
    assert len(ud) == 1000
    assert set(t for e in ud for t in e.tags) <= set(readers.UPOS_LABELS)
    en_train = readers.load_train("udpos", shared_data)
    assert len(en_train) == 2001


def test_conllu_skips_multiword_ranges(tmp_path):
    path = tmp_path / "x.conllu"
    path.write_text(
        "# sent_id = s1\n"
        "1-2\tdel\t_\t_\t_\t_\t_\t_\t_\t_\n"
        "1\tde\tde\tADP\t_\t_\t0\troot\t_\t_\n"
        "2\tel\tel\tDET\t_\t_\t1\tdet\t_\t_\n"
        "2.1\tx\tx\tNOUN\t_\t_\t_\t_\t_\t_\n\n"
    )
    [ex] = readers.read_conllu_upos(path)
    assert (ex.id, ex.tokens, ex.tags) == ("s1", ("de", "el"), ("ADP", "DET"))


def test_corrupt_xtreme_udpos_file_is_rejected_with_its_line(shared_data):
    # The csv export of these files swallowed quote characters (see readers docstring).
    with pytest.raises(ValueError, match=r"test-et\.tsv:\d+: expected 'token<TAB>tag'"):
        readers.read_token_tag_tsv(shared_data / "ud" / "xtreme_udpos" / "test-et.tsv")


def test_retrieval_readers(shared_data):
    de, en = readers.read_tatoeba("de", shared_data)
    assert len(de) == len(en) == 1000
    assert readers.read_tatoeba("deu", shared_data) == (de, en)
    src, tgt, gold = readers.read_bucc("zh-en", "dev", shared_data)
    assert (len(src), len(tgt), len(gold)) == (8624, 13589, 257)


def test_unknown_task_and_language_are_clear_errors(shared_data):
    with pytest.raises(ValueError, match="unknown task 'squad'"):
        readers.get_task("squad")
    with pytest.raises(ValueError, match=r"tydiqa: unknown language\(s\) \['zh'\]"):
        readers.load_eval("tydiqa", "zh", shared_data)
    with pytest.raises(ValueError, match="string"):
        readers.check_languages("xnli", "en")
    with pytest.raises(ValueError, match="no data for language 'xxx'"):
        readers.read_tatoeba("xxx", shared_data)
    with pytest.raises(ValueError, match="no training data"):
        readers.load_train("tatoeba", shared_data)


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data directory .* does not exist"):
        readers.load_eval("xnli", "en", tmp_path / "nowhere")
    (tmp_path / "xquad").mkdir()
    with pytest.raises(FileNotFoundError, match=r"xquad\.de\.json does not exist"):
        readers.load_eval("xquad", "de", tmp_path)


def test_squad_reader_checks_answer_offsets(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(
        '{"data": [{"paragraphs": [{"context": "abc def", "qas": [{"id": "q", '
        '"question": "?", "answers": [{"text": "def", "answer_start": 3}]}]}]}]}'
    )
    with pytest.raises(ValueError, match="question q: answer 'def' is not at answer_start=3"):
        readers.read_squad_json(path)


def test_random_embeddings_on_tatoeba_are_at_chance(shared_data):
    de, en = readers.read_tatoeba("de", shared_data)
    rng = np.random.default_rng(0)
    out = scorers.retrieval_accuracy(rng.normal(size=(len(de), 32)), rng.normal(size=(len(en), 32)))
    # 1000 candidates: chance is 0.1%.
    assert out["src2tgt"] <= 0.5 and out["tgt2src"] <= 0.5
