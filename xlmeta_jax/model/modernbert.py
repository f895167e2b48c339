"""The ModernBERT / mmBERT masked-LM encoder as a Flax (linen) network.

The architecture follows Hugging Face's ``ModernBertForMaskedLM`` (transformers 5.24)
exactly, so that its weights convert both ways (``xlmeta_jax.interop.hf``):

* token embeddings without positions, then a bias-free LayerNorm and dropout;
* pre-LN layers, ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``, every Linear and LayerNorm
  without bias; layer 0 has no attention LayerNorm (its input is already normalised);
* rotary positions (HF's non-interleaved halves), base ``global_rope_theta`` on the global
  layers (0, n, 2n, ... for n = ``global_attn_every_n_layers``) and ``local_rope_theta``
  on the others, which attend only to tokens at most ``local_window // 2`` away;
* a GeGLU MLP: ``Wo(gelu(Wi_0 x) * Wi_1 x)`` (HF's ``Wi`` is ``[Wi_0; Wi_1]``);
* a final LayerNorm; the head: dense -> GELU -> LayerNorm -> decoder tied to the token
  embeddings, with bias.

Packed rows: ``segment_ids`` ([batch, length], 0 = padding) give each whole document of a
row its own id. Attention never crosses a segment and rotary positions restart at each
(the logits of a packed document are those of the document alone). Without them a row is
one document followed by padding (``attention_mask``), positions ``0, 1, 2, ...`` as HF.

Parameters and activations carry the XLM-R network's logical axis names (``batch, length,
embed, mlp, heads, kv, vocab``, plus ``layers`` for the scanned stack). With
``scan_layers`` layer 0 stays outside the scan (it has no attention LayerNorm) and layers
1..N-1 are one scan whose per-layer flag selects the global or local mask and RoPE base.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from xlmeta_jax.model import family as family_lib
from xlmeta_jax.model import layers
from xlmeta_jax.model.config import REMAT_POLICIES, EncoderConfig

Array = jax.Array


def _norm(cfg: EncoderConfig, name: str) -> nn.LayerNorm:
    return layers.layer_norm(cfg, name, use_bias=False)


def _dense(cfg, features, axis, kernel_names, name):
    return layers.dense_general(cfg, features, axis, kernel_names, (), name, use_bias=False)


def positions_from_segments(segment_ids: Array) -> Array:
    """Each token's index within its segment (a packed row's documents each start at 0)."""
    index = jnp.arange(segment_ids.shape[-1], dtype=jnp.int32)
    first = jnp.concatenate(
        [jnp.ones_like(segment_ids[..., :1], bool),
         segment_ids[..., 1:] != segment_ids[..., :-1]], axis=-1)
    start = jax.lax.cummax(jnp.where(first, index, 0), axis=segment_ids.ndim - 1)
    return index - start


def rope_tables(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """fp32 ``(cos, sin)`` of shape [batch, length, head_dim], as HF's rotary embedding."""
    # HF computes the inverse frequencies in fp32 from an fp32 arange.
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    freqs = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotates ``x`` ([batch, length, heads, head_dim]) in fp32; returns x's dtype."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


def attention_masks(segment_ids: Array, local_window: int) -> tuple[Array, Array]:
    """``(global, local)`` boolean masks [batch, 1, q, k]: same segment, no padding key;
    the local one also within ``local_window // 2`` tokens (HF: ``|q - k| <= window``)."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    full = same & (segment_ids[:, None, :] != 0)
    index = jnp.arange(segment_ids.shape[-1])
    near = jnp.abs(index[:, None] - index[None, :]) <= local_window // 2
    return full[:, None], (full & near[None])[:, None]


class Attention(nn.Module):
    """Bias-free multi-head self-attention with rotary positions and a boolean mask."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, cos: Array, sin: Array, mask: Array, is_global,
                 deterministic: bool):
        """``mask``: the boolean [batch, 1, q, k] mask, or for splash the segment ids
        [batch, length] (the kernel applies the window of a local layer itself);
        ``is_global``: a Python bool, or the scanned stack's traced per-layer flag."""
        cfg = self.config
        h, d = cfg.num_heads, cfg.head_dim
        proj = functools.partial(_dense, cfg, (h, d), -1, ("embed", "heads", "kv"))
        q, k, v = (nn.with_logical_constraint(proj(name=n)(x), ("batch", "length", "heads", "kv"))
                   for n in ("query", "key", "value"))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (checkpoint_name(t, "qkv") for t in (q, k, v))
        use_dropout = not deterministic and cfg.attention_dropout_rate > 0.0
        impl = layers.resolve_attention_impl(cfg.attention_impl, cfg.dtype, length=x.shape[1])
        if impl == "splash" and not use_dropout:
            def splash(window):
                return lambda q, k, v: layers.splash_attention(q, k, v, mask, window)

            q = q * jnp.asarray(d ** -0.5, q.dtype)
            if isinstance(is_global, bool):
                ctx = splash(None if is_global else cfg.local_window)(q, k, v)
            else:
                # Two static masks, one traced flag: each layer runs one of the kernels.
                ctx = jax.lax.cond(is_global, splash(None), splash(cfg.local_window), q, k, v)
        elif impl == "cudnn" and not use_dropout:
            # cuDNN's sliding window is one-sided (causal) only: the local window, the
            # segments and the padding all reach it as the boolean mask itself.
            ctx = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=d ** -0.5,
                                               implementation="cudnn")
        else:
            # Scores and softmax in fp32 whatever the compute dtype (HF: softmax in fp32).
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * (d ** -0.5)
            scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
            probs = jax.nn.softmax(scores, axis=-1)
            if use_dropout:
                probs = layers.dropout(cfg, cfg.attention_dropout_rate)(
                    probs, deterministic=False)
            ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))
        out = _dense(cfg, cfg.hidden_size, (-2, -1), ("heads", "kv", "embed"), "out")(ctx)
        out = layers.dropout(cfg, cfg.attention_dropout_rate)(out, deterministic=deterministic)
        return checkpoint_name(out, "attn_out")


