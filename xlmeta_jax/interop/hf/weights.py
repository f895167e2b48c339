"""Hugging Face weights of either family: ``save_pretrained`` directories <-> our parameters.

Reads and writes ``save_pretrained`` directories (safetensors, sharded or not;
``pytorch_model.bin`` only on request) of ``XLMRobertaForMaskedLM`` (layout mapping:
:mod:`xlmeta_jax.interop.hf.layout`, whose public names this module re-exports) and of
``ModernBertForMaskedLM`` (:mod:`xlmeta_jax.interop.hf.modernbert_layout`); the family
comes from ``config.json``'s ``model_type`` on the way in, from the config on the way out::

    cfg, params = weights.load_hf("path/to/xlm-roberta-base")   # or an mmBERT folder
    weights.save_hf("out_dir", cfg, params, vocab_path=...)  # AutoModelForMaskedLM loads it

Our checkpoints to and from such directories: :mod:`xlmeta_jax.interop.hf.convert`.
Only numpy and safetensors are needed; torch is imported only to read
``pytorch_model.bin`` files (and only with ``allow_pickle=True``).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from xlmeta_jax import files as files_lib
from xlmeta_jax.interop.hf import card, families, parity
from xlmeta_jax.interop.hf import tokenizer as hf_tokenizer
from xlmeta_jax.interop.hf.hf_config import (  # noqa: F401 - XLM-R's, named here too
    config_from_hf,
    hf_config_from_config,
)
from xlmeta_jax.interop.hf.layout import (  # noqa: F401 - XLM-R's, named here too
    ConversionError,
    hf_state_dict_from_params,
    params_from_hf_state_dict,
    to_numpy,
)
from xlmeta_jax.model.network import EncoderConfig

# File names written by `PreTrainedModel.save_pretrained`.
CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLE_WEIGHTS_NAME = "pytorch_model.bin"
PICKLE_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
# The vocabulary `to_flax` writes next to its checkpoint (the one of its ids, when known).
FLAX_VOCAB_NAME = "spm.model"


# ---------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    # The numpy backend of safetensors cannot represent bfloat16; jax (on the host CPU)
    # can, and np.asarray then yields ml_dtypes.bfloat16 without copying through fp32.

    out = {}
    try:
        with jax.default_device(jax.devices("cpu")[0]):
            with safe_open(str(path), framework="flax") as f:
                for key in f.keys():
                    out[key] = np.asarray(f.get_tensor(key))
    except SafetensorError as e:
        raise ConversionError(f"{path} is not a readable safetensors file ({e})") from None
    return out


def read_json(path: pathlib.Path, what: str) -> dict:
    """A JSON object file of a model folder; ConversionError naming it when it is not one."""
    try:
        data = json.loads(pathlib.Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConversionError(f"{what} {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{what} {path} is not a JSON object")
    return data


def _read_pickle(path: pathlib.Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - optional: PyTorch only for this

    # weights_only=True restricts unpickling to tensors and containers.
    return torch.load(str(path), map_location="cpu", weights_only=True)


def _shard_files(index_path: pathlib.Path) -> list[pathlib.Path]:
    index = read_json(index_path, "HF weights index")
    if "weight_map" not in index:
        raise ConversionError(f"{index_path} has no 'weight_map'")
    names = sorted(set(index["weight_map"].values()))
    files = [index_path.parent / n for n in names]
    absent = [str(p) for p in files if not p.is_file()]
    if absent:
        raise ConversionError(f"{index_path} names shard files that do not exist: {absent}")
    return files


def read_hf_state_dict(path: str | os.PathLike, *, allow_pickle: bool = False) -> dict[str, Any]:
    """Reads the weights of a ``save_pretrained`` directory or one weights file.

    Looks, in order, for ``model.safetensors``, ``model.safetensors.index.json``
    (sharded), then ``pytorch_model.bin`` / ``pytorch_model.bin.index.json``.

    Args:
      path: a directory, a ``.safetensors`` file, an index json or a ``.bin`` file.
      allow_pickle: permit reading ``pytorch_model.bin`` files (pickles).

    Raises:
      FileNotFoundError: no weights file exists at ``path``.
      ConversionError: only pickle files exist and ``allow_pickle`` is False.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, PICKLE_WEIGHTS_NAME,
                     PICKLE_WEIGHTS_INDEX_NAME):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise FileNotFoundError(
                f"{path} contains no {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, "
                f"{PICKLE_WEIGHTS_NAME} or {PICKLE_WEIGHTS_INDEX_NAME}"
            )
    if not path.is_file():
        raise FileNotFoundError(f"HF weights file {path} does not exist")
    name = path.name
    if name.endswith(".index.json"):
        files = _shard_files(path)
    else:
        files = [path]
    pickles = [f for f in files if f.suffix != ".safetensors"]
    if pickles and not allow_pickle:
        raise ConversionError(
            f"{path} holds PyTorch pickle weights ({pickles[0].name}); unpickling a file can "
            "execute arbitrary code, so it is refused by default. Convert it to safetensors "
            "(transformers: model.save_pretrained(dir)) or, if you trust the file, pass "
            "allow_pickle=True (command line: --allow_pickle)."
        )
    state: dict[str, Any] = {}
    for f in files:
        part = _read_safetensors(f) if f.suffix == ".safetensors" else _read_pickle(f)
        dup = sorted(set(part) & set(state))
        if dup:
            raise ConversionError(f"key {dup[0]!r} appears in more than one shard ({f})")
        state.update(part)
    return state


