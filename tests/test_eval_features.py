"""QA windowing + span decoding and tagging windows, checked end to end on real data."""

import numpy as np
import pytest

from xlmeta_jax.evaluation import features, qa_decoding, readers, scorers, tasks, tokenization


@pytest.fixture(scope="module")
def tok(english_spm):
    return tokenization.Tokenizer(english_spm)


def _gold_logits(feats, length):
    """Logits that put all mass on the gold start / end of windows holding the answer."""
    pos = np.arange(length)[None]
    has = feats.start_positions > 0
    start = np.where((pos == feats.start_positions[:, None]) & has[:, None], 10.0, 0.0)
    end = np.where((pos == feats.end_positions[:, None]) & has[:, None], 10.0, 0.0)
    return start, end


def _token_aligned(tok, ex):
    _, offs = tok.encode_with_offsets(ex.context)
    s, e = ex.answer_starts[0], ex.answer_starts[0] + len(ex.answers[0])
    first, last = features._answer_token_span(offs, s, e)
    return offs[first][0] == s and offs[last][1] == e


@pytest.mark.parametrize("lang", ["en", "sw"])
def test_gold_logits_decode_to_gold_answers(shared_data, tok, lang):
    examples = tasks.get("tydiqa").load_eval(lang, shared_data)[:150]
    # Short windows: many contexts span several windows.
    feats = features.qa_features(
        examples, tok, max_seq_length=192, doc_stride=64, max_query_length=48
    )
    assert len(feats) > 1.5 * len(examples)
    start, end = _gold_logits(feats, 192)
    # The 1000-piece test vocabulary lacks many characters (digits among them): read
    # unknown pieces by their text here, or XTREME's "<unk>" widens those answers to
    # whole words (see test_unknown_piece_reads_unk_as_xtreme_and_answers_whole_words).
    preds = qa_decoding.compute_predictions(start, end, feats, examples, max_answer_length=192,
                                            unknown_pieces="text")
    # Windows holding the whole answer and giving its first token the most context (the
    # only ones where Hugging Face's decoding accepts that start).
    has = feats.start_positions > 0
    usable = has & feats.max_context[np.arange(len(feats)), feats.start_positions]
    in_window = set(feats.example_index[usable].tolist())
    # Answers whose boundaries fall inside a piece ("1920" in "1920s") cannot be exact,
    # nor can answers longer than a window.
    aligned = [
        ex for i, ex in enumerate(examples) if i in in_window and _token_aligned(tok, ex)
    ]
    assert len(aligned) >= 0.85 * len(examples)
    # Hugging Face's post-processing returns the gold text, or, where BasicTokenizer
    # splits it differently ("Italian and Romansh" inside "Romansh.[3]"), the whole
    # whitespace words around it.
    exact = 0
    for ex in aligned:
        pred = preds[ex.id]
        words, _ = features.doc_words(ex.context)
        gold = " ".join(ex.answers[0].split())
        assert gold in pred and pred in " ".join(words), (pred, gold)
        exact += pred == ex.answers[0]
    assert exact >= 0.8 * len(aligned)
    refs = {ex.id: list(ex.answers) for ex in aligned}
    assert scorers.qa_scores(preds, refs)["f1"] > 95.0
    overall = scorers.qa_scores(preds, {ex.id: list(ex.answers) for ex in examples})
    assert overall["f1"] > 90.0


@pytest.mark.parametrize("doc_stride", [32, 200])  # 200: a stride longer than the window
def test_windows_cover_every_context_token(shared_data, tok, doc_stride):
    examples = tasks.get("tydiqa").load_eval("en", shared_data)[:40]
    feats = features.qa_features(
        examples, tok, max_seq_length=96, doc_stride=doc_stride, max_query_length=24
    )
    for i, ex in enumerate(examples):
        _, offs = tok.encode_with_offsets(ex.context)
        seen = set()
        for f in np.nonzero(feats.example_index == i)[0]:
            ctx = feats.offsets[f][feats.offsets[f][:, 0] >= 0]
            seen.update(map(tuple, ctx.tolist()))
            # <s> question </s></s> context </s>: the row ends with eos then padding.
            row = feats.input_ids[f]
            assert row[0] == tok.cls_id
            n = int((row != tok.pad_id).sum())
            assert row[n - 1] == tok.sep_id and n <= 96
        assert seen == set(map(tuple, offs))


def _hand_features(words, tokens, word_index, max_context=None, example_index=(0,)):
    """QAFeatures of hand-made windows: position 0 is <s>, then context pieces."""
    n, length = len(tokens), max(len(t) for t in tokens)
    wi = np.full((n, length), -1, np.int32)
    mc = np.zeros((n, length), bool)
    for r in range(n):
        wi[r, : len(word_index[r])] = word_index[r]
        mc[r, : len(word_index[r])] = (
            np.asarray(word_index[r]) >= 0 if max_context is None else max_context[r])
    return features.QAFeatures(
        input_ids=np.ones((n, length), np.int32), start_positions=np.zeros(n, np.int32),
        end_positions=np.zeros(n, np.int32), offsets=np.full((n, length, 2), -1, np.int32),
        example_index=np.asarray(example_index, np.int32), word_index=wi, max_context=mc,
        tokens=[t + [""] * (length - len(t)) for t in tokens],
    )


