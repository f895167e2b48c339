"""Hugging Face interop: numerical parity with PyTorch XLM-R and exact weight round trips."""

import functools
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from xlmeta_jax.cli import hf as hf_cli  # noqa: E402
from xlmeta_jax.interop.hf import layout as hf_layout  # noqa: E402
from xlmeta_jax.interop.hf import weights as hf  # noqa: E402
from xlmeta_jax.model.network import XLMRForMaskedLM  # noqa: E402

PAD = 1
TOL = 1e-4


def _tiny_hf_config(**overrides):
    kwargs = dict(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=66, pad_token_id=PAD,
        bos_token_id=0, eos_token_id=2, type_vocab_size=1, layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    kwargs.update(overrides)
    return transformers.XLMRobertaConfig(**kwargs)


def _randomise(model, seed):
    """Non-trivial values everywhere (HF init leaves biases 0 and LayerNorms at 1,
    which would hide a swapped bias or LayerNorm mapping)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm.weight" in name or "layer_norm.weight" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif "position_embeddings" in name:
                # Large, so that an off-by-one position offset changes every output.
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.1 * noise)
    return model


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    model = transformers.XLMRobertaForMaskedLM(_tiny_hf_config())
    return _randomise(model, 1).eval()


@pytest.fixture(scope="module")
def hf_state(hf_model):
    return {k: v.detach().numpy().copy() for k, v in hf_model.state_dict().items()}


def _padded_batch(seed=0, lengths=(24, 17, 9, 3), length=24, vocab=1000):
    """<s> tokens </s> then padding; different lengths per row."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), length), PAD, np.int64)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(3, vocab, size=n)
        ids[b, 0] = 0
        ids[b, n - 1] = 2
    return ids, (ids != PAD).astype(np.int64)


@pytest.fixture(scope="module")
def batch_and_reference(hf_model):
    ids, mask = _padded_batch()
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
            output_hidden_states=True,
        )
    logits = out.logits.numpy()
    hidden = [h.numpy() for h in out.hidden_states]
    # The reference must depend on position and content, or parity would prove little.
    assert logits.std() > 0.1
    assert np.abs(logits[0, 1] - logits[0, 2]).max() > 0.1
    return ids, mask, logits, hidden


def _ours(cfg, params, ids, mask=None, **kwargs):
    apply = jax.jit(functools.partial(XLMRForMaskedLM(cfg).apply, **kwargs))
    return apply({"params": params}, ids, mask)


def _encode(cfg, params, ids, mask):
    apply = jax.jit(functools.partial(
        XLMRForMaskedLM(cfg).apply, output_hidden_states=True, method=XLMRForMaskedLM.encode
    ))
    return apply({"params": params}, ids, mask)


@pytest.mark.parametrize("scan", [False, True], ids=["per_layer", "scan"])
def test_logits_and_hidden_states_match_pytorch(hf_model, hf_state, batch_and_reference, scan):
    ids, mask, ref_logits, ref_hidden = batch_and_reference
    cfg = hf.config_from_hf(hf_model.config, scan_layers=scan)
    params = hf.params_from_hf_state_dict(hf_state, cfg)
    assert ("layers" in params["encoder"]) == scan
    assert ("layers_0" in params["encoder"]) == (not scan)

    logits = np.asarray(_ours(cfg, params, ids, mask))
    np.testing.assert_allclose(logits, ref_logits, atol=TOL, rtol=0)
    # Without an explicit mask the network derives it from pad_token_id, as HF's
    # position ids do.
    np.testing.assert_allclose(np.asarray(_ours(cfg, params, ids)), ref_logits, atol=TOL, rtol=0)

    _, hidden = _encode(cfg, params, ids, mask)
    assert len(hidden) == len(ref_hidden) == cfg.num_layers + 1
    for i, (ours, ref) in enumerate(zip(hidden, ref_hidden)):
        np.testing.assert_allclose(np.asarray(ours), ref, atol=TOL, rtol=0, err_msg=f"layer {i}")


