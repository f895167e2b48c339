"""Hugging Face interoperability: ``XLMRobertaForMaskedLM`` weights <-> our Flax params.

Our parameters (``xlmeta_jax.network.XLMRForMaskedLM``) are
``{'encoder': ..., 'lm_head': ...}`` with per-layer subtrees ``layers_{i}``, or one
``layers`` subtree whose leaves carry a leading layer axis when
``EncoderConfig.scan_layers`` is set. Hugging Face names the same weights
``roberta.embeddings.*``, ``roberta.encoder.layer.{i}.*`` and ``lm_head.*``, stores
``nn.Linear`` weights as ``[out, in]`` and ties ``lm_head.decoder.weight`` to the word
embeddings and ``lm_head.decoder.bias`` to ``lm_head.bias``.

Library use::

    cfg, params = hf.load_hf("path/to/xlm-roberta-base")        # save_pretrained dir
    hf.save_hf("out_dir", cfg, params)  # XLMRobertaForMaskedLM.from_pretrained("out_dir")

Command line (Orbax checkpoint of the params + ``encoder_config.json`` next to it)::

    python -m xlmeta_jax.hf to_flax --hf_path=DIR --output=DIR [--scan_layers]
    python -m xlmeta_jax.hf to_hf --checkpoint=DIR --output=DIR

Only numpy, safetensors, jax and orbax are needed; torch is imported only to read
``pytorch_model.bin`` files (and only with ``allow_pickle=True``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from xlmeta_jax.network import EncoderConfig

# File names written by `PreTrainedModel.save_pretrained`.
CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLE_WEIGHTS_NAME = "pytorch_model.bin"
PICKLE_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
# Layout of a Flax checkpoint written by `save_flax_checkpoint`.
FLAX_CONFIG_NAME = "encoder_config.json"
FLAX_PARAMS_DIR = "params"
# The vocabulary of that checkpoint's ids, when known.
FLAX_VOCAB_NAME = "spm.model"

# Keys that may appear in HF checkpoints but have no counterpart in the MLM network:
# the position-id / token-type-id buffers (persistent in transformers < 4.31) and
# the pooler of `XLMRobertaModel` checkpoints (unused by the MLM objective).
_IGNORED_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
_IGNORED_PREFIXES = ("roberta.pooler.",)
# Keys tied to other weights in `XLMRobertaForMaskedLM` (checked, not stored twice).
_TIED = {
    "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
    "lm_head.decoder.bias": "lm_head.bias",
}


class ConversionError(ValueError):
    """A checkpoint does not match the expected XLM-R layout (names the offending key)."""


# ---------------------------------------------------------------------------
# Configs.
# ---------------------------------------------------------------------------


def _get(hf_config: Any, name: str, default: Any = None) -> Any:
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
    model_type = _get(hf_config, "model_type")
    if model_type not in (None, "xlm-roberta", "roberta"):
        raise ConversionError(
            f"HF config model_type={model_type!r}: expected 'xlm-roberta' or 'roberta'"
        )
    act = _get(hf_config, "hidden_act", "gelu")
    if act != "gelu":
        raise ConversionError(
            f"HF config hidden_act={act!r}: only 'gelu' (exact erf GELU) is implemented"
        )
    pos_type = _get(hf_config, "position_embedding_type", "absolute")
    if pos_type not in (None, "absolute"):
        raise ConversionError(
            f"HF config position_embedding_type={pos_type!r}: only 'absolute' is implemented"
        )
    if not _get(hf_config, "tie_word_embeddings", True):
        raise ConversionError(
            "HF config tie_word_embeddings=False: our LM head always ties the decoder to "
            "the word embeddings"
        )
    if _get(hf_config, "is_decoder", False):
        raise ConversionError("HF config is_decoder=True: only the bidirectional encoder exists")
    required = (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "max_position_embeddings", "pad_token_id",
    )
    missing = [k for k in required if _get(hf_config, k) is None]
    if missing:
        raise ConversionError(f"HF config lacks required fields {missing}")
    fields = dict(
        vocab_size=int(_get(hf_config, "vocab_size")),
        hidden_size=int(_get(hf_config, "hidden_size")),
        num_layers=int(_get(hf_config, "num_hidden_layers")),
        num_heads=int(_get(hf_config, "num_attention_heads")),
        mlp_dim=int(_get(hf_config, "intermediate_size")),
        max_position_embeddings=int(_get(hf_config, "max_position_embeddings")),
        type_vocab_size=int(_get(hf_config, "type_vocab_size", 2)),
        pad_token_id=int(_get(hf_config, "pad_token_id")),
        layer_norm_eps=float(_get(hf_config, "layer_norm_eps", 1e-12)),
        dropout_rate=float(_get(hf_config, "hidden_dropout_prob", 0.1)),
        attention_dropout_rate=float(_get(hf_config, "attention_probs_dropout_prob", 0.1)),
        initializer_range=float(_get(hf_config, "initializer_range", 0.02)),
    )
    fields.update(overrides)
    return EncoderConfig(**fields)


def _special_ids(cfg: EncoderConfig) -> tuple[int, int]:
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
        bos, eos = _special_ids(cfg)
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


# ---------------------------------------------------------------------------
# Weight layout.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Rule:
    # HF key (per-layer rules: relative to `roberta.encoder.layer.{i}.`).
    hf_key: str
    # Path in our params (per-layer rules: relative to the layer subtree).
    path: tuple[str, ...]
    # HF shape from the config.
    hf_shape: Callable[[EncoderConfig], tuple[int, ...]]
    # HF array -> ours.
    to_ours: Callable[[np.ndarray, EncoderConfig], np.ndarray]
    # Our array -> HF.
    to_hf: Callable[[np.ndarray, EncoderConfig], np.ndarray]


def _identity(x, cfg):
    return x


def _transpose(x, cfg):
    return x.T


def _hf_to_heads_in(x, cfg):  # [H*d, h] -> [h, H, d]
    return x.T.reshape(cfg.hidden_size, cfg.num_heads, cfg.head_dim)


def _heads_in_to_hf(x, cfg):  # [h, H, d] -> [H*d, h]
    return x.reshape(cfg.hidden_size, cfg.hidden_size).T


def _hf_to_heads_bias(x, cfg):  # [H*d] -> [H, d]
    return x.reshape(cfg.num_heads, cfg.head_dim)


def _heads_bias_to_hf(x, cfg):
    return x.reshape(cfg.hidden_size)


def _hf_to_heads_out(x, cfg):  # [h, H*d] -> [H, d, h]
    return x.T.reshape(cfg.num_heads, cfg.head_dim, cfg.hidden_size)


def _heads_out_to_hf(x, cfg):  # [H, d, h] -> [h, H*d]
    return x.reshape(cfg.hidden_size, cfg.hidden_size).T


def _vec(field):
    return lambda cfg: (getattr(cfg, field),)


def _hh(cfg):
    return (cfg.hidden_size, cfg.hidden_size)


_EMBEDDING_RULES = (
    _Rule("roberta.embeddings.word_embeddings.weight", ("encoder", "embeddings", "word_embeddings"),
          lambda c: (c.vocab_size, c.hidden_size), _identity, _identity),
    _Rule("roberta.embeddings.position_embeddings.weight",
          ("encoder", "embeddings", "position_embeddings"),
          lambda c: (c.max_position_embeddings, c.hidden_size), _identity, _identity),
    _Rule("roberta.embeddings.token_type_embeddings.weight",
          ("encoder", "embeddings", "token_type_embeddings"),
          lambda c: (c.type_vocab_size, c.hidden_size), _identity, _identity),
    _Rule("roberta.embeddings.LayerNorm.weight", ("encoder", "embeddings", "layer_norm", "scale"),
          _vec("hidden_size"), _identity, _identity),
    _Rule("roberta.embeddings.LayerNorm.bias", ("encoder", "embeddings", "layer_norm", "bias"),
          _vec("hidden_size"), _identity, _identity),
)

_LAYER_RULES = tuple(
    rule
    for proj in ("query", "key", "value")
    for rule in (
        _Rule(f"attention.self.{proj}.weight", ("attention", proj, "kernel"), _hh,
              _hf_to_heads_in, _heads_in_to_hf),
        _Rule(f"attention.self.{proj}.bias", ("attention", proj, "bias"), _vec("hidden_size"),
              _hf_to_heads_bias, _heads_bias_to_hf),
    )
) + (
    _Rule("attention.output.dense.weight", ("attention", "out", "kernel"), _hh,
          _hf_to_heads_out, _heads_out_to_hf),
    _Rule("attention.output.dense.bias", ("attention", "out", "bias"), _vec("hidden_size"),
          _identity, _identity),
    _Rule("attention.output.LayerNorm.weight", ("attention_layer_norm", "scale"),
          _vec("hidden_size"), _identity, _identity),
    _Rule("attention.output.LayerNorm.bias", ("attention_layer_norm", "bias"),
          _vec("hidden_size"), _identity, _identity),
    _Rule("intermediate.dense.weight", ("wi", "kernel"), lambda c: (c.mlp_dim, c.hidden_size),
          _transpose, _transpose),
    _Rule("intermediate.dense.bias", ("wi", "bias"), _vec("mlp_dim"), _identity, _identity),
    _Rule("output.dense.weight", ("wo", "kernel"), lambda c: (c.hidden_size, c.mlp_dim),
          _transpose, _transpose),
    _Rule("output.dense.bias", ("wo", "bias"), _vec("hidden_size"), _identity, _identity),
    _Rule("output.LayerNorm.weight", ("output_layer_norm", "scale"), _vec("hidden_size"),
          _identity, _identity),
    _Rule("output.LayerNorm.bias", ("output_layer_norm", "bias"), _vec("hidden_size"),
          _identity, _identity),
)

_HEAD_RULES = (
    _Rule("lm_head.dense.weight", ("lm_head", "dense", "kernel"), _hh, _transpose, _transpose),
    _Rule("lm_head.dense.bias", ("lm_head", "dense", "bias"), _vec("hidden_size"),
          _identity, _identity),
    _Rule("lm_head.layer_norm.weight", ("lm_head", "layer_norm", "scale"), _vec("hidden_size"),
          _identity, _identity),
    _Rule("lm_head.layer_norm.bias", ("lm_head", "layer_norm", "bias"), _vec("hidden_size"),
          _identity, _identity),
    _Rule("lm_head.bias", ("lm_head", "bias"), _vec("vocab_size"), _identity, _identity),
)


def _layer_prefix(i: int) -> str:
    return f"roberta.encoder.layer.{i}."


def hf_keys(cfg: EncoderConfig, *, include_tied: bool = True) -> list[str]:
    """Every HF state-dict key of the ``XLMRobertaForMaskedLM`` matching ``cfg``.

    Args:
      cfg: encoder config.
      include_tied: also list ``lm_head.decoder.weight`` / ``lm_head.decoder.bias``
        (present in ``model.state_dict()``, omitted by ``save_pretrained``).
    """
    keys = [r.hf_key for r in _EMBEDDING_RULES]
    for i in range(cfg.num_layers):
        keys.extend(_layer_prefix(i) + r.hf_key for r in _LAYER_RULES)
    keys.extend(r.hf_key for r in _HEAD_RULES)
    if include_tied:
        keys.extend(_TIED)
    return keys


def _to_numpy(x: Any) -> np.ndarray:
    """A host numpy array from a torch tensor, jax array or numpy array (bf16 kept)."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch.
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            import ml_dtypes

            return t.float().numpy().astype(ml_dtypes.bfloat16)
        return t.numpy()
    return np.asarray(x)


