"""Fine-tuning heads on either encoder family (``xlmeta_jax.model.network.encoder``).

Parameters are ``{"encoder": <the pretrained encoder's params>, "head": {...}}``, so a
pretraining checkpoint (``{"encoder", "lm_head"}``) or a converted Hugging Face model
loads by replacing ``"encoder"``.

:class:`FineTuneModel` is the encoder plus one head of :data:`HEADS` (a task object's
``head`` names it); each head also defines its training loss:

* ``"classification"`` — RoBERTa's classification head on the ``<s>`` state: dropout,
  dense + tanh, dropout, projection to the labels; cross-entropy;
* ``"qa"`` — one dense layer giving start and end logits per token; the mean of the
  start and end cross-entropies over the non-padding positions;
* ``"tagging"`` — dropout and a dense layer giving tag logits per token; cross-entropy
  on each word's first sub-token only (label -1 elsewhere).

The ModernBERT family's heads are Hugging Face's (``ModernBertFor{SequenceClassification,
QuestionAnswering,TokenClassification}``): its prediction head (bias-free dense, GELU,
bias-free LayerNorm) on the ``[CLS]`` state (classification, ``classifier_pooling='cls'``)
or on every token, dropout, then the projection with bias.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from xlmeta_jax.model import layers, network
from xlmeta_jax.model.network import EncoderConfig


def _dense(cfg: EncoderConfig, features: int, name: str) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=nn.initializers.normal(stddev=cfg.initializer_range),
        name=name,
    )


class PredictionHead(nn.Module):
    """ModernBERT's head before each task's projection: dense, GELU, LayerNorm, no biases."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        x = nn.Dense(cfg.hidden_size, use_bias=False, dtype=jnp.dtype(cfg.dtype),
                     param_dtype=jnp.dtype(cfg.param_dtype),
                     kernel_init=nn.initializers.normal(stddev=cfg.initializer_range),
                     name="dense")(x)
        return layers.layer_norm(cfg, "norm", use_bias=False)(nn.gelu(x, approximate=False))


def _prediction_head_first(cfg: EncoderConfig) -> bool:
    """Whether the family's task models put its prediction head before the task layer."""
    return network.family(cfg).task_heads_use_prediction_head


class ClassificationHead(nn.Module):
    """Logits [B, num_outputs] from the ``<s>`` (``[CLS]``) state."""

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(self, hidden, deterministic: bool):
        cfg = self.config
        drop = nn.Dropout(cfg.dropout_rate)
        if _prediction_head_first(cfg):
            x = drop(PredictionHead(cfg, name="head")(hidden[:, 0]), deterministic=deterministic)
            return _dense(cfg, self.num_outputs, "classifier")(x)
        x = drop(hidden[:, 0], deterministic=deterministic)
        x = jnp.tanh(_dense(cfg, cfg.hidden_size, "dense")(x))
        x = drop(x, deterministic=deterministic)
        return _dense(cfg, self.num_outputs, "out_proj")(x)

    @staticmethod
    def loss(outputs, batch, pad_id: int):
        """Mean cross-entropy of the labels."""
        return optax.softmax_cross_entropy_with_integer_labels(outputs, batch["labels"]).mean()


class QAHead(nn.Module):
    """(start, end) logits [B, L] per token."""

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(self, hidden, deterministic: bool):
        if _prediction_head_first(self.config):
            hidden = nn.Dropout(self.config.dropout_rate)(
                PredictionHead(self.config, name="head")(hidden), deterministic=deterministic)
        out = _dense(self.config, 2, "qa_outputs")(hidden)
        return out[..., 0], out[..., 1]

    @staticmethod
    def loss(outputs, batch, pad_id: int):
        """Mean of the start and end cross-entropies; padding is never a position."""
        start, end = outputs
        valid = batch["input_ids"] != pad_id
        start = jnp.where(valid, start, -1e9)
        end = jnp.where(valid, end, -1e9)
        ce = optax.softmax_cross_entropy_with_integer_labels
        return 0.5 * (ce(start, batch["start_positions"]) + ce(end, batch["end_positions"])).mean()


class TaggingHead(nn.Module):
    """Tag logits [B, L, num_outputs] per token."""

    config: EncoderConfig
    num_outputs: int

    @nn.compact
    def __call__(self, hidden, deterministic: bool):
        if _prediction_head_first(self.config):
            hidden = PredictionHead(self.config, name="head")(hidden)
        x = nn.Dropout(self.config.dropout_rate)(hidden, deterministic=deterministic)
        return _dense(self.config, self.num_outputs, "classifier")(x)

    @staticmethod
    def loss(outputs, batch, pad_id: int):
        """Cross-entropy averaged over the labelled tokens (label >= 0)."""
        labels = batch["labels"]
        valid = (labels >= 0).astype(jnp.float32)
        ce = optax.softmax_cross_entropy_with_integer_labels(outputs, jnp.maximum(labels, 0))
        return (ce * valid).sum() / jnp.maximum(valid.sum(), 1.0)


# Head kind (a task's `head`) -> its module.
HEADS = {"classification": ClassificationHead, "qa": QAHead, "tagging": TaggingHead}


class FineTuneModel(nn.Module):
    """Encoder + the head ``HEADS[kind]``.

    Returns float32 logits: [B, num_labels] (classification), a pair of [B, L] start /
    end logits (qa), or [B, L, num_labels] (tagging).
    """

    config: EncoderConfig
    kind: str
    num_labels: int = 2

    def setup(self):
        if self.kind not in HEADS:
            raise ValueError(f"unknown head kind {self.kind!r}; expected one of {sorted(HEADS)}")
        self.encoder = network.encoder(self.config, name="encoder")
        self.head = HEADS[self.kind](self.config, self.num_labels, name="head")

    def __call__(self, input_ids, deterministic: bool = True):
        hidden = self.encoder(input_ids, deterministic=deterministic)
        return jax.tree.map(lambda x: x.astype(jnp.float32), self.head(hidden, deterministic))


def head_loss(model: FineTuneModel, outputs, batch):
    """The training loss of ``model``'s head on its ``outputs`` for ``batch``."""
    return HEADS[model.kind].loss(outputs, batch, model.config.pad_token_id)
