"""A Hugging Face tokenizer folder read as it is: its ids, its special tokens, its record.

A released model (mmBERT, ModernBERT, XLM-R, EuroBERT) brings its tokenizer, and its ids
are part of the model. :func:`read` takes the folder (or its ``tokenizer.json``) and
returns a :class:`HFTokenizer`: the ``tokenizers`` library's tokenizer from
``tokenizer.json`` and the :class:`~xlmeta_jax.data.special_ids.SpecialIds` the rest of
the pipeline asks for. No TensorFlow here; the seqio vocabulary around it is
:mod:`xlmeta_jax.data.seqio_vocabularies`.

Where the special ids come from, checked against each other:

* ``cls`` and ``sep``: the tokenizer's own post-processor (what it adds around one
  sequence: ``<s> … </s>``, ``[CLS] … [SEP]``, ``<bos> … <eos>``), and what it puts
  between a pair's sentences; a side it leaves bare (Gemma's adds ``<bos>`` only; no
  post-processor adds nothing) takes the token ``tokenizer_config.json`` names
  (``cls_token`` or ``bos_token``, ``sep_token`` or ``eos_token``). Where both exist they
  must agree.
* ``pad``, ``mask``, ``unk``: the tokens ``tokenizer_config.json`` (or
  ``special_tokens_map.json``) names, looked up in ``tokenizer.json``.
* ``config.json``'s ``pad_token_id``, ``cls_token_id``, ``sep_token_id``,
  ``mask_token_id``, ``bos_token_id`` and ``eos_token_id``, where given, must equal
  them.
* Every added token of ``tokenizer.json`` (special or not) is never masked.

The record (:meth:`HFTokenizer.record`) is what a checkpoint keeps of its tokenizer: a
SHA-256 over the tokenizer files' bytes and the special ids.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from xlmeta_jax import errors
from xlmeta_jax.data.special_ids import SpecialIds, seqio_layout

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
MODEL_CONFIG = "config.json"
# The files that define the ids, hashed into the record and copied by an export.
TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP)
# What a folder holds when its tokenizer is a slow (Python) one only.
_SLOW_FILES = ("sentencepiece.bpe.model", "spiece.model", "tokenizer.model", "vocab.txt",
               "vocab.json")
# config.json's id keys, and the special id each must equal (bos/eos: the tokens the
# tokenizer names so, else cls/sep).
_CONFIG_IDS = ("pad", "cls", "sep", "mask", "bos", "eos")


class TokenizerError(errors.UserError, ValueError):
    """A tokenizer folder that cannot serve as a model's vocabulary, in one line."""


def is_tokenizer_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a Hugging Face tokenizer: a folder or a ``tokenizer.json``."""
    p = pathlib.Path(path)
    return p.is_dir() or p.name == TOKENIZER_JSON or p.suffix == ".json"


def holds_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether a model folder holds tokenizer files: a ``tokenizer.json``, or a slow
    tokenizer's only (which :func:`read` refuses, saying how to save the fast one)."""
    folder = pathlib.Path(folder)
    return any((folder / n).is_file() for n in (TOKENIZER_JSON, *_SLOW_FILES))


class HFTokenizer:
    """A ``tokenizer.json`` and the special ids of its folder.

    Attributes:
      folder: the folder of the files (the one given, or the ``tokenizer.json``'s).
      tokenizer: the ``tokenizers.Tokenizer``.
      specials: the special ids.
      files: the tokenizer files present, by name (``TOKENIZER_FILES``).
    """

    def __init__(self, folder: pathlib.Path, tokenizer, specials: SpecialIds,
                 files: dict[str, bytes]):
        self.folder = folder
        self.tokenizer = tokenizer
        self.specials = specials
        self.files = files
        # Hashed once: the seqio vocabulary's equality and hash read it for every task of a
        # mixture, and Gemma's tokenizer.json is tens of megabytes.
        self._record = make_record("tokenizers", files, specials)

    def __repr__(self):
        return f"HFTokenizer({str(self.folder)!r}, size={self.specials.size})"

    def encode_batch(self, texts) -> list[list[int]]:
        """The ids of each text, without special tokens (``encode_batch_fast``: the same
        ids without the offsets, which only fine-tuning's word alignment reads; 1.3x the
        tokens per CPU-second of ``encode_batch``, benchmarks/tokenize_speed.py)."""
        return [e.ids for e in self.tokenizer.encode_batch_fast(list(texts),
                                                                add_special_tokens=False)]

    def record(self) -> dict:
        """What a checkpoint records: the files' SHA-256 and the special ids."""
        return dict(self._record)


