"""Our SentencePiece vocabulary in Hugging Face's XLM-R id layout, for ``hf to_hf``.

Our vocabulary (``xlmeta_jax.data.vocabulary``) uses seqio's ids: ``<pad>`` 0,
``</s>`` 1, ``<unk>`` 2, ``<s>`` 3, ``<mask>`` 4, pieces from 5. transformers'
``XLMRobertaTokenizer`` hard-codes fairseq's dictionary instead: ``<s>`` 0, ``<pad>`` 1,
``</s>`` 2, ``<unk>`` 3, the SentencePiece model's ids from 3 on shifted by +1, and
``<mask>`` last; it assumes the SentencePiece file itself holds ``<unk>`` 0, ``<s>`` 1,
``</s>`` 2 (XLM-R's ``sentencepiece.bpe.model``). Every loader of an XLM-R directory
(the tokenizers-backed class of transformers 5, the SentencePiece-backed slow class and
``tokenizer.json`` of transformers 4, fairseq, our ``"fairseq"`` fine-tuning tokenizer)
derives its ids that way from that file.

So the export *converts the model to XLM-R's ids* rather than shipping a tokenizer with
ours (which only a generic tokenizer class would load correctly; every XLM-R-aware
tokenizer would shift it): it writes our SentencePiece model rewritten into XLM-R's
layout (same pieces, same scores, same normaliser, so the same segmentation; ``<pad>``
and ``<mask>`` leave the file as in XLM-R) and permutes the rows of the word embeddings
and of the output bias to match (:func:`hf_rows`). With ``N`` SentencePiece pieces the
permutation is a bijection of the first ``N`` ids::

    ours  0 <pad>  1 </s>  2 <unk>  3 <s>  4 <mask>  5 .. N-1 pieces
    HF    1        2       3        0      N-1       4 .. N-2

Rows past ``N`` (a model vocabulary padded beyond the SentencePiece model) keep their
ids. Since RoBERTa counts positions from ``pad_token_id + 1``, the position table moves
down one row as well, keeping XLM-R's shape (``weights.save_hf``). ``config.json`` then carries
XLM-R's special ids, and records the permutation (:data:`CONFIG_KEY`) so
``hf to_flax`` can undo it and the round trip is exact.

``tokenizer.json`` holds the same vocabulary for the tokenizers library, built to
segment as SentencePiece does, byte fallback included. transformers 5's
``XLMRobertaTokenizer`` rebuilds its model from that file's vocabulary with byte
fallback switched off, so for a vocabulary trained with byte fallback (ours by
default) ``tokenizer_config.json`` names the generic ``PreTrainedTokenizerFast``, which
loads ``tokenizer.json`` as written; a vocabulary without byte fallback gets
``XLMRobertaTokenizer``. Either way the ids agree with ``XLMRobertaTokenizer``'s: the
one difference is that the latter (in transformers 5) maps a character outside the
vocabulary to ``<unk>`` where SentencePiece emits its UTF-8 byte pieces; the export's
model card (:mod:`xlmeta_jax.interop.hf.card`) tells users to load ``AutoTokenizer``.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2 as pb

from xlmeta_jax import errors

# The XLM-R SentencePiece file's name (transformers' VOCAB_FILES_NAMES).
SPM_NAME = "sentencepiece.bpe.model"
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
# config.json key: the rows were permuted from our seqio ids of a SentencePiece model
# with this many pieces (absent: the model was in XLM-R's ids already).
CONFIG_KEY = "xlmeta_jax_seqio_pieces"

# Our special pieces by id (xlmeta_jax.data.vocabulary) and XLM-R's.
SEQIO_SPECIAL = ("<pad>", "</s>", "<unk>", "<s>", "<mask>")
XLMR_SPECIAL = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
_XLMR_SPM_SPECIAL = ("<unk>", "<s>", "</s>")


class VocabularyLayoutError(errors.UserError, ValueError):
    """A SentencePiece model that is in neither our nor XLM-R's id layout."""


def _model_proto(data: bytes, path=None):
    proto = pb.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        what = f"{path} is not" if path else "not"  # without a path: the caller names it
        raise VocabularyLayoutError(f"{what} a SentencePiece model ({e})") from None
    return proto


