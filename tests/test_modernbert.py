"""The ModernBERT family against Hugging Face's ``ModernBertForMaskedLM`` (transformers,
fp32, eager): logits of converted weights both ways, in both parameter layouts, padded
and packed; packed documents equal the documents alone; conversion refusals, one line.

The HF model is a random tiny one made here (no download), with five layers (global,
local, local, global, local) and rows longer than the local window, so that both layer
types, both RoPE bases and the window all reach the logits compared.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax.model import modernbert, network
from xlmeta_jax.model.config import ModelConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from xlmeta_jax.interop.hf import modernbert_layout as layout  # noqa: E402
from xlmeta_jax.interop.hf.hf_config import ConversionError  # noqa: E402
from xlmeta_jax.interop.hf.layout import to_numpy  # noqa: E402

# fp32 logits against transformers (the bound; measured ~1e-7).
HF_ATOL = 1e-4
# Our packed row against our documents alone: the same computation up to summation order.
PACKED_ATOL = 1e-5
LENGTH = 24  # > local_window // 2 = 4: the local layers' window cuts every row
HF_CONFIG = dict(
    vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
    num_attention_heads=4, max_position_embeddings=64, local_attention=8, pad_token_id=0,
    bos_token_id=3, eos_token_id=1, cls_token_id=3, sep_token_id=1,
    global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
    attn_implementation="eager")


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**HF_CONFIG))
    with torch.no_grad():  # norms and the decoder bias away from their 1 / 0 init
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _hf_logits(model, ids, mask=None):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(np.asarray(ids)),
                    attention_mask=None if mask is None else torch.tensor(np.asarray(mask)))
    return out.logits.numpy()


def _ours(cfg, params, ids, mask=None, **kwargs):
    return np.asarray(network.masked_lm(cfg).apply({"params": params}, jnp.asarray(ids),
                                                   mask if mask is None else jnp.asarray(mask),
                                                   **kwargs))


def _padded_batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 97, size=(3, LENGTH)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, n in ((1, 13), (2, 6)):
        mask[row, n:], ids[row, n:] = 0, 0
    return ids, mask


def test_hf_config_reads_layer_types_and_rope_bases(hf_model):
    cfg = layout.config_from_hf(hf_model.config.to_dict())
    assert (cfg.family, cfg.global_attn_every_n_layers, cfg.local_window) == ("modernbert", 3, 8)
    assert [cfg.is_global_layer(i) for i in range(5)] == [True, False, False, True, False]
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (160000.0, 10000.0)
    # Our config written back is HF's again (what an export's config.json holds).
    back = transformers.ModernBertConfig(**layout.hf_config_from_config(
        cfg, special={"bos_token_id": 3, "eos_token_id": 1, "cls_token_id": 3,
                      "sep_token_id": 1}))
    assert back.layer_types == hf_model.config.layer_types
    assert back.rope_parameters == hf_model.config.rope_parameters
    assert back.sliding_window == hf_model.config.sliding_window


@pytest.mark.parametrize("overrides", [
    dict(scan_layers=False),
    dict(scan_layers=True),
    dict(scan_layers=True, remat_policy="dots"),
], ids=["layers", "scan", "scan-remat"])
def test_hf_weights_give_hf_logits(hf_model, overrides):
    """HF -> ours: padded rows, fp32, at every non-padding position."""
    cfg = layout.config_from_hf(hf_model.config.to_dict(), **overrides)
    params = layout.params_from_hf_state_dict(hf_model.state_dict(), cfg, to_numpy=to_numpy)
    ids, mask = _padded_batch()
    diff = np.abs(_ours(cfg, params, ids, mask) - _hf_logits(hf_model, ids, mask))
    assert diff[mask.astype(bool)].max() < HF_ATOL


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
def test_our_weights_give_our_logits_in_hf(scan):
    """Ours -> HF: a freshly initialised network, exported, loads strictly into
    transformers and computes our logits."""
    cfg = layout.config_from_hf(HF_CONFIG, scan_layers=scan)
    ids, mask = _padded_batch()
    params = network.masked_lm(cfg).init(jax.random.key(1), jnp.asarray(ids))["params"]
    params = jax.tree.map(np.asarray, nn.unbox(params))
    state = layout.hf_state_dict_from_params(params, cfg)
    model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**HF_CONFIG))
    model.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)
    diff = np.abs(_ours(cfg, params, ids, mask) - _hf_logits(model.eval(), ids, mask))
    assert diff[mask.astype(bool)].max() < HF_ATOL
    # And back: the same arrays, bit for bit.
    again = layout.params_from_hf_state_dict(state, cfg)
    jax.tree.map(np.testing.assert_array_equal, again, params)


def test_packed_row_gives_each_document_its_own_logits(hf_model):
    """Documents A (7 tokens) and B (9) packed in one row, then padding: each one's logits
    are those of the document alone, ours and HF's."""
    cfg = layout.config_from_hf(hf_model.config.to_dict())
    params = layout.params_from_hf_state_dict(hf_model.state_dict(), cfg, to_numpy=to_numpy)
    rng = np.random.default_rng(2)
    a, b = rng.integers(5, 97, size=7), rng.integers(5, 97, size=9)
    row = np.zeros((1, LENGTH), np.int32)
    row[0, :16] = np.concatenate([a, b])
    segments = np.zeros_like(row)
    segments[0, :7], segments[0, 7:16] = 1, 2
    packed = _ours(cfg, params, row, segment_ids=jnp.asarray(segments))[0]
    for doc, span in ((a, slice(0, 7)), (b, slice(7, 16))):
        alone = _ours(cfg, params, doc[None])[0]
        np.testing.assert_allclose(packed[span], alone, atol=PACKED_ATOL, rtol=0)
        np.testing.assert_allclose(packed[span], _hf_logits(hf_model, doc[None])[0],
                                   atol=HF_ATOL, rtol=0)
    # Sanity: without segment ids, B would see A, far beyond the tolerance above.
    unpacked = _ours(cfg, params, row, (row != 0).astype(np.int32))[0]
    assert np.abs(unpacked[7:16] - packed[7:16]).max() > 10 * PACKED_ATOL


