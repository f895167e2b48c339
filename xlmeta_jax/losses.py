"""Masked-LM loss and metrics (the "model" layer in t5x's split).

Batches are dicts of arrays produced by the data pipeline (``xlmeta_jax.data``) or
by :func:`synthetic_mlm_batch`:

* ``inputs``        [batch, length] int32 — token ids after masking;
* ``mlm_positions`` [batch, slots]  int32 — positions selected for prediction;
* ``mlm_targets``   [batch, slots]  int32 — the original tokens at those positions;
* ``mlm_weights``   [batch, slots]  float32 — 1 for used slots, 0 for unused ones.

Optional full-length views (``targets``, ``weights``) exist for the reference
computation and for seqio's feature converters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MLM_FEATURES = ("inputs", "mlm_positions", "mlm_targets", "mlm_weights")
# What the full-vocabulary head (every position; benchmarks, references) reads.
FULL_HEAD_FEATURES = ("inputs", "targets", "weights")


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
    if full_head:
        positions, targets, weights = None, batch["targets"], batch["weights"]
    else:
        positions = batch["mlm_positions"]
        targets, weights = batch["mlm_targets"], batch["mlm_weights"]
    logits = module.apply(
        {"params": params},
        batch["inputs"],
        mlm_positions=positions,
        deterministic=deterministic,
        rngs=rngs,
    )
    loss_sum, weight_sum, correct_sum = weighted_cross_entropy(logits, targets, weights)
    denom = jnp.maximum(weight_sum, 1.0)
    loss = loss_sum / denom
    metrics = {
        "loss": loss,
        "accuracy": correct_sum / denom,
        "num_predictions": weight_sum,
    }
    return loss, metrics


def mlm_flops_per_token(cfg, length: int, slots: int, *, masked_head: bool = True) -> float:
    """Training FLOPs per input token (forward + backward = 3x forward matmuls).

    Counts matmuls only: QKV/out projections, attention scores and context, MLP,
    and the LM head (dense + vocabulary projection) applied at ``slots`` of every
    ``length`` positions when ``masked_head`` (else at every position).
    """
    h, f, v, n = cfg.hidden_size, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
    per_layer = 2 * (4 * h * h + 2 * h * f) + 2 * (2 * length * h)
    head_frac = slots / length if masked_head else 1.0
    head = 2 * (h * h + h * v) * head_frac
    return 3.0 * (n * per_layer + head)


def dropout_mask_elements_per_token(cfg, length: int, *, attention_dropout: bool = True) -> float:
    """Dropout-mask elements one training step draws per input token.

    The embeddings' and every layer's two hidden-state dropouts draw ``hidden_size``
    elements per token; attention dropout draws ``num_heads * length`` per token and
    layer (one per attention probability). Each element costs one PRNG draw at
    ``dropout_mask_bits=32``, half or a quarter of one at 16 or 8 bits.
    """
    h, n = cfg.hidden_size, cfg.num_layers
    hidden = h * (1 + 2 * n) if cfg.dropout_rate > 0 else 0
    attn = n * cfg.num_heads * length if attention_dropout and cfg.attention_dropout_rate > 0 else 0
    return float(hidden + attn)


def synthetic_mlm_batch(
    rng: np.random.Generator,
    batch_size: int,
    length: int,
    vocab_size: int,
    *,
    slots: int | None = None,
    mask_id: int = 4,
    num_special: int = 5,
    pad_id: int = 0,
    bos_id: int = 3,
) -> dict[str, np.ndarray]:
    """A random, well-formed MLM batch (for benchmarks and tests without data).

    Tokens are drawn from the non-special range; each row starts with ``bos_id``;
    ~15% of positions (never position 0) are selected, filled left-to-right into
    ``slots`` prediction slots (unused slots weighted 0).
    """
    if slots is None:
        slots = max_predictions_for_length(length)
    targets = rng.integers(num_special, vocab_size, size=(batch_size, length), dtype=np.int32)
    targets[:, 0] = bos_id
    inputs = targets.copy()
    positions = np.zeros((batch_size, slots), np.int32)
    mlm_targets = np.full((batch_size, slots), pad_id, np.int32)
    mlm_weights = np.zeros((batch_size, slots), np.float32)
    weights = np.zeros((batch_size, length), np.float32)
    n_select = min(slots, int(round(0.15 * (length - 1))))
    for b in range(batch_size):
        sel = np.sort(rng.choice(np.arange(1, length), size=n_select, replace=False))
        positions[b, :n_select] = sel
        mlm_targets[b, :n_select] = targets[b, sel]
        mlm_weights[b, :n_select] = 1.0
        weights[b, sel] = 1.0
        inputs[b, sel] = mask_id
    return {
        "inputs": inputs,
        "targets": targets,
        "weights": weights,
        "mlm_positions": positions,
        "mlm_targets": mlm_targets,
        "mlm_weights": mlm_weights,
    }


def max_predictions_for_length(length: int, mask_rate: float = 0.15) -> int:
    """Number of prediction slots for a block of ``length`` tokens.

    The data pipeline selects ``floor(mask_rate * n + u)`` positions, u ~ U[0, 1),
    among at most ``length - 1`` candidates, so this many slots always suffice.
    """
    return int(np.ceil(mask_rate * length)) + 1
