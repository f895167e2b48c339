"""Scorers on hand-checked examples; seqeval cross-check; retrieval sanity."""

import random

import numpy as np
import pytest

from xlmeta_jax.evaluation import scorers

# ------------------------------------------------------------------ SQuAD v1.1


def test_squad_normalize_punctuation_articles_whitespace():
    assert scorers.squad_normalize("The  Quick, brown fox!") == "quick brown fox"
    # Articles only as whole words: "Anna" and "theory" keep their letters.
    assert scorers.squad_normalize("An Anna theory") == "anna theory"
    # Only ASCII punctuation is removed by the SQuAD script.
    assert scorers.squad_normalize("«Paris»") == "«paris»"


def test_squad_f1_and_em_hand_checked():
    # pred tokens [cat, sat], gold [cat, sat, down]: P=1, R=2/3, F1=0.8.
    assert scorers.squad_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert scorers.squad_exact_match("Paris.", "paris")
    assert not scorers.squad_exact_match("Paris, France", "Paris")
    # Counter overlap: duplicates count once per gold occurrence. P=1/2, R=1 -> 2/3.
    assert scorers.squad_f1("cat cat", "the cat") == pytest.approx(2 / 3)
    assert scorers.squad_f1("", "cat") == 0.0


def test_squad_on_scripts_without_spaces_and_indic():
    # SQuAD splits on whitespace only: a CJK or Japanese span is one token.
    assert scorers.squad_f1("北京大学", "北京") == 0.0
    assert scorers.squad_f1("東京都", "東京") == 0.0
    # Bengali danda (U+0964) is not ASCII punctuation: the SQuAD script keeps it.
    assert not scorers.squad_exact_match("ঢাকা।", "ঢাকা")
    # Telugu, two words vs one: P=1/2, R=1.
    assert scorers.squad_f1("హైదరాబాద్ నగరం", "హైదరాబాద్") == pytest.approx(2 / 3)


def test_qa_scores_max_over_gold_and_missing_prediction():
    refs = {"q1": ["Denver Broncos", "the Broncos"], "q2": ["1920s"], "q3": ["x"]}
    preds = {"q1": "Broncos", "q2": "the 1920s"}
    out = scorers.qa_scores(preds, refs)
    # q1: EM 1 against "the Broncos"; q2: EM 1 ("the" dropped); q3 missing -> 0.
    assert out["exact_match"] == pytest.approx(200 / 3)
    assert out["f1"] == pytest.approx(200 / 3)
    assert out["num_missing"] == 1 and out["num_examples"] == 3


def test_qa_scores_bad_input():
    with pytest.raises(ValueError, match="normalization"):
        scorers.qa_scores({}, {"q": ["a"]}, normalization="xquad")
    with pytest.raises(ValueError, match="needs lang"):
        scorers.qa_scores({}, {"q": ["a"]}, normalization="mlqa")
    with pytest.raises(ValueError, match="no gold answer"):
        scorers.qa_scores({"q": "a"}, {"q": []})


# ------------------------------------------------------------------ MLQA


def test_mlqa_zh_character_segmentation():
    assert scorers.mlqa_mixed_segmentation("2008年北京奥运会") == [
        "2008", "年", "北", "京", "奥", "运", "会",
    ]
    # Full-width comma is Unicode punctuation: removed before segmentation.
    assert scorers.mlqa_normalize("北京，中国", "zh") == "北 京 中 国"
    # chars [北 京 大 学] vs [北 京]: P=1/2, R=1 -> F1 = 2/3.
    assert scorers.mlqa_f1("北京大学", "北京", "zh") == pytest.approx(2 / 3)
    assert scorers.mlqa_exact_match("《北京》", "北京", "zh")
    # Latin words inside Chinese text stay whole words.
    assert scorers.mlqa_normalize("iPhone手机", "zh") == "iphone 手 机"


def test_mlqa_unicode_punctuation_and_articles():
    assert scorers.mlqa_exact_match("«Paris»", "Paris", "en")
    assert scorers.mlqa_exact_match("der Hund", "Hund", "de")
    assert not scorers.squad_exact_match("der Hund", "Hund")
    assert scorers.mlqa_normalize("La casa de los abuelos", "es") == "casa de abuelos"
    assert scorers.mlqa_normalize("cái bàn", "vi") == "bàn"
    # Hindi has no article list; the danda is Unicode punctuation.
    assert scorers.mlqa_normalize("दिल्ली।", "hi") == "दिल्ली"


def test_mlqa_arabic_definite_article_everywhere():
    # The script replaces every "ال" by a space, word-initial or not.
    assert scorers.mlqa_normalize("الكتاب", "ar") == "كتاب"
    assert scorers.mlqa_exact_match("المدرسة الجديدة", "مدرسة جديدة", "ar")
    assert scorers.mlqa_normalize("فالكتاب", "ar") == "ف كتاب"