def load_hf(
    path: str | os.PathLike, *, allow_pickle: bool = False, seqio_ids: bool = False,
    parity_report: Callable[[str], None] | None = None, **config_overrides,
) -> tuple[EncoderConfig, dict[str, Any]]:
    """Loads a Hugging Face ``XLMRobertaForMaskedLM`` or ``ModernBertForMaskedLM`` (the
    family from ``config.json``'s ``model_type``) as (config, our params).

    Args:
      path: a ``save_pretrained`` directory (``config.json`` + weights) or a weights
        file whose directory holds ``config.json``.
      allow_pickle: permit ``pytorch_model.bin`` weights (see :func:`read_hf_state_dict`).
      seqio_ids: undo :func:`save_hf`'s permutation of a model exported from our
        vocabulary (``config.json`` records it under ``hf_tokenizer.CONFIG_KEY``): the
        result uses our ids again (pad 0), as before the export. False keeps the HF
        ids (pad 1), which the directory's ``sentencepiece.bpe.model`` encodes.
      parity_report: when given, our network and transformers' run the converted weights
        and this receives the one-line result (:mod:`xlmeta_jax.interop.hf.parity`).
      **config_overrides: :class:`EncoderConfig` fields to set (``scan_layers`` picks
        the params layout; ``dtype``, ``remat_policy`` ... only affect the network).

    Returns:
      ``(cfg, params)`` with params as host numpy arrays.

    Raises:
      ConversionError: ``seqio_ids`` for a model that was not exported from our ids, an
        architecture of neither family, or logits that differ beyond the parity tolerance.
    """
    path = pathlib.Path(path)
    if not path.exists():  # else the message would name <parent>/config.json
        raise FileNotFoundError(f"HF model path {path} does not exist")
    config_path = (path if path.is_dir() else path.parent) / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"HF config {config_path} does not exist")
    hf_config = read_json(config_path, "HF config")
    family = families.of_hf_config(hf_config, config_path)
    # numpy once (a pickle's torch tensors), for the conversion and the parity check.
    state = family.normalise({k: to_numpy(v) for k, v in read_hf_state_dict(
        path, allow_pickle=allow_pickle).items()})
    rows = _seqio_rows(hf_config, config_path) if seqio_ids else None
    cfg, params = _convert(family, hf_config, state, config_overrides)
    if parity_report is not None:  # in the stored ids, before any renumbering
        parity.check(hf_config, state, cfg, params, report=parity_report)
    if rows is None:
        return cfg, params
    state = family.from_export_ids(state, rows)
    return _convert(family, hf_config, state, {"pad_token_id": 0, **config_overrides})


