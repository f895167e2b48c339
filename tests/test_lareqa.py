"""LAReQA's pool and mAP@20 (evaluation/lareqa.py) on hand-checked examples and on the
shared XQuAD and MLQA files."""

from __future__ import annotations

import numpy as np
import pytest

from xlmeta_jax.evaluation import lareqa


@pytest.mark.parametrize("targets,ranked,k,expected", [
    (range(1, 6), [6, 4, 7, 1, 2], 2, 0.25),       # one hit at rank 2, over min(5, 2)
    (range(1, 6), [1, 1, 1, 1, 1], 5, 0.2),        # a repeated prediction counts once
    ([1, 3], [1, 2, 3, 4, 5], 3, 5 / 6),           # (1/1 + 2/3) / 2
    ([1, 2, 3], [1, 1, 1], 3, 1 / 3),
    ([1, 2, 3], [1, 2, 1], 3, 2 / 3),
    ([7], [1, 2, 3], 3, 0.0),
    ([5, 6], list(range(30)), 20, (1 / 6 + 2 / 7) / 2),
    ([25], list(range(30)), 20, 0.0),              # beyond the first 20
])
def test_average_precision_at_k_by_hand(targets, ranked, k, expected):
    assert lareqa.average_precision_at_k(list(targets), ranked, k) == pytest.approx(expected)


@pytest.mark.parametrize("context,sentences", [
    ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
    ("  Dr Smith went.  Then home.", ["Dr Smith went.", "Then home."]),
    ("第一句。第二句！第三", ["第一句。", "第二句！", "第三"]),
    ("هل هذا سؤال؟ نعم.", ["هل هذا سؤال؟", "نعم."]),
    ("पहला वाक्य। दूसरा", ["पहला वाक्य।", "दूसरा"]),
    ("3.14 is pi.", ["3.14 is pi."]),                # no space after the point
])
def test_sentence_breaks(context, sentences):
    spans = lareqa.sentence_breaks(context)
    assert [context[a:b] for a, b in spans] == sentences


def _squad(paragraphs):
    return {"data": [{"paragraphs": [
        {"context": c, "qas": [{"id": i, "question": q, "answers": [{"answer_start": s}]}
                               for i, q, s in qas]} for c, qas in paragraphs]}]}


def test_pool_and_map_by_hand():
    en = _squad([("Cats purr. Dogs bark.", [("q1", "What purrs?", 0), ("q2", "Barks?", 11)])])
    de = _squad([("Katzen schnurren. Hunde bellen.", [("q1", "Was schnurrt?", 0),
                                                       ("q2", "Bellt?", 31)])])
    pool = lareqa.build_pool({"en": en, "de": de})
    assert pool.candidates == [("Cats purr.", "en"), ("Dogs bark.", "en"),
                               ("Katzen schnurren.", "de"), ("Hunde bellen.", "de")]
    # q2's German answer start (31) is past the last sentence: that question is skipped.
    assert [q[1:] for q in pool.questions] == [("q1", "en"), ("q2", "en"), ("q1", "de")]
    assert pool.skipped == 1 and pool.answers == {"q1": [0, 2], "q2": [1]}
    # Scores: q1 (en) ranks 0, 2 first: AP 1; q2 ranks 3, 1: AP 1/2; q1 (de) ranks 1, 0, 2:
    # (1/2 + 2/3) / 2.
    q = np.array([[1.0, 0.1, 0.5, 0.2], [0, 0.5, 0.1, 1], [0.5, 1, 0.2, 0.1]])
    c = np.eye(4)
    result = lareqa.mean_average_precision(pool, q, c, k=20)
    expected = [1.0, 0.5, (1 / 2 + 2 / 3) / 2]
    assert result["map"] == pytest.approx(np.mean(expected))
    assert result["languages"]["de"]["map_at_20"] == pytest.approx(100 * expected[2])


@pytest.mark.parametrize("dataset,questions", [("xquad_r", 1190), ("mlqa_r", None)])
def test_pools_of_the_shared_sets(shared_data, dataset, questions):
    data = lareqa.read(dataset, shared_data)
    pool = lareqa.build_pool(data)
    per_lang = {}
    for _, _, lang in pool.questions:
        per_lang[lang] = per_lang.get(lang, 0) + 1
    if questions is not None:
        # XQuAD-R: 11-way parallel, every question answered in all 11 languages.
        assert set(per_lang.values()) == {questions} and pool.skipped == 0
        assert {len(v) for v in pool.answers.values()} == {11}
    else:
        # MLQA-R (dev): 2 to 4 answers a question, as the paper says.
        assert min(len(v) for v in pool.answers.values()) >= 2
        assert max(len(v) for v in pool.answers.values()) <= 7
    langs = {lang for _, lang in pool.candidates}
    assert langs == set(lareqa.XQUAD_R_LANGUAGES if dataset == "xquad_r"
                        else lareqa.MLQA_R_LANGUAGES)