def layout(proto) -> str:
    """``"seqio"`` (ours), ``"xlmr"`` (XLM-R's file) or raises VocabularyLayoutError."""
    pieces = [p.piece for p in proto.pieces[:5]]
    if tuple(pieces) == SEQIO_SPECIAL and proto.trainer_spec.unk_id == 2:
        return "seqio"
    if tuple(pieces[:3]) == _XLMR_SPM_SPECIAL and proto.trainer_spec.unk_id == 0:
        return "xlmr"
    raise VocabularyLayoutError(
        f"SentencePiece model starts with pieces {pieces}: expected ours "
        f"{list(SEQIO_SPECIAL)} or XLM-R's {list(_XLMR_SPM_SPECIAL)}"
    )


def xlmr_sentencepiece(seqio_proto):
    """Our SentencePiece ModelProto rewritten into XLM-R's layout (a new proto).

    Pieces from id 5 keep their order, scores and types; ``<unk>``, ``<s>``, ``</s>``
    move to 0, 1, 2; ``<pad>`` and ``<mask>`` leave the file. The normaliser and the
    trainer options that affect encoding (byte fallback, whitespace handling) are kept.
    """

    out = pb.ModelProto()
    out.CopyFrom(seqio_proto)
    del out.pieces[:]
    kinds = pb.ModelProto.SentencePiece
    for name, kind in (("<unk>", kinds.UNKNOWN), ("<s>", kinds.CONTROL), ("</s>", kinds.CONTROL)):
        out.pieces.add(piece=name, score=0.0, type=kind)
    out.pieces.extend(seqio_proto.pieces[5:])
    spec = out.trainer_spec
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = 0, 1, 2, -1
    spec.unk_piece, spec.bos_piece, spec.eos_piece = "<unk>", "<s>", "</s>"
    spec.ClearField("pad_piece")
    for field in (spec.control_symbols, spec.user_defined_symbols):
        kept = [s for s in field if s not in SEQIO_SPECIAL]
        del field[:]
        field.extend(kept)
    return out


def seqio_sentencepiece(xlmr_proto):
    """Inverse of :func:`xlmr_sentencepiece`: our layout again (``<s>``, ``<mask>``
    as control symbols, as ``xlmeta_jax.data.vocabulary`` trains them)."""

    out = pb.ModelProto()
    out.CopyFrom(xlmr_proto)
    del out.pieces[:]
    kinds = pb.ModelProto.SentencePiece
    for name in SEQIO_SPECIAL:
        out.pieces.add(
            piece=name, score=0.0, type=kinds.UNKNOWN if name == "<unk>" else kinds.CONTROL
        )
    out.pieces.extend(xlmr_proto.pieces[3:])
    spec = out.trainer_spec
    spec.pad_id, spec.eos_id, spec.unk_id, spec.bos_id = 0, 1, 2, -1
    spec.pad_piece, spec.eos_piece, spec.unk_piece = "<pad>", "</s>", "<unk>"
    kept = [s for s in spec.control_symbols if s not in SEQIO_SPECIAL]
    del spec.control_symbols[:]
    spec.control_symbols.extend(["<s>", "<mask>", *kept])
    return out


def hf_rows(num_pieces: int, vocab_size: int) -> np.ndarray:
    """``rows[j]`` = our id of HF id ``j`` (see the module docstring's table).

    Args:
      num_pieces: pieces in our SentencePiece model (``N``).
      vocab_size: rows of the model's embedding table (``>= N``).
    """
    if vocab_size < num_pieces:
        raise VocabularyLayoutError(
            f"the SentencePiece model has {num_pieces} pieces but the model only "
            f"{vocab_size} embeddings"
        )
    return np.concatenate([
        [3, 0, 1, 2], np.arange(5, num_pieces), [4], np.arange(num_pieces, vocab_size)
    ]).astype(np.int64)


