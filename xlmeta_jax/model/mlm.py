"""The masked-LM batch contract: feature names, masking settings, prediction slots.

One place for what the data pipeline (:mod:`xlmeta_jax.data.preprocessors`), the
feeder, the synthetic stream and the train step agree on. A block of ``L`` tokens
becomes these features:

* ``inputs``        [L] int32 — token ids after masking;
* ``targets``       [L] int32 — the original ids (full-length view);
* ``weights``       [L] float32 — 1 at the positions selected for prediction;
* ``mlm_positions`` [P] int32 — the selected positions, ascending, then 0;
* ``mlm_targets``   [P] int32 — the original ids there, then 0;
* ``mlm_weights``   [P] float32 — 1 for used slots, 0 for unused ones;

with ``P = max_predictions(L, masking.rate)`` slots; rows packed from whole documents
also carry ``segment_ids`` and ``positions`` [L] int32 (:data:`PACKED_FEATURES`).
The masking rate is set in one place: :class:`Masking` (gin: ``MASK_RATE``
in gin/pretrain.gin), and every slot count derives from it. Nothing here imports
TensorFlow, seqio or gin.
"""

from __future__ import annotations

import dataclasses
import math

from xlmeta_jax import errors


class MaskingError(errors.UserError, ValueError):
    """A masking setting is out of range (one line naming it)."""


class MaskingSettingError(errors.SettingError, MaskingError):
    """A Masking field out of range, refused where the Masking is built."""


# The name gin files bind Masking by (errors name a bad value's setting from it).
CONFIGURABLE = "xlmeta_jax.model.mlm.Masking"


# Every feature of a masked block, in the order above.
FEATURES = ("inputs", "targets", "weights", "mlm_positions", "mlm_targets", "mlm_weights")
# What the train step reads (the LM head runs at the gathered slots only); the feeder
# sends exactly these.
STEP_FEATURES = ("inputs", "mlm_positions", "mlm_targets", "mlm_weights")
# What the full-vocabulary head (every position; benchmarks, references) reads.
FULL_HEAD_FEATURES = ("inputs", "targets", "weights")
# Rows packed from whole documents (Corpora.packing='documents') add, and the step reads:
# each token's document in the row (1, 2, ...; 0 = padding) and its index in that document.
PACKED_FEATURES = ("segment_ids", "positions")


def step_features(packed: bool) -> tuple[str, ...]:
    """What the train step reads: :data:`STEP_FEATURES`, plus :data:`PACKED_FEATURES`
    for rows packed from whole documents."""
    return STEP_FEATURES + PACKED_FEATURES if packed else STEP_FEATURES


@dataclasses.dataclass(frozen=True)
class Masking:
    """How a block is masked (BERT/RoBERTa/XLM-R: 15%, then 80/10/10)."""

    # Expected share of the candidate tokens selected for prediction (exact in mean:
    # floor(rate * n + u) of n candidates, u ~ U[0, 1)).
    rate: float = 0.15
    # Share of the selected tokens replaced by <mask>.
    mask_token_share: float = 0.8
    # Share of the selected tokens replaced by a random non-special token (the rest stay).
    random_token_share: float = 0.1

    def __post_init__(self):
        rate = self.rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 < rate < 1.0:
            raise MaskingSettingError(CONFIGURABLE, "rate", rate,
                                      f"masking rate must be a number in (0, 1), got {rate!r}")
        shares = (self.mask_token_share, self.random_token_share)
        if min(shares) < 0.0 or sum(shares) > 1.0:
            raise MaskingSettingError(
                CONFIGURABLE, "mask_token_share", self.mask_token_share,
                f"mask_token_share={self.mask_token_share} and random_token_share="
                f"{self.random_token_share} must be >= 0 and sum to at most 1"
            )


# The shortest block the pretraining tasks pack (<s>, text, </s>): below this a block
# holds almost no text to mask.
MIN_SEQUENCE_LENGTH = 8

# XLM-R's masking (what every default refers to).
DEFAULT_MASKING = Masking()


def max_predictions(sequence_length: int, mask_rate: float) -> int:
    """P, the prediction slots of a block of ``sequence_length`` tokens.

    The pipeline selects ``floor(mask_rate * n + u)`` positions, u ~ U[0, 1), among
    at most ``sequence_length - 1`` candidates, so this many slots always suffice.
    """
    return math.ceil(mask_rate * sequence_length) + 1