def _normalise_keys(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Adds the ``roberta.`` prefix to bare ``XLMRobertaModel`` keys; drops buffers."""
    bare = any(k.startswith(("embeddings.", "encoder.")) for k in state_dict)
    out = {}
    for key, value in state_dict.items():
        if bare and key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "roberta." + key
        if key.endswith(_IGNORED_SUFFIXES) or key.startswith(_IGNORED_PREFIXES):
            continue
        out[key] = value
    return out


def _check_shape(key: str, arr: np.ndarray, expected: tuple[int, ...]) -> None:
    if tuple(arr.shape) != tuple(expected):
        raise ConversionError(
            f"HF weight {key!r} has shape {tuple(arr.shape)}, expected {tuple(expected)} "
            "for this config"
        )


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def _get_path(tree: Mapping, path: tuple[str, ...], what: str):
    node = tree
    for i, p in enumerate(path):
        if not isinstance(node, Mapping) or p not in node:
            raise ConversionError(
                f"{what} lacks parameter {'/'.join(path)} (no {p!r} under "
                f"{'/'.join(path[:i]) or 'the root'})"
            )
        node = node[p]
    return node


def params_from_hf_state_dict(
    state_dict: Mapping[str, Any],
    cfg: EncoderConfig,
    *,
    scan_layers: bool | None = None,
) -> dict[str, Any]:
    """Converts an ``XLMRobertaForMaskedLM`` state dict into our Flax params.

    Args:
      state_dict: HF key -> torch tensor / numpy array (``model.state_dict()`` or
        loaded safetensors). Tied keys (``lm_head.decoder.*``) may be present or not;
        buffers (``position_ids``) and the pooler are ignored; bare
        ``XLMRobertaModel`` keys (without ``roberta.``) are accepted.
      cfg: the encoder config (e.g. from :func:`config_from_hf`).
      scan_layers: layout of the result: one ``layers`` subtree with a leading layer
        axis (True) or ``layers_{i}`` subtrees (False). Defaults to ``cfg.scan_layers``.

    Returns:
      ``{'encoder': ..., 'lm_head': ...}`` of numpy arrays in ``cfg.param_dtype``.

    Raises:
      ConversionError: naming every missing and unexpected key, a shape mismatch, or
        a tied weight that differs from the weight it is tied to.
    """
    scan = cfg.scan_layers if scan_layers is None else scan_layers
    sd = _normalise_keys(state_dict)
    expected = set(hf_keys(cfg, include_tied=False))
    missing = sorted(expected - set(sd))
    if "lm_head.bias" in missing and "lm_head.decoder.bias" in sd:
        missing.remove("lm_head.bias")
        sd["lm_head.bias"] = sd["lm_head.decoder.bias"]
    unexpected = sorted(set(sd) - expected - set(_TIED))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        raise ConversionError(
            "HF state dict does not match XLMRobertaForMaskedLM with "
            f"num_layers={cfg.num_layers}: " + "; ".join(parts)
        )
    arrays = {k: _to_numpy(v) for k, v in sd.items()}
    for tied, source in _TIED.items():
        if tied in arrays:
            _check_shape(tied, arrays[tied], arrays[source].shape)
            if not np.array_equal(arrays[tied], arrays[source]):
                raise ConversionError(
                    f"HF weight {tied!r} differs from {source!r}; our LM head ties them"
                )

    pdt = np.dtype(_np_dtype(cfg.param_dtype))

    def convert(rule: _Rule, key: str) -> np.ndarray:
        arr = arrays[key]
        _check_shape(key, arr, rule.hf_shape(cfg))
        return np.ascontiguousarray(rule.to_ours(arr, cfg)).astype(pdt, copy=False)

    params: dict[str, Any] = {}
    for rule in _EMBEDDING_RULES + _HEAD_RULES:
        _set(params, rule.path, convert(rule, rule.hf_key))
    for rule in _LAYER_RULES:
        per_layer = [convert(rule, _layer_prefix(i) + rule.hf_key) for i in range(cfg.num_layers)]
        if scan:
            _set(params, ("encoder", "layers", *rule.path), np.stack(per_layer))
        else:
            for i, arr in enumerate(per_layer):
                _set(params, ("encoder", f"layers_{i}", *rule.path), arr)
    return params


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def hf_state_dict_from_params(
    params: Mapping[str, Any],
    cfg: EncoderConfig,
    *,
    include_tied: bool = True,
    scan_layers: bool | None = None,
) -> dict[str, np.ndarray]:
    """Converts our Flax params into an ``XLMRobertaForMaskedLM`` state dict.

    Args:
      params: ``{'encoder': ..., 'lm_head': ...}`` (numpy or jax arrays; boxed
        ``nn.Partitioned`` leaves are unboxed).
      cfg: the encoder config the params belong to.
      include_tied: also emit ``lm_head.decoder.weight`` and ``lm_head.decoder.bias``
        (as ``model.state_dict()`` lists them, so ``load_state_dict(strict=True)``
        works); ``save_pretrained`` omits them.
      scan_layers: layout of ``params``; defaults to ``cfg.scan_layers``.

    Returns:
      HF key -> contiguous numpy array, keys in HF's order.

    Raises:
      ConversionError: a parameter is missing or has the wrong shape.
    """
    import flax.linen as nn

    params = nn.unbox(params)
    scan = cfg.scan_layers if scan_layers is None else scan_layers
    if "layers" in params.get("encoder", {}) and not scan:
        raise ConversionError(
            "params have a scanned 'encoder/layers' subtree but scan_layers=False"
        )
    if "layers_0" in params.get("encoder", {}) and scan:
        raise ConversionError("params have per-layer 'encoder/layers_0' but scan_layers=True")

    def convert(rule: _Rule, key: str, arr) -> np.ndarray:
        arr = _to_numpy(arr)
        out = np.ascontiguousarray(rule.to_hf(arr, cfg))
        _check_shape(key, out, rule.hf_shape(cfg))
        return out

    def ours(path):
        return _get_path(params, path, "params")

    sd: dict[str, np.ndarray] = {}
    for rule in _EMBEDDING_RULES:
        sd[rule.hf_key] = convert(rule, rule.hf_key, ours(rule.path))
    for i in range(cfg.num_layers):
        for rule in _LAYER_RULES:
            key = _layer_prefix(i) + rule.hf_key
            if scan:
                stacked = _to_numpy(ours(("encoder", "layers", *rule.path)))
                if stacked.shape[0] != cfg.num_layers:
                    raise ConversionError(
                        f"scanned parameter encoder/layers/{'/'.join(rule.path)} has "
                        f"{stacked.shape[0]} layers, config says {cfg.num_layers}"
                    )
                arr = stacked[i]
            else:
                arr = ours(("encoder", f"layers_{i}", *rule.path))
            sd[key] = convert(rule, key, arr)
    for rule in _HEAD_RULES:
        sd[rule.hf_key] = convert(rule, rule.hf_key, ours(rule.path))
    if include_tied:
        for tied, source in _TIED.items():
            sd[tied] = sd[source].copy()
    return sd


# ---------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    # The numpy backend of safetensors cannot represent bfloat16; jax (on the host CPU)
    # can, and np.asarray then yields ml_dtypes.bfloat16 without copying through fp32.
    import jax
    from safetensors import safe_open

    out = {}
    with jax.default_device(jax.devices("cpu")[0]):
        with safe_open(str(path), framework="flax") as f:
            for key in f.keys():
                out[key] = np.asarray(f.get_tensor(key))
    return out


def _read_pickle(path: pathlib.Path) -> dict[str, Any]:
    import torch

    # weights_only=True restricts unpickling to tensors and containers.
    return torch.load(str(path), map_location="cpu", weights_only=True)


def _shard_files(index_path: pathlib.Path) -> list[pathlib.Path]:
    with open(index_path) as f:
        index = json.load(f)
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


_POSITIONS_KEY = "roberta.embeddings.position_embeddings.weight"


def _permute_vocab_rows(state: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """``state`` with the vocabulary rows of the embedding and output bias reordered."""
    out = dict(state)
    for key in ("roberta.embeddings.word_embeddings.weight", "lm_head.bias",
                "lm_head.decoder.weight", "lm_head.decoder.bias"):
        if key in out:
            arr = _to_numpy(out[key])
            if arr.shape[0] != rows.shape[0]:
                raise ConversionError(
                    f"HF weight {key!r} has {arr.shape[0]} vocabulary rows, the vocabulary "
                    f"permutation {rows.shape[0]}"
                )
            out[key] = np.ascontiguousarray(arr[rows])
    return out


def _to_xlmr_ids(state: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """A state dict in our seqio ids (pad 0) -> XLM-R's ids (pad 1).

    Besides the vocabulary rows, the position table moves: positions count from
    ``pad_token_id + 1`` (RoBERTa), so the first token reads row 1 with pad 0 and row 2
    with pad 1. The table gains a leading row (a copy of row 0; XLM-R never reads row
    0) and ``max_position_embeddings`` grows by one; the longest input stays the same.
    """
    out = _permute_vocab_rows(state, rows)
    positions = _to_numpy(out[_POSITIONS_KEY])
    out[_POSITIONS_KEY] = np.ascontiguousarray(np.concatenate([positions[:1], positions]))
    return out


def _from_xlmr_ids(state: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Inverse of :func:`_to_xlmr_ids`."""
    out = _permute_vocab_rows(state, np.argsort(rows))
    out[_POSITIONS_KEY] = np.ascontiguousarray(_to_numpy(out[_POSITIONS_KEY])[1:])
    return out


def load_hf(
    path: str | os.PathLike, *, allow_pickle: bool = False, seqio_ids: bool = False,
    **config_overrides,
) -> tuple[EncoderConfig, dict[str, Any]]:
    """Loads a Hugging Face ``XLMRobertaForMaskedLM`` as (config, our params).

    Args:
      path: a ``save_pretrained`` directory (``config.json`` + weights) or a weights
        file whose directory holds ``config.json``.
      allow_pickle: permit ``pytorch_model.bin`` weights (see :func:`read_hf_state_dict`).
      seqio_ids: undo :func:`save_hf`'s permutation of a model exported from our
        vocabulary (``config.json`` records it under ``hf_tokenizer.CONFIG_KEY``): the
        result uses our ids again (pad 0), as before the export. False keeps the HF
        ids (pad 1), which the directory's ``sentencepiece.bpe.model`` encodes.
      **config_overrides: :class:`EncoderConfig` fields to set (``scan_layers`` picks
        the params layout; ``dtype``, ``remat_policy`` ... only affect the network).

    Returns:
      ``(cfg, params)`` with params as host numpy arrays.

    Raises:
      ConversionError: ``seqio_ids`` for a model that was not exported from our ids.
    """
    from xlmeta_jax import hf_tokenizer

    path = pathlib.Path(path)
    config_path = (path if path.is_dir() else path.parent) / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(f"HF config {config_path} does not exist")
    with open(config_path) as f:
        hf_config = json.load(f)
    state = read_hf_state_dict(path, allow_pickle=allow_pickle)
    if seqio_ids:
        pieces = hf_config.get(hf_tokenizer.CONFIG_KEY)
        if pieces is None:
            raise ConversionError(
                f"{config_path} has no {hf_tokenizer.CONFIG_KEY!r}: the model was not exported "
                "from our vocabulary, its ids are XLM-R's"
            )
        rows = hf_tokenizer.hf_rows(int(pieces), int(hf_config["vocab_size"]))
        state = _from_xlmr_ids(_normalise_keys(state), rows)
        config_overrides = {
            "pad_token_id": 0,
            "max_position_embeddings": int(hf_config["max_position_embeddings"]) - 1,
            **config_overrides,
        }
    cfg = config_from_hf(hf_config, **config_overrides)
    return cfg, params_from_hf_state_dict(state, cfg)


def _write_file(path: pathlib.Path, write: Callable[[str], None]) -> None:
    """Writes ``path`` through a temporary name, with the umask's usual permissions
    (safetensors creates its files 0600)."""
    tmp = path.with_name(path.name + ".tmp")
    write(str(tmp))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def save_hf(path: str | os.PathLike, cfg: EncoderConfig, params: Mapping[str, Any],
            *, vocab_path: str | os.PathLike | None = None,
            **config_kwargs) -> pathlib.Path:
    """Writes a directory that transformers loads as is: weights, config, tokenizer.

    With our vocabulary (pad 0) the vocabulary rows are permuted into XLM-R's ids and
    the SentencePiece model is rewritten to match, so ``AutoTokenizer`` and
    ``pipeline('fill-mask')`` work unchanged (``xlmeta_jax.hf_tokenizer`` explains the
    mapping); a model already in XLM-R's ids is written as it is.

    Args:
      path: output directory (created; it must not hold any of the files written).
      cfg: the encoder config of ``params``.
      params: our Flax params in either layout (``cfg.scan_layers`` tells which).
      vocab_path: the model's SentencePiece file: ours (seqio ids) or an XLM-R
        ``sentencepiece.bpe.model``. Required for a model with our ids; without it
        a model in XLM-R's ids is written without tokenizer files.
      **config_kwargs: passed to :func:`hf_config_from_config` (``bos_token_id``,
        ``eos_token_id``).

    Returns:
      The output directory.

    Raises:
      ConversionError: no vocabulary for a model with our ids, a vocabulary whose ids
        do not fit the model, or an output file that exists already.
    """
    from safetensors.numpy import save_file

    from xlmeta_jax import hf_tokenizer

    path = pathlib.Path(path)
    files, rows, seqio_pieces = {}, None, None
    if vocab_path is None and cfg.pad_token_id != 1:
        raise ConversionError(
            f"the model uses our vocabulary's ids (pad {cfg.pad_token_id}): the export needs "
            "its SentencePiece model to write the tokenizer (vocab_path / --vocab_path)"
        )
    if vocab_path is not None:
        try:
            files, seqio_pieces = hf_tokenizer.tokenizer_files(
                vocab_path, cfg.vocab_size, cfg.max_length
            )
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
    names = [CONFIG_NAME, SAFE_WEIGHTS_NAME, *files]
    existing = [n for n in names if (path / n).exists()]
    if existing:
        raise ConversionError(f"{path} already holds {existing}; export into a new directory")
    state = hf_state_dict_from_params(params, cfg, include_tied=False)
    if rows is not None:
        state = _to_xlmr_ids(state, rows)
        cfg = cfg.replace(pad_token_id=1, max_position_embeddings=cfg.max_position_embeddings + 1)
    hf_config = hf_config_from_config(cfg, **config_kwargs)
    if rows is not None:
        hf_config[hf_tokenizer.CONFIG_KEY] = seqio_pieces
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        _write_file(path / name, lambda p, data=data: pathlib.Path(p).write_bytes(data))
    # transformers refuses safetensors files without format metadata.
    _write_file(path / SAFE_WEIGHTS_NAME,
                lambda p: save_file(state, p, metadata={"format": "pt"}))
    # config.json last: a directory with it is complete.
    text = json.dumps(hf_config, indent=2, sort_keys=True)
    _write_file(path / CONFIG_NAME, lambda p: pathlib.Path(p).write_text(text))
    return path


def config_to_json(cfg: EncoderConfig) -> str:
    """Our config as JSON (every field)."""
    return json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True)


