"""Sentence embeddings (mean pooling per layer), bitext mining, Tatoeba end to end."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax import retrieval as retrieval_cli
from xlmeta_jax.evaluation import retrieval, scorers, tokenization
from xlmeta_jax.network import Encoder, get_config


@pytest.fixture(scope="module")
def vocab(shared_data, tmp_path_factory):
    path = shared_data / "english_pd" / "tinyshakespeare" / "input.txt"
    lines = [line for line in path.read_text().splitlines() if line.strip()][:8000]
    return tokenization.train_sentencepiece(lines, tmp_path_factory.mktemp("spm") / "en", 1000)


def test_mean_pooling_matches_unpadded_encoder_per_layer(vocab):
    tok = tokenization.Tokenizer(vocab)
    cfg = get_config("tiny", vocab_size=tok.vocab_size, pad_token_id=0)
    params = retrieval._fresh_params(cfg, seed=0)
    embed = retrieval.SentenceEmbedder(cfg, params, tok, max_seq_length=64, batch_size=4)
    sentences = ["To be, or not to be.", "A horse!", "O", "What light through yonder window?"]
    out = embed(sentences)
    assert out.shape == (cfg.num_layers + 1, len(sentences), cfg.hidden_size)
    apply = jax.jit(
        lambda ids: Encoder(cfg).apply({"params": params}, ids, output_hidden_states=True)[1]
    )
    for i, s in enumerate(sentences):
        hidden = apply(jnp.array([tok.single(tok.encode(s), 64)]))
        for layer, h in enumerate(hidden):
            np.testing.assert_allclose(out[layer, i], np.asarray(h[0]).mean(0), atol=2e-5)


def test_mining_recovers_a_permutation():
    rng = np.random.default_rng(0)
    tgt = rng.normal(size=(300, 16)).astype(np.float32)
    perm = rng.permutation(300)[:120]
    src = tgt[perm] + 0.05 * rng.normal(size=(120, 16)).astype(np.float32)
    best, score = retrieval.mine_bitext(src, tgt)
    assert (best == perm).all()
    gold = {(f"s{i}", f"t{p}") for i, p in enumerate(perm)}
    cands = [(f"s{i}", f"t{b}", s) for i, (b, s) in enumerate(zip(best, score))]
    assert scorers.bitext_mining_f1(cands, gold)["f1"] == 100.0


def test_tatoeba_demo_gin_end_to_end(shared_data, vocab, tmp_path):
    gin.clear_config()
    model_dir = tmp_path / "tatoeba"
    try:
        results = retrieval_cli.main([
            "--gin_file=finetune/tatoeba_demo.gin",
            "--gin.INITIAL_CHECKPOINT_PATH='init:tiny'",
            f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.VOCAB_PATH='{vocab}'",
            f"--gin.DATA_DIR='{shared_data}'",
            "--gin.evaluate_retrieval.languages=['de', 'cmn']",
            "--gin.evaluate_retrieval.max_sentences=100",
        ])
    finally:
        gin.clear_config()
    on_disk = json.loads((model_dir / "results.json").read_text())
    assert on_disk["task"] == "tatoeba" and on_disk["metric"] == "accuracy"
    assert set(on_disk["languages"]) == {"de", "cmn"}
    assert on_disk["layer"] == 2 and set(on_disk["layer_sweep"]) == {"0", "1", "2"}
    for lang, v in on_disk["languages"].items():
        assert v["num_examples"] == 100
        assert v["accuracy"] == on_disk["per_layer"][lang]["xx2en"][2]
        assert v["accuracy_en2xx"] == on_disk["per_layer"][lang]["en2xx"][2]
    assert on_disk["english"] is None and on_disk["transfer_gap"] is None
    assert results["average"] == pytest.approx(
        np.mean([v["accuracy"] for v in on_disk["languages"].values()])
    )


def test_identical_sides_retrieve_themselves(shared_data, vocab):
    """Sanity of the whole path: English against itself is (almost) always found."""
    from xlmeta_jax.evaluation import readers

    _, en = readers.read_tatoeba("de", shared_data)
    en = list(dict.fromkeys(en))[:200]  # distinct sentences
    tok = tokenization.Tokenizer(vocab)
    cfg = get_config("tiny", vocab_size=tok.vocab_size, pad_token_id=0)
    embed = retrieval.SentenceEmbedder(cfg, retrieval._fresh_params(cfg, 0), tok)
    e = embed(en)[cfg.num_layers]
    assert scorers.retrieval_accuracy(e, e.copy())["src2tgt"] >= 99.0


def test_bad_layer_is_an_error(shared_data, vocab, tmp_path):
    with pytest.raises(ValueError, match=r"layer=5 is not in \[0, 2\]"):
        retrieval.evaluate_retrieval(
            initial_checkpoint_path="init:tiny", model_dir=str(tmp_path), vocab_path=vocab,
            data_dir=str(shared_data), languages=["de"], layer=5, max_sentences=5,
        )
    with pytest.raises(ValueError, match="must be 'tatoeba' or 'bucc'"):
        retrieval.evaluate_retrieval(
            task="xnli", initial_checkpoint_path="init:tiny", model_dir=str(tmp_path)
        )


def test_finetune_command_runs_retrieval_gin(shared_data, vocab, tmp_path):
    from xlmeta_jax import finetune as finetune_cli

    gin.clear_config()
    try:
        results = finetune_cli.main([
            "--gin_file=finetune/bucc_demo.gin",
            "--gin.INITIAL_CHECKPOINT_PATH='init:tiny'",
            f"--gin.MODEL_DIR='{tmp_path}'",
            f"--gin.VOCAB_PATH='{vocab}'",
            f"--gin.DATA_DIR='{shared_data}'",
            "--gin.evaluate_retrieval.max_sentences=50",
        ])
    finally:
        gin.clear_config()
    assert results["task"] == "bucc" and results["metric"] == "f1"
    zh = results["languages"]["zh"]
    # All gold sentences are kept, plus 50 others per side.
    assert (zh["num_examples"], zh["num_source"], zh["num_target"]) == (257, 307, 307)
    assert 0.0 <= zh["f1"] <= 100.0
