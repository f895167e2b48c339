"""Work per training step: model FLOPs and dropout PRNG draws, per input token.

For the benchmark's TFLOP/s and MFU, and the trainer's MFU log line. Counts follow
from the model configuration and the batch shape only (no TensorFlow, no tracing).
"""

from __future__ import annotations


def mlm_flops_per_token(cfg, length: int, slots: int, *, masked_head: bool = True) -> float:
    """Training FLOPs per input token (forward + backward = 3x forward matmuls).

    Counts matmuls only: QKV/out projections, attention scores and context, MLP (GeGLU:
    three matrices), and the LM head (dense + vocabulary projection) applied at ``slots`` of every
    ``length`` positions when ``masked_head`` (else at every position). ``slots``
    is the batch's prediction slots (``batch["mlm_positions"].shape[1]``, i.e.
    ``mlm.max_predictions(length, masking rate)``).
    """
    h, f, v, n = cfg.hidden_size, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
    modernbert = getattr(cfg, "family", "xlmr") == "modernbert"
    # ModernBERT's GeGLU has two input projections (Wi is 2 x mlp_dim wide).
    mlp_matrices = 3 if modernbert else 2
    # Keys a query attends to: the row, or on ModernBERT's local layers the window's
    # local_window + 1 (the model's work: the splash kernel skips tiles outside it, XLA's
    # dense path computes the whole row and masks it).
    keys = [length if not modernbert or cfg.is_global_layer(i)
            else min(length, cfg.local_window + 1) for i in range(n)]
    dense = 2 * (4 * h * h + mlp_matrices * h * f)
    layers = sum(dense + 2 * (2 * k * h) for k in keys)
    head_frac = slots / length if masked_head else 1.0
    head = 2 * (h * h + h * v) * head_frac
    return 3.0 * (layers + head)


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
