"""The two kinds of vocabulary, as seqio ``Vocabulary`` objects with their special ids.

* :class:`SentencePieceVocabulary`: our SentencePiece model in seqio's ids (seqio's own
  class, which the XLM-R demo has always used, plus the ids and the record);
* :class:`TokenizerVocabulary`: a Hugging Face ``tokenizer.json`` in its own ids
  (:mod:`xlmeta_jax.data.hf_tokenizer`), encoded in tf.data through the ``tokenizers``
  library, so tasks, mixtures, t5x and the Beam token cache take it as they take ours.

Both answer the same questions: ``encode(text)`` and ``encode_batch(texts)`` give the ids
without special tokens, ``specials`` the :class:`~xlmeta_jax.data.special_ids.SpecialIds`
(also as ``pad_id``, ``cls_id``, ``sep_id``, ``mask_id``, ``unk_id``), ``record()`` what a
checkpoint keeps. Built by :func:`xlmeta_jax.data.vocabulary.load_vocabulary`.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import seqio
import tensorflow as tf

from xlmeta_jax.data import hf_tokenizer
from xlmeta_jax.data.special_ids import SpecialIds, seqio_layout


class _SpecialIdAttributes:
    """``pad_id`` … ``mask_id`` from ``specials`` (seqio's eos is the sequence end)."""

    specials: SpecialIds

    @property
    def pad_id(self) -> int:
        return self.specials.pad

    @property
    def cls_id(self) -> int:
        return self.specials.cls

    @property
    def sep_id(self) -> int:
        return self.specials.sep

    @property
    def mask_id(self) -> int:
        return self.specials.mask


class SentencePieceVocabulary(_SpecialIdAttributes, seqio.SentencePieceVocabulary):
    """Our SentencePiece model (seqio's layout: pad 0, eos 1, unk 2, ``<s>`` 3, ``<mask>``
    4), checked by :func:`xlmeta_jax.data.vocabulary.load_vocabulary`."""

    @property
    def specials(self) -> SpecialIds:
        return seqio_layout(self.tokenizer.get_piece_size())

    def encode_batch(self, texts) -> list[list[int]]:
        """The ids of each text, without special tokens."""
        return self.tokenizer.encode(list(texts))

    def record(self) -> dict:
        """The model file's SHA-256 and the special ids."""
        with tf.io.gfile.GFile(self.sentencepiece_model_file, "rb") as f:
            return hf_tokenizer.sentencepiece_record(f.read(), self.specials.size)


def one_tokenizer_thread() -> None:
    """Sets ``TOKENIZERS_PARALLELISM=false`` in the process unless it is set.

    tf.data runs the tokenizer's calls in parallel already, and Beam runs a worker per
    core: the ``tokenizers`` library's own thread pool competing with them cost a third
    of the tokens per CPU-second (benchmarks/tokenize_speed.py). It also spares Beam's
    forked workers the library's fork warning.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class BatchEncodingTf:
    """``encode_tf`` through the Python ``encode_batch`` of a tokenizer library: a batch of
    strings per ``tf.numpy_function`` call, as ``(ids, counts)`` (no per-string call)."""

    def encode_flat(self, strings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """UTF-8 strings to (all their ids, each one's count): what tf.data receives."""
        ids = self.encode_batch([s.decode("utf-8") for s in strings])
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        values = np.fromiter(itertools.chain.from_iterable(ids), np.int32,
                             count=int(lengths.sum()))
        return values, lengths

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """A string scalar to int32 ids, or a vector of strings to a ragged [n, None]
        (on one tokenizer thread: :func:`one_tokenizer_thread`)."""
        one_tokenizer_thread()
        s = tf.convert_to_tensor(s, tf.string)
        values, lengths = tf.numpy_function(self.encode_flat, [tf.reshape(s, [-1])],
                                            [tf.int32, tf.int64], stateful=False)
        values.set_shape([None])
        lengths.set_shape([None])
        if s.shape.rank == 0:
            return values
        return tf.RaggedTensor.from_row_lengths(values, lengths)


class TokenizerVocabulary(_SpecialIdAttributes, BatchEncodingTf, seqio.Vocabulary):
    """A Hugging Face tokenizer in its own ids, as a seqio vocabulary.

    Args:
      hf: the folder's tokenizer, as :func:`xlmeta_jax.data.hf_tokenizer.read` returns it.
    """

    def __init__(self, hf: hf_tokenizer.HFTokenizer):
        super().__init__(extra_ids=0)
        self.hf = hf
        self.specials = hf.specials

    def __repr__(self):
        return f"TokenizerVocabulary({str(self.hf.folder)!r}, size={self.specials.size})"

    def __eq__(self, other):
        return isinstance(other, TokenizerVocabulary) and hf_tokenizer.same_tokenizer(
            self.record(), other.record())

    def __hash__(self):
        return hash(self.record()["sha256"])

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer``."""
        return self.hf.tokenizer

    @property
    def eos_id(self) -> int:
        return self.specials.sep

    @property
    def bos_id(self) -> int:
        return self.specials.cls

    @property
    def unk_id(self) -> int | None:
        return self.specials.unk

    @property
    def _base_vocab_size(self) -> int:
        return self.specials.size

    def record(self) -> dict:
        return self.hf.record()

    def encode_batch(self, texts) -> list[list[int]]:
        """The ids of each text, without special tokens."""
        return self.hf.encode_batch(texts)

    def _encode(self, s: str) -> list[int]:
        return self.tokenizer.encode(s, add_special_tokens=False).ids

    def _decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        def decode(rows):
            rows = np.atleast_2d(rows)
            return np.array([self.tokenizer.decode([int(i) for i in r], skip_special_tokens=True)
                             .encode("utf-8") for r in rows], object)

        out = tf.numpy_function(decode, [ids], tf.string, stateful=False)
        return tf.reshape(out, []) if ids.shape.rank == 1 else tf.reshape(out, [-1])
