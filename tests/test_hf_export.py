"""``hf to_hf`` of a model with our vocabulary: transformers' tokenizers, fill-mask and
logits agree with our tokenizer and model; ``to_flax`` undoes the export exactly."""

import dataclasses
import functools
import os
import shutil
import stat

import flax.linen as nn
import jax
import numpy as np
import pytest
import sentencepiece as spm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from xlmeta_jax.cli import hf as hf_cli  # noqa: E402
from xlmeta_jax.evaluation import encoders  # noqa: E402
from xlmeta_jax.interop.hf import card, convert  # noqa: E402
from xlmeta_jax.interop.hf import tokenizer as hf_tokenizer  # noqa: E402
from xlmeta_jax.interop.hf import weights as hf  # noqa: E402
from xlmeta_jax.model.network import EncoderConfig, XLMRForMaskedLM  # noqa: E402
from xlmeta_jax.pretrain import checkpoints, loading  # noqa: E402
from xlmeta_jax.pretrain.step import TrainState  # noqa: E402

# The vocabulary is trained on these (UDHR sample texts shipped by gflanguages) ...
TRAIN_LANGUAGES = ("en_Latn", "fr_Latn", "de_Latn", "ru_Cyrl", "el_Grek", "ar_Arab",
                   "hi_Deva", "th_Thai", "zh_Hans", "vi_Latn", "sw_Latn", "tr_Latn")
# ... and tested on those too, whose scripts (Hebrew, Armenian, Georgian, Japanese,
# Korean, Amharic, Tamil) it has not seen: SentencePiece falls back to UTF-8 bytes.
UNSEEN_LANGUAGES = ("he_Hebr", "hy_Armn", "ka_Geor", "ja_Jpan", "ko_Kore", "am_Ethi",
                    "ta_Taml", "uk_Cyrl", "pl_Latn")
VOCAB_SIZE = 1200


def _sample_texts(key):
    import gflanguages

    sample = gflanguages.LoadLanguages()[key].sample_text
    texts = [getattr(sample, f.name) for f in sample.DESCRIPTOR.fields]
    return [t.strip() for t in texts if isinstance(t, str) and t.strip()]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """Our SentencePiece vocabulary (xlmeta_jax.data.vocabulary: seqio ids, byte fallback)."""
    from xlmeta_jax.data import vocabulary

    root = tmp_path_factory.mktemp("vocab")
    files = {}
    for key in TRAIN_LANGUAGES:
        path = root / f"{key}.txt"
        path.write_text("\n".join(_sample_texts(key)) + "\n", encoding="utf-8")
        files[key] = [str(path)]
    return vocabulary.train_vocabulary(
        files, str(root / "spm"), VOCAB_SIZE, num_lines=2000, num_threads=1,
        print_report=False,
    )


@pytest.fixture(scope="module")
def texts():
    out = []
    for key in TRAIN_LANGUAGES + UNSEEN_LANGUAGES:
        out += _sample_texts(key)[:4]
    return out


def _random_params(cfg, seed):
    """Non-trivial values everywhere: zero biases or unit LayerNorms would hide a row or
    position mix-up."""
    params = XLMRForMaskedLM(cfg).init(jax.random.key(seed), np.ones((1, 4), np.int32))
    params = jax.tree.map(np.asarray, nn.unbox(params["params"]))
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(
        tree, [(x + 0.2 * rng.standard_normal(x.shape)).astype(x.dtype) for x in leaves]
    )