class EncoderLayer(nn.Module):
    """One pre-LN layer: ``x + Attn(LN(x))`` then ``x + GeGLU(LN(x))``."""

    config: EncoderConfig
    # Layer 0: no attention LayerNorm (HF: nn.Identity).
    first: bool = False
    # When used inside nn.scan: return (carry, per-layer output) pairs.
    scanned: bool = False
    collect_hidden: bool = False

    @nn.compact
    def __call__(self, x, rope_global, rope_local, mask_global, mask_local, is_global,
                 deterministic: bool):
        cfg = self.config

        def pick(a, b):
            # A Python bool outside a scan; a traced per-layer flag inside one.
            if isinstance(is_global, bool):
                return a if is_global else b
            return jnp.where(is_global, a, b)

        cos, sin = (pick(g, loc) for g, loc in zip(rope_global, rope_local))
        mask = pick(mask_global, mask_local)
        h = x if self.first else _norm(cfg, "attn_norm")(x)
        x = x + Attention(cfg, name="attention")(h, cos, sin, mask, is_global, deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))

        h = _norm(cfg, "mlp_norm")(x)
        wi = functools.partial(_dense, cfg, cfg.mlp_dim, -1, ("embed", "mlp"))
        y = nn.gelu(wi(name="wi_0")(h), approximate=False) * wi(name="wi_1")(h)
        y = nn.with_logical_constraint(y, ("batch", "length", "mlp"))
        y = layers.dropout(cfg, cfg.dropout_rate)(y, deterministic=deterministic)
        y = _dense(cfg, cfg.hidden_size, -1, ("mlp", "embed"), "wo")(y)
        x = x + checkpoint_name(y, "mlp_out")
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        if self.scanned:
            return x, (x if self.collect_hidden else None)
        return x


class Encoder(nn.Module):
    """Embeddings, the layers and the final LayerNorm; returns the final hidden states.

    With ``output_hidden_states`` it also returns the ``num_layers + 1`` hidden states
    (embedding output first; the last before the final LayerNorm, as HF records them).
    """

    config: EncoderConfig

    def setup(self):
        cfg = self.config
        self.word_embeddings = self.param(
            "word_embeddings", layers.param(layers.dense_init(cfg), ("vocab", "embed")),
            (cfg.vocab_size, cfg.hidden_size), jnp.dtype(cfg.param_dtype))
        self.embedding_norm = _norm(cfg, "embedding_norm")
        self.embedding_dropout = layers.dropout(cfg, cfg.dropout_rate)

    @nn.compact
    def __call__(self, input_ids: Array, attention_mask: Array | None = None,
                 token_type_ids: Array | None = None, deterministic: bool = True,
                 output_hidden_states: bool = False, segment_ids: Array | None = None,
                 positions: Array | None = None):
        # token_type_ids: ModernBERT has none (a pair is told apart by its separator);
        # accepted so that both families share one call.
        del token_type_ids
        cfg = self.config
        if segment_ids is None:
            if attention_mask is None:
                attention_mask = input_ids != cfg.pad_token_id
            segment_ids = attention_mask.astype(jnp.int32)
            if positions is None:
                positions = jnp.broadcast_to(
                    jnp.arange(input_ids.shape[-1], dtype=jnp.int32), input_ids.shape)
        elif positions is None:
            positions = positions_from_segments(segment_ids)
        word = nn.with_logical_constraint(self.word_embeddings, ("vocab", None))
        x = jnp.take(word, input_ids, axis=0).astype(jnp.dtype(cfg.dtype))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        x = self.embedding_dropout(self.embedding_norm(x), deterministic=deterministic)

        rope_global = rope_tables(positions, cfg.head_dim, cfg.global_rope_theta)
        rope_local = rope_tables(positions, cfg.head_dim, cfg.local_rope_theta)
        impl = layers.resolve_attention_impl(cfg.attention_impl, cfg.dtype,
                                             length=input_ids.shape[-1])
        if impl == "splash" and (deterministic or cfg.attention_dropout_rate == 0.0):
            # The kernel masks tile by tile from the segment ids: no [q, k] mask is built.
            mask_global = mask_local = segment_ids
        else:
            mask_global, mask_local = attention_masks(segment_ids, cfg.local_window)
        shared = (rope_global, rope_local, mask_global, mask_local)

        def remat(static_argnums):
            if cfg.remat_policy == "none":
                return EncoderLayer
            # Arguments count from self: (6, 7) are is_global and deterministic.
            return nn.remat(EncoderLayer, policy=REMAT_POLICIES[cfg.remat_policy],
                            prevent_cse=not cfg.scan_layers, static_argnums=static_argnums)

        layer_cls = remat((6, 7))
        hidden = [x]
        x = layer_cls(cfg, first=True, name="layers_0")(x, *shared, True, deterministic)
        hidden.append(x)
        rest = cfg.num_layers - 1
        if cfg.scan_layers and rest:
            flags = jnp.asarray([cfg.is_global_layer(i) for i in range(1, cfg.num_layers)])
            stack = nn.scan(
                remat((7,)),  # the scanned flag is traced
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * 4 + (0, nn.broadcast),
                length=rest,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )(cfg, scanned=True, collect_hidden=output_hidden_states, name="layers")
            x, stacked = stack(x, *shared, flags, deterministic)
            if output_hidden_states:
                hidden.extend(stacked[i] for i in range(rest))
        else:
            for i in range(1, cfg.num_layers):
                x = layer_cls(cfg, name=f"layers_{i}")(
                    x, *shared, cfg.is_global_layer(i), deterministic)
                hidden.append(x)
        x = _norm(cfg, "final_norm")(x)
        if output_hidden_states:
            return x, tuple(hidden)
        return x

    def attend(self, x: Array) -> Array:
        """Projects hidden states onto the (tied) token embeddings: logits without bias."""
        dt = jnp.dtype(self.config.dtype)
        return jnp.einsum("...e,ve->...v", x.astype(dt), self.word_embeddings.astype(dt))


class MLMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> tied decoder + bias (HF: head, decoder)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, attend_fn) -> Array:
        cfg = self.config
        x = _dense(cfg, cfg.hidden_size, -1, ("embed", "mlp"), "dense")(x)
        x = _norm(cfg, "norm")(nn.gelu(x, approximate=False))
        bias = self.param("bias", layers.param(nn.initializers.zeros, ("vocab",)),
                          (cfg.vocab_size,), jnp.dtype(cfg.param_dtype))
        logits = attend_fn(x)
        return logits + bias.astype(logits.dtype)


class ModernBertForMaskedLM(nn.Module):
    """Encoder + MLM head. Parameters: ``{'encoder': ..., 'lm_head': ...}``.

    Called as the XLM-R network is (``mlm_positions`` applies the head only at the masked
    slots), plus ``segment_ids`` (and optionally ``positions``) for packed rows.
    """

    config: EncoderConfig

    def setup(self):
        self.encoder = Encoder(self.config, name="encoder")
        self.lm_head = MLMHead(self.config, name="lm_head")

    def __call__(self, input_ids: Array, attention_mask: Array | None = None,
                 token_type_ids: Array | None = None, mlm_positions: Array | None = None,
                 deterministic: bool = True, segment_ids: Array | None = None,
                 positions: Array | None = None) -> Array:
        x = self.encoder(input_ids, attention_mask, token_type_ids, deterministic,
                         segment_ids=segment_ids, positions=positions)
        if mlm_positions is not None:
            x = jnp.take_along_axis(x, mlm_positions[..., None].astype(jnp.int32), axis=1)
        logits = self.lm_head(x, self.encoder.attend)
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))

    def encode(self, input_ids, attention_mask=None, token_type_ids=None,
               deterministic=True, output_hidden_states=False, segment_ids=None):
        """Runs only the encoder (for fine-tuning heads and retrieval)."""
        return self.encoder(input_ids, attention_mask, token_type_ids, deterministic,
                            output_hidden_states, segment_ids=segment_ids)


def _attended_keys(cfg: EncoderConfig, index: int, length: int) -> int:
    # A local layer's window: local_window + 1 keys (the splash kernel skips tiles outside
    # it; XLA's dense path computes the whole row and masks it).
    return length if cfg.is_global_layer(index) else min(length, cfg.local_window + 1)


def _length_problem(cfg: EncoderConfig, length: int) -> tuple[str, str] | None:
    if cfg.local_window >= length:
        return ("local_window", f"must be shorter than sequence_length={length}: the local "
                "layers would attend to the whole row, as the global ones do")
    return None


FAMILY = family_lib.Family(
    name="modernbert", masked_lm=ModernBertForMaskedLM, encoder=Encoder, mlp_matrices=3,
    rotary=True, packed_rows=True, attended_keys=_attended_keys, length_problem=_length_problem,
    task_heads_use_prediction_head=True)
