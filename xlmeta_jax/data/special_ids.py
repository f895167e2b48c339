"""The ids a model's tokenizer reserves, in the form every id-aware step asks for them.

A vocabulary (:func:`xlmeta_jax.data.vocabulary.load_vocabulary`) carries one
:class:`SpecialIds`: masking reads which ids are never selected or drawn as random
replacements, packing how a document is wrapped (``cls … sep``), fine-tuning how a pair
is joined (``pair_middle``; :mod:`xlmeta_jax.evaluation.tokenization` builds the rows),
padding the pad id. Nothing else in the pipeline names an id.

Our own SentencePiece vocabularies use seqio's layout (:data:`SEQIO`): pad 0, eos 1,
unk 2, ``<s>`` 3, ``<mask>`` 4, and pieces from 5. A Hugging Face tokenizer's are read
from its files (:mod:`xlmeta_jax.data.hf_tokenizer`): ModernBERT's ``[CLS]``/``[SEP]``
near the end of its 50k ids, Gemma's (mmBERT) ``<pad>`` 0 ``<eos>`` 1 ``<bos>`` 2,
XLM-R's ``<s>`` 0 ``<pad>`` 1 ``</s>`` 2.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# seqio's layout, which our SentencePiece trainer writes (xlmeta_jax.data.vocabulary).
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3
MASK_ID = 4
# Ids below this are special in seqio's layout.
NUM_SPECIAL_TOKENS = 5


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """A tokenizer's reserved ids.

    Attributes:
      pad: padding.
      cls: the token that starts every sequence and packed document (``<s>``,
        ``[CLS]``, ``<bos>``); its output is the sequence's classification position.
      sep: the token that ends every sequence and document (``</s>``, ``[SEP]``,
        ``<eos>``); in the pretraining token stream it ends each line or document.
      mask: the MLM mask.
      unk: the unknown token, None where the tokenizer has none (byte-level BPE).
      never_masked: every special or added token's id, sorted: never selected for
        masking, never drawn as a random replacement.
      pair_middle: what joins a pair's two sentences (``</s></s>`` in RoBERTa and
        XLM-R, ``[SEP]`` in BERT and ModernBERT).
      size: the tokenizer's number of ids; a model's vocabulary may be larger
        (rows past ``size`` are padding that no text reaches).
    """

    pad: int
    cls: int
    sep: int
    mask: int
    unk: int | None
    never_masked: tuple[int, ...]
    pair_middle: tuple[int, ...]
    size: int

    def as_dict(self) -> dict:
        """The named ids, as a checkpoint records them."""
        return {"pad": self.pad, "cls": self.cls, "sep": self.sep, "mask": self.mask,
                "unk": self.unk}

    def is_candidate(self) -> np.ndarray:
        """bool[size]: which ids masking may select (every id but the reserved ones)."""
        table = np.ones([self.size], bool)
        table[list(self.never_masked)] = False
        return table

    def replacement_ids(self) -> np.ndarray:
        """int32[n]: the ids a random replacement is drawn from, uniformly."""
        return np.flatnonzero(self.is_candidate()).astype(np.int32)


def seqio_layout(size: int) -> SpecialIds:
    """Our SentencePiece vocabularies' ids (``size`` pieces): the pair as RoBERTa's."""
    return SpecialIds(pad=PAD_ID, cls=BOS_ID, sep=EOS_ID, mask=MASK_ID, unk=UNK_ID,
                      never_masked=tuple(range(NUM_SPECIAL_TOKENS)),
                      pair_middle=(EOS_ID, EOS_ID), size=int(size))


def of(vocabulary) -> SpecialIds:
    """A seqio vocabulary's special ids: its own (``load_vocabulary``'s kinds), or seqio's
    layout for a plain ``seqio.SentencePieceVocabulary`` of one of our models (what a
    t5x config or a notebook may build itself)."""
    own = getattr(vocabulary, "specials", None)
    return own if own is not None else seqio_layout(vocabulary.vocab_size)
