"""The encoder's configuration: every field of both families, and the named sizes.

:class:`EncoderConfig` holds what the network (:mod:`xlmeta_jax.model.network`) reads;
its ``family`` picks the architecture (``xlmr``: XLM-R / RoBERTa; ``modernbert``:
ModernBERT / mmBERT). :func:`get_config` is the one way the gin files name a model (a
size, which fixes the family, plus field overrides). Both are importable from
``network`` too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from xlmeta_jax import errors

DType = Any

REMAT_POLICIES = {
    # Recompute everything in the backward pass (least memory).
    "full": None,
    # Keep matmul outputs without batch dims (weights-stationary); recompute the rest.
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    # Save all activations named by `checkpoint_name` in this file.
    "save_named": jax.checkpoint_policies.save_only_these_names(
        "attn_out", "mlp_out", "qkv"
    ),
}


# The encoder families (xlmeta_jax.model.network.masked_lm builds either).
FAMILIES = ("xlmr", "modernbert")

# Random bits per dropout-mask element that ``Dropout`` supports.
DROPOUT_MASK_BITS = (8, 16, 32)


# Where gin files bind the encoder's fields (gin/models/*.gin): a bad value is named by
# that binding, or by the macro it comes from (MODEL_SIZE).
_CONFIGURABLE = "xlmeta_jax.model.network.get_config"


class ModelConfigError(errors.SettingError):
    """A model setting is out of range or unknown (one line naming it)."""

    def __init__(self, field: str, value, message: str):
        super().__init__(_CONFIGURABLE, field, value, message)
        # Outside a command that knows the binding: named as the config's own field.
        self.setting = f"EncoderConfig.{field}"


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Sizes and numerics of the encoder. Use :func:`get_config` for named sizes."""

    # Architecture: "xlmr" (post-LN, learned positions; HF XLMRobertaForMaskedLM) or
    # "modernbert" (pre-LN, bias-free, RoPE, GeGLU, local/global attention; HF
    # ModernBertForMaskedLM).
    family: str = "xlmr"
    # Vocabulary size, including special tokens (XLM-R: 250002).
    vocab_size: int = 250002
    # Width of the residual stream ("embed" axis).
    hidden_size: int = 768
    # Number of Transformer layers.
    num_layers: int = 12
    # Number of attention heads; hidden_size must be divisible by it.
    num_heads: int = 12
    # Width of the feed-forward layer ("mlp" axis).
    mlp_dim: int = 3072
    # xlmr: rows of the learned position table. RoBERTa reserves pad_token_id + 1
    # rows, so 514 rows allow sequences of 512 tokens when pad_token_id == 1.
    # modernbert: the longest sequence (RoPE has no table; HF's config field).
    max_position_embeddings: int = 514
    # Rows of the token-type table (XLM-R has exactly one type).
    type_vocab_size: int = 1
    # Token id that marks padding; also the RoBERTa position offset. XLM-R's
    # fairseq vocabulary uses 1; our SentencePiece vocabulary (seqio ids) uses 0.
    pad_token_id: int = 1
    # Epsilon of every LayerNorm (RoBERTa: 1e-5).
    layer_norm_eps: float = 1e-5
    # Dropout on embeddings, attention output and MLP output.
    dropout_rate: float = 0.1
    # Dropout on the attention probabilities.
    attention_dropout_rate: float = 0.1
    # Random bits drawn per dropout-mask element: 32 (flax's nn.Dropout, bit for
    # bit), 16 or 8. Fewer bits cut the PRNG work 2x / 4x (one 32-bit draw serves
    # 2 / 4 elements); the keep probability is then rounded to a multiple of
    # 2**-bits (XLM-R's 0.9: 0.9000 at 16 bits, 230/256 = 0.8984 at 8) and the
    # kept values are scaled by its inverse, so the expectation stays exact.
    dropout_mask_bits: int = 32
    # Standard deviation of the normal initializer (RoBERTa: 0.02).
    initializer_range: float = 0.02
    # Dtype in which activations and matmuls are computed (bf16 for training).
    dtype: str = "float32"
    # Dtype in which parameters are stored (fp32 master weights).
    param_dtype: str = "float32"
    # Stack the layers with nn.scan (one compiled layer body, faster compiles).
    scan_layers: bool = False
    # Rematerialisation policy for each layer: "none", "full", "dots",
    # "dots_no_batch" or "save_named".
    remat_policy: str = "none"
    # Attention kernel: "xla" (portable einsum + softmax), "cudnn" (flash attention
    # through jax.nn.dot_product_attention on NVIDIA GPUs, bf16/fp16 only), "splash"
    # (Pallas' sparse flash attention on TPU: segments and the local window skip whole
    # tiles) or "auto" (cudnn on a GPU in bf16/fp16, splash on a TPU, xla otherwise: fp32
    # evaluation of a checkpoint trained with "auto" on a GPU stays on XLA). Attention
    # dropout, when on, runs on XLA's path whatever the kernel.
    attention_impl: str = "xla"
    # modernbert: every n-th layer (0, n, 2n, ...) attends globally, the others within
    # a local window (HF: global_attn_every_n_layers, 3).
    global_attn_every_n_layers: int = 3
    # modernbert: the local window in tokens, both sides together (HF: local_attention,
    # 128): a token attends to those at most local_window // 2 away. Even.
    local_window: int = 128
    # modernbert: RoPE base of the global and of the local layers (HF rope_parameters
    # full_attention / sliding_attention rope_theta).
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0

    def __post_init__(self):
        def refuse(field, message):
            raise ModelConfigError(field, getattr(self, field), message)

        if self.family not in FAMILIES:
            refuse("family", f"unknown family {self.family!r}; expected one of "
                   f"{list(FAMILIES)}")
        if self.family == "modernbert":
            if self.local_window <= 0 or self.local_window % 2:
                refuse("local_window", f"must be even and > 0 (a token sees local_window // 2 "
                       f"tokens on each side), got {self.local_window}")
            if self.global_attn_every_n_layers < 1:
                refuse("global_attn_every_n_layers",
                       f"must be >= 1, got {self.global_attn_every_n_layers}")
            if self.head_dim % 2:
                refuse("num_heads", f"head_dim = hidden_size / num_heads = {self.hidden_size} / "
                       f"{self.num_heads} = {self.head_dim} must be even for rotary positions")
        if self.hidden_size % self.num_heads:
            refuse("num_heads", f"hidden_size={self.hidden_size} is not divisible by "
                   f"num_heads={self.num_heads}")
        if self.remat_policy not in ("none", *REMAT_POLICIES):
            refuse("remat_policy", f"unknown remat_policy {self.remat_policy!r}; expected one "
                   f"of {['none', *REMAT_POLICIES]}")
        for field in ("dropout_rate", "attention_dropout_rate"):
            rate = getattr(self, field)
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1:
                refuse(field, f"must be a probability in [0, 1), got {rate!r}")
        for field in ("global_rope_theta", "local_rope_theta"):
            base = getattr(self, field)
            if isinstance(base, bool) or not isinstance(base, int | float) or not base > 1:
                refuse(field, f"must be a RoPE base > 1 (mmBERT: 160000 global, 10000 local), "
                       f"got {base!r}")
        if self.dropout_mask_bits not in DROPOUT_MASK_BITS:
            refuse("dropout_mask_bits", f"must be 8, 16 or 32, got {self.dropout_mask_bits}")
        if self.attention_impl not in ("xla", "cudnn", "splash", "auto"):
            refuse("attention_impl", f"unknown attention_impl {self.attention_impl!r}; "
                   "expected 'xla', 'cudnn', 'splash' or 'auto'")
        for field in ("dtype", "param_dtype"):
            try:
                jnp.dtype(getattr(self, field))
            except TypeError:
                refuse(field, f"not a dtype: {getattr(self, field)!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_length(self) -> int:
        """Longest sequence the model supports (xlmr: its position table)."""
        if self.family == "modernbert":
            return self.max_position_embeddings
        return self.max_position_embeddings - self.pad_token_id - 1

    def is_global_layer(self, index: int) -> bool:
        """modernbert: whether layer ``index`` attends globally (HF's layer_types)."""
        return index % self.global_attn_every_n_layers == 0

    def replace(self, **kwargs) -> EncoderConfig:
        return dataclasses.replace(self, **kwargs)


# Named sizes: the one table of model shapes (gin/models/*.gin name a size and read it
# through get_config). `tiny` and `modernbert_tiny` are for tests and the CPU demos
# (divisible by 8 everywhere it matters, so tests can shard them on 8 devices); base and
# large are XLM-R's published shapes, mmbert_small and mmbert_base mmBERT's
# (JHU-CLSP/mmBERT configs/*.yaml: 22 layers, GeGLU 1152, Gemma's 256k vocabulary;
# the published checkpoints' RoPE bases, 160k global and 10k local, at 8192 tokens).
# ModernBERT's sizes train without dropout (HF ModernBertConfig's defaults).
_SIZE_FIELDS = ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
                "max_position_embeddings")
