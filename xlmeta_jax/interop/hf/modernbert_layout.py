"""Hugging Face's ModernBERT layout <-> ours: config fields, weight names, shapes, ties.

Our parameters (``xlmeta_jax.model.modernbert.ModernBertForMaskedLM``) are
``{'encoder': ..., 'lm_head': ...}`` with per-layer subtrees ``layers_{i}``; with
``scan_layers`` layer 0 stays ``layers_0`` and layers 1..N-1 are one ``layers`` subtree
with a leading layer axis. Hugging Face's ``ModernBertForMaskedLM`` names them
``model.embeddings.*``, ``model.layers.{i}.*``, ``model.final_norm``, ``head.*`` and
``decoder.*``, fuses the query, key and value projections into ``attn.Wqkv`` ([3, heads,
head_dim] rows) and the GeGLU's two input projections into ``mlp.Wi`` (input rows, then
gate rows), stores ``nn.Linear`` weights as ``[out, in]`` and ties ``decoder.weight`` to
the token embeddings. Layer 0 has no ``attn_norm``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from xlmeta_jax.interop.hf import layout
from xlmeta_jax.interop.hf.hf_config import ConversionError, config_value
from xlmeta_jax.interop.hf.hf_config import special_ids as hf_special_ids
from xlmeta_jax.model.config import EncoderConfig

FAMILY = "modernbert"
DISPLAY_NAME = "ModernBERT"
MODEL_TYPE = "modernbert"
MODEL_TYPES = (MODEL_TYPE,)
ARCHITECTURE = "ModernBertForMaskedLM"
CONFIG_CLASS = "ModernBertConfig"
# Weights with a row per vocabulary id (embeddings, output bias, tied decoder).
VOCAB_KEYS = ("model.embeddings.tok_embeddings.weight", "decoder.weight", "decoder.bias")
# The model card's note on the renumbering of our ids (none: RoPE has no position table).
CARD_IDS_NOTE = ""
_TIED = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}
# The choices of ModernBertConfig that our network implements (field: value).
_FIXED = {
    "hidden_activation": "gelu", "classifier_activation": "gelu", "norm_bias": False,
    "attention_bias": False, "mlp_bias": False, "decoder_bias": True,
    "classifier_bias": False, "tie_word_embeddings": True,
}


def _every_n(layer_types: list[str]) -> int:
    """HF's ``layer_types`` as ``global_attn_every_n_layers`` (global at 0, n, 2n...)."""
    globals_ = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    n = globals_[1] if len(globals_) > 1 else len(layer_types)
    if unknown or not globals_ or globals_ != list(range(0, len(layer_types), n)):
        raise ConversionError(
            f"HF config layer_types={layer_types}: only a global layer every n-th layer from "
            "layer 0 ('full_attention' at 0, n, 2n, ..., 'sliding_attention' elsewhere) is "
            "implemented")
    return n


def _theta(hf_config: Any, layer_type: str, legacy: str, default: float) -> float:
    rope = (config_value(hf_config, "rope_parameters") or {}).get(layer_type) or {}
    if rope.get("rope_type", "default") != "default":
        raise ConversionError(
            f"HF config rope_parameters[{layer_type!r}].rope_type={rope['rope_type']!r}: only "
            "'default' rotary positions are implemented")
    return float(rope.get("rope_theta", config_value(hf_config, legacy, default)))