def _tokenizer_json(xlmr_proto) -> str:
    """``tokenizer.json`` of the XLM-R-layout vocabulary, segmenting as SentencePiece."""
    from tokenizers import (  # noqa: PLC0415 - optional: tokenizers (transformers) only for this
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    spec, norm = xlmr_proto.trainer_spec, xlmr_proto.normalizer_spec
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(p.piece, p.score) for p in xlmr_proto.pieces[3:]]
    vocab += [("<mask>", 0.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=XLMR_SPECIAL["unk"],
                                   byte_fallback=spec.byte_fallback))
    steps = []
    if norm.precompiled_charsmap:
        steps.append(normalizers.Precompiled(norm.precompiled_charsmap))
    if norm.remove_extra_whitespaces:
        # SentencePiece drops leading/trailing spaces and squeezes runs of them (after
        # the charsmap, which maps other whitespace to spaces).
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""),
                  normalizers.Replace(Regex(" {2,}"), " ")]
    tok.normalizer = normalizers.Sequence(steps)
    scheme = "always" if norm.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    parts = [decoders.Replace("▁", " ")]
    if spec.byte_fallback:
        parts.append(decoders.ByteFallback())
    parts.append(decoders.Fuse())
    if norm.add_dummy_prefix:
        parts.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(parts)
    bos, eos = XLMR_SPECIAL["bos"], XLMR_SPECIAL["eos"]
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    tok.add_special_tokens([
        AddedToken("<s>", normalized=False, special=True),
        AddedToken("<pad>", normalized=False, special=True),
        AddedToken("</s>", normalized=False, special=True),
        AddedToken("<unk>", normalized=False, special=True),
        # As XLM-R: "... <mask>" takes the space before it, so the prediction at the mask
        # is a word-initial piece.
        AddedToken("<mask>", lstrip=True, normalized=False, special=True),
    ])
    return tok.to_str(pretty=True)


def _special_tokens() -> dict[str, Any]:
    return {
        "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
        "unk_token": "<unk>", "pad_token": "<pad>",
        "mask_token": {"content": "<mask>", "lstrip": True, "normalized": False,
                       "rstrip": False, "single_word": False, "special": True},
    }


def tokenizer_files(vocab_path: str | os.PathLike, vocab_size: int,
                    model_max_length: int) -> tuple[dict[str, bytes], int | None]:
    """The tokenizer files of an export and the row permutation its weights need.

    Args:
      vocab_path: our SentencePiece ``.model`` (or an XLM-R ``sentencepiece.bpe.model``
        for a model already in XLM-R's ids).
      vocab_size: rows of the model's embedding table.
      model_max_length: longest input in tokens (XLM-R's max_position_embeddings - 2).

    Returns:
      ``(files, num_pieces)``: file name -> bytes, and for a vocabulary in our layout
      its number of pieces, which :func:`hf_rows` needs (None for one already in
      XLM-R's ids).

    Raises:
      VocabularyLayoutError: the file is in neither layout, or has more ids than
        the model has embeddings.
    """
    with open(vocab_path, "rb") as f:
        proto = _model_proto(f.read())  # the caller's message names the file
    kind = layout(proto)
    if kind == "seqio":
        num_pieces = len(proto.pieces)
        hf_rows(num_pieces, vocab_size)  # Checks that the ids fit.
        xlmr = xlmr_sentencepiece(proto)
    else:
        num_pieces, xlmr = None, proto
        if len(proto.pieces) + 2 > vocab_size:
            raise VocabularyLayoutError(
                f"{vocab_path} needs {len(proto.pieces) + 2} ids but the model has only "
                f"{vocab_size} embeddings"
            )
    tokenizer_class = (
        "PreTrainedTokenizerFast" if xlmr.trainer_spec.byte_fallback else "XLMRobertaTokenizer"
    )
    config = {
        "tokenizer_class": tokenizer_class,
        "model_max_length": model_max_length,
        "add_prefix_space": bool(xlmr.normalizer_spec.add_dummy_prefix),
        "clean_up_tokenization_spaces": False,
        **_special_tokens(),
    }
    files = {
        SPM_NAME: xlmr.SerializeToString(),
        TOKENIZER_NAME: _tokenizer_json(xlmr).encode(),
        TOKENIZER_CONFIG_NAME: json.dumps(config, indent=2, sort_keys=True).encode(),
        SPECIAL_TOKENS_MAP_NAME: json.dumps(_special_tokens(), indent=2,
                                            sort_keys=True).encode(),
    }
    return files, num_pieces


def seqio_vocabulary_bytes(hf_dir: str | os.PathLike) -> bytes:
    """Our SentencePiece model back from an export's ``sentencepiece.bpe.model``."""
    path = pathlib.Path(hf_dir) / SPM_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{hf_dir} has no {SPM_NAME}")
    proto = _model_proto(path.read_bytes(), path)
    if layout(proto) != "xlmr":
        raise VocabularyLayoutError(f"{path} is not in XLM-R's layout")
    return seqio_sentencepiece(proto).SerializeToString()