@pytest.mark.parametrize("scan", [False, True], ids=["per_layer", "scan"])
def test_masked_head_matches_gathered_full_logits(hf_model, hf_state, batch_and_reference, scan):
    ids, mask, ref_logits, _ = batch_and_reference
    cfg = hf.config_from_hf(hf_model.config, scan_layers=scan)
    params = hf.params_from_hf_state_dict(hf_state, cfg)
    rng = np.random.default_rng(3)
    lengths = mask.sum(1)
    # Slots inside each row's real tokens; unused slots point at 0, as the pipeline pads.
    positions = np.zeros((ids.shape[0], 5), np.int32)
    for b, n in enumerate(lengths):
        k = min(4, n - 1)
        positions[b, :k] = np.sort(rng.choice(np.arange(1, n), size=k, replace=False))
    logits = np.asarray(_ours(cfg, params, ids, mask, mlm_positions=positions))
    expected = np.take_along_axis(ref_logits, positions[..., None].astype(np.int64), axis=1)
    assert logits.shape == (ids.shape[0], 5, cfg.vocab_size)
    np.testing.assert_allclose(logits, expected, atol=TOL, rtol=0)


def test_parity_check_detects_position_offset_and_mask_errors(
    hf_model, hf_state, batch_and_reference
):
    """Negative controls: the parity check above fails for typical wrong implementations."""
    ids, mask, ref_logits, _ = batch_and_reference
    cfg = hf.config_from_hf(hf_model.config)
    params = hf.params_from_hf_state_dict(hf_state, cfg)
    real = mask.astype(bool)

    # Position ids off by one (e.g. starting at pad_token_id instead of pad_token_id + 1).
    shifted = jax.tree.map(lambda x: x, params)
    table = params["encoder"]["embeddings"]["position_embeddings"]
    shifted["encoder"]["embeddings"]["position_embeddings"] = np.roll(table, 1, axis=0)
    diff = np.abs(np.asarray(_ours(cfg, shifted, ids, mask)) - ref_logits)[real]
    assert diff.max() > 100 * TOL

    # Ignoring the padding mask changes the real tokens of padded rows.
    diff = np.abs(np.asarray(_ours(cfg, params, ids, np.ones_like(mask))) - ref_logits)
    assert diff[1:][real[1:]].max() > 100 * TOL
    # ... but not the unpadded row: the check is about padding, nothing else.
    np.testing.assert_allclose(diff[0], 0, atol=TOL)


@pytest.mark.parametrize("scan", [False, True], ids=["per_layer", "scan"])
def test_state_dict_round_trip_is_exact(hf_model, hf_state, scan):
    cfg = hf.config_from_hf(hf_model.config, scan_layers=scan)
    params = hf.params_from_hf_state_dict(hf_state, cfg)
    back = hf.hf_state_dict_from_params(params, cfg)
    assert list(back) == hf_layout.hf_keys(cfg)
    assert set(back) == set(hf_state)
    for key, value in hf_state.items():
        assert back[key].dtype == value.dtype, key
        np.testing.assert_array_equal(back[key], value, err_msg=key)
    # The result loads strictly into a fresh HF model.
    fresh = transformers.XLMRobertaForMaskedLM(_tiny_hf_config())
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_layouts_hold_the_same_weights(hf_model, hf_state):
    cfg = hf.config_from_hf(hf_model.config)
    per_layer = hf.params_from_hf_state_dict(hf_state, cfg, scan_layers=False)
    scanned = hf.params_from_hf_state_dict(hf_state, cfg, scan_layers=True)
    for i in range(cfg.num_layers):
        jax.tree.map(
            lambda s, p, i=i: np.testing.assert_array_equal(s[i], p),
            scanned["encoder"]["layers"], per_layer["encoder"][f"layers_{i}"],
        )


