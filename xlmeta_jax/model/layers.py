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


# Splash's tiles along the sequence (at most; a shorter row is one tile). The kernel
# needs rows of a multiple of 128 tokens (pretrain/checks.py refuses other lengths).
SPLASH_BLOCK = 512
SPLASH_ALIGN = 128


def resolve_attention_impl(impl: str, dtype: str, backend: str | None = None,
                           length: int | None = None) -> str:
    """The kernel ``attention_impl`` stands for: "auto" is cuDNN on a GPU in a 16-bit
    dtype (JAX's cuDNN attention rejects fp32), splash on a TPU, XLA otherwise.

    Splash takes rows of a multiple of 128 tokens only: other rows (``length``; None:
    any) run on XLA, such as the 8-token row parameters are initialised with. A training
    run that names 'splash' for such rows is refused (``pretrain/checks.py``).
    """
    if impl == "auto":
        backend = backend or jax.default_backend()
        sixteen_bit = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
        if backend == "tpu":
            impl = "splash"
        else:
            impl = "cudnn" if backend == "gpu" and sixteen_bit else "xla"
    if impl == "splash" and length is not None and length % SPLASH_ALIGN:
        return "xla"
    return impl


def splash_attention(q: Array, k: Array, v: Array, segment_ids: Array,
                     local_window: int | None = None) -> Array:
    """Pallas' splash attention (TPU), the scores' mask never materialised.

    Args:
      q, k, v: [batch, length, heads, head_dim]; ``q`` already scaled.
      segment_ids: [batch, length] int: a token attends to keys of its own id only
        (padding, id 0, attends to padding: its output is never read).
      local_window: attend only within ``local_window // 2`` tokens either side (HF
        ModernBERT's sliding window); None: the whole row.

    Returns:
      The attention output, [batch, length, heads, head_dim], in ``v``'s dtype.

    Under a mesh the kernel runs per shard (``shard_map``: batch over the data axes,
    heads over ``tensor``, as the logical rules say). Lowered for another platform than
    TPU it runs in Pallas' interpret mode (tests compare it with the XLA path on CPU).
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash  # Pallas: on use

    def kernel(q, k, v, segment_ids, interpret=False):
        heads, length = q.shape[1], q.shape[2]
        shape = (length, length)
        if local_window is None:
            mask = splash.FullMask(shape)
        else:
            half = local_window // 2
            mask = splash.LocalMask(shape, window_size=(half, half), offset=0)
        block = min(SPLASH_BLOCK, length)
        sizes = splash.BlockSizes(
            block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
            block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
        fn = splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), head_shards=1,
                                    q_seq_shards=1, block_sizes=sizes, interpret=interpret)
        segments = splash.SegmentIds(q=segment_ids, kv=segment_ids)
        return jax.vmap(fn)(q, k, v, segment_ids=segments)

    def per_platform(*args):
        # Mosaic's kernel where the program is lowered for a TPU (also ahead of time from a
        # CPU host); elsewhere the same kernel interpreted.
        return jax.lax.platform_dependent(
            *args, tpu=kernel, default=lambda *a: kernel(*a, interpret=True))

    # The kernel's layout: [batch, heads, length, head_dim].
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    segment_ids = segment_ids.astype(jnp.int32)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = per_platform(q, k, v, segment_ids)
    else:
        spec = nn.logical_to_mesh_axes(("batch", "heads", "length", "kv"))
        rows = nn.logical_to_mesh_axes(("batch", "length"))
        out = jax.shard_map(per_platform, mesh=mesh, in_specs=(spec, spec, spec, rows),
                            out_specs=spec, check_vma=False)(q, k, v, segment_ids)
    return jnp.swapaxes(out, 1, 2).astype(v.dtype)


