"""Fine-tuning heads on :class:`xlmeta_jax.model.network.Encoder`.

Parameters are ``{"encoder": <the pretrained encoder's params>, "head": {...}}``, so a
pretraining checkpoint (``{"encoder", "lm_head"}``) or a converted Hugging Face model
loads by replacing ``"encoder"``.

:class:`FineTuneModel` is the encoder plus a :class:`TaskHead` of one kind:

* ``"classification"`` — RoBERTa's classification head on the ``<s>`` state: dropout,
  dense + tanh, dropout, projection to the labels;
* ``"qa"`` — one dense layer giving start and end logits per token;
* ``"tagging"`` — dropout and a dense layer giving tag logits per token (the training
  loss and the decoding use each word's first sub-token only).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from xlmeta_jax.model.network import Encoder, EncoderConfig


def _dense(cfg: EncoderConfig, features: int, name: str) -> nn.Dense:
    return nn.Dense(
        features,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=nn.initializers.normal(stddev=cfg.initializer_range),
        name=name,
    )


class TaskHead(nn.Module):
    """The task-specific layers on top of the encoder's hidden states."""

    config: EncoderConfig
    kind: str
    num_outputs: int

    @nn.compact
    def __call__(self, hidden, deterministic: bool):
        cfg = self.config
        drop = nn.Dropout(cfg.dropout_rate)
        if self.kind == "classification":
            x = drop(hidden[:, 0], deterministic=deterministic)
            x = jnp.tanh(_dense(cfg, cfg.hidden_size, "dense")(x))
            x = drop(x, deterministic=deterministic)
            return _dense(cfg, self.num_outputs, "out_proj")(x)
        if self.kind == "qa":
            return _dense(cfg, 2, "qa_outputs")(hidden)
        x = drop(hidden, deterministic=deterministic)
        return _dense(cfg, self.num_outputs, "classifier")(x)


class FineTuneModel(nn.Module):
    """Encoder + a task head. ``kind``: "classification", "qa" or "tagging".

    Returns float32 logits: [B, num_labels] (classification), a pair of [B, L] start /
    end logits (qa), or [B, L, num_labels] (tagging).
    """

    config: EncoderConfig
    kind: str
    num_labels: int = 2

    def setup(self):
        if self.kind not in ("classification", "qa", "tagging"):
            raise ValueError(f"unknown head kind {self.kind!r}")
        self.encoder = Encoder(self.config, name="encoder")
        self.head = TaskHead(self.config, self.kind, self.num_labels, name="head")

    def __call__(self, input_ids, deterministic: bool = True):
        hidden = self.encoder(input_ids, deterministic=deterministic)
        out = self.head(hidden, deterministic).astype(jnp.float32)
        if self.kind == "qa":
            return out[..., 0], out[..., 1]
        return out

