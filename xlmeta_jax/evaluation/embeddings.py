"""Sentence embeddings of a trained embedder: ``load(path).encode(texts)``.

``path`` is a contrastive run's ``MODEL_DIR`` (or one of its step folders), or its
export (``python -m xlmeta_jax.hf to_hf``: a sentence-transformers folder). The
embeddings are the ones the loss saw: the encoder's final hidden states, pooled as the
run pooled them (mean over the tokens that are not padding, or the first token),
normalised to unit length, in float32::

    from xlmeta_jax.evaluation import embeddings
    model = embeddings.load("runs/embeddings")
    vectors = model.encode(["Hello world.", "Bonjour le monde."])   # [2, hidden]

The same object embeds the retrieval tasks' sentences (Tatoeba, BUCC) through their
scorers (:meth:`Embedder.__call__`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from xlmeta_jax import errors
from xlmeta_jax.evaluation import encoders
from xlmeta_jax.evaluation.embedding_step import embedder
from xlmeta_jax.evaluation.retrieval import length_sorted_batches
from xlmeta_jax.model import contrastive
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import checkpoints, loading

# The key of a contrastive run's checkpoint metadata that holds its embedding settings.
META_KEY = "embedding"
# sentence-transformers' files in an export.
MODULES_NAME = "modules.json"
POOLING_DIR = "1_Pooling"
ST_CONFIG_NAME = "sentence_bert_config.json"


class EmbedderError(errors.UserError, ValueError):
    """A path that is neither a contrastive run nor its export."""


@dataclasses.dataclass(frozen=True)
class EmbeddingSettings:
    """What turns a text into the vector the loss saw (recorded with the checkpoint)."""

    pooling: str = "mean"
    # Tokens per text, the special tokens included.
    max_seq_length: int = 128


class Embedder:
    """Normalised, pooled embeddings of an encoder, in batches."""

    def __init__(self, cfg: EncoderConfig, params, tokenizer, settings: EmbeddingSettings, *,
                 batch_size: int = 64):
        """Args: the encoder's config, its parameters (the encoder's subtree), its
        tokenizer, the pooling and length, and the rows per forward pass."""
        self.cfg = cfg.replace(dropout_rate=0.0, attention_dropout_rate=0.0)
        self.params, self.tokenizer, self.settings = params, tokenizer, settings
        self.batch_size = batch_size
        self.max_seq_length = min(settings.max_seq_length, self.cfg.max_length)
        embed = embedder(self.cfg, settings.pooling)
        self._embed = jax.jit(lambda p, ids: contrastive.normalize(embed(p, ids)))

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with the tokenizer's special tokens, at most ``max_seq_length``."""
        return [self.tokenizer.single(x, self.max_seq_length)
                for x in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), hidden]`` float32 unit vectors."""
        ids = self.ids(texts)
        out = np.zeros((len(ids), self.cfg.hidden_size), np.float32)
        for idx, batch in length_sorted_batches(ids, self.batch_size, self.max_seq_length,
                                                self.cfg.pad_token_id):
            out[idx] = np.asarray(self._embed(self.params, batch))[: len(idx)]
        return out

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        """The retrieval scorers' view: ``[1, N, hidden]`` of the stripped sentences."""
        return self.encode([s.strip() for s in sentences])[None]


def recorded_settings(path) -> EmbeddingSettings | None:
    """The embedding settings a contrastive run's checkpoint records (None: none)."""
    try:
        meta = checkpoints.read_meta(loading.find_step_dir(path))
    except errors.CheckpointError:
        return None
    recorded = meta.get(META_KEY)
    if not recorded:
        return None
    fields = {f.name for f in dataclasses.fields(EmbeddingSettings)}
    return EmbeddingSettings(**{k: v for k, v in recorded.items() if k in fields})


def export_settings(folder: pathlib.Path) -> EmbeddingSettings:
    """The pooling and length a sentence-transformers folder declares.

    Raises:
      EmbedderError: a pooling other than mean or CLS tokens.
    """
    pooling_config = json.loads((folder / POOLING_DIR / "config.json").read_text())
    modes = [k for k, v in pooling_config.items() if k.startswith("pooling_mode") and v]
    by_mode = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
    if len(modes) != 1 or modes[0] not in by_mode:
        raise EmbedderError(f"{folder}: pooling {modes} is not one of mean or CLS tokens")
    length = json.loads((folder / ST_CONFIG_NAME).read_text()).get("max_seq_length", 512)
    return EmbeddingSettings(pooling=by_mode[modes[0]], max_seq_length=int(length))


def load(path: str | os.PathLike, *, batch_size: int = 64) -> Embedder:
    """The embedder of a contrastive run (its ``MODEL_DIR`` or a step folder) or of its
    export (a sentence-transformers folder).

    Raises:
      EmbedderError: ``path`` is neither.
    """
    folder = pathlib.Path(path)
    if not folder.exists():
        raise EmbedderError(f"embedder {folder} does not exist")
    if (folder / MODULES_NAME).is_file():
        settings = export_settings(folder)
    else:
        settings = recorded_settings(folder)
        if settings is None:
            raise EmbedderError(
                f"{folder} is neither a contrastive run (its checkpoints record no "
                f"'{META_KEY}' settings) nor a sentence-transformers export ({MODULES_NAME})")
    loaded = encoders.load_encoder(os.fspath(folder))
    return Embedder(loaded.config, loaded.params, loaded.tokenizer, settings,
                    batch_size=batch_size)


def from_loaded(loaded: Any, settings: EmbeddingSettings, *, batch_size: int = 64,
                params=None) -> Embedder:
    """An embedder of an encoder already loaded (:func:`encoders.load_encoder`), with
    ``params`` (the encoder's subtree) instead of the loaded ones where given."""
    return Embedder(loaded.config, loaded.params if params is None else params,
                    loaded.tokenizer, settings, batch_size=batch_size)