def config_from_json(text: str) -> EncoderConfig:
    """Inverse of :func:`config_to_json`; unknown fields are an error."""
    fields = json.loads(text)
    known = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConversionError(f"encoder config JSON has unknown fields {unknown}")
    return EncoderConfig(**fields)


def save_flax_checkpoint(path: str | os.PathLike, cfg: EncoderConfig, params) -> pathlib.Path:
    """Writes ``path/params`` (Orbax) and ``path/encoder_config.json``.

    Raises:
      FileExistsError: ``path/params`` already exists.
    """
    import orbax.checkpoint as ocp

    path = pathlib.Path(path).absolute()
    if (path / FLAX_PARAMS_DIR).exists():
        raise FileExistsError(f"{path / FLAX_PARAMS_DIR} already exists")
    path.mkdir(parents=True, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path / FLAX_PARAMS_DIR, params)
    ckptr.wait_until_finished()
    (path / FLAX_CONFIG_NAME).write_text(config_to_json(cfg))
    return path


def load_flax_checkpoint(path: str | os.PathLike) -> tuple[EncoderConfig, dict[str, Any]]:
    """Reads a checkpoint written by :func:`save_flax_checkpoint` (params on host).

    Raises:
      FileNotFoundError: the config JSON or the params directory is missing.
    """
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from xlmeta_jax.network import XLMRForMaskedLM

    path = pathlib.Path(path).absolute()
    for p in (path / FLAX_CONFIG_NAME, path / FLAX_PARAMS_DIR):
        if not p.exists():
            raise FileNotFoundError(f"Flax checkpoint {path} lacks {p.name}")
    cfg = config_from_json((path / FLAX_CONFIG_NAME).read_text())
    model = XLMRForMaskedLM(cfg)
    # Restore onto the host CPU: conversion never needs accelerator memory.
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    abstract = jax.eval_shape(
        lambda: nn.unbox(
            model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
        )
    )
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cpu), abstract)
    params = ocp.StandardCheckpointer().restore(path / FLAX_PARAMS_DIR, target)
    return cfg, jax.tree.map(np.asarray, params)


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------


