"""Readers of ../shared/data: counts from the READMEs, splits, clear errors, sanity."""

import collections

import numpy as np
import pytest

from xlmeta_jax import errors
from xlmeta_jax.evaluation import readers, scorers, splits, tasks
from xlmeta_jax.evaluation.tasks import classification, retrieval, tagging


def test_tydiqa_counts_match_readme(shared_data):
    counts = {
        lang: len(tasks.get("tydiqa").load_eval(lang, shared_data))
        for lang in tasks.get("tydiqa").languages
    }
    assert counts == {
        "ar": 921, "bn": 113, "en": 440, "fi": 782, "id": 565, "ko": 276, "ru": 812,
        "sw": 499, "te": 669,
    }
    assert len(tasks.get("tydiqa").load_train(shared_data)) == 3696


def test_mlqa_and_xquad_counts(shared_data):
    mlqa = {lang: len(tasks.get("mlqa").load_eval(lang, shared_data)) for lang in ("en", "zh")}
    assert mlqa == {"en": 1148, "zh": 504}
    assert len(tasks.get("xquad").load_eval("th", shared_data)) == 1190


def _sentences(rows):
    return {x for r in rows for x in (r.text_a, r.text_b)}


def test_xnli_heldout_split_is_disjoint_and_parallel(shared_data):
    train = tasks.get("xnli").load_train(shared_data)
    select = tasks.get("xnli").load_select(shared_data)
    en_eval = tasks.get("xnli").load_eval("en", shared_data)
    de_eval = tasks.get("xnli").load_eval("de", shared_data)
    assert (len(train), len(select), len(en_eval)) == (996, 249, 1245)
    # The split falls between premises: no training premise is evaluated.
    assert not {e.text_a for e in train + select} & {e.text_a for e in en_eval}
    # Every language is evaluated on the same (translated) lines.
    assert [e.label for e in de_eval] == [e.label for e in en_eval]
    assert [e.id.split("-")[-1] for e in de_eval] == [e.id.split("-")[-1] for e in en_eval]


def test_pawsx_split_shares_no_sentence(shared_data):
    """The old line split (first 1000 / last 1000) leaked 411 evaluation pairs."""
    rows = readers.read_pair_tsv(shared_data / "pawsx" / "dev-en.tsv", classification.PAWSX_LABELS)
    old_train = _sentences(rows[:1000])
    leaked = [r for r in rows[1000:] if r.text_a in old_train or r.text_b in old_train]
    assert len(leaked) == 411
    train = tasks.get("pawsx").load_train(shared_data)
    select = tasks.get("pawsx").load_select(shared_data)
    for lang in ("en", "de", "zh"):
        evaluated = tasks.get("pawsx").load_eval(lang, shared_data)
        assert len(evaluated) == 1000 if lang == "en" else len(evaluated) > 0
        if lang == "en":
            assert not _sentences(train) & _sentences(evaluated)
            assert not _sentences(select) & _sentences(evaluated)
            assert not _sentences(train) & _sentences(select)
    # Groups span languages: two English sentences can share one German translation.
    files = [readers.read_pair_tsv(shared_data / "pawsx" / f"dev-{lang}.tsv",
                                   classification.PAWSX_LABELS) for lang in ("en", "de")]
    english_only = splits.dev_split(files[:1], 0.5, 0.1)
    de_leak = _sentences([files[1][i] for i in english_only["train"]]) & _sentences(
        [files[1][i] for i in english_only["eval"]])
    assert de_leak
    langs = tasks.get("pawsx").languages
    every = [readers.read_pair_tsv(shared_data / "pawsx" / f"dev-{lang}.tsv",
                                   classification.PAWSX_LABELS) for lang in langs]
    parts = splits.dev_split(every, 0.5, 0.1)
    for lang, rows in zip(langs, every):
        seen = _sentences([rows[i] for i in parts["train"] + parts["select"]])
        assert not seen & _sentences(tasks.get("pawsx").load_eval(lang, shared_data)), lang


