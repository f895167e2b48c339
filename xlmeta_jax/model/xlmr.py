"""The XLM-R / RoBERTa masked-LM encoder as a pure Flax (linen) network.

The architecture follows Hugging Face's ``XLMRobertaForMaskedLM`` exactly so that
published weights load (see ``xlmeta_jax.hf``):

* word embeddings + learned absolute positions (RoBERTa's padding-index offset:
  position ids start at ``pad_token_id + 1`` and padding tokens get ``pad_token_id``)
  + one token-type embedding, then LayerNorm and dropout;
* post-LN Transformer layers (``LN(x + Attn(x))``, ``LN(x + MLP(x))``), exact GELU;
* MLM head: dense -> GELU -> LayerNorm -> decoder tied to the word embeddings + bias.

Every parameter and the main activations carry t5x logical axis names
(``batch, length, embed, mlp, heads, kv, vocab``, plus ``layers`` for scanned
stacks and ``abspos`` for position tables); ``xlmeta_jax.model.partitioning`` maps them
to mesh axes. Built through ``xlmeta_jax.model.network.masked_lm`` (``family='xlmr'``).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from xlmeta_jax.model import family as family_lib
from xlmeta_jax.model import layers
from xlmeta_jax.model.config import REMAT_POLICIES, EncoderConfig

Array = jax.Array


def position_ids_from_input_ids(input_ids: Array, pad_token_id: int) -> Array:
    """RoBERTa's positions: 1-based count of non-pad tokens, offset by the pad id.

    Padding tokens get ``pad_token_id`` itself (a row that is never trained in HF).
    """
    mask = (input_ids != pad_token_id).astype(jnp.int32)
    return jnp.cumsum(mask, axis=-1) * mask + pad_token_id


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout."""

    config: EncoderConfig

    def setup(self):
        cfg = self.config
        pdt = jnp.dtype(cfg.param_dtype)
        self.word_embeddings = self.param(
            "word_embeddings",
            layers.param(layers.dense_init(cfg), ("vocab", "embed")),
            (cfg.vocab_size, cfg.hidden_size),
            pdt,
        )
        self.position_embeddings = self.param(
            "position_embeddings",
            layers.param(layers.dense_init(cfg), ("abspos", "embed")),
            (cfg.max_position_embeddings, cfg.hidden_size),
            pdt,
        )
        self.token_type_embeddings = self.param(
            "token_type_embeddings",
            layers.param(layers.dense_init(cfg), ("abspos", "embed")),
            (cfg.type_vocab_size, cfg.hidden_size),
            pdt,
        )
        self.layer_norm = layers.layer_norm(cfg, "layer_norm")
        self.dropout = layers.dropout(cfg, cfg.dropout_rate)

    def __call__(self, input_ids, position_ids, token_type_ids, deterministic: bool):
        cfg = self.config
        dt = jnp.dtype(cfg.dtype)
        # Look up in tables whose `embed` dimension is whole (FSDP's all-gather of
        # the weights before use): a gather from an fsdp-sharded `embed` yields
        # activations split on `embed`, which XLA can only turn into the
        # batch-split layout by replicating them ("involuntary full
        # rematerialization"), in the forward and in the scatter-add backward.
        word = nn.with_logical_constraint(self.word_embeddings, ("vocab", None))
        pos = nn.with_logical_constraint(self.position_embeddings, ("abspos", None))
        types = nn.with_logical_constraint(self.token_type_embeddings, ("abspos", None))
        x = jnp.take(word, input_ids, axis=0)
        x = x + jnp.take(pos, position_ids, axis=0)
        x = x + jnp.take(types, token_type_ids, axis=0)
        x = x.astype(dt)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        x = self.layer_norm(x)
        return self.dropout(x, deterministic=deterministic)

    def attend(self, x: Array) -> Array:
        """Projects hidden states onto the (tied) word embeddings: logits without bias."""
        dt = jnp.dtype(self.config.dtype)
        return jnp.einsum("...e,ve->...v", x.astype(dt), self.word_embeddings.astype(dt))


