"""Hyper-parameters of an evaluation run: fine-tuning settings and retrieval settings.

Plain frozen dataclasses (no gin here: :mod:`xlmeta_jax.cli.configurables` builds them
from the gin bindings ``finetune.<field>`` and ``evaluate_retrieval.<field>``).
"""

from __future__ import annotations

import dataclasses
import math

from xlmeta_jax import errors


class SettingsError(errors.UserError, ValueError):
    """A fine-tuning setting is out of range; names its gin binding (``finetune.<field>``)."""


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# (fields, the rule in words, the check) of FineTuneSettings; None passes where allowed.
_RULES = (
    (("max_seq_length", "doc_stride", "max_query_length", "max_answer_length", "n_best",
      "batch_size", "eval_batch_size", "log_every"), "an integer > 0", errors.is_count),
    (("train_steps", "eval_every", "max_train_examples", "max_eval_examples"),
     "None or an integer > 0", lambda x: x is None or errors.is_count(x)),
    (("warmup_steps",), "an integer >= 0",
     lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0),
    (("learning_rate", "num_epochs", "adam_eps"), "a finite number > 0",
     lambda x: _number(x) and x > 0),
    (("large_learning_rate",), "None or a finite number > 0",
     lambda x: x is None or (_number(x) and x > 0)),
    (("weight_decay", "max_grad_norm"), "a finite number >= 0",
     lambda x: _number(x) and x >= 0),
    (("adam_b1", "adam_b2", "select_fraction"), "in [0, 1)",
     lambda x: _number(x) and 0 <= x < 1),
    (("dropout_rate",), "None or in [0, 1)", lambda x: x is None or (_number(x) and 0 <= x < 1)),
    (("train_fraction",), "in (0, 1]", lambda x: _number(x) and 0 < x <= 1),
    (("dtype",), "'float32' or 'bfloat16'", lambda x: x in ("float32", "bfloat16")),
    (("qa_unknown_pieces",), "'xtreme' or 'text'", lambda x: x in ("xtreme", "text")),
    (("seed",), "an integer", lambda x: isinstance(x, int) and not isinstance(x, bool)),
)


@dataclasses.dataclass(frozen=True)
class FineTuneSettings:
    """Hyper-parameters of one fine-tuning run (all settable from gin).

    Defaults are those of XTREME's scripts for a base-size encoder where they are
    shared (``third_party/run_*.py`` argument defaults); the per-task gin files set the
    rest from ``scripts/train_<task>.sh``.
    """

    # Longest input in tokens (XTREME: 128 for classification/tagging, 384 for QA;
    # retrieval: 512).
    max_seq_length: int = 128
    # QA: context tokens between the starts of consecutive windows.
    doc_stride: int = 128
    # QA: questions are truncated to this many tokens.
    max_query_length: int = 64
    # QA: longest answer in tokens considered when decoding.
    max_answer_length: int = 30
    # QA: start / end candidates per window when decoding.
    n_best: int = 20
    # QA: "xtreme" reads an unknown piece as <unk> when decoding answer text, as
    # XTREME's convert_ids_to_tokens (its span then answers with whole words); "text"
    # uses the piece's own text.
    qa_unknown_pieces: str = "xtreme"
    # Training batch size (global; XTREME: 8 per GPU x 4 accumulation steps = 32).
    batch_size: int = 32
    # Evaluation batch size (rounded up to a multiple of the number of devices).
    eval_batch_size: int = 128
    # Training steps; None: `num_epochs` passes over the training features.
    train_steps: int | None = None
    # Epochs when `train_steps` is None (XTREME's --num_train_epochs).
    num_epochs: float = 3.0
    # Peak AdamW learning rate.
    learning_rate: float = 2e-5
    # Peak learning rate instead for a large encoder (24 or more layers), where XTREME's
    # script sets one for xlm-roberta-large (train_xnli.sh: 3e-5); None: `learning_rate`.
    large_learning_rate: float | None = None
    # Steps of linear warm-up from 0 (then linear decay to 0; XTREME's --warmup_steps;
    # may exceed the training steps, as in Hugging Face's schedule).
    warmup_steps: int = 0
    # Decoupled weight decay (not on biases / LayerNorm).
    weight_decay: float = 0.0
    # AdamW beta1, beta2 and epsilon (Hugging Face AdamW defaults, XTREME's).
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    # Gradient clipping by global norm (0 disables).
    max_grad_norm: float = 1.0
    # Model selection on English dev every this many steps (XTREME's --save_steps with
    # --save_only_best_checkpoint: at its multiples only, not at the last step); None:
    # keep the final parameters.
    eval_every: int | None = None
    # Dropout on the encoder and head; None keeps the checkpoint's.
    dropout_rate: float | None = None
    # Compute dtype of the encoder ("float32" or "bfloat16").
    dtype: str = "float32"
    # Use at most this many training examples (None: all), a seeded random subset.
    max_train_examples: int | None = None
    # Evaluate at most this many examples per language (None: all), the first ones;
    # also caps the selection set; retrieval: sentences (pairs) per language.
    max_eval_examples: int | None = None
    # XNLI / PAWS-X: share of English dev lines used for training (see readers).
    train_fraction: float = 0.5
    # XNLI / PAWS-X: share of English dev lines, taken from the training part, held
    # out for model selection. PAN-X: share of English dev held out for model selection
    # (the rest is English's evaluation set). 0: no selection data.
    select_fraction: float = 0.1
    # Seed of head init, data order and dropout; run i of `num_seeds` uses seed + i.
    seed: int = 42
    # Log the training loss every this many steps.
    log_every: int = 50

    def __post_init__(self):
        for fields, rule, ok in _RULES:
            for field in fields:
                value = getattr(self, field)
                if not ok(value):
                    raise SettingsError(f"finetune.{field} = {value!r}: must be {rule}")


LARGE_NUM_LAYERS = 24


def settings_for_encoder(s: FineTuneSettings, num_layers: int) -> FineTuneSettings:
    """``s`` with the recipe of the encoder's size: XTREME's scripts switch the learning
    rate for xlm-roberta-large (24 layers), so ``large_learning_rate`` replaces
    ``learning_rate`` for an encoder of 24 or more layers."""
    if s.large_learning_rate is not None and num_layers >= LARGE_NUM_LAYERS:
        return dataclasses.replace(s, learning_rate=s.large_learning_rate)
    return s


@dataclasses.dataclass(frozen=True)
class RetrievalSettings:
    """Settings of the sentence-retrieval tasks (gin: ``evaluate_retrieval.<field>``)."""

    # XTREME's --specific_layer (0 = the first Transformer layer's output, i.e. Hugging
    # Face hidden_states[1]); None: the task's XTREME layer for the encoder's depth.
    layer: int | None = None
    # BUCC margin's k, nearest neighbours each way (XTREME: 4).
    neighbourhood: int = 4
    # "mean" or "cls" (see retrieval.SentenceEmbedder); None: the task's XTREME pooling.
    pooling: str | None = None
