"""Sentence embeddings' model: pooling and the contrastive loss over in-batch negatives.

The loss is sentence-transformers' ``MultipleNegativesRankingLoss`` (InfoNCE): every
query's positive competes with every other document of the batch, the hard negatives
included, on cosine similarity times ``scale`` (20, its default). The documents are laid
out as that loss lays them out: the positives, then each column of hard negatives, so
that the scores of a batch of B queries are ``[B, B * (1 + negatives)]`` with the
positive of row ``i`` at column ``i``. ``symmetric`` adds the documents' direction
(``directions=("query_to_doc", "doc_to_query")``, ``partition_mode="per_direction"``:
the two log-partition terms are averaged), and ``margin`` is LaBSE's additive margin
(Yang et al., 2019): the positive's cosine is lowered by it before scaling, in both
directions. With the margin 0 the values equal sentence-transformers' to rounding
(tests/test_contrastive.py).

Under a mesh the embeddings of a step are one global array: the similarity matrix of
the step's jitted function spans every device and host of the batch, so a row's
negatives are the whole global batch with no explicit gather.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

POOLINGS = ("mean", "cls")

# torch.nn.functional.normalize's eps (sentence-transformers' cos_sim and Normalize).
NORMALIZE_EPS = 1e-12


def pool(hidden: jax.Array, input_ids: jax.Array, pad_id: int, pooling: str) -> jax.Array:
    """One float32 vector per row: the mean over the row's tokens, or its first token.

    As sentence-transformers' ``Pooling`` (``pooling_mode_mean_tokens``: the sum over
    the tokens that are not padding, divided by their count, at least 1e-9;
    ``pooling_mode_cls_token``: the first position).

    Args:
      hidden: the encoder's final hidden states, ``[B, L, H]``.
      input_ids: ``[B, L]`` ids; ``pad_id`` marks padding.
      pad_id: the vocabulary's padding id.
      pooling: one of :data:`POOLINGS`.
    """
    hidden = hidden.astype(jnp.float32)
    if pooling == "cls":
        return hidden[:, 0]
    mask = (input_ids != pad_id).astype(jnp.float32)[..., None]
    return (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)


def normalize(x: jax.Array) -> jax.Array:
    """Rows divided by their L2 norm (``torch.nn.functional.normalize``)."""
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, NORMALIZE_EPS)


def _cosines(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.matmul(normalize(a), normalize(b).T, precision=jax.lax.Precision.HIGHEST)


def ranking_loss(queries: jax.Array, documents: jax.Array, *, scale: float = 20.0,
                 symmetric: bool = False, margin: float = 0.0) -> jax.Array:
    """InfoNCE over in-batch negatives (sentence-transformers' layout, see module doc).

    Args:
      queries: ``[B, H]`` embeddings.
      documents: ``[B * (1 + n), H]``: the B positives, then n columns of B hard
        negatives (row ``i`` of each column belongs to query ``i``).
      scale: the cosines' multiplier (1 / temperature).
      symmetric: also rank the queries for each positive (averaged log-partitions).
      margin: LaBSE's additive margin, subtracted from the positive pairs' cosines.

    Returns:
      The mean loss over the queries, a float32 scalar.
    """
    b = queries.shape[0]
    positive = jnp.eye(b, documents.shape[0], dtype=jnp.float32)
    logits = scale * (_cosines(queries, documents) - margin * positive)
    positives = jnp.diagonal(logits[:, :b])
    log_z = jax.nn.logsumexp(logits, axis=1)
    if symmetric:
        back = scale * (_cosines(documents[:b], queries) - margin * positive[:, :b])
        log_z = (log_z + jax.nn.logsumexp(back, axis=1)) / 2
    return -jnp.mean(positives - log_z)
