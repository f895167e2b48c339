"""Masked-LM loss and metrics (the "model" layer in t5x's split).

Batches are dicts of [batch, ...] arrays in the format of :mod:`xlmeta_jax.model.mlm`,
from the data pipeline or its synthetic stream (:mod:`xlmeta_jax.data.feeding`); the
loss reads ``mlm.STEP_FEATURES`` (``inputs`` and the gathered ``mlm_*`` slots), or
``mlm.FULL_HEAD_FEATURES`` with the full-vocabulary head, and ``mlm.PACKED_FEATURES``
where the batch holds them (rows packed from whole documents).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xlmeta_jax.model import mlm


def weighted_cross_entropy(logits, targets, weights):
    """Sums of token cross-entropy, weights and correct predictions (fp32).

    Args:
      logits: [..., vocab] logits in any float dtype.
      targets: [...] int targets.
      weights: [...] float weights (0 drops a position).

    Returns:
      (loss_sum, weight_sum, correct_sum) as float32 scalars.
    """
    logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), -1)[..., 0]
    nll = logz - target_logit
    weights = weights.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return (nll * weights).sum(), weights.sum(), (correct * weights).sum()


def mlm_loss_and_metrics(module, params, batch, *, rngs=None, deterministic=True,
                         full_head=False):
    """Applies the MLM network at the gathered positions; returns (loss, metrics).

    The LM head (dense, LayerNorm, vocabulary projection) runs only at the
    ``mlm_positions`` slots, so its cost scales with the slots, not the length.

    Args:
      module: an ``XLMRForMaskedLM``.
      params: its parameters (without the ``{'params': ...}`` wrapper).
      batch: a dict with ``inputs``, ``mlm_positions``, ``mlm_targets`` and ``mlm_weights``.
      rngs: PRNG keys for ``apply`` (``{'dropout': key}`` when not deterministic).
      deterministic: disables dropout.
      full_head: apply the LM head at every position instead (reads ``inputs``,
        ``targets`` and ``weights``); for measuring what the gathered head saves.

    Returns:
      ``(loss, metrics)``: the mean cross-entropy over slots of weight 1 (0 when there
      are none), and ``loss``, ``accuracy`` and ``num_predictions`` (float32 scalars).
    """
    loss_sum, weight_sum, correct_sum = mlm_sums(
        module, params, batch, rngs=rngs, deterministic=deterministic, full_head=full_head
    )
    return loss_from_sums(loss_sum, weight_sum, correct_sum)


def mlm_sums(module, params, batch, *, rngs=None, deterministic=True, full_head=False):
    """The MLM network's summed cross-entropy, prediction count and correct count.

    Sums, not means, so that parts of a batch (microbatches) add up to the whole:
    :func:`loss_from_sums` of the added sums is the loss of the whole batch.
    Arguments as :func:`mlm_loss_and_metrics`.

    Returns:
      ``(loss_sum, weight_sum, correct_sum)``, float32 scalars.
    """
    if full_head:
        positions, targets, weights = None, batch["targets"], batch["weights"]
    else:
        positions = batch["mlm_positions"]
        targets, weights = batch["mlm_targets"], batch["mlm_weights"]
    # Rows packed from whole documents: each document attends to itself alone.
    packed = {k: batch[k] for k in mlm.PACKED_FEATURES if k in batch}
    logits = module.apply(
        {"params": params},
        batch["inputs"],
        mlm_positions=positions,
        **packed,
        deterministic=deterministic,
        rngs=rngs,
    )
    return weighted_cross_entropy(logits, targets, weights)


def loss_from_sums(loss_sum, weight_sum, correct_sum):
    """``(loss, metrics)`` of :func:`mlm_loss_and_metrics` from :func:`mlm_sums`' sums."""
    denom = jnp.maximum(weight_sum, 1.0)
    loss = loss_sum / denom
    metrics = {
        "loss": loss,
        "accuracy": correct_sum / denom,
        "num_predictions": weight_sum,
    }
    return loss, metrics