@pytest.mark.parametrize("segments, positions", [
    ([1, 1, 1, 2, 2, 0, 0], [0, 1, 2, 0, 1, 0, 1]),
    ([1, 2, 3, 3, 3, 3, 3], [0, 0, 0, 1, 2, 3, 4]),
    ([4, 4, 4, 4, 4, 4, 4], [0, 1, 2, 3, 4, 5, 6]),
])
def test_positions_restart_at_each_segment(segments, positions):
    got = modernbert.positions_from_segments(jnp.asarray([segments]))
    assert np.asarray(got)[0].tolist() == positions


def test_cudnn_branch_arguments_match_xla_path(hf_model, monkeypatch):
    """The 'cudnn' branch's layout, mask (segments, padding and the local window) and scale,
    run by JAX's portable kernel: the logits of the 'xla' path."""
    real, calls = jax.nn.dot_product_attention, []

    def portable(*args, implementation=None, **kwargs):
        calls.append(implementation)
        return real(*args, implementation="xla", **kwargs)

    cfg = layout.config_from_hf(hf_model.config.to_dict())
    params = layout.params_from_hf_state_dict(hf_model.state_dict(), cfg, to_numpy=to_numpy)
    ids, mask = _padded_batch()
    segments = np.where(np.arange(LENGTH) < 10, 1, 2) * mask
    want = _ours(cfg, params, ids, segment_ids=jnp.asarray(segments))
    monkeypatch.setattr(jax.nn, "dot_product_attention", portable)
    got = _ours(cfg.replace(attention_impl="cudnn"), params, ids,
                segment_ids=jnp.asarray(segments))
    assert calls == ["cudnn"] * cfg.num_layers
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("size, overrides, gradients", [
    # Layers global, local, local, global: layer 0 alone, layers 1-3 scanned, each picking
    # the global or the local kernel by its traced flag (lax.cond).
    ("modernbert_tiny", dict(local_window=32, scan_layers=True), True),
    # XLM-R's key padding mask as segments (the kernel's backward pass is the same).
    ("tiny", dict(dropout_rate=0.0, attention_dropout_rate=0.0), False),
], ids=["modernbert", "xlmr"])
def test_splash_kernel_matches_xla_path(size, overrides, gradients):
    """attention_impl='splash', Pallas' TPU kernel (run in its interpret mode on CPU): the
    logits (and gradients) of the 'xla' path, on 128-token rows with padding and, for
    ModernBERT, three documents in a row and windows cut at segment edges."""
    cfg = network.get_config(size, dtype="float32", pad_token_id=0, **overrides)
    rng = np.random.default_rng(4)
    ids = rng.integers(5, cfg.vocab_size, size=(2, 128)).astype(np.int32)
    segments = np.ones_like(ids)
    segments[1, 90:] = 0
    if cfg.family == "modernbert":
        segments[0, 40:], segments[0, 70:], segments[0, 120:] = 2, 3, 0
    ids[segments == 0] = 0
    text = segments != 0
    packed = {"segment_ids": jnp.asarray(segments)} if cfg.family == "modernbert" else {}
    params = nn.unbox(network.masked_lm(cfg).init(jax.random.key(0), jnp.asarray(ids))["params"])

    def logits(params, impl):
        module = network.masked_lm(cfg.replace(attention_impl=impl))
        return module.apply({"params": params}, jnp.asarray(ids), jnp.asarray(text), **packed)

    def loss(params, impl):
        return jnp.sum(jnp.where(text[..., None], logits(params, impl), 0.0) ** 2)

    # The kernel runs (rows of 128 tokens: no fallback to XLA). ModernBERT's local layers
    # cut rows the global ones do not, so a wrong window in either kernel changes logits.
    assert "pallas_call[" in str(jax.make_jaxpr(logits, static_argnums=1)(params, "splash"))
    want, got = logits(params, "xla"), logits(params, "splash")
    assert np.abs(np.asarray(got - want))[text].max() < 1e-5
    if not gradients:
        return
    grads = [jax.grad(loss)(params, impl) for impl in ("xla", "splash")]
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[0]))
    for a, b in zip(*map(jax.tree.leaves, grads)):
        np.testing.assert_allclose(b, a, atol=1e-6 * scale, rtol=0)


