"""Hugging Face's XLM-R layout <-> ours: config fields, weight names, shapes, ties.

Our parameters (``xlmeta_jax.model.network.XLMRForMaskedLM``) are
``{'encoder': ..., 'lm_head': ...}`` with per-layer subtrees ``layers_{i}``, or one
``layers`` subtree whose leaves carry a leading layer axis when
``EncoderConfig.scan_layers`` is set. Hugging Face names the same weights
``roberta.embeddings.*``, ``roberta.encoder.layer.{i}.*`` and ``lm_head.*``, stores
``nn.Linear`` weights as ``[out, in]`` and ties ``lm_head.decoder.weight`` to the word
embeddings and ``lm_head.decoder.bias`` to ``lm_head.bias``. This module maps
in-memory configs and state dicts; :mod:`xlmeta_jax.hf` reads and writes the files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import ml_dtypes
import numpy as np

from xlmeta_jax.interop.hf.hf_config import ConversionError
from xlmeta_jax.model.network import EncoderConfig

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


def to_numpy(x: Any) -> np.ndarray:
    """A host numpy array from a torch tensor, jax array or numpy array (bf16 kept)."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch.
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":

            return t.float().numpy().astype(ml_dtypes.bfloat16)
        return t.numpy()
    return np.asarray(x)


def normalise_keys(state_dict: Mapping[str, Any]) -> dict[str, Any]:
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
    sd = normalise_keys(state_dict)
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
    arrays = {k: to_numpy(v) for k, v in sd.items()}
    for tied, source in _TIED.items():
        if tied in arrays:
            _check_shape(tied, arrays[tied], arrays[source].shape)
            if not np.array_equal(arrays[tied], arrays[source]):
                raise ConversionError(
                    f"HF weight {tied!r} differs from {source!r}; our LM head ties them"
                )

    pdt = np.dtype(np_dtype(cfg.param_dtype))

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


def np_dtype(name: str):
    """The numpy dtype of an EncoderConfig dtype name (bfloat16: ml_dtypes')."""
    if name == "bfloat16":

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

    params = nn.unbox(params)
    scan = cfg.scan_layers if scan_layers is None else scan_layers
    if "layers" in params.get("encoder", {}) and not scan:
        raise ConversionError(
            "params have a scanned 'encoder/layers' subtree but scan_layers=False"
        )
    if "layers_0" in params.get("encoder", {}) and scan:
        raise ConversionError("params have per-layer 'encoder/layers_0' but scan_layers=True")

    def convert(rule: _Rule, key: str, arr) -> np.ndarray:
        arr = to_numpy(arr)
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
                stacked = to_numpy(ours(("encoder", "layers", *rule.path)))
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


def permute_vocab_rows(state: Mapping[str, Any], rows: np.ndarray,
                       keys: tuple[str, ...]) -> dict[str, Any]:
    """``state`` with the vocabulary rows of the weights ``keys`` (those with a row per id:
    embeddings, output bias, tied decoder) reordered to ``rows``."""
    out = dict(state)
    for key in keys:
        if key in out:
            arr = to_numpy(out[key])
            if arr.shape[0] != rows.shape[0]:
                raise ConversionError(
                    f"HF weight {key!r} has {arr.shape[0]} vocabulary rows, the vocabulary "
                    f"permutation {rows.shape[0]}"
                )
            out[key] = np.ascontiguousarray(arr[rows])
    return out