def config_of(path: str | os.PathLike, *, dtype: str | None = None,
              param_dtype: str | None = None, scan_layers: bool | None = None,
              remat_policy: str | None = None, attention_impl: str | None = None,
              dropout_rate: float | None = None,
              attention_dropout_rate: float | None = None) -> EncoderConfig:
    """The encoder configuration of a Hugging Face folder (its ``config.json``), either
    family: what continued pretraining of a released model trains (gin/native/continue.gin).

    The sizes, vocabulary, pad id and RoPE bases are the folder's; the arguments set how
    it runs (None keeps the default).

    Raises:
      FileNotFoundError: no ``config.json``; ConversionError: of neither family.
    """
    config_path = pathlib.Path(path) / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"INITIAL_CHECKPOINT_PATH {path} has no {CONFIG_NAME}: give "
                                "a Hugging Face model folder (save_pretrained's)")
    hf_config = read_json(config_path, "HF config")
    overrides = {k: v for k, v in (
        ("dtype", dtype), ("param_dtype", param_dtype), ("scan_layers", scan_layers),
        ("remat_policy", remat_policy), ("attention_impl", attention_impl),
        ("dropout_rate", dropout_rate), ("attention_dropout_rate", attention_dropout_rate),
    ) if v is not None}
    return families.of_hf_config(hf_config, config_path).config_from_hf(hf_config, **overrides)


def _convert(family, hf_config, state, overrides):
    cfg = family.config_from_hf(hf_config, **overrides)
    return cfg, family.params_from_hf(state, cfg)


def _seqio_rows(hf_config: Mapping[str, Any], config_path: pathlib.Path) -> np.ndarray:
    """The renumbering an export from our ids recorded in ``config.json``."""
    pieces = hf_config.get(hf_tokenizer.CONFIG_KEY)
    if pieces is None:
        raise ConversionError(
            f"{config_path} has no {hf_tokenizer.CONFIG_KEY!r}: the model was not exported "
            "from our vocabulary, its ids are its own")
    return hf_tokenizer.hf_rows(int(pieces), int(hf_config["vocab_size"]))


def write_file(path: pathlib.Path, write: Callable[[str], None]) -> None:
    """Writes ``path`` through a temporary name, with the umask's usual permissions
    (safetensors creates its files 0600)."""
    umask = os.umask(0)
    os.umask(umask)

    def write_readable(tmp: str) -> None:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask)

    files_lib.write_atomic(path, write=write_readable)