@pytest.mark.parametrize("change, message", [
    (dict(hidden_activation="silu"), "hidden_activation='silu'"),
    (dict(norm_bias=True), "norm_bias=True"),
    (dict(mlp_bias=True), "mlp_bias=True"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings=False"),
    (dict(embedding_dropout=0.1), "embedding_dropout=0.1 and mlp_dropout=0.0 differ"),
    (dict(layer_types=["sliding_attention", "full_attention"] * 2 + ["full_attention"]),
     "only a global layer every n-th layer"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0},
                           "sliding_attention": {"rope_type": "default"}}),
     "rope_type='yarn'"),
    (dict(vocab_size=None), "lacks required fields ['vocab_size']"),
])
def test_unsupported_hf_configs_are_refused_in_one_line(change, message):
    with pytest.raises(ConversionError) as err:
        layout.config_from_hf({**HF_CONFIG, "num_hidden_layers": 5, **change})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_wrong_weights_are_named(hf_model):
    cfg = layout.config_from_hf(hf_model.config.to_dict())
    state = dict(hf_model.state_dict())
    del state["model.layers.1.attn_norm.weight"]
    state["model.layers.0.attn_norm.weight"] = state["model.final_norm.weight"]
    with pytest.raises(ConversionError, match=r"missing keys \['model.layers.1.attn_norm.weight'"
                       r"\]; unexpected keys \['model.layers.0.attn_norm.weight'\]"):
        layout.params_from_hf_state_dict(state, cfg, to_numpy=to_numpy)
    with pytest.raises(ConversionError, match="'decoder.weight' differs"):
        layout.params_from_hf_state_dict(
            {**hf_model.state_dict(), "decoder.weight": torch.zeros(97, 32)}, cfg,
            to_numpy=to_numpy)
    small = layout.config_from_hf({**HF_CONFIG, "intermediate_size": 40})
    with pytest.raises(ConversionError, match=r"'model.layers.0.mlp.Wi.weight' has shape "
                       r"\(96, 32\), expected \(80, 32\)"):
        layout.params_from_hf_state_dict(hf_model.state_dict(), small, to_numpy=to_numpy)