def to_flax(hf_path: str, output: str, *, scan_layers: bool = False,
            allow_pickle: bool = False) -> pathlib.Path:
    """HF ``save_pretrained`` dir -> Orbax params + ``encoder_config.json`` (+ ``spm.model``).

    A model that :func:`to_hf` exported from our vocabulary gets our ids back (the
    round trip is exact) and ``spm.model`` is our SentencePiece model again; any other
    model keeps XLM-R's ids and its ``sentencepiece.bpe.model`` is copied.
    """
    from xlmeta_jax import hf_tokenizer

    src = pathlib.Path(hf_path)
    src_dir = src if src.is_dir() else src.parent
    config_path = src_dir / CONFIG_NAME
    seqio = config_path.is_file() and hf_tokenizer.CONFIG_KEY in json.loads(config_path.read_text())
    cfg, params = load_hf(hf_path, allow_pickle=allow_pickle, seqio_ids=seqio,
                          scan_layers=scan_layers)
    vocab = None
    if (src_dir / hf_tokenizer.SPM_NAME).is_file():
        vocab = (hf_tokenizer.seqio_vocabulary_bytes(src_dir) if seqio
                 else (src_dir / hf_tokenizer.SPM_NAME).read_bytes())
    out = save_flax_checkpoint(output, cfg, params)
    if vocab is not None:
        (out / FLAX_VOCAB_NAME).write_bytes(vocab)
    return out


