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
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from xlmeta_jax.data import vocabulary

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

    def pair(self, a: Sequence[int], b: Sequence[int], max_length: int) -> list[int]:
        """``<s> a </s></s> b </s>``, truncating the longer side first to fit."""
        a, b = list(a), list(b)
        budget = max_length - 4
        if budget < 2:
            raise ValueError(f"max_length={max_length} leaves no room for a sentence pair")
        while len(a) + len(b) > budget:
            if len(a) >= len(b):
                a.pop()
            else:
                b.pop()
        return [self.cls_id, *a, self.sep_id, self.sep_id, *b, self.sep_id]


def _byte_to_char_map(text: str) -> np.ndarray:
    """Index i: the character that byte i of ``text.encode()`` belongs to (len+1 entries)."""
    lengths = np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))
    out = np.repeat(np.arange(len(text)), lengths)
    return np.append(out, len(text))
