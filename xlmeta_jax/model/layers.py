"""Parts both encoder families build on: logically partitioned parameters, dense and
norm layers, dropout with fewer random bits, and the attention kernel setting.

Every parameter carries t5x logical axis names (``xlmeta_jax.model.partitioning`` maps
them to mesh axes); the families (``xlmr``, ``modernbert``) name their own.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlmeta_jax.model.config import EncoderConfig

Array = jax.Array


def dense_init(cfg: EncoderConfig):
    """The normal initializer of ``cfg.initializer_range``."""
    return nn.initializers.normal(stddev=cfg.initializer_range)


class _LogicallyPartitioned(nn.LogicallyPartitioned):
    """Logical axis names of a parameter, constrained only at their full rank.

    Flax's DenseGeneral initialises a multi-axis kernel (e.g. embed x heads x kv)
    flat and unboxes it before reshaping; under a mesh, the flat value would be
    constrained with more names than it has dimensions, which fails.
    """

    def unbox(self, apply_constraint=True):
        full_rank = jnp.ndim(self.value) == len(self.names)
        return super().unbox(apply_constraint=apply_constraint and full_rank)


def param(init, names):
    """``init`` whose value carries the logical axis ``names``."""

    def boxed_init(*args, **kwargs):
        return _LogicallyPartitioned(init(*args, **kwargs), names)

    return boxed_init


class Dropout(nn.Dropout):
    """``nn.Dropout`` that can draw fewer random bits per mask element.

    With ``mask_bits=32`` it is ``nn.Dropout`` (same masks for the same key; the
    class keeps that name so auto-named modules and their RNG streams are
    unchanged). With 16 or 8 one 32-bit draw is split into 2 or 4 mask
    elements along the last axis (which activations never shard).
    """

    mask_bits: int = 32

    @nn.compact
    def __call__(self, inputs, deterministic: bool | None = None, rng=None):
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        per_word = 32 // self.mask_bits
        if (deterministic or self.rate == 0.0 or per_word == 1 or self.broadcast_dims
                or inputs.shape[-1] % per_word or self.rate == 1.0):
            return super().__call__(inputs, deterministic=deterministic, rng=rng)
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        levels = 2 ** self.mask_bits
        threshold = round((1.0 - self.rate) * levels)
        if threshold <= 0:
            return jnp.zeros_like(inputs)
        if threshold >= levels:
            return inputs
        words = jax.random.bits(rng, inputs.shape[:-1] + (inputs.shape[-1] // per_word,),
                                jnp.uint32)
        small = jax.lax.bitcast_convert_type(words, jnp.dtype(f"uint{self.mask_bits}"))
        keep = small.reshape(inputs.shape) < threshold
        keep_prob = threshold / levels
        return jax.lax.select(keep, inputs / jnp.asarray(keep_prob, inputs.dtype),
                              jnp.zeros_like(inputs))


def dropout(cfg: EncoderConfig, rate: float, **kwargs) -> Dropout:
    """:class:`Dropout` with the config's mask bits."""
    return Dropout(rate, mask_bits=cfg.dropout_mask_bits, **kwargs)


def layer_norm(cfg: EncoderConfig, name: str, use_bias: bool = True) -> nn.LayerNorm:
    """LayerNorm over ``embed`` in the compute dtype (ModernBERT's has no bias)."""
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        use_bias=use_bias,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        scale_init=param(nn.initializers.ones, ("embed",)),
        bias_init=param(nn.initializers.zeros, ("embed",)),
        name=name,
    )


def dense_general(cfg, features, axis, kernel_names, bias_names, name, use_bias=True):
    """DenseGeneral in the config's dtypes, its kernel and bias logically named."""
    return nn.DenseGeneral(
        features=features,
        axis=axis,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=param(dense_init(cfg), kernel_names),
        bias_init=param(nn.initializers.zeros, bias_names),
        use_bias=use_bias,
        name=name,
    )


def resolve_attention_impl(impl: str, dtype: str, backend: str | None = None) -> str:
    """The kernel ``attention_impl`` stands for: "auto" is cuDNN only on a GPU and in a
    16-bit dtype (JAX's cuDNN attention rejects fp32), XLA otherwise."""
    if impl == "auto":
        backend = backend or jax.default_backend()
        sixteen_bit = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
        return "cudnn" if backend == "gpu" and sixteen_bit else "xla"
    return impl


