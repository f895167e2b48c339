"""Tokenizer conventions (ours and fairseq/HF XLM-R) and character offsets."""

import pytest

from xlmeta_jax.data import vocabulary
from xlmeta_jax.evaluation import tokenization

# XLM-R's SentencePiece ids (unk 0, <s> 1, </s> 2, no pad), which fairseq shifts.
XLMR_SPM_IDS = dict(pad_id=-1, eos_id=2, unk_id=0, bos_id=1, control_symbols=[])


@pytest.fixture(scope="module")
def english_text(english_lines):
    return english_lines


@pytest.fixture(scope="module")
def our_vocab(english_spm):
    return english_spm


def test_our_vocab_special_ids(our_vocab):
    tok = tokenization.Tokenizer(our_vocab)
    assert (tok.pad_id, tok.sep_id, tok.unk_id, tok.cls_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert [tok.sp.id_to_piece(i) for i in (3, 4)] == ["<s>", "<mask>"]
    ids = tok.encode("to be or not")
    assert tok.single(ids, 64) == [3, *ids, 1]
    assert tok.pair([7, 8, 9], [10], 7) == [3, 7, 8, 1, 1, 10, 1]
    assert tok.decode(tok.single(ids, 64)) == "to be or not"


def test_special_pieces_in_text_are_plain_text(our_vocab, english_text, tmp_path):
    # <s> and <mask> are control symbols: text that spells them cannot inject the ids.
    tok = tokenization.Tokenizer(our_vocab)
    text = "a <mask> b <s> c <mask><s>"
    for ids in (tok.encode(text), tok.encode_with_offsets(text)[0]):
        assert not {tok.cls_id, tok.mask_id} & set(ids)
    # A vocabulary with user-defined <s>/<mask> (the old evaluation trainer's) is refused.
    user_defined = vocabulary.train_sentencepiece(
        tmp_path / "user_defined", 300, sentences=[*english_text[:2000], text],
        trainer_options=dict(control_symbols=[], user_defined_symbols=["<s>", "<mask>"]),
    )
    with pytest.raises(vocabulary.VocabularyError, match="must be a control symbol"):
        tokenization.Tokenizer(user_defined)


def test_vocab_not_following_convention_is_rejected(english_text, tmp_path):
    other = vocabulary.train_sentencepiece(
        tmp_path / "x", 300, sentences=english_text[:2000], trainer_options=XLMR_SPM_IDS
    )
    with pytest.raises(ValueError, match="does not follow our vocabulary convention"):
        tokenization.Tokenizer(other)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tokenization.Tokenizer(tmp_path / "missing.model")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenization.Tokenizer(other, "bert")


@pytest.mark.parametrize(
    "text",
    [
        "Héllo  wörld, the1920s.",
        "北京大学 and Ελληνικά",
        "  leading spaces\tand tabs ",
        "ঢাকা। తెలుగు العربية",
    ],
)
def test_offsets_point_at_the_piece_text(our_vocab, text):
    tok = tokenization.Tokenizer(our_vocab)
    ids, offsets = tok.encode_with_offsets(text)
    assert ids == tok.encode(text)
    covered = []
    for (b, e), piece_id in zip(offsets, ids):
        assert 0 <= b <= e <= len(text)
        span = text[b:e]
        assert span == span.lstrip(), "spans start at a visible character"
        if piece_id != tok.unk_id:
            # A known piece's surface is its text, with ▁ for a space.
            assert tok.sp.id_to_piece(piece_id).lstrip("▁") == span
        covered.append(span)
    # Together the spans spell the text without its whitespace.
    assert "".join(covered) == "".join(text.split())


def test_fairseq_ids_match_hugging_face(english_text, tmp_path):
    transformers = pytest.importorskip("transformers")
    # A model with XLM-R's SentencePiece specials (unk 0, <s> 1, </s> 2).
    model = vocabulary.train_sentencepiece(
        tmp_path / "sentencepiece.bpe", 500, sentences=english_text[:3000],
        trainer_options=XLMR_SPM_IDS,
    )
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "sentencepiece.bpe.model").write_bytes(open(model, "rb").read())
    hf_tok = transformers.XLMRobertaTokenizer.from_pretrained(str(tmp_path / "hf"))
    tok = tokenization.Tokenizer(model, "fairseq")
    assert tok.vocab_size == len(hf_tok)
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (
        hf_tok.cls_token_id, hf_tok.pad_token_id, hf_tok.sep_token_id, hf_tok.unk_token_id,
        hf_tok.mask_token_id,
    )
    for text in ["Hello world, ‽ zebra", "What light through yonder window breaks?"]:
        assert tok.single(tok.encode(text), 128) == hf_tok(text)["input_ids"]
    assert tok.pair(tok.encode("a b"), tok.encode("c"), 128) == hf_tok("a b", "c")["input_ids"]
