"""Hugging Face's ``XLMRobertaConfig`` <-> our :class:`EncoderConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xlmeta_jax.errors import UserError
from xlmeta_jax.model.network import EncoderConfig


class ConversionError(UserError, ValueError):
    """A checkpoint does not match the expected XLM-R layout (names the offending key)."""



def config_value(hf_config: Any, name: str, default: Any = None) -> Any:
    """A field of an HF config object or of its ``config.json`` dict."""
    if isinstance(hf_config, Mapping):
        return hf_config.get(name, default)
    return getattr(hf_config, name, default)


def config_from_hf(hf_config: Any, **overrides) -> EncoderConfig:
    """Builds an :class:`EncoderConfig` from a Hugging Face XLM-R / RoBERTa config.

    Args:
      hf_config: a ``transformers.XLMRobertaConfig`` (or ``RobertaConfig``) object or
        the dict of its ``config.json``.
      **overrides: fields of :class:`EncoderConfig` with no HF counterpart (e.g.
        ``scan_layers``, ``dtype``, ``remat_policy``, ``attention_impl``) or to override.

    Returns:
      The encoder config whose network computes what the HF model computes.

    Raises:
      ConversionError: if the HF config describes an architecture our network does
        not implement (activation, relative positions, untied decoder, decoder model).
    """
    model_type = config_value(hf_config, "model_type")
    if model_type not in (None, "xlm-roberta", "roberta"):
        raise ConversionError(
            f"HF config model_type={model_type!r}: expected 'xlm-roberta' or 'roberta'"
        )
    act = config_value(hf_config, "hidden_act", "gelu")
    if act != "gelu":
        raise ConversionError(
            f"HF config hidden_act={act!r}: only 'gelu' (exact erf GELU) is implemented"
        )
    pos_type = config_value(hf_config, "position_embedding_type", "absolute")
    if pos_type not in (None, "absolute"):
        raise ConversionError(
            f"HF config position_embedding_type={pos_type!r}: only 'absolute' is implemented"
        )
    if not config_value(hf_config, "tie_word_embeddings", True):
        raise ConversionError(
            "HF config tie_word_embeddings=False: our LM head always ties the decoder to "
            "the word embeddings"
        )
    if config_value(hf_config, "is_decoder", False):
        raise ConversionError("HF config is_decoder=True: only the bidirectional encoder exists")
    required = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "max_position_embeddings", "pad_token_id",
    )
    missing = [k for k in required if config_value(hf_config, k) is None]
    if missing:
        raise ConversionError(f"HF config lacks required fields {missing}")
    fields = dict(
        vocab_size=int(config_value(hf_config, "vocab_size")),
        hidden_size=int(config_value(hf_config, "hidden_size")),
        num_layers=int(config_value(hf_config, "num_hidden_layers")),
        num_heads=int(config_value(hf_config, "num_attention_heads")),
        mlp_dim=int(config_value(hf_config, "intermediate_size")),
        max_position_embeddings=int(config_value(hf_config, "max_position_embeddings")),
        type_vocab_size=int(config_value(hf_config, "type_vocab_size", 2)),
        pad_token_id=int(config_value(hf_config, "pad_token_id")),
        layer_norm_eps=float(config_value(hf_config, "layer_norm_eps", 1e-12)),
        dropout_rate=float(config_value(hf_config, "hidden_dropout_prob", 0.1)),
        attention_dropout_rate=float(config_value(hf_config, "attention_probs_dropout_prob", 0.1)),
        initializer_range=float(config_value(hf_config, "initializer_range", 0.02)),
    )
    fields.update(overrides)
    return EncoderConfig(**fields)


def special_ids(cfg: EncoderConfig) -> tuple[int, int]:
    # (bos, eos): fairseq/HF XLM-R ids when pad=1, our seqio SentencePiece ids when pad=0.
    if cfg.pad_token_id == 1:
        return 0, 2
    if cfg.pad_token_id == 0:
        return 3, 1
    raise ConversionError(
        f"EncoderConfig.pad_token_id={cfg.pad_token_id}: pass bos_token_id and eos_token_id "
        "explicitly (known vocabularies use pad 1 (XLM-R) or pad 0 (seqio))"
    )


def hf_config_from_config(
    cfg: EncoderConfig,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` dict of the ``XLMRobertaForMaskedLM`` equal to ``cfg``.

    Args:
      cfg: our encoder config.
      bos_token_id: id of ``<s>``; defaults to 0 when ``pad_token_id == 1`` (XLM-R's
        vocabulary) and to 3 when ``pad_token_id == 0`` (our seqio vocabulary).
      eos_token_id: id of ``</s>``; defaults to 2 (XLM-R) or 1 (seqio).

    Returns:
      A JSON-serialisable dict accepted by ``transformers.XLMRobertaConfig(**d)``.
    """
    if bos_token_id is None or eos_token_id is None:
        bos, eos = special_ids(cfg)
        bos_token_id = bos if bos_token_id is None else bos_token_id
        eos_token_id = eos if eos_token_id is None else eos_token_id
    return {
        "architectures": ["XLMRobertaForMaskedLM"],
        "model_type": "xlm-roberta",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": cfg.pad_token_id,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        # Dtype of the stored weights (transformers < 5 reads `torch_dtype`).
        "torch_dtype": cfg.param_dtype,
    }