def save_hf(path: str | os.PathLike, cfg: EncoderConfig, params: Mapping[str, Any],
            *, vocab_path: str | os.PathLike | None = None,
            tokenizer_files: Mapping[str, bytes] | None = None,
            special: Mapping[str, int] | None = None,
            parity_report: Callable[[str], None] | None = None,
            also_write: Callable[[pathlib.Path], object] | None = None,
            **config_kwargs) -> pathlib.Path:
    """Writes a directory that transformers loads as is: weights, config, tokenizer, and a
    model card (``README.md``, :mod:`xlmeta_jax.interop.hf.card`) that says how to load it.

    With our vocabulary (pad 0) the vocabulary rows are permuted into XLM-R's ids and
    the SentencePiece model is rewritten to match, so ``AutoTokenizer`` and
    ``pipeline('fill-mask')`` work unchanged (``xlmeta_jax.interop.hf.tokenizer`` explains the
    mapping); a model already in XLM-R's ids is written as it is.

    Args:
      path: output directory (created; it must not hold any of the files written).
      cfg: the encoder config of ``params``.
      params: our Flax params in either layout (``cfg.scan_layers`` tells which).
      vocab_path: the model's SentencePiece file: ours (seqio ids) or an XLM-R
        ``sentencepiece.bpe.model``. Required for a model with our ids; without it
        a model in XLM-R's ids is written without tokenizer files.
      tokenizer_files: instead, a Hugging Face tokenizer's files (name -> bytes) that the
        model was trained in: written byte for byte, the rows left in their ids.
      special: with ``tokenizer_files``, its ``pad``, ``cls`` and ``sep`` ids (and
        ``bos``/``eos`` where it names them), written into ``config.json``.
      parity_report: when given, transformers' model and ours run the exported weights
        before anything is written; this receives the one-line result.
      also_write: writes further files of the export (sentence-transformers') into the
        folder it is given, before the export moves in.
      **config_kwargs: ``bos_token_id`` and ``eos_token_id`` of the written config.

    Returns:
      The output directory.

    Raises:
      ConversionError: no vocabulary for a model with our ids, a vocabulary whose ids
        do not fit the model, or an output file that exists already.
    """

    path = pathlib.Path(path)
    files, rows, seqio_pieces = {}, None, None
    if tokenizer_files is not None:
        files = dict(tokenizer_files)
        if cfg.pad_token_id != special["pad"]:
            raise ConversionError(f"the tokenizer's pad id is {special['pad']} but the model's "
                                  f"pad_token_id is {cfg.pad_token_id}")
        config_kwargs = {"bos_token_id": special.get("bos", special["cls"]),
                         "eos_token_id": special.get("eos", special["sep"]), **config_kwargs}
    elif vocab_path is None and cfg.pad_token_id != 1:
        raise ConversionError(
            f"the model uses our vocabulary's ids (pad {cfg.pad_token_id}): the export needs "
            "its SentencePiece model to write the tokenizer (vocab_path / --vocab_path)"
        )
    if vocab_path is not None:
        try:
            files, seqio_pieces = hf_tokenizer.tokenizer_files(
                vocab_path, cfg.vocab_size, families.of(cfg).max_tokens(cfg))
            if seqio_pieces is not None:
                rows = hf_tokenizer.hf_rows(seqio_pieces, cfg.vocab_size)
        except hf_tokenizer.VocabularyLayoutError as e:
            raise ConversionError(f"{vocab_path}: {e}") from None
        want_pad = 0 if rows is not None else 1
        if cfg.pad_token_id != want_pad:
            raise ConversionError(
                f"{vocab_path} uses pad id {want_pad} but the model's pad_token_id is "
                f"{cfg.pad_token_id}"
            )
    names = [CONFIG_NAME, SAFE_WEIGHTS_NAME, card.README_NAME, *files]
    tokenizer_config = files.get(hf_tokenizer.TOKENIZER_CONFIG_NAME)
    tokenizer_class = (json.loads(tokenizer_config).get("tokenizer_class", "AutoTokenizer")
                       if tokenizer_config else None)
    # The same tokenizer already there (an export's folder prepared with it) stays.
    same = [n for n in files if (path / n).is_file() and (path / n).read_bytes() == files[n]]
    existing = [n for n in names if (path / n).exists() and n not in same]
    if tokenizer_files is not None and set(existing) & set(files):
        raise ConversionError(
            f"{path} holds another tokenizer (its {', '.join(sorted(set(existing) & set(files)))}"
            " not the model's); export into a new directory")
    files = {n: data for n, data in files.items() if n not in same}
    if existing:
        raise ConversionError(f"{path} already holds {existing}; export into a new directory")
    family = families.of(cfg)
    state = family.state_from_params(params, cfg)
    if rows is not None:
        state = family.to_export_ids(state, rows)
        cfg = cfg.replace(pad_token_id=1)
    hf_config = family.export_config(cfg, special, config_kwargs)
    if rows is not None:
        hf_config[hf_tokenizer.CONFIG_KEY] = seqio_pieces
    if parity_report is not None:  # before anything is written
        parity.check(hf_config, state, *_convert(family, hf_config, state, {}),
                     report=parity_report)
    files[card.README_NAME] = card.model_card(hf_config, tokenizer_class, seqio_pieces).encode()
    # Written beside the folder and moved in, config.json last (a directory with it is
    # complete): an interrupted export leaves the folder as it was, not half-written.
    with files_lib.staged_into(path, last=CONFIG_NAME) as stage:
        stage = pathlib.Path(stage)
        for name, data in files.items():
            write_file(stage / name, lambda p, data=data: pathlib.Path(p).write_bytes(data))
        # transformers refuses safetensors files without format metadata.
        write_file(stage / SAFE_WEIGHTS_NAME,
                   lambda p: save_file(state, p, metadata={"format": "pt"}))
        text = json.dumps(hf_config, indent=2, sort_keys=True)
        write_file(stage / CONFIG_NAME, lambda p: pathlib.Path(p).write_text(text))
        if also_write is not None:
            also_write(stage)
    return path


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------