_MODERNBERT = {"dropout_rate": 0.0, "attention_dropout_rate": 0.0}
_SIZES = {
    "tiny": ("xlmr", 1024, 64, 2, 8, 128, 130),
    "small": ("xlmr", 32000, 256, 4, 4, 1024, 514),
    "base": ("xlmr", 250002, 768, 12, 12, 3072, 514),
    "large": ("xlmr", 250002, 1024, 24, 16, 4096, 514),
    "modernbert_tiny": ("modernbert", 1024, 64, 4, 4, 96, 8192),
    "mmbert_small": ("modernbert", 256000, 384, 22, 6, 1152, 8192),
    "mmbert_base": ("modernbert", 256000, 768, 22, 12, 1152, 8192),
}
# Fields a family's sizes set unless overridden.
_FAMILY_DEFAULTS = {"xlmr": {}, "modernbert": _MODERNBERT}

SIZES = tuple(_SIZES)


def get_config(size: str, **overrides) -> EncoderConfig:
    """Returns the named encoder size with any :class:`EncoderConfig` fields overridden.

    Args:
      size: one of :data:`SIZES` (XLM-R: tiny, small, base, large; ModernBERT:
        modernbert_tiny, mmbert_small, mmbert_base).
      **overrides: EncoderConfig fields, e.g. ``dtype="bfloat16"``.

    Raises:
      ModelConfigError: naming an unknown size or field.
    """
    if size not in _SIZES:
        raise ModelConfigError("size", size,
                               f"unknown model size {size!r}; expected one of {list(_SIZES)}")
    fields = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ModelConfigError(unknown[0], overrides[unknown[0]],
                               f"not an EncoderConfig field ({sorted(fields)})")
    shape = dict(zip(_SIZE_FIELDS, _SIZES[size]))
    return EncoderConfig(**{**_FAMILY_DEFAULTS[shape["family"]], **shape, **overrides})