@pytest.fixture(scope="module")
def model(vocab):
    """A tiny model in our ids (pad 0), its vocabulary padded past the SentencePiece size."""
    cfg = EncoderConfig(
        vocab_size=VOCAB_SIZE + 8, hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128,
        max_position_embeddings=66, pad_token_id=0, dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    return cfg, _random_params(cfg, 0)


@pytest.fixture(scope="module")
def export(model, vocab, tmp_path_factory):
    """``hf to_hf`` of a pretraining checkpoint that records its vocabulary."""
    cfg, params = model
    root = tmp_path_factory.mktemp("export")
    ckpts = checkpoints.PhaseCheckpoints(
        str(root / "run" / "phase2"), save_interval_steps=1, max_to_keep=1, async_save=False
    )
    state = TrainState(step=np.int32(3), params=params, opt_state={})
    meta = {"model_config": dataclasses.asdict(cfg), "vocab_path": vocab}
    ckpts.save(3, state, None, meta, force=True)
    ckpts.close()
    old_umask = os.umask(0o022)
    try:
        assert hf_cli.main(["to_hf", f"--checkpoint={root / 'run' / 'phase2'}",
                        f"--output={root / 'hf'}"]) == 0
    finally:
        os.umask(old_umask)
    return root / "hf"


def _ours_to_hf(vocab_size):
    """HF id of each of our ids."""
    return np.argsort(hf_tokenizer.hf_rows(VOCAB_SIZE, vocab_size))


def test_export_writes_xlmr_ids_and_normal_permissions(export, model):
    cfg, _ = model
    config = transformers.AutoConfig.from_pretrained(export)
    assert (config.bos_token_id, config.pad_token_id, config.eos_token_id) == (0, 1, 2)
    assert config.vocab_size == cfg.vocab_size
    # XLM-R's shapes: 2 rows more than the longest input, as 514 / 512.
    assert config.max_position_embeddings == cfg.max_position_embeddings
    assert transformers.AutoTokenizer.from_pretrained(export).model_max_length == (
        cfg.max_position_embeddings - 2)
    names = sorted(p.name for p in export.iterdir())
    assert names == sorted([
        "config.json", "model.safetensors", "sentencepiece.bpe.model", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "README.md",
    ])
    for p in export.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p.name


def test_tokenizers_agree_with_ours_on_multilingual_text(export, vocab, texts):
    ours = spm.SentencePieceProcessor(model_file=vocab)
    to_hf = _ours_to_hf(VOCAB_SIZE + 8)
    auto = transformers.AutoTokenizer.from_pretrained(export)
    # transformers' own XLM-R class, from tokenizer.json and from the SentencePiece file
    # alone (converted by transformers).
    stock = transformers.XLMRobertaTokenizer.from_pretrained(export)
    spm_only = export.parent / "spm_only"
    spm_only.mkdir()
    for name in ("config.json", hf_tokenizer.SPM_NAME):
        (spm_only / name).write_bytes((export / name).read_bytes())
    converted = transformers.AutoTokenizer.from_pretrained(spm_only)
    assert type(converted).__name__ == "XLMRobertaTokenizer"
    for tok in (auto, stock, converted):
        assert len(tok) == VOCAB_SIZE
        specials = (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id,
                    tok.mask_token_id)
        assert specials == (0, 1, 2, 3, VOCAB_SIZE - 1)
        assert specials == tuple(int(to_hf[i]) for i in (3, 0, 1, 2, 4))

    with_bytes = 0
    for text in texts:
        ids = ours.encode(text)
        want = [0, *(int(to_hf[i]) for i in ids), 2]
        assert auto(text)["input_ids"] == want, text
        assert auto.decode(want, skip_special_tokens=True) == ours.decode(ids)
        if any(ours.is_byte(i) for i in ids):
            # transformers 5's XLMRobertaTokenizer has no byte fallback: <unk> instead.
            with_bytes += 1
            assert 3 in stock(text)["input_ids"]
        else:
            assert stock(text)["input_ids"] == want, text
            assert converted(text)["input_ids"] == want, text
    # Both kinds of text were seen.
    assert 0 < with_bytes < len(texts)


@functools.cache
def _apply(cfg):
    return jax.jit(XLMRForMaskedLM(cfg).apply)


def _batch(ours, texts, pad, to_ids=lambda i: i, bos=3, eos=1):
    rows = [[bos, *[to_ids(i) for i in ours.encode(t)][:30], eos] for t in texts]
    ids = np.full((len(rows), max(map(len, rows))), pad, np.int64)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
    return ids


def test_exported_logits_match_ours(export, model, vocab, texts):
    cfg, params = model
    ours = spm.SentencePieceProcessor(model_file=vocab)
    to_hf = _ours_to_hf(cfg.vocab_size)
    batch = texts[::3]
    our_ids = _batch(ours, batch, pad=0)
    hf_ids = _batch(ours, batch, pad=1, to_ids=lambda i: int(to_hf[i]), bos=0, eos=2)
    np.testing.assert_array_equal(to_hf[our_ids], hf_ids)
    mask = our_ids != 0
    assert mask.sum(1).min() < mask.shape[1]  # Padded rows.
    ref = np.asarray(_apply(cfg)({"params": params}, our_ids.astype(np.int32)))
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(export).eval()
    with torch.no_grad():
        got = loaded(input_ids=torch.from_numpy(hf_ids),
                     attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
    rows = hf_tokenizer.hf_rows(VOCAB_SIZE, cfg.vocab_size)
    np.testing.assert_allclose(got[mask], ref[..., rows][mask], atol=1e-4, rtol=0)


def test_exported_logits_match_ours_at_the_longest_input(export, model, vocab, texts):
    """``model_max_length`` tokens read the last row of the exported position table."""
    cfg, params = model
    ours = spm.SentencePieceProcessor(model_file=vocab)
    length = transformers.AutoTokenizer.from_pretrained(export).model_max_length
    pieces = [i for text in texts for i in ours.encode(text)][: length - 2]
    our_ids = np.array([[3, *pieces, 1]], np.int32)
    assert our_ids.shape[1] == length
    ref = np.asarray(_apply(cfg)({"params": params}, our_ids))
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(export).eval()
    with torch.no_grad():
        got = loaded(input_ids=torch.from_numpy(_ours_to_hf(cfg.vocab_size)[our_ids])).logits
    rows = hf_tokenizer.hf_rows(VOCAB_SIZE, cfg.vocab_size)
    np.testing.assert_allclose(got.numpy()[0], ref[0][:, rows], atol=1e-4, rtol=0)


@pytest.mark.parametrize("pad", [0, 1])
def test_export_has_xlmr_shapes_for_either_pad_id(export, model, vocab, pad, tmp_path):
    """A base-sized position table (514 rows) exports as XLM-R base's: 514 / 512, from our
    ids (pad 0) and from XLM-R's (pad 1, the export's own vocabulary)."""
    cfg, params = model
    cfg = cfg.replace(max_position_embeddings=514)
    params = _random_params(cfg, 1)
    if pad == 1:
        cfg, params = hf.load_hf(hf.save_hf(tmp_path / "pad0", cfg, params, vocab_path=vocab))
        assert cfg.pad_token_id == 1
        vocab = str(tmp_path / "pad0" / hf_tokenizer.SPM_NAME)
    out = hf.save_hf(tmp_path / "hf", cfg, params, vocab_path=vocab)
    config = transformers.AutoConfig.from_pretrained(out)
    assert (config.max_position_embeddings, config.pad_token_id) == (514, 1)
    assert transformers.AutoTokenizer.from_pretrained(out).model_max_length == 512
    assert "Inputs of up to 512 tokens" in (out / "README.md").read_text()


def test_model_card_says_which_tokenizer_to_load(export, tmp_path):
    card = (export / "README.md").read_text()
    # Our vocabulary has byte fallback: the card warns against the XLM-R class.
    assert "AutoTokenizer.from_pretrained" in card
    assert "Do not name `XLMRobertaTokenizer` explicitly" in card
    assert "to_flax" in card and "`<mask>` 1199" in card


def test_fill_mask_predictions_equal_ours(export, model, vocab):
    cfg, params = model
    ours = spm.SentencePieceProcessor(model_file=vocab)
    to_hf = _ours_to_hf(cfg.vocab_size)
    fill = transformers.pipeline("fill-mask", model=str(export), top_k=5)
    sentences = [
        ("Everyone has the right to", "."), ("Tout individu a droit à la", "."),
        ("Каждый человек имеет право на", "."), ("所有人生而自由，在尊严和", "上一律平等。"),
    ]
    for prefix, suffix in sentences:
        our_ids = np.array([[3, *ours.encode(prefix), 4, *ours.encode(suffix), 1]], np.int32)
        pos = int(np.flatnonzero(our_ids[0] == 4)[0])
        logits = np.asarray(_apply(cfg)({"params": params}, our_ids))[0, pos]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = np.argsort(-probs)[:5]
        # "<mask>" takes the space before it (as in XLM-R's tokenizer).
        got = fill(f"{prefix} <mask>{suffix}")
        assert [r["token"] for r in got] == [int(to_hf[i]) for i in top], prefix
        assert [r["token_str"] for r in got] == [ours.decode([int(i)]) for i in top]
        np.testing.assert_allclose([r["score"] for r in got], probs[top], atol=1e-5)


def test_to_flax_undoes_the_export(export, model, vocab, tmp_path, texts):
    cfg, params = model
    assert hf_cli.main(["to_flax", f"--hf_path={export}", f"--output={tmp_path / 'flax'}"]) == 0
    cfg2, params2, vocab2 = loading.load_pretrained(tmp_path / "flax")
    assert cfg2 == cfg
    # Exact but for the last position row, which XLM-R's shape has no room for.
    table, table2 = (p["encoder"]["embeddings"]["position_embeddings"] for p in (params, params2))
    np.testing.assert_array_equal(table2[:-1], table[:-1])
    np.testing.assert_array_equal(table2[-1], 0)
    rest, rest2 = (jax.tree_util.tree_map_with_path(
        lambda k, x: None if "position_embeddings" in jax.tree_util.keystr(k) else x, p)
        for p in (params, params2))
    jax.tree.map(np.testing.assert_array_equal, rest2, rest)
    assert vocab2 == str(tmp_path / "flax" / hf.FLAX_VOCAB_NAME)
    back = spm.SentencePieceProcessor(model_file=vocab2)
    ours = spm.SentencePieceProcessor(model_file=vocab)
    assert [back.id_to_piece(i) for i in range(len(ours))] == [
        ours.id_to_piece(i) for i in range(len(ours))
    ]
    for text in texts:
        assert back.encode(text) == ours.encode(text)
    # The restored directory exports to the same files again.
    assert hf_cli.main(["to_hf", f"--checkpoint={tmp_path / 'flax'}",
                    f"--output={tmp_path / 'again'}"]) == 0
    for p in export.iterdir():
        assert (tmp_path / "again" / p.name).read_bytes() == p.read_bytes(), p.name


def test_fine_tuning_loads_the_export_as_is(export, model, vocab, texts):
    """INITIAL_CHECKPOINT_PATH=<export>: XLM-R's ids, tokenised as transformers does, and
    the encoder computes what ours computes."""
    cfg, params = model
    loaded = encoders.load_encoder(str(export))
    # The folder's own tokenizer.json (XLM-R's ids, as its sentencepiece.bpe.model gives them).
    assert loaded.source == "hf" and loaded.tokenizer.kind == "tokenizers"
    auto = transformers.AutoTokenizer.from_pretrained(export)
    for text in texts:
        assert loaded.tokenizer.single(loaded.tokenizer.encode(text), 10_000) == (
            auto(text)["input_ids"]
        )
    ours = spm.SentencePieceProcessor(model_file=vocab)
    our_ids = _batch(ours, texts[:4], pad=0).astype(np.int32)
    hf_ids = _ours_to_hf(cfg.vocab_size)[our_ids].astype(np.int32)
    encode = functools.partial(XLMRForMaskedLM.apply, method=XLMRForMaskedLM.encode)
    ref = encode(XLMRForMaskedLM(cfg), {"params": params}, our_ids)
    got = encode(XLMRForMaskedLM(loaded.config),
                 {"params": {"encoder": loaded.params, "lm_head": params["lm_head"]}}, hf_ids)
    mask = our_ids != 0
    np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(ref)[mask], atol=1e-5)


def test_bad_exports_are_refused_before_writing(export, model, vocab, tmp_path):
    cfg, params = model
    with pytest.raises(hf.ConversionError, match="already holds"):
        convert.to_hf(str(export.parent / "run" / "phase2"), str(export))
    with pytest.raises(hf.ConversionError, match="vocab_path"):
        hf.save_hf(tmp_path / "no_vocab", cfg, params)
    assert not (tmp_path / "no_vocab").exists()
    small = cfg.replace(vocab_size=VOCAB_SIZE - 1)
    with pytest.raises(hf.ConversionError, match="pieces but the model only"):
        hf.save_hf(tmp_path / "small", small, params, vocab_path=vocab)
    with pytest.raises(hf.ConversionError, match="pad id 0"):
        hf.save_hf(tmp_path / "pad", cfg.replace(pad_token_id=1), params, vocab_path=vocab)
    assert not (tmp_path / "small").exists() and not (tmp_path / "pad").exists()


def test_an_interrupted_export_leaves_the_folder_as_it_was(model, vocab, tmp_path,
                                                           monkeypatch):
    """The files are written beside the folder and moved in, config.json last: cut while
    writing the weights, the folder (here holding a file of the user's) is unchanged."""
    from xlmeta_jax.interop.hf import weights

    cfg, params = model
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")

    def cut(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(weights, "save_file", cut)
    with pytest.raises(KeyboardInterrupt):
        hf.save_hf(out, cfg, params, vocab_path=vocab)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    monkeypatch.undo()
    # Through a link to the folder (an output on another disk): written beside the folder
    # itself, so the moves stay on its file system.
    (tmp_path / "link").symlink_to(out)
    hf.save_hf(tmp_path / "link", cfg, params, vocab_path=vocab)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "out"]
    assert {"config.json", "model.safetensors", "notes.txt"} <= {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_fine_tuning_command_runs_on_the_export(export, shared_data, tmp_path):
    """``python -m xlmeta_jax.finetune`` with the export as INITIAL_CHECKPOINT_PATH and no
    other checkpoint flag (no vocabulary, no id convention)."""
    import gin

    from xlmeta_jax.cli import finetune

    gin.clear_config()
    results = finetune.main([
        "--gin_file=gin/finetune/pawsx.gin", "--gin_file=gin/finetune/demo.gin",
        f"--gin.INITIAL_CHECKPOINT_PATH='{export}'", f"--gin.MODEL_DIR='{tmp_path / 'pawsx'}'",
        f"--gin.DATA_DIR='{shared_data}'", "--gin.finetune.train_steps=4",
        "--gin.finetune.max_train_examples=64", "--gin.finetune.max_eval_examples=8",
        "--gin.finetune.eval_every=4", "--gin.finetune.log_every=2",
        # The test model has 64 positions.
        "--gin.finetune.max_seq_length=64",
    ])
    gin.clear_config()
    assert results["model"]["source"] == "hf"
    assert results["model"]["vocab_path"] == str(export)  # its tokenizer.json
    assert results["train"]["steps"] == 4
    assert set(results["languages"]) == {"de", "en", "es", "fr", "ja", "ko", "zh"}


def test_vocabulary_without_byte_fallback_gets_the_xlmr_tokenizer_class(tmp_path, texts):
    """Without byte pieces transformers' XLMRobertaTokenizer is exact, so AutoTokenizer
    builds that class."""
    import json

    from xlmeta_jax.data import vocabulary

    path = tmp_path / "en.txt"
    path.write_text("\n".join(_sample_texts("en_Latn") + _sample_texts("fr_Latn")) + "\n")
    model = vocabulary.train_vocabulary({"en": [str(path)]}, str(tmp_path / "spm"), 300,
                                        num_lines=500, num_threads=1, byte_fallback=False,
                                        print_report=False)
    files, pieces = hf_tokenizer.tokenizer_files(model, 300, 128)
    out = tmp_path / "hf"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    (out / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert type(auto).__name__ == "XLMRobertaTokenizer"
    notes = card.model_card({**hf.hf_config_from_config(EncoderConfig()), "vocab_size": 300},
                            type(auto).__name__, pieces)
    assert "Do not name" not in notes and "`AutoTokenizer` builds `XLMRobertaTokenizer`" in notes
    ours = spm.SentencePieceProcessor(model_file=model)
    to_hf = np.argsort(hf_tokenizer.hf_rows(pieces, 300))
    for text in texts:
        assert auto(text)["input_ids"] == [0, *(int(to_hf[i]) for i in ours.encode(text)), 2]


def _damage(folder, name, how):
    path = folder / name
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 3], "empty": b"",
                      "garbage": b"\x00garbage{{" * 7, "header": data[:8] + b"\xff" + data[9:],
                      }[how])