def test_mlqa_unknown_language_is_an_error():
    with pytest.raises(ValueError, match="'ja'"):
        scorers.mlqa_normalize("東京", "ja")
    with pytest.raises(ValueError, match="'ja'"):
        scorers.qa_scores({"q": "a"}, {"q": ["a"]}, normalization="mlqa", lang="ja")


# ------------------------------------------------------------------ tagging


def test_entities_hand_checked():
    assert scorers.get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [
        ("PER", 0, 1), ("LOC", 3, 3),
    ]
    # I- after O starts an entity; a type change ends one.
    assert scorers.get_entities(["O", "I-LOC", "I-LOC"]) == [("LOC", 1, 2)]
    assert scorers.get_entities(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    assert scorers.entity_f1(gold, [["B-PER", "I-PER", "O", "I-LOC"]])["f1"] == 100.0
    # PER truncated (wrong), LOC right: P = R = 1/2.
    out = scorers.entity_f1(gold, [["B-PER", "O", "O", "B-LOC"]])
    assert (out["precision"], out["recall"], out["f1"]) == (50.0, 50.0, 50.0)
    assert scorers.entity_f1(gold, [["O"] * 4])["f1"] == 0.0


def test_entity_f1_bad_input():
    with pytest.raises(ValueError, match="sentence 0"):
        scorers.entity_f1([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="invalid tag 'PER'"):
        scorers.get_entities(["PER"])


def test_entity_f1_matches_seqeval_on_random_sequences():
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    for _ in range(30):
        n = rng.randint(1, 12)
        lengths = [rng.randint(1, 15) for _ in range(n)]
        y_true = [[rng.choice(tags) for _ in range(k)] for k in lengths]
        y_pred = [
            [t if rng.random() < 0.6 else rng.choice(tags) for t in s] for s in y_true
        ]
        ours = scorers.entity_f1(y_true, y_pred)
        assert ours["f1"] == pytest.approx(100 * seqeval_metrics.f1_score(y_true, y_pred))
        assert ours["precision"] == pytest.approx(
            100 * seqeval_metrics.precision_score(y_true, y_pred)
        )
        assert ours["recall"] == pytest.approx(100 * seqeval_metrics.recall_score(y_true, y_pred))


def test_token_accuracy_and_accuracy():
    out = scorers.token_accuracy([["NOUN", "VERB"], ["DET"]], [["NOUN", "NOUN"], ["DET"]])
    assert out["accuracy"] == pytest.approx(200 / 3)
    assert scorers.accuracy([0, 1, 2, 2], [0, 1, 1, 2])["accuracy"] == 75.0
    with pytest.raises(ValueError, match="no examples"):
        scorers.accuracy([], [])


# ------------------------------------------------------------------ retrieval


def test_retrieval_accuracy_hand_checked_both_directions():
    src = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    tgt = np.array([[2.0, 0.1], [0.1, 3.0], [1.0, 0.9]])
    # src2: s0->t0 ok, s1->t1 ok, s2 (45 deg) -> t2 (42 deg) ok.
    # tgt2: t0 -> s0 ok; t1 -> s1 ok; t2 (42 deg) -> s2 (45 deg) ok.
    assert scorers.retrieval_accuracy(src, tgt)["src2tgt"] == 100.0
    tgt2 = np.array([[2.0, 0.1], [0.1, 3.0], [-1.0, -1.0]])
    out = scorers.retrieval_accuracy(src, tgt2)
    # s2 is closest to t0; t2 is equally far (-0.707) from s0 and s1 -> s0: both wrong.
    assert out["src2tgt"] == pytest.approx(200 / 3)
    assert out["tgt2src"] == pytest.approx(200 / 3)


def test_retrieval_random_embeddings_near_chance():
    rng = np.random.default_rng(0)
    out = scorers.retrieval_accuracy(rng.normal(size=(1000, 64)), rng.normal(size=(1000, 64)))
    # Chance is 1/1000 = 0.1%.
    assert out["src2tgt"] < 1.0 and out["tgt2src"] < 1.0


def test_bitext_mining_f1_threshold_is_xtremes_midpoint():
    gold = {("a", "x"), ("b", "y"), ("c", "z")}
    cands = [("a", "x", 0.9), ("b", "q", 0.8), ("b", "y", 0.7), ("d", "w", 0.1)]
    out = scorers.bitext_mining_f1(cands, gold)
    # Best prefix ends at 0.7: 2 of 3 mined correct, 2 of 3 gold found. bucc_optimize puts
    # the threshold halfway to the next score (0.1), not at 0.7.
    assert out["f1"] == pytest.approx(200 / 3)
    assert out["threshold"] == pytest.approx(0.4)


def test_bitext_mining_f1_ties_do_not_depend_on_input_order():
    gold = {("a", "x"), ("b", "y")}
    cands = [("c", "z", 0.5), ("a", "x", 0.9), ("b", "y", 0.5), ("d", "w", 0.1)]
    outs = [scorers.bitext_mining_f1(order, gold) for order in (cands, cands[::-1])]
    assert outs[0] == outs[1]
    # Tied pairs at 0.5 are ranked by ids: ("b", "y") before ("c", "z"), so the best
    # prefix is 2 of 2 (F1 100) and its threshold (0.5 + 0.5) / 2 extracts both tied
    # pairs, as bucc_extract's `score >= threshold`: 2 of 3 mined correct.
    assert outs[0]["threshold"] == 0.5
    assert outs[0]["f1"] == pytest.approx(80.0)


@pytest.mark.filterwarnings("ignore:.*seems not to be NE tag")
def test_pos_f1_is_seqeval_over_tags_and_differs_from_accuracy():
    gold = [["DET", "NOUN", "NOUN", "VERB"], ["PRON", "VERB", "X"]]
    pred = [["DET", "NOUN", "ADJ", "VERB"], ["PRON", "VERB", "X"]]
    out = scorers.tag_f1(gold, pred)
    # Accuracy: 6 of 7 tags. seqeval chunks runs of one tag: gold NOUN NOUN is one chunk
    # (1..2) that the prediction breaks. seqeval 0.0.12 (the headline) keeps the whole
    # tag as the type, so every other tag, "X" included, is a chunk: 5 of 6 gold and 5 of
    # 7 predicted chunks match, F1 = 2 * 5 / (6 + 7).
    assert out["accuracy"] == pytest.approx(600 / 7)
    assert out["f1"] == pytest.approx(1000 / 13) and out["accuracy"] > out["f1"] + 5
    # seqeval 1.2 reads "X"'s type as "_", that of "O": X starts no chunk, 4 of 5 gold
    # and 4 of 6 predicted chunks match.
    old = scorers.tag_f1(gold, pred, reading="seqeval-1.2")
    assert old["f1"] == pytest.approx(800 / 11)
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    assert old["f1"] == pytest.approx(100 * seqeval_metrics.f1_score(gold, pred))
    # NER keeps rejecting tags that are not IOB.
    with pytest.raises(ValueError, match="invalid tag 'DET'"):
        scorers.entity_f1(gold, pred)


def test_pos_f1_keeps_cconj_and_sconj_apart_as_xtreme_seqeval():
    gold = [["PRON", "VERB", "SCONJ", "PRON", "VERB", "CCONJ", "VERB"]]
    pred = [["PRON", "VERB", "CCONJ", "PRON", "VERB", "SCONJ", "VERB"]]
    # seqeval 0.0.12 (XTREME's numbers): the types are the whole tags, each of the 7 tags
    # is its own chunk (neighbours differ; SCONJ's prefix "S" is a single anyway), and
    # the two swapped chunks are wrong: 5 of 7 right both ways, F1 = 5/7.
    assert scorers.tag_f1(gold, pred)["f1"] == pytest.approx(500 / 7)
    # seqeval 1.2 reads both as type "CONJ" at the same positions: all 7 match.
    assert scorers.tag_f1(gold, pred, reading="seqeval-1.2")["f1"] == pytest.approx(100.0)
    assert scorers.POS_F1_READING == "seqeval-0.0.12"
    with pytest.raises(ValueError, match="unknown tag reading"):
        scorers.tag_f1(gold, pred, reading="seqeval-2")


def test_pos_f1_seqeval_1_2_reading_matches_seqeval_on_random_upos_sequences():
    import warnings

    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    from xlmeta_jax.evaluation.readers import UPOS_LABELS

    rng = np.random.default_rng(0)
    tags = list(UPOS_LABELS)
    for _ in range(200):
        gold = [[tags[i] for i in rng.integers(0, len(tags), rng.integers(1, 9))]
                for _ in range(rng.integers(1, 5))]
        pred = [[t if rng.random() < 0.6 else tags[rng.integers(len(tags))] for t in g]
                for g in gold]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # seqeval warns that POS tags are not NE tags
            expected = 100 * seqeval_metrics.f1_score(gold, pred)
        got = scorers.tag_f1(gold, pred, reading="seqeval-1.2")["f1"]
        assert got == pytest.approx(expected)


def test_transfer_summary():
    per_lang = {"en": {"f1": 80.0}, "de": {"f1": 70.0}, "zh": {"f1": 60.0}}
    out = scorers.transfer_summary(per_lang, "f1")
    assert out == {
        "average": pytest.approx(70.0),
        "average_target": 65.0,
        "english": 80.0,
        "transfer_gap": 15.0,
    }
    with pytest.raises(ValueError, match="no metric 'em'"):
        scorers.transfer_summary(per_lang, "em")