def make_record(kind: str, files: dict[str, bytes], specials: SpecialIds) -> dict:
    """A tokenizer's record: ``kind``, the SHA-256 of its files (by name) and its ids."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return {"kind": kind, "sha256": digest.hexdigest(), "files": sorted(files),
            "special_ids": specials.as_dict(), "size": specials.size}


def sentencepiece_record(data: bytes, num_pieces: int) -> dict:
    """The record of our SentencePiece model (its bytes, seqio's ids)."""
    return make_record("sentencepiece", {"model": data}, seqio_layout(num_pieces))


def record_of(path: str | os.PathLike) -> dict:
    """The record of the vocabulary at ``path``: a tokenizer folder or ``tokenizer.json``,
    or our SentencePiece ``.model`` (read as seqio's layout)."""
    if is_tokenizer_path(path):
        return read(path).record()
    import sentencepiece as spm  # noqa: PLC0415 - only for SentencePiece models

    data = pathlib.Path(path).read_bytes()
    return sentencepiece_record(data, spm.SentencePieceProcessor(model_proto=data)
                                .get_piece_size())


def same_tokenizer(a: dict, b: dict) -> bool:
    """Whether two records name the same tokenizer (files and special ids)."""
    return (a.get("sha256"), a.get("special_ids")) == (b.get("sha256"), b.get("special_ids"))


def describe(record: dict, where: str) -> str:
    """A record in a few words, for the line that refuses a mismatch."""
    ids = record.get("special_ids") or {}
    named = " ".join(f"{k} {v}" for k, v in ids.items() if v is not None)
    return (f"{where} ({record.get('kind')}, {record.get('size')} ids, {named}, sha256 "
            f"{str(record.get('sha256'))[:12]})")


def _token(value) -> str | None:
    """A token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: pathlib.Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path} is not readable JSON ({errors.first_line(e)})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} is not a JSON object")
    return data


def _wrapping(tokenizer) -> tuple[list[int], list[int], list[int] | None]:
    """(ids before a sequence, ids after it, ids between a pair's sentences or None)
    as the tokenizer's post-processor adds them."""
    a, b = "a", "b"
    plain_a = tokenizer.encode(a, add_special_tokens=False).ids
    plain_b = tokenizer.encode(b, add_special_tokens=False).ids
    single = tokenizer.encode(a, add_special_tokens=True).ids
    prefix = next((i for i in range(len(single) - len(plain_a) + 1)
                   if single[i:i + len(plain_a)] == plain_a), None)
    if prefix is None:
        return [], [], None
    before, after = single[:prefix], single[prefix + len(plain_a):]
    pair = tokenizer.encode(a, b, add_special_tokens=True).ids
    head = before + plain_a
    if pair[:len(head)] != head or pair[len(pair) - len(plain_b + after):] != plain_b + after:
        return before, after, None
    return before, after, pair[len(head):len(pair) - len(plain_b + after)]


def read(path: str | os.PathLike) -> HFTokenizer:
    """Reads a tokenizer folder (or its ``tokenizer.json``) and checks its special ids.

    Raises:
      TokenizerError: the folder has no ``tokenizer.json`` (a slow tokenizer only), the
        file does not parse, a special token is missing or the files disagree; the line
        names the file and what is wrong.
    """
    import tokenizers  # noqa: PLC0415 - only for Hugging Face tokenizers

    given = pathlib.Path(path)
    folder = given if given.is_dir() else given.parent
    tokenizer_json = given / TOKENIZER_JSON if given.is_dir() else given
    if not tokenizer_json.is_file():
        slow = [n for n in _SLOW_FILES if (folder / n).is_file()]
        if given.is_dir() and slow:
            raise TokenizerError(
                f"{folder} holds a slow tokenizer only ({', '.join(slow)}), no "
                f"{TOKENIZER_JSON}: save its fast tokenizer there first "
                "(transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder))")
        raise TokenizerError(f"{tokenizer_json} does not exist"
                             + (" (the folder has no tokenizer)" if given.is_dir() else ""))
    files = {TOKENIZER_JSON: tokenizer_json.read_bytes()}
    try:
        tokenizer = tokenizers.Tokenizer.from_str(files[TOKENIZER_JSON].decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - the Rust parser's error (serde's message)
        raise TokenizerError(f"{tokenizer_json} is not a tokenizers tokenizer.json "
                             f"({errors.first_line(e)})") from None
    named: dict[str, str] = {}
    for name in (SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG):  # the config's names win
        if (folder / name).is_file():
            files[name] = (folder / name).read_bytes()
            data = _read_json(folder / name)
            named.update({k[:-len("_token")]: t for k, v in data.items()
                          if k.endswith("_token") and (t := _token(v))})
    where = folder / TOKENIZER_CONFIG if TOKENIZER_CONFIG in files else tokenizer_json

    def id_of(role: str) -> int | None:
        token = named.get(role)
        if token is None:
            return None
        found = tokenizer.token_to_id(token)
        if found is None:
            raise TokenizerError(f"{where} names {role}_token {token!r}, which "
                                 f"{tokenizer_json} does not hold")
        return found

    before, after, middle = _wrapping(tokenizer)
    if len(before) > 1 or len(after) > 1:
        raise TokenizerError(
            f"{tokenizer_json}'s post-processor puts {len(before)} token(s) before a sequence "
            f"and {len(after)} after it; an encoder's rows need one of each (<s> … </s>, "
            "[CLS] … [SEP])")
    # A side the post-processor leaves bare (Gemma's adds <bos> only, a tokenizer without
    # one adds nothing) takes the token the files name for it.
    named_cls, named_sep = id_of("cls"), id_of("sep")
    for role, added, given in (("cls", before, named_cls), ("sep", after, named_sep)):
        if added and given is not None and given != added[0]:
            raise TokenizerError(f"{where} names {role}_token id {given}, but "
                                 f"{tokenizer_json}'s post-processor puts id {added[0]} there")
    cls = before[0] if before else (named_cls if named_cls is not None else id_of("bos"))
    sep = after[0] if after else (named_sep if named_sep is not None else id_of("eos"))
    if cls is None or sep is None:
        side, names = (("start", "cls_token or bos_token") if cls is None
                       else ("end", "sep_token or eos_token"))
        raise TokenizerError(f"{tokenizer_json} adds no {side} token to a sequence and "
                             f"{where} names no {names}: an encoder's rows need both")
    middle = middle if (before and after and middle is not None) else [sep]
    mask, pad = id_of("mask"), id_of("pad")
    if mask is None:
        raise TokenizerError(f"{where} names no mask_token: masked-LM training and fill-mask "
                             "need one")
    if pad is None:
        raise TokenizerError(f"{where} names no pad_token: padded rows need one")
    ids = {"pad": pad, "cls": cls, "sep": sep, "mask": mask,
           "bos": id_of("bos") if "bos" in named else cls,
           "eos": id_of("eos") if "eos" in named else sep}
    if (folder / MODEL_CONFIG).is_file():
        config = _read_json(folder / MODEL_CONFIG)
        for role in _CONFIG_IDS:
            given_id = config.get(f"{role}_token_id")
            if isinstance(given_id, int) and given_id != ids[role]:
                raise TokenizerError(
                    f"{folder / MODEL_CONFIG} has {role}_token_id={given_id}, but the "
                    f"tokenizer files give {role} id {ids[role]}")
    added = set(tokenizer.get_added_tokens_decoder())
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    specials = SpecialIds(
        pad=pad, cls=cls, sep=sep, mask=mask, unk=id_of("unk"),
        never_masked=tuple(sorted(added | {pad, cls, sep, mask} | (
            {id_of("unk")} if named.get("unk") else set()))),
        pair_middle=tuple(middle), size=size)
    return HFTokenizer(folder, tokenizer, specials, files)


# Gemma's layout (mmBERT's tokenizer): the special tokens first, <bos>/<eos> around a row.
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")


def train_tokenizer(folder: str | os.PathLike, sentences, vocab_size: int) -> pathlib.Path:
    """Trains a small BPE tokenizer in Gemma's id layout and saves it as a folder.

    What a released mmBERT folder holds, at toy size: ``tokenizer.json`` (BPE over
    SentencePiece-style ``▁`` words with byte fallback, ``<pad>`` 0 ``<eos>`` 1 ``<bos>`` 2
    ``<unk>`` 3 ``<mask>`` 4, a post-processor that writes ``<bos> a <eos>`` and
    ``<bos> a <eos> b <eos>``), ``tokenizer_config.json`` and ``special_tokens_map.json``.
    Its ids are not seqio's (``<bos>`` and ``<unk>`` swap places), so a pipeline that
    assumed ours would train on the wrong ids. For demos and tests.

    Args:
      folder: where the files go (created).
      sentences: the training text.
      vocab_size: ids in all, the special ones included.

    Returns:
      The folder.
    """
    import tokenizers  # noqa: PLC0415 - only for Hugging Face tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415

    pad, eos, bos, unk, mask = GEMMA_SPECIALS
    tok = tokenizers.Tokenizer(models.BPE(unk_token=unk, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()])
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size), special_tokens=list(GEMMA_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:0], show_progress=False,
        limit_alphabet=1000)
    tok.train_from_iterator(list(sentences), trainer)
    ids = {t: tok.token_to_id(t) for t in GEMMA_SPECIALS}
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:1 {eos}:1",
        special_tokens=[(bos, ids[bos]), (eos, ids[eos])])
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(os.fspath(folder / TOKENIZER_JSON))
    named = {"bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": pad,
             "mask_token": mask, "cls_token": bos, "sep_token": eos}
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps(named, indent=2) + "\n")
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, **named},
        indent=2) + "\n")
    return folder
