"""End to end: fine-tune from a demo gin file on real data; checkpoint loading; errors."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax import finetune as finetune_cli
from xlmeta_jax.evaluation import encoders, finetuning, tokenization
from xlmeta_jax.network import XLMRForMaskedLM, get_config


@pytest.fixture(scope="module")
def english_lines(shared_data):
    path = shared_data / "english_pd" / "tinyshakespeare" / "input.txt"
    return [line for line in path.read_text().splitlines() if line.strip()][:8000]


@pytest.fixture(scope="module")
def vocab(english_lines, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("spm") / "en"
    return tokenization.train_sentencepiece(english_lines, prefix, 1000)


@pytest.fixture(autouse=True)
def _clean_gin():
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


def test_tydiqa_demo_gin_end_to_end(shared_data, vocab, tmp_path):
    model_dir = tmp_path / "tydiqa"
    results = finetune_cli.main([
        "--gin_file=finetune/tydiqa_demo.gin",
        "--gin.INITIAL_CHECKPOINT_PATH='init:tiny'",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.VOCAB_PATH='{vocab}'",
        f"--gin.DATA_DIR='{shared_data}'",
        "--gin.finetune.train_steps=24",
        "--gin.finetune.max_train_examples=96",
        "--gin.finetune.max_eval_examples=6",
        "--gin.finetune.log_every=8",
    ])
    on_disk = json.loads((model_dir / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    assert set(on_disk["languages"]) == {"ar", "bn", "en", "fi", "id", "ko", "ru", "sw", "te"}
    for lang, scores in on_disk["languages"].items():
        assert set(scores) >= {"f1", "exact_match", "num_examples"}, lang
        assert 0.0 <= scores["exact_match"] <= scores["f1"] <= 100.0
        assert scores["num_examples"] == 6
    others = [v["f1"] for k, v in on_disk["languages"].items() if k != "en"]
    assert on_disk["english"] == on_disk["languages"]["en"]["f1"]
    assert on_disk["average_target"] == pytest.approx(np.mean(others))
    assert on_disk["transfer_gap"] == pytest.approx(on_disk["english"] - np.mean(others))
    assert on_disk["metric"] == "f1" and on_disk["train"]["steps"] == 24
    # 24 steps at lr 5e-4 must move the span loss down from ~log(128).
    assert on_disk["train"]["final_loss"] < on_disk["train"]["first_loss"]
    config = (model_dir / "config.gin").read_text()
    assert "finetune.task = 'tydiqa'" in config and "finetune.train_steps = 24" in config
    preds = json.loads((model_dir / "predictions" / "te.json").read_text())
    assert len(preds) == 6


def test_bad_inputs_fail_before_training(shared_data, vocab, tmp_path):
    common = dict(initial_checkpoint_path="init:tiny", model_dir=str(tmp_path), vocab_path=vocab,
                  data_dir=str(shared_data))
    with pytest.raises(ValueError, match="unknown task 'squad'"):
        finetuning.finetune(task="squad", **common)
    with pytest.raises(ValueError, match=r"unknown language\(s\) \['xx'\]"):
        finetuning.finetune(task="xnli", languages=["xx"], **common)
    with pytest.raises(TypeError, match="unknown settings \\['batchsize'\\]"):
        finetuning.finetune(task="xnli", batchsize=8, **common)
    with pytest.raises(ValueError, match="not divisible by the 8 devices"):
        finetuning.finetune(task="xnli", batch_size=12, **common)
    with pytest.raises(FileNotFoundError, match="INITIAL_CHECKPOINT_PATH .* does not exist"):
        finetuning.finetune(task="xnli", **{**common, "initial_checkpoint_path": "/no/ckpt"})
    with pytest.raises(ValueError, match="exceeds the encoder's 129 positions"):
        finetuning.finetune(task="xnli", max_seq_length=256, **common)
    with pytest.raises(SystemExit, match="unknown arguments"):
        finetune_cli.main(["--gin_file=finetune/xnli_demo.gin", "--steps=3"])


def _random_params(cfg):
    """Random XLMRForMaskedLM params of the right tree (no XLA init compile)."""
    shapes = jax.eval_shape(
        lambda: nn.unbox(XLMRForMaskedLM(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
    )["params"]
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype), shapes)


def test_hugging_face_checkpoint_is_accepted(english_lines, tmp_path):
    hf = pytest.importorskip("xlmeta_jax.hf")
    # XLM-R's SentencePiece specials; fairseq ids put pad at 1.
    spm_path = tokenization.train_sentencepiece(
        english_lines[:3000], tmp_path / "spm", 500, pad_id=-1, eos_id=2, unk_id=0, bos_id=1,
        user_defined_symbols=[],
    )
    cfg = get_config("tiny", vocab_size=502, pad_token_id=1)
    params = _random_params(cfg)
    hf.save_hf(tmp_path / "hf", cfg, params)
    (tmp_path / "hf" / "sentencepiece.bpe.model").write_bytes(open(spm_path, "rb").read())
    loaded = encoders.load_encoder(str(tmp_path / "hf"))
    assert loaded.source == "hf"
    assert loaded.tokenizer.kind == "fairseq" and loaded.tokenizer.pad_id == 1
    assert loaded.config.pad_token_id == 1 and loaded.config.vocab_size == 502
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(params["encoder"])):
        np.testing.assert_array_equal(a, b)
    # An encoder whose table is too small for the vocabulary is refused.
    with pytest.raises(ValueError, match="has 502 ids but the encoder"):
        small = get_config("tiny", vocab_size=400, pad_token_id=1)
        p2 = _random_params(small)
        hf.save_hf(tmp_path / "hf2", small, p2)
        (tmp_path / "hf2" / "sentencepiece.bpe.model").write_bytes(open(spm_path, "rb").read())
        encoders.load_encoder(str(tmp_path / "hf2"))


def test_pretrained_encoder_params_are_used_and_checked():
    from xlmeta_jax.evaluation.models import FineTuneModel

    cfg = get_config("tiny", vocab_size=300, pad_token_id=0)
    encoder = _random_params(cfg)["encoder"]
    model = FineTuneModel(cfg, "classification", 3)
    params = finetuning._init_params(model, encoder, 32, seed=0)
    assert set(params) == {"encoder", "head"}
    assert params["head"]["out_proj"]["kernel"].shape == (64, 3)
    for a, b in zip(jax.tree.leaves(params["encoder"]), jax.tree.leaves(encoder)):
        np.testing.assert_array_equal(a, b)
    bad = jax.tree.map(lambda x: x, encoder)
    bad["embeddings"]["word_embeddings"] = np.zeros((299, 64), np.float32)
    with pytest.raises(ValueError, match=r"encoder\['embeddings'\]\['word_embeddings'\] has shape"):
        finetuning._init_params(model, bad, 32, seed=0)


def test_pretraining_checkpoint_dispatch(vocab, tmp_path, monkeypatch):
    from xlmeta_jax import checkpoints

    cfg = get_config("tiny", vocab_size=1024, pad_token_id=0)
    params = _random_params(cfg)
    calls = []

    def fake_load_pretrained(path):
        calls.append(path)
        return cfg, params, vocab

    monkeypatch.setattr(checkpoints, "load_pretrained", fake_load_pretrained)
    (tmp_path / "run").mkdir()
    loaded = encoders.load_encoder(str(tmp_path / "run"))
    assert calls == [str(tmp_path / "run")]
    assert loaded.source == "pretraining" and loaded.tokenizer.kind == "seqio"
    assert loaded.params is params["encoder"]
    # A recorded vocabulary that does not fit the embedding table is refused.
    monkeypatch.setattr(
        checkpoints, "load_pretrained",
        lambda path: (cfg.replace(vocab_size=500), params, vocab),
    )
    with pytest.raises(ValueError, match="has 1000 ids but the encoder"):
        encoders.load_encoder(str(tmp_path / "run"))
