"""The contrastive run's settings: :class:`EmbeddingConfig` (gin: ``embeddings.<field>``),
each checked once, where the config is built (:func:`bad` names the binding)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from xlmeta_jax import errors, files
from xlmeta_jax.evaluation.embedding_step import LossSettings
from xlmeta_jax.model import contrastive

CONFIGURABLE = "xlmeta_jax.cli.runs.embeddings"
# finetune.task of gin/finetune/embeddings.gin: the evaluation command runs embedding_run.
TASK = "embeddings"
PHASE = "embeddings"
RETRIEVAL_TASKS = ("tatoeba", "bucc", "xquad_r", "mlqa_r")
# LAReQA's sets (evaluation/lareqa.py): one multilingual pool each.
LAREQA_SETS = ("xquad_r", "mlqa_r")
# Settings that decide the batches and updates: a rerun must not change them.
RUN_FIELDS = ("initial_checkpoint_path", "steps", "batch_size", "mini_batch_size",
              "learning_rate", "warmup_steps", "weight_decay", "max_grad_norm", "adam_b1",
              "adam_b2", "adam_eps", "query_length", "document_length", "pooling", "scale",
              "symmetric", "margin", "dropout_rate", "seed", "train_files", "bitext_dir",
              "bitext_languages", "bitext_pivot", "bitext_split",
              "exclude_evaluation_sentences")


@dataclasses.dataclass(frozen=True)
class EmbeddingConfig:
    """One contrastive run (every field is a gin binding ``embeddings.<field>``)."""

    # The encoder trained: a run's MODEL_DIR, a phase or step folder, an HF folder of
    # either family, or a `hf to_flax` output (see evaluation/encoders.py).
    initial_checkpoint_path: str
    # Output folder: embeddings/<step>/, before.json, results.json, config.gin.
    model_dir: str
    # Optimizer steps.
    steps: int
    # JSONL or TSV files of (query, positive[, negatives]) rows.
    train_files: Sequence[str] = ()
    # Line-aligned parallel text (FLORES-200's devtest/ layout): translation pairs.
    bitext_dir: str | None = None
    bitext_languages: Sequence[str] = ()
    bitext_pivot: str = "eng_Latn"
    bitext_split: str = "devtest"
    # The rows' token cache (python -m xlmeta_jax.tools.caching with this run's gin flags
    # writes it): read in place of tokenizing; None: tokenize on the way.
    cache_dir: str | None = None
    # Drop training rows that hold a sentence of the evaluated retrieval sets.
    exclude_evaluation_sentences: bool = True
    # Rows per step (the global batch: every row's negatives), and GradCache's rows per
    # forward pass (None: one pass).
    batch_size: int = 64
    mini_batch_size: int | None = None
    # AdamW (Hugging Face's: no decay on biases and LayerNorms) on a linear schedule;
    # sentence-transformers' Trainer defaults.
    learning_rate: float = 5e-5
    warmup_steps: int = 0
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    # Tokens per query and per document (positives, negatives), special tokens included.
    query_length: int = 128
    document_length: int = 128
    pooling: str = "mean"
    # sentence-transformers' scale (1 / temperature), the documents' direction too, and
    # LaBSE's additive margin.
    scale: float = 20.0
    symmetric: bool = False
    margin: float = 0.0
    # Dropout of the encoder while training (None: the checkpoint's).
    dropout_rate: float | None = None
    seed: int = 0
    # (data, fsdp, tensor); -1: what the others leave.
    mesh_shape: Sequence[int] = (-1, 1, 1)
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    # Retrieval tasks scored before and after ('tatoeba', 'bucc'), their languages
    # (None: the task's), sentences per language (None: all) and forward batch.
    evaluate: Sequence[str] = ("tatoeba",)
    eval_languages: Sequence[str] | None = None
    max_eval_sentences: int | None = None
    eval_batch_size: int = 64
    # Folder laid out like ../shared/data (None: that folder).
    data_dir: str | None = None
    allow_pickle: bool = False
    # Written to MODEL_DIR/config.gin once the inputs are read.
    config_text: str | None = None

    def __post_init__(self):
        for field, setting in (("initial_checkpoint_path", "INITIAL_CHECKPOINT_PATH"),
                               ("model_dir", "MODEL_DIR"), ("data_dir", "DATA_DIR"),
                               ("bitext_dir", "embeddings.bitext_dir"),
                               ("cache_dir", "CACHE_DIR")):
            object.__setattr__(self, field, files.user_path(getattr(self, field), setting))
        object.__setattr__(self, "train_files", tuple(
            files.user_paths(self.train_files, "embeddings.train_files") or ()))
        for field in ("bitext_languages", "evaluate", "mesh_shape"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        if self.eval_languages is not None:
            object.__setattr__(self, "eval_languages", tuple(self.eval_languages))
        _check(self)

    def loss(self) -> LossSettings:
        return LossSettings(pooling=self.pooling, scale=self.scale, symmetric=self.symmetric,
                            margin=self.margin, mini_batch_size=self.mini_batch_size)

    def recorded(self) -> dict[str, Any]:
        """The fields a rerun must keep, as JSON values."""
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items() if k in RUN_FIELDS}


def bad(field: str, value, message: str) -> errors.SettingError:
    return errors.SettingError(CONFIGURABLE, field, value, message)


def _check(c: EmbeddingConfig) -> None:
    """Every field's range, once, where the config is built."""
    positive = ("steps", "batch_size", "query_length", "document_length", "checkpoint_every",
                "keep_checkpoints", "log_every", "eval_batch_size")
    for field in positive:
        value = getattr(c, field)
        if not errors.is_count(value) or value < 1:
            raise bad(field, value, f"must be a whole number >= 1, got {value!r}")
    if c.mini_batch_size is not None:
        if not errors.is_count(c.mini_batch_size) or c.mini_batch_size < 1:
            raise bad("mini_batch_size", c.mini_batch_size,
                       f"must be a whole number >= 1 or None, got {c.mini_batch_size!r}")
        if c.batch_size % c.mini_batch_size:
            raise bad("mini_batch_size", c.mini_batch_size,
                       f"{c.mini_batch_size} does not divide batch_size={c.batch_size}")
    for field in ("learning_rate", "scale"):
        value = getattr(c, field)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise bad(field, value, f"must be a number > 0, got {value!r}")
    for field in ("weight_decay", "max_grad_norm", "warmup_steps"):
        value = getattr(c, field)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise bad(field, value, f"must be a number >= 0, got {value!r}")
    for field in ("adam_b1", "adam_b2", "margin"):
        value = getattr(c, field)
        if not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise bad(field, value, f"must be in [0, 1), got {value!r}")
    if not isinstance(c.adam_eps, (int, float)) or not c.adam_eps > 0:
        raise bad("adam_eps", c.adam_eps, f"must be a number > 0, got {c.adam_eps!r}")
    if c.dropout_rate is not None and (not isinstance(c.dropout_rate, (int, float))
                                       or not 0 <= c.dropout_rate < 1):
        raise bad("dropout_rate", c.dropout_rate, f"must be in [0, 1) or None, got "
                   f"{c.dropout_rate!r}")
    if c.pooling not in contrastive.POOLINGS:
        raise bad("pooling", c.pooling, f"must be one of {contrastive.POOLINGS}, got "
                   f"{c.pooling!r}")
    unknown = [t for t in c.evaluate if t not in RETRIEVAL_TASKS]
    if unknown:
        raise bad("evaluate", c.evaluate, f"unknown tasks {unknown}; retrieval tasks: "
                   f"{RETRIEVAL_TASKS}")
    if not c.train_files and c.bitext_dir is None:
        raise bad("train_files", c.train_files,
                   "no training data: give train_files (JSONL or TSV rows) or bitext_dir")
    if c.bitext_dir is not None and not c.bitext_languages:
        raise bad("bitext_languages", c.bitext_languages,
                   "bitext_dir needs the languages paired with bitext_pivot")
    if len(c.mesh_shape) != 3 or not all(isinstance(x, int) for x in c.mesh_shape):
        raise bad("mesh_shape", c.mesh_shape, "must be (data, fsdp, tensor) whole numbers")
    if c.max_eval_sentences is not None and (not errors.is_count(c.max_eval_sentences)
                                             or c.max_eval_sentences < 1):
        raise bad("max_eval_sentences", c.max_eval_sentences, "must be >= 1 or None")