def _flax_vocab(checkpoint: pathlib.Path) -> pathlib.Path | None:
    from xlmeta_jax import hf_tokenizer

    for name in (FLAX_VOCAB_NAME, hf_tokenizer.SPM_NAME):
        if (checkpoint / name).is_file():
            return checkpoint / name
    return None


def to_hf(checkpoint: str, output: str, *, vocab_path: str | None = None) -> pathlib.Path:
    """Flax checkpoint -> HF directory with weights, config and tokenizer (:func:`save_hf`).

    Args:
      checkpoint: a directory written by :func:`save_flax_checkpoint` (it holds
        ``encoder_config.json``), or a pretraining checkpoint of ``xlmeta_jax.train``
        (MODEL_DIR, ``MODEL_DIR/phaseN`` or ``MODEL_DIR/phaseN/<step>``, read with
        ``xlmeta_jax.checkpoints.load_pretrained``).
      output: output directory.
      vocab_path: the model's SentencePiece file; default: the one the pretraining
        checkpoint records, or the ``spm.model`` of a :func:`to_flax` directory.
    """
    existing = [n for n in (CONFIG_NAME, SAFE_WEIGHTS_NAME) if (pathlib.Path(output) / n).exists()]
    if existing:
        raise ConversionError(f"{output} already holds {existing}; export into a new directory")
    if vocab_path is not None and not os.path.isfile(vocab_path):
        raise FileNotFoundError(f"vocabulary {vocab_path} does not exist")
    if (pathlib.Path(checkpoint) / FLAX_CONFIG_NAME).is_file():
        cfg, params = load_flax_checkpoint(checkpoint)
        recorded = _flax_vocab(pathlib.Path(checkpoint))
    else:
        from xlmeta_jax import checkpoints

        cfg, params, recorded = checkpoints.load_pretrained(checkpoint)
    return save_hf(output, cfg, params, vocab_path=vocab_path or recorded)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m xlmeta_jax.hf",
        description="Convert XLM-R masked-LM weights between Hugging Face and xlmeta_jax.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("to_flax", help="HF save_pretrained dir -> Orbax checkpoint")
    p.add_argument("--hf_path", required=True, help="save_pretrained dir or weights file")
    p.add_argument("--output", required=True, help="output dir (params/ + encoder_config.json)")
    p.add_argument("--scan_layers", action="store_true",
                   help="write the scanned layout (one 'layers' subtree with a layer axis)")
    p.add_argument("--allow_pickle", action="store_true",
                   help="permit pytorch_model.bin (pickle) weights; only for trusted files")
    p = sub.add_parser("to_hf", help="Orbax checkpoint -> HF save_pretrained dir")
    p.add_argument("--checkpoint", required=True,
                   help="dir written by to_flax, or a pretraining MODEL_DIR / phase / step dir")
    p.add_argument("--output", required=True,
                   help="new output dir (config.json, model.safetensors, tokenizer files)")
    p.add_argument("--vocab_path", default=None,
                   help="the model's SentencePiece .model (default: the one the checkpoint "
                   "records)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m xlmeta_jax.hf``."""
    args = _parser().parse_args(argv)
    if args.command == "to_flax":
        out = to_flax(args.hf_path, args.output, scan_layers=args.scan_layers,
                      allow_pickle=args.allow_pickle)
    else:
        out = to_hf(args.checkpoint, args.output, vocab_path=args.vocab_path)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