def test_pair_groups_join_chains_of_shared_sentences():
    ex = lambda a, b: readers.ClassificationExample("", a, b, 0)  # noqa: E731
    rows = [ex("a", "b"), ex("c", "d"), ex("b", "e"), ex("f", "a"), ex("d", "g"), ex("h", "i")]
    assert splits.pair_groups(rows) == [[0, 2, 3], [1, 4], [5]]
    # A line split after row 3 would put "d" on both sides; the group split does not.
    parts = splits.dev_split([rows], 0.5, 0.0)
    assert parts == {"train": [0, 2, 3], "select": [], "eval": [1, 4, 5]}
    # A translation that merges rows 0 and 5 ("a" and "h" both become "x") joins them.
    other = [ex("x", "b"), ex("c", "d"), ex("b", "e"), ex("f", "x"), ex("d", "g"), ex("x", "i")]
    assert splits.pair_groups(rows, other) == [[0, 2, 3, 5], [1, 4]]
    with pytest.raises(ValueError, match="select_fraction must be in"):
        splits.dev_split([rows], 0.5, 0.5)


def test_majority_label_xnli_is_chance(shared_data):
    for lang in ("en", "zh", "sw"):
        labels = [e.label for e in tasks.get("xnli").load_eval(lang, shared_data)]
        majority = collections.Counter(labels).most_common(1)[0][0]
        acc = scorers.accuracy(labels, [majority] * len(labels))["accuracy"]
        assert 33.0 <= acc <= 36.0, acc


def _content(example):
    # What a model sees of an example (ids differ between files even for equal text).
    if isinstance(example, readers.ClassificationExample):
        return (example.text_a, example.text_b)
    if isinstance(example, readers.TaggingExample):
        return example.tokens
    return (example.context, example.question)


FINE_TUNED_TASKS = [n for n in tasks.names() if tasks.get(n).fine_tunes]


@pytest.mark.parametrize("task", FINE_TUNED_TASKS)
def test_selection_and_evaluation_examples_are_disjoint(shared_data, task):
    select = tasks.get(task).load_select(shared_data) or []
    select_content = {_content(e) for e in select}
    # Parallel dev files (XNLI, PAWS-X): the line number names a sentence in every
    # language, so a translation of a selection example is not evaluated either.
    select_lines = {e.id.split("-")[-1] for e in select} if task in ("xnli", "pawsx") else set()
    for lang in tasks.get(task).languages:
        evaluated = tasks.get(task).load_eval(lang, shared_data)
        assert evaluated, (task, lang)
        assert not {e.id for e in select} & {e.id for e in evaluated}, (task, lang)
        assert not select_lines & {e.id.split("-")[-1] for e in evaluated}, (task, lang)
        if lang == "en":
            # Same language: not even a repeated sentence is on both sides. (Other
            # languages' files may hold the same string, e.g. a person's name in
            # PAN-X, as XTREME's English dev and foreign test sets do.)
            assert not select_content & {_content(e) for e in evaluated}, (task, lang)


def test_panx_english_dev_is_split_between_selection_and_score(shared_data):
    select = tasks.get("panx").load_select(shared_data)
    en_eval = tasks.get("panx").load_eval("en", shared_data)
    # 10000 English dev sentences (9890 distinct): the first 1000 rows select, a
    # sentence repeated later stays on its first side, the rest scores English.
    assert len(select) + len(en_eval) == 10000
    assert len(select) >= 1000 and select[0].id == "panx-en-0"
    assert not {e.tokens for e in select} & {e.tokens for e in en_eval}
    # Without selection data, English is scored on all of dev.
    assert tasks.get("panx").load_select(shared_data, select_fraction=0) is None
    assert len(tasks.get("panx").load_eval("en", shared_data, select_fraction=0)) == 10000


def test_holdout_split_keeps_repeated_keys_on_one_side():
    parts = splits.holdout_split(["a", "b", "a", "c", "b", "d"], 1 / 3)
    # 2 rows select: "a" and "b" (rows 0, 1); their repeats (2, 4) follow them.
    assert parts == {"select": [0, 1, 2, 4], "eval": [3, 5]}
    with pytest.raises(ValueError, match="fraction"):
        splits.holdout_split(["a"], 1.0)