def config_from_hf(hf_config: Any, **overrides) -> EncoderConfig:
    """Builds the ``modernbert`` :class:`EncoderConfig` of a Hugging Face ModernBERT config.

    Args:
      hf_config: a ``transformers.ModernBertConfig`` or the dict of its ``config.json``
        (older files' ``global_attn_every_n_layers``, ``global_rope_theta`` and
        ``local_rope_theta`` are read too).
      **overrides: EncoderConfig fields with no HF counterpart (``scan_layers``, ``dtype``).

    Raises:
      ConversionError: naming a setting our network does not implement.
    """
    for field, value in _FIXED.items():
        got = config_value(hf_config, field, value)
        if got != value:
            raise ConversionError(
                f"HF config {field}={got!r}: our ModernBERT implements {field}={value!r}")
    embedding_dropout, mlp_dropout = (float(config_value(hf_config, k, 0.0))
                                      for k in ("embedding_dropout", "mlp_dropout"))
    if embedding_dropout != mlp_dropout:
        raise ConversionError(
            f"HF config embedding_dropout={embedding_dropout} and mlp_dropout={mlp_dropout} "
            "differ: our dropout_rate is both")
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "pad_token_id")
    missing = [k for k in required if config_value(hf_config, k) is None]
    if missing:
        raise ConversionError(f"HF config lacks required fields {missing}")
    num_layers = int(config_value(hf_config, "num_hidden_layers"))
    layer_types = config_value(hf_config, "layer_types")
    every_n = (_every_n(list(layer_types)) if layer_types
               else int(config_value(hf_config, "global_attn_every_n_layers", 3)))
    fields = dict(
        family="modernbert",
        vocab_size=int(config_value(hf_config, "vocab_size")),
        hidden_size=int(config_value(hf_config, "hidden_size")),
        num_layers=num_layers,
        num_heads=int(config_value(hf_config, "num_attention_heads")),
        mlp_dim=int(config_value(hf_config, "intermediate_size")),
        max_position_embeddings=int(config_value(hf_config, "max_position_embeddings")),
        pad_token_id=int(config_value(hf_config, "pad_token_id")),
        layer_norm_eps=float(config_value(hf_config, "norm_eps", 1e-5)),
        dropout_rate=mlp_dropout,
        attention_dropout_rate=float(config_value(hf_config, "attention_dropout", 0.0)),
        initializer_range=float(config_value(hf_config, "initializer_range", 0.02)),
        global_attn_every_n_layers=every_n,
        local_window=int(config_value(hf_config, "local_attention", 128)),
        global_rope_theta=_theta(hf_config, "full_attention", "global_rope_theta", 160000.0),
        local_rope_theta=_theta(hf_config, "sliding_attention", "local_rope_theta", 10000.0),
    )
    fields.update(overrides)
    return EncoderConfig(**fields)


def hf_config_from_config(cfg: EncoderConfig, *, special: Mapping[str, int]) -> dict[str, Any]:
    """The ``config.json`` dict of the ``ModernBertForMaskedLM`` equal to ``cfg``.

    Args:
      cfg: a ``modernbert`` encoder config.
      special: token ids ``bos_token_id``, ``eos_token_id``, ``cls_token_id``,
        ``sep_token_id`` of the vocabulary the model was trained with.
    """
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "norm_eps": cfg.layer_norm_eps,
        "embedding_dropout": cfg.dropout_rate,
        "mlp_dropout": cfg.dropout_rate,
        "attention_dropout": cfg.attention_dropout_rate,
        "local_attention": cfg.local_window,
        "layer_types": ["full_attention" if cfg.is_global_layer(i) else "sliding_attention"
                        for i in range(cfg.num_layers)],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_theta},
        },
        **_FIXED,
        "pad_token_id": cfg.pad_token_id,
        **dict(special),
        "dtype": cfg.param_dtype,
    }


# ---------------------------------------------------------------------------
# Weights.
# ---------------------------------------------------------------------------