class SelfAttention(nn.Module):
    """Multi-head self-attention with a key padding mask (BERT/RoBERTa numerics)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
        cfg = self.config
        h, d = cfg.num_heads, cfg.head_dim
        proj = functools.partial(
            layers.dense_general, cfg, (h, d), -1, ("embed", "heads", "kv"), ("heads", "kv")
        )
        q = proj(name="query")(x)
        k = proj(name="key")(x)
        v = proj(name="value")(x)
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        k = nn.with_logical_constraint(k, ("batch", "length", "heads", "kv"))
        v = nn.with_logical_constraint(v, ("batch", "length", "heads", "kv"))
        q, k, v = (checkpoint_name(t, "qkv") for t in (q, k, v))

        impl = layers.resolve_attention_impl(cfg.attention_impl, cfg.dtype,
                                             length=x.shape[1])
        use_dropout = not deterministic and cfg.attention_dropout_rate > 0.0
        if impl == "splash" and not use_dropout:
            # The key padding mask as segments: text (1) attends to text only.
            scale = 1.0 / jnp.sqrt(jnp.float32(d)).astype(q.dtype)
            ctx = layers.splash_attention(q * scale, k, v, mask.astype(jnp.int32))
        elif impl == "cudnn" and not use_dropout:
            # cuDNN flash attention; `mask` is [batch, kv_length] (True = attend).
            ctx = jax.nn.dot_product_attention(
                q, k, v, mask=mask[:, None, None, :], implementation="cudnn"
            )
        else:
            # Scores and softmax in fp32 whatever the compute dtype, as HF does
            # for fp16/bf16 via autocast's fp32 softmax.
            scale = 1.0 / jnp.sqrt(jnp.float32(d)).astype(q.dtype)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q * scale, k).astype(jnp.float32)
            big_neg = jnp.finfo(jnp.float32).min
            scores = jnp.where(mask[:, None, None, :], scores, big_neg)
            probs = jax.nn.softmax(scores, axis=-1)
            if use_dropout:
                probs = layers.dropout(cfg, cfg.attention_dropout_rate)(probs, deterministic=False)
            ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))
        out = layers.dense_general(
            cfg, cfg.hidden_size, (-2, -1), ("heads", "kv", "embed"), ("embed",), "out"
        )(ctx)
        return checkpoint_name(out, "attn_out")


class EncoderLayer(nn.Module):
    """One post-LN Transformer layer: LN(x + Attn(x)) then LN(x + MLP(x))."""

    config: EncoderConfig
    # When used inside nn.scan: return (carry, per-layer output) pairs.
    scanned: bool = False
    # With `scanned`: emit the layer's output as the scan's stacked output.
    collect_hidden: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool):
        cfg = self.config
        y = SelfAttention(cfg, name="attention")(x, mask, deterministic)
        y = layers.dropout(cfg, cfg.dropout_rate)(y, deterministic=deterministic)
        x = layers.layer_norm(cfg, "attention_layer_norm")(x + y)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))

        y = layers.dense_general(cfg, cfg.mlp_dim, -1, ("embed", "mlp"), ("mlp",), "wi")(x)
        y = nn.with_logical_constraint(y, ("batch", "length", "mlp"))
        y = nn.gelu(y, approximate=False)
        y = layers.dense_general(cfg, cfg.hidden_size, -1, ("mlp", "embed"), ("embed",), "wo")(y)
        y = checkpoint_name(y, "mlp_out")
        y = layers.dropout(cfg, cfg.dropout_rate)(y, deterministic=deterministic)
        x = layers.layer_norm(cfg, "output_layer_norm")(x + y)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        if self.scanned:
            return x, (x if self.collect_hidden else None)
        return x


class Encoder(nn.Module):
    """Embeddings and the stack of layers; returns the final hidden states.

    With ``output_hidden_states`` it also returns a tuple of ``num_layers + 1``
    hidden states (embedding output first), as Hugging Face does.
    """

    config: EncoderConfig

    def setup(self):
        self.embeddings = Embeddings(self.config, name="embeddings")

    @nn.compact
    def __call__(
        self,
        input_ids: Array,
        attention_mask: Array | None = None,
        token_type_ids: Array | None = None,
        deterministic: bool = True,
        output_hidden_states: bool = False,
    ):
        cfg = self.config
        if attention_mask is None:
            attention_mask = input_ids != cfg.pad_token_id
        attention_mask = attention_mask.astype(bool)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        position_ids = position_ids_from_input_ids(input_ids, cfg.pad_token_id)
        x = self.embeddings(input_ids, position_ids, token_type_ids, deterministic)

        layer_cls = EncoderLayer
        if cfg.remat_policy != "none":
            layer_cls = nn.remat(
                EncoderLayer,
                policy=REMAT_POLICIES[cfg.remat_policy],
                prevent_cse=not cfg.scan_layers,
                static_argnums=(3,),
            )
        hidden = [x]
        if cfg.scan_layers:
            stack = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )(cfg, scanned=True, collect_hidden=output_hidden_states, name="layers")
            x, stacked = stack(x, attention_mask, deterministic)
            if output_hidden_states:
                hidden.extend(stacked[i] for i in range(cfg.num_layers))
        else:
            for i in range(cfg.num_layers):
                x = layer_cls(cfg, name=f"layers_{i}")(x, attention_mask, deterministic)
                hidden.append(x)
        if output_hidden_states:
            return x, tuple(hidden)
        return x

    def attend(self, x: Array) -> Array:
        return self.embeddings.attend(x)


class MLMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> tied decoder + bias (RoBERTa's lm_head)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, attend_fn) -> Array:
        cfg = self.config
        x = layers.dense_general(cfg, cfg.hidden_size, -1, ("embed", "mlp"), ("mlp",), "dense")(x)
        x = nn.gelu(x, approximate=False)
        x = layers.layer_norm(cfg, "layer_norm")(x)
        logits = attend_fn(x)
        bias = self.param(
            "bias",
            layers.param(nn.initializers.zeros, ("vocab",)),
            (cfg.vocab_size,),
            jnp.dtype(cfg.param_dtype),
        )
        logits = logits + bias.astype(logits.dtype)
        return logits


class XLMRForMaskedLM(nn.Module):
    """Encoder + MLM head. Parameters: ``{'encoder': ..., 'lm_head': ...}``.

    Call with ``mlm_positions`` ([batch, slots] int) to apply the LM head only at
    those positions (the masked-head trick: the vocabulary projection is most of
    the compute when applied at every position); without it, logits are computed
    for every position.
    """

    config: EncoderConfig

    def setup(self):
        self.encoder = Encoder(self.config, name="encoder")
        self.lm_head = MLMHead(self.config, name="lm_head")

    def __call__(
        self,
        input_ids: Array,
        attention_mask: Array | None = None,
        token_type_ids: Array | None = None,
        mlm_positions: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        x = self.encoder(input_ids, attention_mask, token_type_ids, deterministic)
        if mlm_positions is not None:
            x = jnp.take_along_axis(x, mlm_positions[..., None].astype(jnp.int32), axis=1)
        logits = self.lm_head(x, self.encoder.attend)
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))

    def encode(self, input_ids, attention_mask=None, token_type_ids=None,
               deterministic=True, output_hidden_states=False):
        """Runs only the encoder (for fine-tuning heads and retrieval)."""
        return self.encoder(
            input_ids, attention_mask, token_type_ids, deterministic, output_hidden_states
        )


FAMILY = family_lib.Family(
    name="xlmr", masked_lm=XLMRForMaskedLM, encoder=Encoder, mlp_matrices=2, rotary=False,
    packed_rows=False,
    attended_keys=family_lib.whole_row, length_problem=family_lib.no_length_problem,
    task_heads_use_prediction_head=False)