@pytest.mark.parametrize("overrides, setting, value", [
    (dict(local_window=7), "local_window", 7),
    (dict(local_window=0), "local_window", 0),
    (dict(global_attn_every_n_layers=0), "global_attn_every_n_layers", 0),
    (dict(hidden_size=36, num_heads=4), "num_heads", 4),  # head_dim 9: RoPE needs pairs
    (dict(hidden_size=64, num_heads=3), "num_heads", 3),
    (dict(family="bert"), "family", "bert"),
    (dict(remat_policy="most"), "remat_policy", "most"),
    (dict(dropout_mask_bits=4), "dropout_mask_bits", 4),
    (dict(attention_impl="flash"), "attention_impl", "flash"),
    (dict(dtype="float99"), "dtype", "float99"),
    # Each trained to exit 0, or stopped at step 1 blaming the learning rate (12-06's sweep).
    (dict(dropout_rate=1.5), "dropout_rate", 1.5),
    (dict(dropout_rate=-0.1), "dropout_rate", -0.1),
    (dict(attention_dropout_rate=1.0), "attention_dropout_rate", 1.0),
    (dict(global_rope_theta=0.0), "global_rope_theta", 0.0),
    (dict(local_rope_theta=-5.0), "local_rope_theta", -5.0),
    (dict(hiden_size=64), "hiden_size", 64),
])
def test_bad_encoder_settings_are_refused_naming_the_field(overrides, setting, value):
    with pytest.raises(ModelConfigError) as err:
        network.get_config("modernbert_tiny", **overrides)
    assert (err.value.field, err.value.value) == (setting, value)
    assert str(err.value).startswith(f"EncoderConfig.{setting}: ")
    if hasattr(network.EncoderConfig, setting):  # the bad value, as given
        assert repr(value) in str(err.value) or str(value) in str(err.value)
    else:
        assert "not an EncoderConfig field" in str(err.value)


def test_named_sizes_are_mmbert_published_shapes():
    """JHU-CLSP/mmBERT configs/mmBERT-{small,base}.yaml and the tiny test size."""
    shapes = {s: network.get_config(s) for s in ("modernbert_tiny", "mmbert_small",
                                                   "mmbert_base")}
    got = {s: (c.family, c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.mlp_dim,
               c.max_length, c.local_window, c.dropout_rate) for s, c in shapes.items()}
    assert got == {
        "modernbert_tiny": ("modernbert", 1024, 64, 4, 4, 96, 8192, 128, 0.0),
        "mmbert_small": ("modernbert", 256000, 384, 22, 6, 1152, 8192, 128, 0.0),
        "mmbert_base": ("modernbert", 256000, 768, 22, 12, 1152, 8192, 128, 0.0),
    }
    # Parameter counts as published, in whole millions (mmBERT-small 140M, base 307M).
    for size, millions in (("mmbert_small", 140), ("mmbert_base", 307)):
        cfg = shapes[size]
        shapes_tree = jax.eval_shape(lambda r, c=cfg: network.masked_lm(c).init(
            r, jnp.zeros((1, 8), jnp.int32)), jax.random.key(0))
        count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes_tree)))
        assert count // 10**6 == millions, (size, count)


@pytest.mark.parametrize("kind, hf_class", [
    ("classification", "ModernBertForSequenceClassification"),
    ("tagging", "ModernBertForTokenClassification"),
])
def test_fine_tuning_heads_are_hf_heads(kind, hf_class):
    """Fine-tuning a ModernBERT uses HF's task heads: the pretrained encoder plus prediction
    head and classifier of transformers' model give its logits (classification on [CLS])."""
    from xlmeta_jax.evaluation.models import FineTuneModel

    torch.manual_seed(3)
    hf = getattr(transformers, hf_class)(
        transformers.ModernBertConfig(**HF_CONFIG, num_labels=3)).eval()
    state = {k: to_numpy(v) for k, v in hf.state_dict().items()}
    cfg = layout.config_from_hf(HF_CONFIG)
    converted = layout.params_from_hf_state_dict(
        {**{k: v for k, v in state.items() if k.startswith(("model.", "head."))},
         "decoder.bias": np.zeros(cfg.vocab_size, np.float32)}, cfg)
    params = {"encoder": converted["encoder"], "head": {
        "head": {"dense": {"kernel": state["head.dense.weight"].T},
                 "norm": {"scale": state["head.norm.weight"]}},
        "classifier": {"kernel": state["classifier.weight"].T,
                       "bias": state["classifier.bias"]}}}
    ids, _ = _padded_batch()
    ids = ids[:1]  # fine-tuning rows are unpadded here: HF's pooling reads [CLS] either way
    got = FineTuneModel(cfg, kind, 3).apply({"params": params}, jnp.asarray(ids))
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(np.asarray(got), want, atol=HF_ATOL, rtol=0)