def _logits(length, start, end):
    s, e = np.zeros((1, length)), np.zeros((1, length))
    s[0, 0] = e[0, 0] = 9.0  # <s> scores highest but is not context
    s[0, start], e[0, end] = 5.0, 4.0
    return s, e


def test_decode_respects_max_answer_length_and_context():
    ex = readers.QAExample("q", "who?", "alpha beta gamma", ("beta",), (6,))
    feats = _hand_features(None, [["", "▁alpha", "▁beta", "▁gamma"]], [[-1, 0, 1, 2]])
    start, end = _logits(4, 2, 3)
    start[0, 1] = 1.0
    assert qa_decoding.compute_predictions(start, end, feats, [ex])["q"] == "beta gamma"
    assert qa_decoding.compute_predictions(
        start, end, feats, [ex], max_answer_length=1)["q"] == "beta"


def test_answer_text_is_whole_words_trimmed_as_hugging_face():
    """A span inside an unspaced Chinese word: the exact pieces ("北京大学") are not what
    XTREME scores; get_final_text cannot align them with BERT's spaced CJK characters and
    returns the whole whitespace word."""
    context = "他在北京大学读书。 真的"
    ex = readers.QAExample("zh", "?", context, ("北京大学",), (2,))
    pieces = ["", "▁他在", "北京", "大学", "读书", "。", "▁真的"]
    feats = _hand_features(None, [pieces], [[-1, 0, 0, 0, 0, 0, 1]])
    pred = qa_decoding.compute_predictions(*_logits(7, 2, 3), feats, [ex])["zh"]
    assert pred == "他在北京大学读书。"
    exact_span = "北京大学"  # what the character offsets of the two pieces give
    ours = scorers.qa_scores({"zh": pred}, {"zh": ["北京大学"]}, normalization="mlqa", lang="zh")
    exact = scorers.qa_scores(
        {"zh": exact_span}, {"zh": ["北京大学"]}, normalization="mlqa", lang="zh")
    # MLQA's zh F1 counts characters: 4 of the 8 predicted ones are the gold answer.
    assert exact["f1"] == 100.0 and ours["f1"] == pytest.approx(200 / 3)
    # Latin script: a span ending inside "1920s," is trimmed back to the pieces' text,
    # while a span that BasicTokenizer splits ("U.S") is widened to its whole word.
    ex2 = readers.QAExample("en", "?", "In the 1920s, the U.S. grew", ("1920",), (7,))
    pieces2 = ["", "▁In", "▁the", "▁1920", "s", ",", "▁the", "▁U", ".", "S", ".", "▁grew"]
    words2 = [[-1, 0, 1, 2, 2, 2, 3, 4, 4, 4, 4, 5]]
    feats2 = _hand_features(None, [pieces2], words2)
    assert qa_decoding.compute_predictions(*_logits(12, 3, 3), feats2, [ex2])["en"] == "1920"
    assert qa_decoding.compute_predictions(*_logits(12, 7, 9), feats2, [ex2])["en"] == "U.S."


def test_start_must_have_its_max_context_in_the_window():
    # Two windows of one example; "▁beta" (word 1) is in both, but window 1 holds it in
    # the middle: in window 0 it may not start an answer, though it scores highest there.
    ex = readers.QAExample("q", "?", "alpha beta gamma delta", ("gamma",), (11,))
    feats = _hand_features(
        None, [["", "▁alpha", "▁beta"], ["", "▁beta", "▁gamma", "▁delta"]],
        [[-1, 0, 1], [-1, 1, 2, 3]],
        max_context=[[False, True, False], [False, True, True, True]], example_index=(0, 0),
    )
    start = np.array([[0, 0, 8.0, -50], [0, 1.0, 6.0, 0]])
    end = np.array([[0, 0, 8.0, 0], [0, 0, 6.0, 0]])
    assert qa_decoding.compute_predictions(start, end, feats, [ex])["q"] == "gamma"
    feats.max_context[0, 2] = True  # without the rule, window 0's "beta" would win
    assert qa_decoding.compute_predictions(start, end, feats, [ex])["q"] == "beta"


def test_max_context_windows_follow_bert():
    # Windows of 4 tokens, 2 apart over 8 tokens. Token 2 is the 3rd of window 0 (score
    # min(2, 1) = 1) and the 1st of window 1 (0): window 0. Token 3 is the 4th of window 0
    # (0) and the 2nd of window 1 (1): window 1.
    best = features._max_context([0, 2, 4], [4, 4, 4], 8)
    assert [(np.nonzero(b)[0] + s).tolist() for b, s in zip(best, [0, 2, 4])] == [
        [0, 1, 2], [3, 4], [5, 6, 7]]
    # Token 3 of windows [0, 5) and [2, 7) scores min(3, 1) = min(1, 3) in both: the first
    # window wins (BERT's `score > best_score`).
    best = features._max_context([0, 2], [5, 5], 7)
    assert [(np.nonzero(b)[0] + s).tolist() for b, s in zip(best, [0, 2])] == [
        [0, 1, 2, 3], [4, 5, 6]]


