"""QA windowing + span decoding and tagging windows, checked end to end on real data."""

import numpy as np
import pytest

from xlmeta_jax.evaluation import features, readers, scorers, tokenization


@pytest.fixture(scope="module")
def tok(shared_data, tmp_path_factory):
    path = shared_data / "english_pd" / "tinyshakespeare" / "input.txt"
    lines = [line for line in path.read_text().splitlines() if line.strip()][:8000]
    prefix = tmp_path_factory.mktemp("spm") / "en"
    return tokenization.Tokenizer(tokenization.train_sentencepiece(lines, prefix, 1000))


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
    examples = readers.load_eval("tydiqa", lang, shared_data)[:150]
    # Short windows: many contexts span several windows.
    feats = features.qa_features(
        examples, tok, max_seq_length=192, doc_stride=64, max_query_length=48
    )
    assert len(feats) > 1.5 * len(examples)
    start, end = _gold_logits(feats, 192)
    preds = features.decode_qa(start, end, feats, examples, max_answer_length=192)
    in_window = set(feats.example_index[feats.start_positions > 0].tolist())
    # Answers whose boundaries fall inside a piece ("1920" in "1920s") cannot be exact,
    # nor can answers longer than a window.
    aligned = [
        ex for i, ex in enumerate(examples) if i in in_window and _token_aligned(tok, ex)
    ]
    assert len(aligned) >= 0.85 * len(examples)
    for ex in aligned:
        assert preds[ex.id] == ex.answers[0]
    refs = {ex.id: list(ex.answers) for ex in aligned}
    scores = scorers.qa_scores(preds, refs)
    assert scores["f1"] == 100.0 and scores["exact_match"] == 100.0
    overall = scorers.qa_scores(preds, {ex.id: list(ex.answers) for ex in examples})
    assert overall["f1"] > 90.0


def test_windows_cover_every_context_token(shared_data, tok):
    examples = readers.load_eval("tydiqa", "en", shared_data)[:40]
    feats = features.qa_features(
        examples, tok, max_seq_length=96, doc_stride=32, max_query_length=24
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


def test_decode_respects_max_answer_length_and_context():
    ex = readers.QAExample("q", "who?", "alpha beta gamma", ("beta",), (6,))
    offsets = np.full((1, 8, 2), -1, np.int32)
    offsets[0, 4:7] = [[0, 5], [6, 10], [11, 16]]
    feats = features.QAFeatures(
        input_ids=np.ones((1, 8), np.int32), start_positions=np.zeros(1, np.int32),
        end_positions=np.zeros(1, np.int32), offsets=offsets,
        example_index=np.zeros(1, np.int32),
    )
    start = np.array([[9.0, 0, 0, 0, 1.0, 5.0, 0, 0]])  # position 0 (<s>) is not context
    end = np.array([[9.0, 0, 0, 0, 0, 1.0, 4.0, 0]])
    assert features.decode_qa(start, end, feats, [ex])["q"] == "beta gamma"
    assert features.decode_qa(start, end, feats, [ex], max_answer_length=1)["q"] == "beta"


def test_tagging_windows_round_trip_gold_tags(shared_data, tok):
    examples = readers.load_eval("panx", "de", shared_data)[:300]
    labels = readers.PANX_LABELS
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
    examples = readers.load_eval("xnli", "en", shared_data)[:5]
    out = features.classification_features(examples, tok, 16)
    assert out["input_ids"].shape == (5, 16)
    row = out["input_ids"][0]
    assert row[0] == tok.cls_id and list(row).count(tok.sep_id) == 3
    assert out["labels"].tolist() == [ex.label for ex in examples]
