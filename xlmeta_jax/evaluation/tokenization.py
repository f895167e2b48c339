"""SentencePiece tokenisation for fine-tuning, with character offsets.

Two id conventions are supported:

* ``"seqio"`` — our vocabulary: pad=0, eos=1, unk=2, ``<s>``=3, ``<mask>``=4, pieces
  at their SentencePiece ids (the model file itself defines these ids; the convention
  and its trainer, ``train_sentencepiece``, live in :mod:`xlmeta_jax.data.vocabulary`).
* ``"fairseq"`` — Hugging Face / fairseq XLM-R: ``<s>``=0, ``<pad>``=1, ``</s>``=2,
  ``<unk>``=3, every other SentencePiece id shifted by +1, ``<mask>`` = last id
  (250001 for XLM-R's 250000-piece ``sentencepiece.bpe.model``).

A single sequence is ``<s> x </s>`` and a pair ``<s> a </s></s> b </s>`` (RoBERTa),
where ``</s>`` is eos in our vocabulary. Only the ``sentencepiece`` package is used
(no TensorFlow).

A Hugging Face tokenizer folder (``tokenizer.json``: mmBERT's Gemma tokenizer,
ModernBERT's BPE, XLM-R's) is :class:`HFTokenizer`, with the same methods: its own ids,
its own wrapping (``[CLS] a [SEP] b [SEP]`` for ModernBERT), offsets from ``tokenizers``.
:func:`load_tokenizer` picks the class from the path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from xlmeta_jax.data import hf_tokenizer, vocabulary
from xlmeta_jax.data.special_ids import SpecialIds

KINDS = ("seqio", "fairseq")


class Tokenizer:
    """A SentencePiece model with the special ids of one convention.

    Attributes:
      kind: "seqio" or "fairseq".
      vocab_size: number of ids the encoder's embedding table must have.
      pad_id, cls_id, sep_id, unk_id, mask_id: special ids (``cls`` = ``<s>``,
        ``sep`` = eos / ``</s>``).
    """

    def __init__(self, model_path: str | os.PathLike, kind: str = "seqio"):
        model_path = os.fspath(model_path)
        if kind not in KINDS:
            raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {KINDS}")
        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"SentencePiece model file {model_path} does not exist")
        self.model_path = model_path
        self.kind = kind
        self.sp = spm.SentencePieceProcessor(model_file=model_path)
        self._invisible_chars: dict[str, bool] = {}
        n = self.sp.get_piece_size()
        if kind == "seqio":
            try:
                vocabulary.check_sentencepiece_model(self.sp, "the model")
            except vocabulary.VocabularyError as e:
                raise vocabulary.VocabularyError(
                    f"{model_path} does not follow our vocabulary convention ({e}). For a "
                    "Hugging Face XLM-R model use kind='fairseq'."
                ) from None
            self.vocab_size = n
            self.pad_id, self.sep_id, self.unk_id = (
                vocabulary.PAD_ID, vocabulary.EOS_ID, vocabulary.UNK_ID
            )
            self.cls_id, self.mask_id = vocabulary.BOS_ID, vocabulary.MASK_ID
        else:
            # fairseq's dictionary: 4 specials, then spm pieces from spm id 3 on (spm ids
            # 0..2 are its own unk/bos/eos); net offset +1, spm unk -> <unk>.
            self.vocab_size = n + 2
            self.cls_id, self.pad_id, self.sep_id, self.unk_id = 0, 1, 2, 3
            self.mask_id = n + 1

    def __repr__(self):
        return f"Tokenizer({self.model_path!r}, kind={self.kind!r}, vocab_size={self.vocab_size})"

    def record(self) -> dict:
        """What a checkpoint records of this tokenizer (as the pretraining vocabulary's)."""
        with open(self.model_path, "rb") as f:
            return hf_tokenizer.make_record("sentencepiece", {"model": f.read()}, SpecialIds(
                pad=self.pad_id, cls=self.cls_id, sep=self.sep_id, mask=self.mask_id,
                unk=self.unk_id, never_masked=(), pair_middle=self.pair_middle,
                size=self.vocab_size))

    def _map(self, spm_ids: Sequence[int]) -> list[int]:
        if self.kind == "seqio":
            return list(spm_ids)
        unk = self.sp.unk_id()
        return [self.unk_id if i == unk else i + 1 for i in spm_ids]

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` (no special tokens)."""
        return self._map(self.sp.encode(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of several texts at once (no special tokens)."""
        return [self._map(ids) for ids in self.sp.encode(list(texts))]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Piece ids and, per piece, the ``[begin, end)`` character span it covers.

        Leading whitespace (the ``▁`` of a piece) and leading characters that the
        normaliser deletes (U+200B, U+200C, U+200E, ... which SentencePiece counts into
        the next piece) are excluded from the span, so a span starts at the piece's
        first visible character, inside its own word; a piece that covers no visible
        character gets an empty span.
        """
        ids, _, offsets = self.encode_pieces(text)
        return ids, offsets

    def encode_pieces(self, text: str) -> tuple[list[int], list[str], list[tuple[int, int]]]:
        """Ids, piece strings (with ``▁``, as Hugging Face's ``tokenize``) and offsets."""
        proto = self.sp.encode(text, out_type="proto")
        # SentencePiece reports byte offsets into the UTF-8 input.
        byte_to_char = _byte_to_char_map(text)
        ids, pieces, offsets = [], [], []
        for piece in proto.pieces:
            begin, end = byte_to_char[piece.begin], byte_to_char[piece.end]
            # Without skipping deleted characters, "▁came" of "king\u200b came" would
            # start at the U+200B, inside the previous word.
            while begin < end and self._invisible(text[begin]):
                begin += 1
            ids.append(piece.id)
            pieces.append(piece.piece)
            offsets.append((begin, end))
        return self._map(ids), pieces, offsets

    def _invisible(self, char: str) -> bool:
        """Whether the normaliser turns ``char`` alone into nothing (whitespace too)."""
        hidden = self._invisible_chars.get(char)
        if hidden is None:
            hidden = self._invisible_chars[char] = char.isspace() or not self.sp.normalize(char)
        return hidden

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, skipping special ids."""
        special = {self.pad_id, self.cls_id, self.sep_id, self.mask_id}
        if self.kind == "seqio":
            spm_ids = [i for i in ids if i not in special]
        else:
            spm_ids = [
                self.sp.unk_id() if i == self.unk_id else i - 1 for i in ids if i not in special
            ]
        return self.sp.decode(spm_ids)

    def single(self, ids: Sequence[int], max_length: int) -> list[int]:
        """``<s> ids </s>``, ids truncated to fit ``max_length``."""
        return [self.cls_id, *list(ids)[: max_length - 2], self.sep_id]

    @property
    def pair_middle(self) -> tuple[int, ...]:
        """What joins a pair's sentences: ``</s></s>`` (RoBERTa)."""
        return (self.sep_id, self.sep_id)

    def pair(self, a: Sequence[int], b: Sequence[int], max_length: int) -> list[int]:
        """``<s> a </s></s> b </s>``, truncating the longer side first to fit."""
        return _pair(self, a, b, max_length)

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's ids (SentencePiece segments at whitespace: each word alone)."""
        return self.encode_batch(words)


def _pair(tok, a: Sequence[int], b: Sequence[int], max_length: int) -> list[int]:
    """``cls a <pair_middle> b sep``, truncating the longer side first to fit."""
    a, b = list(a), list(b)
    budget = max_length - 2 - len(tok.pair_middle)
    if budget < 2:
        raise ValueError(f"max_length={max_length} leaves no room for a sentence pair")
    while len(a) + len(b) > budget:
        if len(a) >= len(b):
            a.pop()
        else:
            b.pop()
    return [tok.cls_id, *a, *tok.pair_middle, *b, tok.sep_id]


class HFTokenizer:
    """A Hugging Face tokenizer folder with the methods of :class:`Tokenizer`.

    Its ids are the folder's own (:mod:`xlmeta_jax.data.hf_tokenizer`), a pair is joined
    as its post-processor joins one, and offsets come from ``tokenizers`` (leading
    whitespace left out of a piece's span, as for SentencePiece above).
    """

    kind = "tokenizers"

    def __init__(self, path: str | os.PathLike):
        self.hf = hf_tokenizer.read(path)
        self.model_path = os.fspath(self.hf.folder)
        specials = self.hf.specials
        self.vocab_size = specials.size
        self.pad_id, self.cls_id, self.sep_id = specials.pad, specials.cls, specials.sep
        self.unk_id = specials.unk if specials.unk is not None else specials.pad
        self.mask_id = specials.mask
        self.pair_middle = specials.pair_middle

    def __repr__(self):
        return f"HFTokenizer({self.model_path!r}, vocab_size={self.vocab_size})"

    def record(self) -> dict:
        """What a checkpoint records of this tokenizer."""
        return self.hf.record()

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` (no special tokens)."""
        return self.hf.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of several texts at once (no special tokens)."""
        return self.hf.encode_batch(texts)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Piece ids and each piece's ``[begin, end)`` characters (see :class:`Tokenizer`)."""
        ids, _, offsets = self.encode_pieces(text)
        return ids, offsets

    def encode_pieces(self, text: str) -> tuple[list[int], list[str], list[tuple[int, int]]]:
        """Ids, piece strings and character offsets, leading whitespace left out."""
        enc = self.hf.tokenizer.encode(text, add_special_tokens=False)
        offsets = []
        for begin, end in enc.offsets:
            while begin < end and text[begin].isspace():
                begin += 1
            offsets.append((begin, end))
        return list(enc.ids), list(enc.tokens), offsets

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's ids, as the words joined by spaces tokenize (a byte-level BPE marks
        a word's first piece by the space before it), each piece to the word its offsets
        start in."""
        text, starts = "", []
        for w in words:
            starts.append(len(text) + (1 if text else 0))
            text = f"{text} {w}" if text else w
        ids, offsets = self.encode_with_offsets(text)
        out: list[list[int]] = [[] for _ in words]
        word_of = np.searchsorted(np.array(starts), [b for b, _ in offsets], side="right") - 1
        for i, w in zip(ids, word_of):
            out[max(int(w), 0)].append(i)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, skipping special ids."""
        return self.hf.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def single(self, ids: Sequence[int], max_length: int) -> list[int]:
        """``cls ids sep``, ids truncated to fit ``max_length``."""
        return [self.cls_id, *list(ids)[: max_length - 2], self.sep_id]

    def pair(self, a: Sequence[int], b: Sequence[int], max_length: int) -> list[int]:
        """``cls a <pair_middle> b sep``, truncating the longer side first to fit."""
        return _pair(self, a, b, max_length)


def load_tokenizer(path: str | os.PathLike, kind: str | None = None):
    """The fine-tuning tokenizer of ``path``: a Hugging Face tokenizer folder or
    ``tokenizer.json`` (:class:`HFTokenizer`), else a SentencePiece model of ``kind``."""
    if kind in (None, HFTokenizer.kind) and hf_tokenizer.is_tokenizer_path(path):
        return HFTokenizer(path)
    return Tokenizer(path, kind or "seqio")


def _byte_to_char_map(text: str) -> np.ndarray:
    """Index i: the character that byte i of ``text.encode()`` belongs to (len+1 entries)."""
    lengths = np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))
    out = np.repeat(np.arange(len(text)), lengths)
    return np.append(out, len(text))