@pytest.mark.parametrize("name, how, part", [
    ("model.safetensors", "header", "is not a readable safetensors file"),
    ("model.safetensors", "truncated", "is not a readable safetensors file"),
    ("model.safetensors", "empty", "is not a readable safetensors file"),
    ("model.safetensors", "garbage", "is not a readable safetensors file"),
    ("config.json", "garbage", "HF config"),
    (hf_tokenizer.SPM_NAME, "garbage", "is not a SentencePiece model"),
])
def test_damaged_hf_folder_is_one_line(export, tmp_path, capsys, name, how, part):
    """``hf to_flax`` on a damaged save_pretrained folder: exit 2, one line naming the
    file, no output folder."""
    from xlmeta_jax import errors
    from xlmeta_jax.cli import hf as hf_cli

    src = tmp_path / "src"
    shutil.copytree(export, src)
    _damage(src, name, how)
    out = tmp_path / "out"
    code = errors.run_command(hf_cli.main, ["to_flax", f"--hf_path={src}", f"--output={out}"],
                              prog="xlmeta_jax.hf")
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == errors.EXIT_USER_ERROR and len(lines) == 1, lines
    assert lines[0].startswith("xlmeta_jax.hf: error: ") and part in lines[0], lines
    assert str(src / name) in lines[0], lines
    assert not out.exists() or not any(out.iterdir())


def test_paths_that_are_files_are_named(export, tmp_path, capsys):
    from xlmeta_jax import errors
    from xlmeta_jax.cli import hf as hf_cli

    a_file = tmp_path / "f"
    a_file.write_text("x")
    phase2 = export.parent / "run" / "phase2"
    for argv, part in [
        (["to_flax", f"--hf_path={export}", f"--output={a_file}"], f"{a_file} is a file"),
        (["to_flax", f"--hf_path={export}", f"--output={a_file}/o"], f"{a_file} is a file"),
        (["to_hf", f"--checkpoint={phase2}", f"--output={a_file}"], f"{a_file} is a file"),
        (["to_hf", f"--checkpoint={a_file}", f"--output={tmp_path / 'o'}"],
         f"checkpoint path {a_file} is a file"),
        (["to_hf", f"--checkpoint={phase2}", f"--output={tmp_path / 'o'}",
          f"--vocab_path={a_file}"], f"{a_file}: not a SentencePiece model"),
    ]:
        code = errors.run_command(hf_cli.main, argv, prog="xlmeta_jax.hf")
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == errors.EXIT_USER_ERROR and len(lines) == 1, (argv, lines)
        assert part in lines[0], (argv, lines)
    assert a_file.read_text() == "x"