def _hf_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every stored key of ``ModernBertForMaskedLM`` (without the tied decoder weight)."""
    h, i, v = cfg.hidden_size, cfg.mlp_dim, cfg.vocab_size
    shapes = {"model.embeddings.tok_embeddings.weight": (v, h),
              "model.embeddings.norm.weight": (h,)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        if n:
            shapes[p + "attn_norm.weight"] = (h,)
        shapes.update({p + "attn.Wqkv.weight": (3 * h, h), p + "attn.Wo.weight": (h, h),
                       p + "mlp_norm.weight": (h,), p + "mlp.Wi.weight": (2 * i, h),
                       p + "mlp.Wo.weight": (h, i)})
    shapes.update({"model.final_norm.weight": (h,), "head.dense.weight": (h, h),
                   "head.norm.weight": (h,), "decoder.bias": (v,)})
    return shapes


def hf_keys(cfg: EncoderConfig, *, include_tied: bool = True) -> list[str]:
    """Every HF state-dict key of the ``ModernBertForMaskedLM`` matching ``cfg``."""
    return [*_hf_shapes(cfg), *(_TIED if include_tied else ())]


def _layer_from_hf(sd: Mapping[str, np.ndarray], n: int, cfg: EncoderConfig) -> dict:
    p, h, heads, d, i = (f"model.layers.{n}.", cfg.hidden_size, cfg.num_heads, cfg.head_dim,
                         cfg.mlp_dim)
    qkv = sd[p + "attn.Wqkv.weight"].reshape(3, heads, d, h).transpose(0, 3, 1, 2)
    wi = sd[p + "mlp.Wi.weight"]
    layer = {
        "attention": {"query": {"kernel": qkv[0]}, "key": {"kernel": qkv[1]},
                      "value": {"kernel": qkv[2]},
                      "out": {"kernel": sd[p + "attn.Wo.weight"].T.reshape(heads, d, h)}},
        "mlp_norm": {"scale": sd[p + "mlp_norm.weight"]},
        "wi_0": {"kernel": wi[:i].T}, "wi_1": {"kernel": wi[i:].T},
        "wo": {"kernel": sd[p + "mlp.Wo.weight"].T},
    }
    if n:
        layer["attn_norm"] = {"scale": sd[p + "attn_norm.weight"]}
    return layer


def _layer_to_hf(layer: Mapping[str, Any], n: int, cfg: EncoderConfig) -> dict:
    p, h = f"model.layers.{n}.", cfg.hidden_size
    att = layer["attention"]
    qkv = np.stack([np.asarray(att[k]["kernel"]) for k in ("query", "key", "value")])
    out = {p + "attn.Wqkv.weight": qkv.transpose(0, 2, 3, 1).reshape(3 * h, h),
           p + "attn.Wo.weight": np.asarray(att["out"]["kernel"]).reshape(h, h).T,
           p + "mlp_norm.weight": np.asarray(layer["mlp_norm"]["scale"]),
           p + "mlp.Wi.weight": np.concatenate([np.asarray(layer["wi_0"]["kernel"]).T,
                                                np.asarray(layer["wi_1"]["kernel"]).T]),
           p + "mlp.Wo.weight": np.asarray(layer["wo"]["kernel"]).T}
    if n:
        out[p + "attn_norm.weight"] = np.asarray(layer["attn_norm"]["scale"])
    return out


def params_from_hf_state_dict(state_dict: Mapping[str, Any], cfg: EncoderConfig, *,
                              scan_layers: bool | None = None, to_numpy=np.asarray,
                              dtype=None) -> dict[str, Any]:
    """Converts a ``ModernBertForMaskedLM`` state dict into our Flax params.

    Args:
      state_dict: HF key -> tensor or array; the tied ``decoder.weight`` may be present
        (it must equal the token embeddings).
      cfg: the encoder config (:func:`config_from_hf`).
      scan_layers: the result's layout; defaults to ``cfg.scan_layers``.
      to_numpy: tensor -> numpy array (bf16 kept).
      dtype: the numpy dtype of the result (``cfg.param_dtype``'s).

    Raises:
      ConversionError: naming missing and unexpected keys, a wrong shape, or a tied weight
        that differs from the embeddings.
    """
    scan = cfg.scan_layers if scan_layers is None else scan_layers
    shapes = _hf_shapes(cfg)
    missing = sorted(set(shapes) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(shapes) - set(_TIED))
    if missing or unexpected:
        parts = [f"missing keys {missing}"] * bool(missing) + [
            f"unexpected keys {unexpected}"] * bool(unexpected)
        raise ConversionError(f"HF state dict does not match {ARCHITECTURE} with num_layers="
                              f"{cfg.num_layers}: " + "; ".join(parts))
    sd = {k: to_numpy(v) for k, v in state_dict.items()}
    for key, shape in shapes.items():
        if tuple(sd[key].shape) != shape:
            raise ConversionError(f"HF weight {key!r} has shape {tuple(sd[key].shape)}, "
                                  f"expected {shape} for this config")
    for tied, source in _TIED.items():
        if tied in sd and not np.array_equal(sd[tied], sd[source]):
            raise ConversionError(f"HF weight {tied!r} differs from {source!r}; our LM head "
                                  "ties them")
    encoder = {"word_embeddings": sd["model.embeddings.tok_embeddings.weight"],
               "embedding_norm": {"scale": sd["model.embeddings.norm.weight"]},
               "final_norm": {"scale": sd["model.final_norm.weight"]}}
    per_layer = [_layer_from_hf(sd, n, cfg) for n in range(cfg.num_layers)]
    encoder["layers_0"] = per_layer[0]
    if scan and cfg.num_layers > 1:
        encoder["layers"] = _stack(per_layer[1:])
    else:
        encoder.update({f"layers_{n}": layer for n, layer in enumerate(per_layer) if n})
    params = {"encoder": encoder,
              "lm_head": {"dense": {"kernel": sd["head.dense.weight"].T},
                          "norm": {"scale": sd["head.norm.weight"]},
                          "bias": sd["decoder.bias"]}}
    return jax.tree.map(
        lambda x: np.ascontiguousarray(x).astype(dtype or x.dtype, copy=False), params)


def hf_state_dict_from_params(params: Mapping[str, Any], cfg: EncoderConfig, *,
                              include_tied: bool = True, scan_layers: bool | None = None,
                              to_numpy=np.asarray) -> dict[str, np.ndarray]:
    """Converts our ModernBERT params (either layout) into a ``ModernBertForMaskedLM``
    state dict, keys in HF's order; ``include_tied`` adds ``decoder.weight``.

    Raises:
      ConversionError: a parameter is missing or has the wrong shape.
    """
    params = jax.tree.map(to_numpy, nn.unbox(params))
    scan = cfg.scan_layers if scan_layers is None else scan_layers
    encoder = params.get("encoder", {})
    try:
        layers = [encoder["layers_0"]]
        if scan and cfg.num_layers > 1:
            layers += _unstack(encoder["layers"], cfg.num_layers - 1)
        else:
            layers += [encoder[f"layers_{n}"] for n in range(1, cfg.num_layers)]
        sd = {"model.embeddings.tok_embeddings.weight": encoder["word_embeddings"],
              "model.embeddings.norm.weight": encoder["embedding_norm"]["scale"]}
        for n, layer in enumerate(layers):
            sd.update(_layer_to_hf(layer, n, cfg))
        head = params["lm_head"]
        sd.update({"model.final_norm.weight": encoder["final_norm"]["scale"],
                   "head.dense.weight": head["dense"]["kernel"].T,
                   "head.norm.weight": head["norm"]["scale"], "decoder.bias": head["bias"]})
    except KeyError as e:
        raise ConversionError(f"params lack {e.args[0]!r} of a {cfg.num_layers}-layer "
                              f"ModernBERT (scan_layers={scan})") from None
    except ValueError as e:  # a reshape of a parameter of another size
        raise ConversionError(f"params do not fit the config ({e})") from None
    shapes = _hf_shapes(cfg)
    for key, shape in shapes.items():
        if tuple(sd[key].shape) != shape:
            raise ConversionError(f"parameter of HF weight {key!r} has shape "
                                  f"{tuple(sd[key].shape)}, expected {shape} for this config")
    out = {k: np.ascontiguousarray(sd[k]) for k in shapes}
    if include_tied:
        out.update({tied: out[source].copy() for tied, source in _TIED.items()})
    return out


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: np.stack(xs), *trees)


def _unstack(tree: Any, count: int) -> list:
    sizes = {x.shape[0] for x in jax.tree.leaves(tree)}
    if sizes != {count}:
        raise ConversionError(f"the scanned layers hold {sorted(sizes)} layers, the config "
                              f"{count} after layer 0")
    return [jax.tree.map(lambda x, n=n: x[n], tree) for n in range(count)]


# What :mod:`xlmeta_jax.interop.hf.families` asks every family's layout.


def normalise(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state dict as stored (``ModernBertForMaskedLM``'s keys)."""
    return dict(state)


def params_from_hf(state: Mapping[str, Any], cfg: EncoderConfig) -> dict[str, Any]:
    """Our parameters from a state dict."""
    return params_from_hf_state_dict(state, cfg, to_numpy=layout.to_numpy,
                                     dtype=np.dtype(layout.np_dtype(cfg.param_dtype)))


def state_from_params(params: Mapping[str, Any], cfg: EncoderConfig) -> dict[str, Any]:
    """The state dict an export writes (tied weights once)."""
    return hf_state_dict_from_params(params, cfg, include_tied=False,
                                     to_numpy=layout.to_numpy)


def export_config(cfg: EncoderConfig, special: Mapping[str, int] | None,
                  config_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json`` of an export: bos and eos from ``config_kwargs`` or the config's
    vocabulary, cls and sep from ``special`` (a tokenizer's) or the same."""
    bos, eos = hf_special_ids(cfg)
    bos, eos = config_kwargs.get("bos_token_id", bos), config_kwargs.get("eos_token_id", eos)
    cls, sep = (special["cls"], special["sep"]) if special else (bos, eos)
    return hf_config_from_config(cfg, special={
        "bos_token_id": bos, "eos_token_id": eos, "cls_token_id": cls, "sep_token_id": sep})


def max_tokens(cfg: EncoderConfig) -> int:
    """Tokens an input may hold: the configured length (RoPE has no position table)."""
    return cfg.max_length


def to_export_ids(state: Mapping[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """A state dict in our seqio ids -> the export's ids (the vocabulary rows move)."""
    return layout.permute_vocab_rows(state, rows, VOCAB_KEYS)


def from_export_ids(state: Mapping[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Inverse of :func:`to_export_ids`."""
    return layout.permute_vocab_rows(state, np.argsort(rows), VOCAB_KEYS)


def card_description(hf: Mapping[str, Any]) -> tuple[str, str]:
    """The model card's title and its sentence on inputs."""
    return ("# ModernBERT-style masked-LM encoder (xlmeta_jax)",
            f"Inputs of up to {int(hf['max_position_embeddings'])} tokens (rotary positions; "
            f"every layer of `layer_types` that is `sliding_attention` sees "
            f"{hf.get('local_attention')} tokens around each token).")