def test_save_hf_loads_with_from_pretrained(hf_model, hf_state, batch_and_reference, tmp_path):
    ids, mask, ref_logits, _ = batch_and_reference
    cfg = hf.config_from_hf(hf_model.config, scan_layers=True)
    params = hf.params_from_hf_state_dict(hf_state, cfg)
    hf.save_hf(tmp_path, cfg, params)
    loaded = transformers.XLMRobertaForMaskedLM.from_pretrained(tmp_path).eval()
    for key, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), hf_state[key], err_msg=key)
    with torch.no_grad():
        logits = loaded(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
        ).logits.numpy()
    np.testing.assert_array_equal(logits, ref_logits)
    assert hf.config_from_hf(loaded.config, scan_layers=True) == cfg

    cfg2, params2 = hf.load_hf(tmp_path, scan_layers=True)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_load_hf_reads_save_pretrained_single_and_sharded(hf_model, hf_state, tmp_path):
    cfg = hf.config_from_hf(hf_model.config)
    expected = hf.params_from_hf_state_dict(hf_state, cfg)
    hf_model.save_pretrained(tmp_path / "single")
    hf_model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / hf.SAFE_WEIGHTS_INDEX_NAME).is_file()
    for name in ("single", "sharded"):
        cfg2, params = hf.load_hf(tmp_path / name)
        assert cfg2 == cfg
        jax.tree.map(np.testing.assert_array_equal, params, expected)


