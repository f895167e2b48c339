"""What the rest of the house asks an encoder family, in one record per family.

Each family module (:mod:`xlmeta_jax.model.xlmr`, :mod:`xlmeta_jax.model.modernbert`)
defines its :class:`Family`; :func:`xlmeta_jax.model.network.family` returns the one a
config names. The step's FLOPs count, the run's checks and the fine-tuning heads ask it
instead of comparing family names; the Hugging Face layout of each family is its
``interop/hf/<family>_layout.py`` (:mod:`xlmeta_jax.interop.hf.families`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Family:
    """An encoder family's network and the traits other modules ask of it."""

    # EncoderConfig.family.
    name: str
    # The masked-LM network and the encoder alone (Flax module classes of a config).
    masked_lm: Callable[..., Any]
    encoder: Callable[..., Any]
    # Matrices of a layer's MLP, for the FLOPs count (GELU: 2; GeGLU: 3, its input
    # projection is twice mlp_dim wide).
    mlp_matrices: int
    # Rotary positions: a phase may set its own RoPE bases.
    rotary: bool
    # Rows packed from whole documents (segment ids: each attends only to itself).
    packed_rows: bool
    # Keys a query attends to in layer ``index`` of rows of ``length`` tokens (the model's
    # work: a sliding window's keys on local layers).
    attended_keys: Callable[[Any, int, int], int]
    # (field, what is wrong) when rows of ``length`` tokens do not suit the config, else None.
    length_problem: Callable[[Any, int], tuple[str, str] | None]
    # The fine-tuning heads put the family's prediction head (dense, activation, norm)
    # before their task layer, as its transformers task models do (ModernBERT's).
    task_heads_use_prediction_head: bool


def whole_row(cfg, index: int, length: int) -> int:
    """Every key of the row (full attention)."""
    return length


def no_length_problem(cfg, length: int) -> None:
    """Any row length the position table holds (checked by the config itself)."""
    return None
