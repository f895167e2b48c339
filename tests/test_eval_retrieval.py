"""Sentence embeddings (mean pooling per layer), XTREME's bitext mining and Tatoeba
conventions, both retrieval tasks end to end through the fine-tune command."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax.cli import finetune as finetune_cli
from xlmeta_jax.evaluation import retrieval, scorers, tasks, tokenization
from xlmeta_jax.evaluation.settings import RetrievalSettings
from xlmeta_jax.model.network import Encoder, get_config


@pytest.fixture(scope="module")
def vocab(english_spm):
    return english_spm


def test_mean_pooling_matches_unpadded_encoder_per_layer(vocab):
    tok = tokenization.Tokenizer(vocab)
    cfg = get_config("tiny", vocab_size=tok.vocab_size, pad_token_id=0)
    params = retrieval.fresh_params(cfg, seed=0)
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


def test_cls_pooling_is_the_first_token_state_per_layer(vocab):
    tok = tokenization.Tokenizer(vocab)
    cfg = get_config("tiny", vocab_size=tok.vocab_size, pad_token_id=0)
    params = retrieval.fresh_params(cfg, seed=0)
    sentences = ["To be, or not to be.", "A horse!", "What light through yonder window?"]
    cls = retrieval.SentenceEmbedder(cfg, params, tok, max_seq_length=64, batch_size=2,
                                     pooling="cls")(sentences)
    mean = retrieval.SentenceEmbedder(cfg, params, tok, max_seq_length=64,
                                      batch_size=2)(sentences)
    apply = jax.jit(
        lambda ids: Encoder(cfg).apply({"params": params}, ids, output_hidden_states=True)[1]
    )
    for i, s in enumerate(sentences):
        hidden = apply(jnp.array([tok.single(tok.encode(s), 64)]))
        for layer, h in enumerate(hidden):
            # XTREME's cls_pool_embedding: hidden_states[layer][:, 0] (the <s> token).
            np.testing.assert_allclose(cls[layer, i], np.asarray(h[0, 0]), atol=2e-5)
            assert np.abs(cls[layer, i] - mean[layer, i]).max() > 1e-3
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        retrieval.SentenceEmbedder(cfg, params, tok, pooling="max")


def test_bucc_layer_is_the_8th_of_the_last_12_as_run_bucc2018():
    # run_bucc2018.sh: --specific_layer 7 and evaluate_retrieval.py's default --num_layers 12,
    # so hidden_states[-12:][7]: hidden_states[8] of base (layer 7), hidden_states[20] of
    # large (layer 19) — not Tatoeba's 13.
    bucc = tasks.get("bucc")
    assert bucc.xtreme_layer(12) == 7 and bucc.xtreme_layer(24) == 19
    assert 25 - 12 + 7 == bucc.xtreme_layer(24) + 1  # as a hidden_states index
    assert bucc.xtreme_layer(2) == 1
    assert {n: tasks.get(n).pooling for n in ("tatoeba", "bucc")} == {
        "tatoeba": "mean", "bucc": "cls"}


def _angles(*degrees):
    return np.array([[np.cos(np.radians(d)), np.sin(np.radians(d))] for d in degrees],
                    np.float32)


def test_mining_recovers_a_permutation():
    rng = np.random.default_rng(0)
    tgt = rng.normal(size=(300, 16)).astype(np.float32)
    perm = rng.permutation(300)[:120]
    src = tgt[perm] + 0.05 * rng.normal(size=(120, 16)).astype(np.float32)
    mined = retrieval.mine_bitext(src, tgt)
    assert sorted((i, j) for i, j, _ in mined)[:120] == [(i, int(p)) for i, p in enumerate(perm)]
    gold = {(f"s{i}", f"t{p}") for i, p in enumerate(perm)}
    cands = [(f"s{i}", f"t{j}", score) for i, j, score in mined]
    assert scorers.bitext_mining_f1(cands, gold)["f1"] == 100.0


def test_max_retrieval_finds_pairs_forward_mining_misses():
    # s0 and s1 both prefer t0; only the backward direction (t1's best source is s1)
    # finds the gold pair (s1, t1). Forward-only mining scores F1 80, XTREME's 'max' 100.
    src, tgt = _angles(0, 20, 200), _angles(8, 60, 190)
    gold = {("s0", "t0"), ("s1", "t1"), ("s2", "t2")}
    mined = retrieval.mine_bitext(src, tgt, k=2)
    assert [(i, j) for i, j, _ in mined] == [(2, 2), (0, 0), (1, 1)]
    sim = src @ tgt.T
    fwd_mean = np.sort(sim, 1)[:, -2:].mean(1)
    bwd_mean = np.sort(sim.T, 1)[:, -2:].mean(1)
    margin = sim / ((fwd_mean[:, None] + bwd_mean[None, :]) / 2)
    forward = [(f"s{i}", f"t{j}", margin[i, j]) for i, j in enumerate(margin.argmax(1))]
    assert scorers.bitext_mining_f1(forward, gold)["f1"] == pytest.approx(80.0)
    found = [(f"s{i}", f"t{j}", score) for i, j, score in mined]
    assert scorers.bitext_mining_f1(found, gold)["f1"] == 100.0


def _hash_embed(dim=8):
    def embed(sentences):
        out = []
        for text in sentences:
            rng = np.random.default_rng(sum(map(ord, text.strip().lower())))
            out.append(rng.normal(size=dim))
        return np.array(out, np.float32)

    return embed


def test_bucc_merges_duplicates_and_ignores_input_order():
    src = {"zh-1": "A", "zh-2": "b", "zh-3": "C", "zh-4": "C", "zh-5": "d"}
    tgt = {"en-1": "a", "en-2": "B", "en-3": "c", "en-4": "D "}
    embed = _hash_embed()
    cands = retrieval.mine_bucc(embed, embed, src, tgt)
    # "C" occurs under two ids: merged for mining, then dropped (XTREME's read_sent2id).
    assert {a for a, _, _ in cands} == {"zh-1", "zh-2", "zh-5"}
    assert sorted((a, b) for a, b, _ in cands) == [
        ("zh-1", "en-1"), ("zh-2", "en-2"), ("zh-5", "en-4")]
    shuffled = retrieval.mine_bucc(
        embed, embed, dict(reversed(src.items())), dict(reversed(tgt.items())))
    assert sorted(shuffled) == sorted(cands)


def test_mining_ties_break_on_text_not_position():
    # Two sources identical in embedding space compete for one target: the tie goes to
    # the smaller key whatever the row order.
    src, tgt = _angles(10, 10), _angles(10, 100)
    one = retrieval.mine_bitext(src, tgt, k=1, src_keys=["b", "a"])
    two = retrieval.mine_bitext(src[::-1], tgt, k=1, src_keys=["a", "b"])
    assert one[0][:2] == (1, 0) and two[0][:2] == (0, 0)


def test_tatoeba_en2xx_is_the_headline_and_layers_drop_the_embeddings(shared_data, vocab,
                                                                        tmp_path):
    gin.clear_config()
    model_dir = tmp_path / "tatoeba"
    try:
        results = finetune_cli.main([
            "--gin_file=finetune/tatoeba.gin",
            "--gin_file=finetune/demo.gin",
            "--gin.INITIAL_CHECKPOINT_PATH='init:tiny'",
            f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.VOCAB_PATH='{vocab}'",
            f"--gin.DATA_DIR='{shared_data}'",
            "--gin.finetune.languages=['de', 'cmn']",
            "--gin.finetune.max_eval_examples=100",
            "--gin.evaluate_retrieval.layer=0",
        ])
    finally:
        gin.clear_config()
    on_disk = json.loads((model_dir / "results.json").read_text())
    assert on_disk["task"] == "tatoeba" and on_disk["metric"] == "accuracy"
    assert set(on_disk["languages"]) == {"de", "cmn"}
    # XTREME's layer 0 is the first Transformer layer: hidden_states[1], not the embeddings.
    assert on_disk["layer"] == 0 and on_disk["hidden_states_index"] == 1
    assert set(on_disk["layer_sweep"]) == {"0", "1", "2"}
    for lang, v in on_disk["languages"].items():
        assert v["num_examples"] == 100
        assert v["accuracy"] == on_disk["per_layer"][lang]["en2xx"][1]
        assert v["accuracy_xx2en"] == on_disk["per_layer"][lang]["xx2en"][1]
    # The directions are different numbers (random weights: the layer sweep shows it).
    sweep = on_disk["per_layer"]["de"]
    assert sweep["en2xx"] != sweep["xx2en"]
    assert on_disk["english"] is None and on_disk["transfer_gap"] is None
    assert on_disk["provenance"]["data_source"] == "local"
    assert results["average"] == pytest.approx(
        np.mean([v["accuracy"] for v in on_disk["languages"].values()])
    )


def test_en2xx_queries_with_english():
    # xx rows 0 and 1 are both closest to English row 0: xx->en gets 1 of 2, en->xx
    # (English 1 is closest to xx 1) gets 2 of 2.
    xx, en = _angles(0, 40), _angles(10, 80)
    out = scorers.retrieval_accuracy(xx, en)
    assert out["src2tgt"] == 50.0 and out["tgt2src"] == 100.0
    tatoeba = tasks.get("tatoeba")
    assert tatoeba.xtreme_layer(12) == 7 and tatoeba.xtreme_layer(24) == 13


def test_identical_sides_retrieve_themselves(shared_data, vocab):
    """Sanity of the whole path: English against itself is (almost) always found."""
    _, en = tasks.get("tatoeba").read("de", shared_data)
    en = list(dict.fromkeys(en))[:200]  # distinct sentences
    tok = tokenization.Tokenizer(vocab)
    cfg = get_config("tiny", vocab_size=tok.vocab_size, pad_token_id=0)
    embed = retrieval.SentenceEmbedder(cfg, retrieval.fresh_params(cfg, 0), tok)
    e = embed(en)[cfg.num_layers]
    assert scorers.retrieval_accuracy(e, e.copy())["src2tgt"] >= 99.0


def test_bad_layer_is_an_error(shared_data, vocab, tmp_path):
    with pytest.raises(ValueError, match=r"layer=2 is not in \[0, 1\]"):
        tasks.get("tatoeba").evaluate(
            "init:tiny", str(tmp_path), vocab_path=vocab, data_dir=str(shared_data),
            languages=["de"], settings=RetrievalSettings(layer=2), max_sentences=5,
        )
    # Only a retrieval task evaluates without fine-tuning.
    assert tasks.get("xnli").fine_tunes and not hasattr(tasks.get("xnli"), "evaluate")


def test_finetune_command_runs_bucc(shared_data, vocab, tmp_path):
    gin.clear_config()
    try:
        results = finetune_cli.main([
            "--gin_file=finetune/bucc.gin",
            "--gin_file=finetune/demo.gin",
            "--gin.INITIAL_CHECKPOINT_PATH='init:tiny'",
            f"--gin.MODEL_DIR='{tmp_path}'",
            f"--gin.VOCAB_PATH='{vocab}'",
            f"--gin.DATA_DIR='{shared_data}'",
            "--gin.finetune.max_eval_examples=50",
        ])
    finally:
        gin.clear_config()
    assert results["task"] == "bucc" and results["metric"] == "f1"
    zh = results["languages"]["zh"]
    # All gold sentences are kept, plus 50 others per side.
    assert (zh["num_examples"], zh["num_source"], zh["num_target"]) == (257, 307, 307)
    assert 0.0 <= zh["f1"] <= 100.0 and zh["num_mined"] <= 307
    assert results["threshold_tuned_on"].startswith("dev")
    # XTREME's BUCC embedding: <s> state of the layer of bucc_xtreme_layer (tiny: the last).
    assert results["pooling"] == "cls" and results["settings"]["pooling"] == "cls"
    assert results["layer"] == 1
    assert not results["provenance"]["comparable_to_xtreme"]