def test_load_hf_reads_bfloat16_safetensors(hf_model, tmp_path):
    bf16 = transformers.XLMRobertaForMaskedLM(_tiny_hf_config())
    bf16.load_state_dict(hf_model.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    bf16.save_pretrained(tmp_path)
    cfg, params = hf.load_hf(tmp_path)
    table = params["encoder"]["embeddings"]["word_embeddings"]
    assert table.dtype == np.float32
    expected = bf16.roberta.embeddings.word_embeddings.weight.detach().float().numpy()
    np.testing.assert_array_equal(table, expected)


def test_pickle_weights_refused_unless_allowed(hf_model, hf_state, tmp_path):
    torch.save(hf_model.state_dict(), tmp_path / hf.PICKLE_WEIGHTS_NAME)
    (tmp_path / hf.CONFIG_NAME).write_text(json.dumps(hf_model.config.to_dict()))
    with pytest.raises(hf.ConversionError, match="allow_pickle=True"):
        hf.load_hf(tmp_path)
    cfg, params = hf.load_hf(tmp_path, allow_pickle=True)
    jax.tree.map(
        np.testing.assert_array_equal, params, hf.params_from_hf_state_dict(hf_state, cfg)
    )


def test_buffers_and_pooler_are_ignored(hf_model, hf_state):
    cfg = hf.config_from_hf(hf_model.config)
    old_style = dict(hf_state)
    old_style["roberta.embeddings.position_ids"] = np.arange(66)[None]
    old_style["roberta.pooler.dense.weight"] = np.zeros((64, 64), np.float32)
    old_style.pop("lm_head.decoder.weight")
    old_style.pop("lm_head.decoder.bias")
    jax.tree.map(
        np.testing.assert_array_equal,
        hf.params_from_hf_state_dict(old_style, cfg),
        hf.params_from_hf_state_dict(hf_state, cfg),
    )


def test_bad_state_dicts_name_the_key(hf_model, hf_state):
    cfg = hf.config_from_hf(hf_model.config)
    missing = dict(hf_state)
    del missing["roberta.encoder.layer.1.intermediate.dense.bias"]
    with pytest.raises(hf.ConversionError, match=r"missing keys.*layer\.1\.intermediate"):
        hf.params_from_hf_state_dict(missing, cfg)

    extra = dict(hf_state)
    extra["roberta.encoder.layer.2.output.dense.bias"] = np.zeros(64, np.float32)
    with pytest.raises(hf.ConversionError, match=r"unexpected keys.*layer\.2\.output"):
        hf.params_from_hf_state_dict(extra, cfg)

    with pytest.raises(hf.ConversionError, match=r"'roberta.encoder.layer.0.intermediate"):
        hf.params_from_hf_state_dict(hf_state, cfg.replace(mlp_dim=256))

    untied = dict(hf_state)
    untied["lm_head.decoder.weight"] = untied["lm_head.decoder.weight"] + 1
    with pytest.raises(hf.ConversionError, match="lm_head.decoder.weight"):
        hf.params_from_hf_state_dict(untied, cfg)


def test_unsupported_hf_configs_are_refused():
    with pytest.raises(hf.ConversionError, match="hidden_act"):
        hf.config_from_hf(_tiny_hf_config(hidden_act="relu"))
    with pytest.raises(hf.ConversionError, match="tie_word_embeddings"):
        hf.config_from_hf({**_tiny_hf_config().to_dict(), "tie_word_embeddings": False})
    with pytest.raises(hf.ConversionError, match="position_embedding_type"):
        hf.config_from_hf(
            {**_tiny_hf_config().to_dict(), "position_embedding_type": "relative_key"}
        )


def test_hf_config_round_trip():
    cfg = hf.config_from_hf(_tiny_hf_config())
    assert hf.config_from_hf(hf.hf_config_from_config(cfg)) == cfg
    d = hf.hf_config_from_config(cfg)
    assert (d["bos_token_id"], d["eos_token_id"], d["pad_token_id"]) == (0, 2, 1)
    ours = hf.hf_config_from_config(cfg.replace(pad_token_id=0))
    assert (ours["bos_token_id"], ours["eos_token_id"], ours["pad_token_id"]) == (3, 1, 0)


def test_command_line_round_trip(hf_model, hf_state, tmp_path):
    hf_model.save_pretrained(tmp_path / "hf_in")
    assert hf_cli.main([
        "to_flax", f"--hf_path={tmp_path / 'hf_in'}", f"--output={tmp_path / 'flax'}",
        "--scan_layers",
    ]) == 0
    # The trainer's own checkpoint format: a phase directory with step 0.
    from xlmeta_jax.pretrain import loading

    assert loading.find_step_dir(tmp_path / "flax") == tmp_path / "flax" / "0"
    cfg, params, vocab = loading.load_pretrained(tmp_path / "flax")
    assert cfg.scan_layers and params["encoder"]["layers"]["wi"]["kernel"].shape[0] == 2
    assert vocab is None  # the HF directory has no sentencepiece.bpe.model
    with pytest.raises(hf.ConversionError, match="is not empty"):
        hf_cli.main(["to_flax", f"--hf_path={tmp_path / 'hf_in'}", f"--output={tmp_path / 'flax'}"])
    assert hf_cli.main(["to_hf", f"--checkpoint={tmp_path / 'flax'}",
                    f"--output={tmp_path / 'hf_out'}"]) == 0
    loaded = transformers.XLMRobertaForMaskedLM.from_pretrained(tmp_path / "hf_out")
    for key, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), hf_state[key], err_msg=key)


def test_to_hf_exports_a_pretraining_checkpoint(hf_model, hf_state, tmp_path):
    """A training run's checkpoint (TrainState + meta) exports to a loadable HF model."""
    import dataclasses

    from xlmeta_jax.pretrain import checkpoints
    from xlmeta_jax.pretrain.step import TrainState

    cfg = hf.config_from_hf(hf_model.config, scan_layers=True)
    params = hf.params_from_hf_state_dict(hf_state, cfg)
    state = TrainState(step=np.int32(7), params=params, opt_state={})
    ckpts = checkpoints.PhaseCheckpoints(
        str(tmp_path / "run" / "phase1"), save_interval_steps=1, max_to_keep=1, async_save=False
    )
    ckpts.save(7, state, None, {"model_config": dataclasses.asdict(cfg)}, force=True)
    ckpts.close()
    # The phase directory: MODEL_DIR itself resolves through the run's config.gin.
    assert hf_cli.main(["to_hf", f"--checkpoint={tmp_path / 'run' / 'phase1'}",
                    f"--output={tmp_path / 'hf_out'}"]) == 0
    loaded = transformers.XLMRobertaForMaskedLM.from_pretrained(tmp_path / "hf_out")
    for key, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), hf_state[key], err_msg=key)
