"""Each encoder family's Hugging Face layout, by family and by ``config.json``'s model_type.

A layout module (:mod:`.xlmr_layout`, :mod:`.modernbert_layout`) answers the same
questions: ``FAMILY``, ``DISPLAY_NAME``, ``MODEL_TYPES``, ``ARCHITECTURE`` and
``CONFIG_CLASS`` (transformers' names),
``VOCAB_KEYS``; ``config_from_hf``, ``normalise``, ``params_from_hf``, ``state_from_params``,
``export_config``, ``max_tokens``, ``to_export_ids``/``from_export_ids`` (our ids in an
export) and ``card_description``. The import, the export, the model card and the benchmark
ask it instead of comparing family names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from xlmeta_jax.interop.hf import modernbert_layout, xlmr_layout
from xlmeta_jax.interop.hf.hf_config import ConversionError

LAYOUTS: dict[str, ModuleType] = {m.FAMILY: m for m in (xlmr_layout, modernbert_layout)}
_BY_MODEL_TYPE = {t: m for m in LAYOUTS.values() for t in m.MODEL_TYPES}


def of(cfg) -> ModuleType:
    """The layout of ``cfg.family``."""
    return LAYOUTS[cfg.family]


def of_hf_config(hf_config: Mapping[str, Any], where: os.PathLike | str) -> ModuleType:
    """The layout of an HF ``config.json`` dict (XLM-R's when it names no model_type).

    Raises:
      ConversionError: naming the architecture of any other model.
    """
    model_type = hf_config.get("model_type")
    if model_type is None:
        return xlmr_layout
    if model_type not in _BY_MODEL_TYPE:
        known = [f"{m.DISPLAY_NAME} ({', '.join(repr(t) for t in m.MODEL_TYPES)})"
                 for m in LAYOUTS.values()]
        raise ConversionError(
            f"{where}: model_type={model_type!r} (architectures "
            f"{hf_config.get('architectures')}) is neither {' nor '.join(known)}, the two "
            "families we train" if len(known) == 2 else
            f"{where}: model_type={model_type!r} is none of {', '.join(known)}")
    return _BY_MODEL_TYPE[model_type]
