"""``hf to_hf`` / ``hf to_flax`` for the ModernBERT family: an export of a model in our ids
loads with transformers' Auto classes and computes our logits; ``to_flax`` undoes it
exactly; a ModernBERT folder saved by transformers imports as a checkpoint; every
conversion prints its parity line, and refuses unknown architectures and NaN weights."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import sentencepiece as spm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from xlmeta_jax import errors  # noqa: E402
from xlmeta_jax.cli import hf as hf_cli  # noqa: E402
from xlmeta_jax.interop.hf import parity  # noqa: E402
from xlmeta_jax.interop.hf import tokenizer as hf_tokenizer  # noqa: E402
from xlmeta_jax.model import network  # noqa: E402
from xlmeta_jax.pretrain import checkpoints, loading  # noqa: E402
from xlmeta_jax.pretrain.step import TrainState  # noqa: E402

VOCAB_SIZE = 1000
PARITY = "parity: max |logits - transformers' logits| = "


def _texts(keys=("en_Latn", "fr_Latn", "ru_Cyrl", "zh_Hans", "ar_Arab")):
    import gflanguages

    out = []
    for key in keys:
        sample = gflanguages.LoadLanguages()[key].sample_text
        out += [t.strip() for t in (getattr(sample, f.name) for f in sample.DESCRIPTOR.fields)
                if isinstance(t, str) and t.strip()]
    return out


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    from xlmeta_jax.data import vocabulary

    root = tmp_path_factory.mktemp("vocab")
    (root / "udhr.txt").write_text("\n".join(_texts()) + "\n", encoding="utf-8")
    return vocabulary.train_vocabulary({"xx": [str(root / "udhr.txt")]}, str(root / "spm"),
                                       VOCAB_SIZE, num_lines=2000, num_threads=1,
                                       print_report=False)


@pytest.fixture(scope="module")
def model():
    """A ModernBERT in our ids (pad 0), 4 layers, an 8-token local window, its embedding
    table padded past the vocabulary; values away from their init everywhere."""
    cfg = network.get_config("modernbert_tiny", vocab_size=VOCAB_SIZE + 8, hidden_size=32,
                             num_heads=4, mlp_dim=48, local_window=8, pad_token_id=0)
    params = network.masked_lm(cfg).init(jax.random.key(0), np.ones((1, 4), np.int32))
    leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, nn.unbox(params["params"])))
    rng = np.random.default_rng(0)
    return cfg, jax.tree.unflatten(tree, [
        (x + 0.2 * rng.standard_normal(x.shape)).astype(x.dtype) for x in leaves])


def _cli(argv):
    """(exit status, stdout) of ``python -m xlmeta_jax.hf``; its error line in stdout too."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = errors.run_command(hf_cli.main, argv, prog="xlmeta_jax.hf")
    return code, out.getvalue()


@pytest.fixture(scope="module")
def export(model, vocab, tmp_path_factory):
    cfg, params = model
    root = tmp_path_factory.mktemp("export")
    ckpts = checkpoints.PhaseCheckpoints(str(root / "run" / "phase2"), save_interval_steps=1,
                                         max_to_keep=1, async_save=False)
    meta = {"model_config": dataclasses.asdict(cfg), "vocab_path": vocab}
    ckpts.save(3, TrainState(step=np.int32(3), params=params, opt_state={}), None, meta,
               force=True)
    ckpts.close()
    code, out = _cli(["to_hf", f"--checkpoint={root / 'run' / 'phase2'}",
                      f"--output={root / 'hf'}"])
    assert code == 0, out
    return root / "hf", out


def _batch(sp, texts, to_id=int, bos=3, eos=1, pad=0):
    rows = [[bos, *(to_id(i) for i in sp.encode(t)), eos] for t in texts]
    ids = np.full((len(rows), max(map(len, rows))), pad, np.int64)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = row
    return ids


