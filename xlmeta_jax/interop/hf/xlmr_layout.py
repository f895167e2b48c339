"""XLM-R's Hugging Face layout (``XLMRobertaForMaskedLM``), as every family's layout answers
:mod:`xlmeta_jax.interop.hf.families`: the parameter mapping (:mod:`.layout`), the
``config.json`` (:mod:`.hf_config`), the renumbering of our ids into XLM-R's, and the model
card's description.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from xlmeta_jax.interop.hf import hf_config, layout
from xlmeta_jax.model.config import EncoderConfig

FAMILY = "xlmr"
DISPLAY_NAME = "XLM-R"
MODEL_TYPES = ("xlm-roberta", "roberta")
ARCHITECTURE = "XLMRobertaForMaskedLM"
CONFIG_CLASS = "XLMRobertaConfig"
# Weights with a row per vocabulary id (embeddings, output bias, tied decoder).
VOCAB_KEYS = ("roberta.embeddings.word_embeddings.weight", "lm_head.bias",
              "lm_head.decoder.weight", "lm_head.decoder.bias")
_POSITIONS_KEY = "roberta.embeddings.position_embeddings.weight"
# The model card's note on the renumbering of our ids (to_export_ids's position row).
CARD_IDS_NOTE = ("Pad id 0 left room for one more position in the same table; the export "
                 "drops that row (pretraining at the length above never reads it). ")

config_from_hf = hf_config.config_from_hf


def normalise(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state dict's keys as ``XLMRobertaForMaskedLM`` names them (a bare encoder's too)."""
    return layout.normalise_keys(state)


def params_from_hf(state: Mapping[str, Any], cfg: EncoderConfig) -> dict[str, Any]:
    """Our parameters from a (normalised) state dict."""
    return layout.params_from_hf_state_dict(state, cfg)


def state_from_params(params: Mapping[str, Any], cfg: EncoderConfig) -> dict[str, Any]:
    """The state dict an export writes (tied weights once)."""
    return layout.hf_state_dict_from_params(params, cfg, include_tied=False)


def export_config(cfg: EncoderConfig, special: Mapping[str, int] | None,
                  config_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` of an export (``special``: the pad, bos and eos ids are the
    config's and ``config_kwargs``')."""
    del special
    return hf_config.hf_config_from_config(cfg, **config_kwargs)


def max_tokens(cfg: EncoderConfig) -> int:
    """Tokens an input may hold: the position table less the pad row and row 0."""
    return cfg.max_position_embeddings - 2


def to_export_ids(state: Mapping[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """A state dict in our seqio ids (pad 0) -> XLM-R's ids (pad 1), same table sizes.

    Besides the vocabulary rows, the position table moves: positions count from
    ``pad_token_id + 1`` (RoBERTa), so the first token reads row 1 with pad 0 and row 2
    with pad 1. The table keeps its ``max_position_embeddings`` rows, XLM-R's shape
    (514 rows for 512 tokens, ``model_max_length`` 512): it gains a leading row (a copy
    of row 0; XLM-R never reads row 0) and loses its last, the row of the one position
    pad 0 leaves room for beyond ``max_position_embeddings - 2`` tokens, which
    pretraining at that length never reads.
    """
    out = layout.permute_vocab_rows(state, rows, VOCAB_KEYS)
    positions = layout.to_numpy(out[_POSITIONS_KEY])
    out[_POSITIONS_KEY] = np.ascontiguousarray(np.concatenate([positions[:1], positions[:-1]]))
    return out


def from_export_ids(state: Mapping[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Inverse of :func:`to_export_ids`; the dropped last position row comes back as zeros
    (the export has no values for it), so the table keeps its size."""
    out = layout.permute_vocab_rows(state, np.argsort(rows), VOCAB_KEYS)
    positions = layout.to_numpy(out[_POSITIONS_KEY])
    out[_POSITIONS_KEY] = np.ascontiguousarray(
        np.concatenate([positions[1:], np.zeros_like(positions[:1])]))
    return out


def card_description(hf: Mapping[str, Any]) -> tuple[str, str]:
    """The model card's title and its sentence on inputs."""
    positions = int(hf["max_position_embeddings"])
    return ("# XLM-R-style masked-LM encoder (xlmeta_jax)",
            f"Inputs of up to {positions - 2} tokens (`model_max_length`; "
            f"`max_position_embeddings` {positions}, the pad row and the unused row 0 as in "
            "XLM-R).")