def test_basic_tokenizer_matches_hugging_face():
    tf = pytest.importorskip("transformers.models.prophetnet.tokenization_prophetnet")
    hf = tf.BasicTokenizer(do_lower_case=False)
    for text in ["Steve Smith's, “quoted” (ok)!", "他在北京大学读书。 真的", "a\u00a0b\tc–d",
                 "naïve café 1920s U.S.", "ค่าเงิน 3.5%"]:
        assert qa_decoding.basic_tokenize(text) == hf.tokenize(text), text
    assert qa_decoding.get_final_text("Steve Smith", "Steve Smith's") == "Steve Smith"


def test_tagging_windows_round_trip_gold_tags(shared_data, tok):
    examples = tasks.get("panx").load_eval("de", shared_data)[:300]
    labels = tasks.get("panx").labels
    # 24 tokens per window: long sentences are split at word boundaries.
    feats = features.tagging_features(examples, tok, labels, 24)
    assert len(feats) > len(examples)
    logits = np.zeros((*feats.input_ids.shape, len(labels)))
    rows, cols = np.nonzero(feats.labels >= 0)
    logits[rows, cols, feats.labels[rows, cols]] = 1.0
    pred = features.decode_tags(logits, feats, examples, labels)
    gold = [list(ex.tags) for ex in examples]
    assert pred == gold
    assert scorers.entity_f1(gold, pred)["f1"] == 100.0
    # Exactly one labelled position per word.
    assert (feats.labels >= 0).sum() == sum(len(ex.tokens) for ex in examples)


def test_classification_features(shared_data, tok):
    examples = tasks.get("xnli").load_eval("en", shared_data)[:5]
    out = features.classification_features(examples, tok, 16)
    assert out["input_ids"].shape == (5, 16)
    row = out["input_ids"][0]
    assert row[0] == tok.cls_id and list(row).count(tok.sep_id) == 3
    assert out["labels"].tolist() == [ex.label for ex in examples]


def test_piece_after_a_zero_width_character_belongs_to_its_own_word(tok):
    """SentencePiece's normaliser deletes U+200B / U+200C / U+200E and counts them into
    the next piece; "▁came" must still start at "came", not inside "king\u200b"."""
    context = "the king\u200b came home"
    _, pieces, offsets = tok.encode_pieces(context)
    assert pieces[:3] == ["▁the", "▁king", "▁came"]
    assert offsets[2] == (10, 14) and context[10:14] == "came"
    assert tok.encode_pieces("the king\u200c\u200e came")[2][2] == (11, 15)
    ex = readers.QAExample("zw", "who?", context, ("came",), (10,))
    feats = features.qa_features([ex], tok, max_seq_length=32, max_query_length=8)
    pos = int(feats.start_positions[0])
    assert feats.tokens[0][pos] == "▁came" and feats.end_positions[0] == pos
    # The piece maps to the word "came" (index 2), so the answer text is "came"; before,
    # it mapped to word 1 and the prediction read "king\u200b".
    assert feats.word_index[0, pos] == 2
    start, end = _gold_logits(feats, 32)
    assert qa_decoding.compute_predictions(start, end, feats, [ex])["zw"] == "came"


def test_unknown_piece_reads_unk_as_xtreme_and_answers_whole_words(tok):
    """XTREME's tokens come from convert_ids_to_tokens: the unknown "☃" reads "<unk>", so
    "<unk>cd" is not found in the words and get_final_text returns the whole word."""
    context = "the king ab☃cd today"
    ex = readers.QAExample("unk", "what?", context, ("☃cd",), (11,))
    feats = features.qa_features([ex], tok, max_seq_length=32, max_query_length=8)
    s, e = int(feats.start_positions[0]), int(feats.end_positions[0])
    assert feats.tokens[0][s : e + 1] == ["☃", "c", "d"]
    assert feats.input_ids[0][s] == tok.unk_id == feats.unk_id
    start, end = _gold_logits(feats, 32)
    xtreme = qa_decoding.compute_predictions(start, end, feats, [ex])["unk"]
    text = qa_decoding.compute_predictions(start, end, feats, [ex], unknown_pieces="text")["unk"]
    assert xtreme == "ab☃cd" and text == "☃cd"
    # SQuAD F1 of the two against the gold "☃cd": 0 (one token, different) vs 100.
    ref = {"unk": ["☃cd"]}
    assert scorers.qa_scores({"unk": xtreme}, ref)["f1"] == 0.0
    assert scorers.qa_scores({"unk": text}, ref)["f1"] == 100.0
    with pytest.raises(ValueError, match="unknown_pieces"):
        qa_decoding.compute_predictions(start, end, feats, [ex], unknown_pieces="unk")
