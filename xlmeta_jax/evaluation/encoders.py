"""Loads the encoder to evaluate and its tokenizer from ``INITIAL_CHECKPOINT_PATH``.

Accepted values:

* a pretraining checkpoint of ``xlmeta_jax.train`` (``MODEL_DIR``, ``MODEL_DIR/phaseN``
  or a step directory) or a directory written by ``python -m xlmeta_jax.hf to_flax``
  (the same format), read with ``xlmeta_jax.pretrain.loading.load_pretrained``; the
  vocabulary is the one recorded in the checkpoint (or ``vocab_path``);
* a Hugging Face XLM-R ``save_pretrained`` directory (it holds ``config.json``),
  converted with ``xlmeta_jax.interop.hf.weights.load_hf``; the tokenizer is its
  ``sentencepiece.bpe.model`` with fairseq ids;
* ``init:<size>`` (``init:tiny``, ...): a freshly initialised encoder of that size — for
  demos and tests only; needs ``vocab_path``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from xlmeta_jax.evaluation.tokenization import Tokenizer
from xlmeta_jax.interop.hf import weights as hf
from xlmeta_jax.model.network import EncoderConfig, get_config
from xlmeta_jax.pretrain import loading

HF_SPM_NAME = "sentencepiece.bpe.model"


@dataclasses.dataclass
class LoadedEncoder:
    """An encoder to fine-tune or probe."""

    config: EncoderConfig
    # Encoder params ({"embeddings", "layers_*"}), or None for a fresh init.
    params: Any
    tokenizer: Tokenizer
    # "pretraining" (also `hf to_flax` output), "hf" or "init".
    source: str


def _tokenizer_kind(cfg: EncoderConfig) -> str:
    return "fairseq" if cfg.pad_token_id == 1 else "seqio"


def _encoder_params(params, path) -> Any:
    if isinstance(params, dict) and "encoder" in params:
        return params["encoder"]
    raise ValueError(f"checkpoint {path} has no 'encoder' parameters (keys: {sorted(params)})")


def load_encoder(
    path: str, vocab_path: str | None = None, *, allow_pickle: bool = False
) -> LoadedEncoder:
    """Config, encoder params and tokenizer of ``path`` (see module docstring).

    Raises:
      FileNotFoundError: the checkpoint or vocabulary does not exist.
      ValueError: the vocabulary does not fit the encoder.
    """
    if not path:
        raise ValueError("INITIAL_CHECKPOINT_PATH is empty")
    if path.startswith("init:"):
        if vocab_path is None:
            raise ValueError(f"INITIAL_CHECKPOINT_PATH={path!r} needs a vocab_path")
        tokenizer = Tokenizer(vocab_path, "seqio")
        cfg = get_config(
            path[len("init:") :], vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id
        )
        return LoadedEncoder(cfg, None, tokenizer, "init")
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"INITIAL_CHECKPOINT_PATH {path} does not exist")
    if not p.is_dir():
        raise NotADirectoryError(
            f"INITIAL_CHECKPOINT_PATH {path} is a file, not a checkpoint directory")
    if (p / "config.json").is_file():
        cfg, params = hf.load_hf(p, allow_pickle=allow_pickle)
        vocab = vocab_path or os.fspath(p / HF_SPM_NAME)
        if not os.path.isfile(vocab):
            raise FileNotFoundError(
                f"Hugging Face checkpoint {path} has no {HF_SPM_NAME}; pass vocab_path"
            )
        tokenizer, source = Tokenizer(vocab, "fairseq"), "hf"
    else:
        cfg, params, recorded_vocab = loading.load_pretrained(path)
        vocab = vocab_path or recorded_vocab
        if not vocab:
            raise ValueError(f"checkpoint {path} records no vocabulary; pass vocab_path")
        tokenizer, source = Tokenizer(vocab, _tokenizer_kind(cfg)), "pretraining"
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"vocabulary {tokenizer.model_path} has {tokenizer.vocab_size} ids but the encoder "
            f"at {path} has only {cfg.vocab_size} embeddings"
        )
    if tokenizer.pad_id != cfg.pad_token_id:
        raise ValueError(
            f"vocabulary pad id {tokenizer.pad_id} != encoder pad_token_id {cfg.pad_token_id}"
        )
    return LoadedEncoder(cfg, _encoder_params(params, path), tokenizer, source)