def test_tagging_readers(shared_data):
    panx = tasks.get("panx").load_eval("zh", shared_data)
    assert len(panx) == 10000
    assert all(len(e.tokens) == len(e.tags) for e in panx)
    ud = tasks.get("udpos").load_eval("ko", shared_data)
    assert len(ud) == 1000
    assert set(t for e in ud for t in e.tags) <= set(readers.UPOS_LABELS)
    en_train = tasks.get("udpos").load_train(shared_data)
    assert len(en_train) == 2001
    assert len(tasks.get("udpos").load_select(shared_data)) == 2077


def test_udpos_pud_languages_follow_english_order(shared_data):
    assert tasks.get("udpos").languages == tuple(
        "ar cs de en es fi fr hi id is it ko pl pt ru sv th tr zh".split())
    english = [e.id for e in tasks.get("udpos").load_eval("en", shared_data)]
    # Icelandic's file lists its sentences sorted by id; read as is, position i would be
    # another sentence than English's i.
    raw_is = readers.read_conllu_upos(shared_data / "ud" / tagging.UD_TEST_FILES["is"])
    assert [e.id for e in raw_is] != english
    for lang in ("is", "de", "zh"):
        assert [e.id for e in tasks.get("udpos").load_eval(lang, shared_data)] == english


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


def test_corrupt_token_tag_file_is_rejected_with_its_line(tmp_path):
    # XTREME's udpos csv export swallowed quote characters: tokens without a tag.
    path = tmp_path / "test-et.tsv"
    path.write_text("Tere\tINTJ\n\"\n\tPUNCT\n")
    with pytest.raises(ValueError, match=r"test-et\.tsv:2: expected 'token<TAB>tag'"):
        readers.read_token_tag_tsv(path)


def test_retrieval_readers(shared_data):
    de, en = retrieval.TATOEBA.read("de", shared_data)
    assert len(de) == len(en) == 1000
    assert retrieval.TATOEBA.read("deu", shared_data) == (de, en)
    src, tgt, gold = retrieval.BUCC.read("zh", shared_data)
    assert (len(src), len(tgt), len(gold)) == (8624, 13589, 257)


def test_unknown_task_and_language_are_clear_errors(shared_data):
    with pytest.raises(ValueError, match="unknown task 'squad'"):
        tasks.get("squad")
    with pytest.raises(ValueError, match=r"tydiqa: unknown language\(s\) \['zh'\]"):
        tasks.get("tydiqa").load_eval("zh", shared_data)
    with pytest.raises(ValueError, match="string"):
        tasks.get("xnli").check_languages("en")
    with pytest.raises(ValueError, match="no data for language 'xxx'"):
        retrieval.TATOEBA.read("xxx", shared_data)
    # A retrieval task reads no training data: it has no training reader at all.
    assert not tasks.get("tatoeba").fine_tunes
    assert not hasattr(tasks.get("tatoeba"), "load_train")
    # A user error: one line, no traceback.
    with pytest.raises(errors.UserError, match=r"^unknown task 'squad'; expected one of \["):
        tasks.get("squad")


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data directory .* does not exist"):
        tasks.get("xnli").load_eval("en", tmp_path / "nowhere")
    (tmp_path / "xquad").mkdir()
    with pytest.raises(FileNotFoundError, match=r"xquad\.de\.json does not exist"):
        tasks.get("xquad").load_eval("de", tmp_path)


def test_squad_reader_checks_answer_offsets(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(
        '{"data": [{"paragraphs": [{"context": "abc def", "qas": [{"id": "q", '
        '"question": "?", "answers": [{"text": "def", "answer_start": 3}]}]}]}]}'
    )
    with pytest.raises(ValueError, match="question q: answer 'def' is not at answer_start=3"):
        readers.read_squad_json(path)


def test_random_embeddings_on_tatoeba_are_at_chance(shared_data):
    de, en = retrieval.TATOEBA.read("de", shared_data)
    rng = np.random.default_rng(0)
    out = scorers.retrieval_accuracy(rng.normal(size=(len(de), 32)), rng.normal(size=(len(en), 32)))
    # 1000 candidates: chance is 0.1%.
    assert out["src2tgt"] <= 0.5 and out["tgt2src"] <= 0.5
