"""Loads the encoder to evaluate and its tokenizer from ``INITIAL_CHECKPOINT_PATH``.

Accepted values:

* a pretraining checkpoint of ``xlmeta_jax.train`` (``MODEL_DIR``, ``MODEL_DIR/phaseN``
  or a step directory) or a directory written by ``python -m xlmeta_jax.hf to_flax``
  (the same format), read with ``xlmeta_jax.pretrain.loading.load_pretrained``; the
  vocabulary is the one recorded in the checkpoint (or ``vocab_path``);
* a Hugging Face ``save_pretrained`` directory of either family (it holds
  ``config.json``: ModernBERT, mmBERT, XLM-R), converted with
  ``xlmeta_jax.interop.hf.weights.load_hf``; the tokenizer is the folder's own, in its
  own ids: its ``tokenizer.json`` (else XLM-R's ``sentencepiece.bpe.model`` with
  fairseq ids);
* ``init:<size>`` (``init:tiny``, ...): a freshly initialised encoder of that size — for
  demos and tests only; needs ``vocab_path``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from xlmeta_jax.data import hf_tokenizer
from xlmeta_jax.evaluation.tokenization import Tokenizer, load_tokenizer
from xlmeta_jax.interop.hf import weights as hf
from xlmeta_jax.model.network import EncoderConfig, get_config
from xlmeta_jax.pretrain import loading, run_dir

HF_SPM_NAME = "sentencepiece.bpe.model"


@dataclasses.dataclass
class LoadedEncoder:
    """An encoder to fine-tune or probe."""

    config: EncoderConfig
    # Encoder params ({"embeddings", "layers_*"}), or None for a fresh init.
    params: Any
    tokenizer: Any  # tokenization.Tokenizer or tokenization.HFTokenizer
    # "pretraining" (also `hf to_flax` output), "hf" or "init".
    source: str
    # The whole masked-LM parameter tree (encoder and LM head; None for a fresh init):
    # what a run that continues the checkpoint (contrastive training) starts from.
    masked_lm_params: Any = None


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
        tokenizer = load_tokenizer(vocab_path)
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
        if (p / hf_tokenizer.TOKENIZER_JSON).is_file():
            tokenizer = load_tokenizer(p)
            if vocab_path and not hf_tokenizer.same_tokenizer(
                    load_tokenizer(vocab_path).record(), tokenizer.record()):
                raise ValueError(
                    f"vocab_path {vocab_path} is not the tokenizer of {path}: leave it out, the "
                    "folder brings its own")
        else:
            vocab = vocab_path or os.fspath(p / HF_SPM_NAME)
            if not os.path.isfile(vocab):
                raise FileNotFoundError(
                    f"Hugging Face checkpoint {path} has neither {hf_tokenizer.TOKENIZER_JSON} "
                    f"nor {HF_SPM_NAME}; pass vocab_path")
            tokenizer = Tokenizer(vocab, "fairseq")
        source = "hf"
    else:
        cfg, params, recorded_vocab = loading.load_pretrained(path)
        vocab = vocab_path or recorded_vocab
        if not vocab:
            raise ValueError(f"checkpoint {path} records no vocabulary; pass vocab_path")
        kind = None if hf_tokenizer.is_tokenizer_path(vocab) else _tokenizer_kind(cfg)
        tokenizer, source = load_tokenizer(vocab, kind), "pretraining"
        # A model's ids are its tokenizer's: fine-tuning in another is refused.
        recorded = loading.recorded_tokenizer(path)
        if recorded and not hf_tokenizer.same_tokenizer(recorded, tokenizer.record()):
            raise run_dir.RunConfigMismatch(
                f"{path} was trained in another tokenizer: "
                f"{hf_tokenizer.describe(recorded, 'its')}, not "
                f"{hf_tokenizer.describe(tokenizer.record(), f'vocab_path {vocab}')}; leave "
                "vocab_path out to fine-tune in the checkpoint's own")
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"vocabulary {tokenizer.model_path} has {tokenizer.vocab_size} ids but the encoder "
            f"at {path} has only {cfg.vocab_size} embeddings"
        )
    if tokenizer.pad_id != cfg.pad_token_id:
        raise ValueError(
            f"vocabulary pad id {tokenizer.pad_id} != encoder pad_token_id {cfg.pad_token_id}"
        )
    return LoadedEncoder(cfg, _encoder_params(params, path), tokenizer, source, params)