def test_export_loads_in_transformers_and_gives_our_logits(export, model, vocab):
    folder, out = export
    cfg, params = model
    assert PARITY in out and "(fp32; refused above 1e-03)" in out
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    assert type(loaded).__name__ == "ModernBertForMaskedLM"
    assert loaded.config.layer_types == [
        "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    # AutoTokenizer gives our ids, renumbered as the export says (XLM-R's layout).
    sp = spm.SentencePieceProcessor(model_file=vocab)
    rows = hf_tokenizer.hf_rows(VOCAB_SIZE, cfg.vocab_size)
    to_hf = np.argsort(rows)
    texts = _texts(("en_Latn", "ru_Cyrl", "zh_Hans"))[:6]
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    hf_ids = _batch(sp, texts, lambda i: int(to_hf[i]), bos=0, eos=2, pad=1)
    np.testing.assert_array_equal(
        auto(texts, padding=True, return_tensors="np")["input_ids"], hf_ids)
    our_ids = _batch(sp, texts)
    mask = our_ids != 0
    assert mask.sum(1).min() < mask.shape[1] and mask.sum(1).max() > cfg.local_window
    ref = np.asarray(network.masked_lm(cfg).apply({"params": params}, our_ids.astype(np.int32)))
    with torch.no_grad():
        got = loaded(input_ids=torch.from_numpy(hf_ids),
                     attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(got[mask], ref[..., rows][mask], atol=1e-4, rtol=0)
    card = (folder / "README.md").read_text()
    assert "# ModernBERT-style masked-LM encoder" in card and "Inputs of up to 8192" in card


def test_to_flax_undoes_the_export(export, model, tmp_path):
    folder, _ = export
    cfg, params = model
    code, out = _cli(["to_flax", f"--hf_path={folder}", f"--output={tmp_path / 'flax'}"])
    assert code == 0 and PARITY in out, out
    cfg2, params2, vocab2 = loading.load_pretrained(tmp_path / "flax")
    assert cfg2 == cfg.replace(attention_impl="xla")  # an execution setting, not stored
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    code, out = _cli(["to_hf", f"--checkpoint={tmp_path / 'flax'}",
                      f"--output={tmp_path / 'again'}"])
    assert code == 0, out
    for p in folder.iterdir():
        assert (tmp_path / "again" / p.name).read_bytes() == p.read_bytes(), p.name


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A ModernBERT saved by transformers itself (its own ids, no SentencePiece model)."""
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, local_attention=8, pad_token_id=0, bos_token_id=2,
        eos_token_id=1, cls_token_id=2, sep_token_id=1)
    folder = tmp_path_factory.mktemp("hf_modernbert") / "model"
    transformers.ModernBertForMaskedLM(config).save_pretrained(folder)
    return folder


def _assert_gives_the_folders_logits(folder, cfg, params):
    """Our network with ``params`` computes what transformers' model in ``folder`` does."""
    ids, mask = parity.batch(cfg)
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask)).logits.numpy()
    got = np.asarray(network.masked_lm(cfg).apply({"params": params}, ids, mask))
    np.testing.assert_allclose(got[mask == 1], ref[mask == 1], atol=1e-4, rtol=0)


def test_a_transformers_folder_imports_as_a_checkpoint(hf_folder, tmp_path):
    code, out = _cli(["to_flax", f"--hf_path={hf_folder}", f"--output={tmp_path / 'flax'}",
                      "--scan_layers"])
    assert code == 0 and PARITY in out, out
    cfg, params, vocab = loading.load_pretrained(tmp_path / "flax")
    assert (cfg.family, cfg.num_layers, cfg.local_window, cfg.scan_layers) == (
        "modernbert", 4, 8, True)
    assert vocab is None  # nothing to tokenise with: the folder has no SentencePiece model
    _assert_gives_the_folders_logits(hf_folder, cfg, params)


def test_unknown_architectures_and_nan_weights_are_refused(hf_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    (bert / "model.safetensors").write_bytes((hf_folder / "model.safetensors").read_bytes())
    nan = tmp_path / "nan"
    nan.mkdir()
    (nan / "config.json").write_text((hf_folder / "config.json").read_text())
    state = load_file(hf_folder / "model.safetensors")
    state["model.layers.2.attn.Wqkv.weight"][0, 0] = np.nan
    save_file(state, nan / "model.safetensors", metadata={"format": "pt"})
    for src, part in [
        (bert, "model_type='bert' (architectures ['BertForMaskedLM']) is neither XLM-R "
               "('xlm-roberta', 'roberta') nor ModernBERT ('modernbert')"),
        (nan, "refused, the converted model's logits differ: max |logits - transformers' "
              "logits| = inf"),
    ]:
        code, out = _cli(["to_flax", f"--hf_path={src}", f"--output={tmp_path / 'out'}"])
        lines = out.strip().splitlines()
        assert code == errors.EXIT_USER_ERROR and len(lines) == 1, out
        assert lines[0].startswith("xlmeta_jax.hf: error: ") and part in lines[0], lines
        assert not (tmp_path / "out").exists()


def test_a_transformers_folder_is_an_initial_checkpoint(hf_folder):
    """INITIAL_CHECKPOINT_PATH=<a ModernBERT folder>: pretraining starts from its weights
    when the gin model is of its family and shape; fine-tuning asks for the vocabulary its
    ids come from, which the folder does not hold (transformers' own tokenizer files)."""
    from xlmeta_jax.evaluation import encoders
    from xlmeta_jax.pretrain import loading

    cfg = network.get_config("modernbert_tiny", vocab_size=120, hidden_size=32, num_heads=4,
                             mlp_dim=48, local_window=8)
    params = loading.initial_params(str(hf_folder), cfg)
    _assert_gives_the_folders_logits(hf_folder, cfg, params)
    xlmr = network.get_config("tiny", vocab_size=120, hidden_size=32, num_heads=4, mlp_dim=48,
                              num_layers=4)
    with pytest.raises(errors.UserError, match="its encoder is of the 'modernbert' family, the "
                       "configured model of the 'xlmr' family"):
        loading.initial_params(str(hf_folder), xlmr)
    with pytest.raises(FileNotFoundError, match="has neither tokenizer.json nor "
                       "sentencepiece.bpe.model; pass vocab_path"):
        encoders.load_encoder(str(hf_folder))
