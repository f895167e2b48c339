"""End to end: fine-tune from a demo gin file on real data; checkpoint loading; errors."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax import errors
from xlmeta_jax.cli import finetune as finetune_cli
from xlmeta_jax.data import vocabulary
from xlmeta_jax.evaluation import encoders, settings, tasks, training
from xlmeta_jax.evaluation.finetune import FineTuneConfig, finetune
from xlmeta_jax.evaluation.results import format_table
from xlmeta_jax.model.network import XLMRForMaskedLM, get_config


@pytest.fixture(scope="module")
def vocab(english_spm):
    return english_spm


pytestmark = pytest.mark.usefixtures("clean_gin")


def test_tydiqa_with_demo_override_end_to_end(shared_data, vocab, tmp_path):
    model_dir = tmp_path / "tydiqa"
    results = finetune_cli.main([
        "--gin_file=finetune/tydiqa.gin",
        "--gin_file=finetune/demo.gin",
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
    # QA keeps the final parameters (XTREME's run_squad.py selects nothing).
    assert on_disk["seeds"][0]["selected_step"] == 24 and on_disk["seeds"][0]["selection"] == []
    prov = on_disk["provenance"]
    assert prov["data_source"] == "local" and prov["comparable_to_xtreme"] is False
    # TyDi QA trained on TyDi QA GoldP is XTREME's protocol: only the demo settings differ.
    assert prov["train_examples"] == 3696
    assert all("demo run" in d for d in prov["differences"]) and prov["differences"]


def test_bad_inputs_fail_before_training(shared_data, vocab, tmp_path):
    common = dict(initial_checkpoint_path="init:tiny", model_dir=str(tmp_path), vocab_path=vocab,
                  data_dir=str(shared_data))
    with pytest.raises(ValueError, match="unknown task 'squad'"):
        finetune(FineTuneConfig.from_kwargs(task="squad", **common))
    with pytest.raises(ValueError, match=r"unknown language\(s\) \['xx'\]"):
        finetune(FineTuneConfig.from_kwargs(task="xnli", languages=["xx"], **common))
    with pytest.raises(TypeError, match="unknown settings \\['batchsize'\\]"):
        FineTuneConfig.from_kwargs(task="xnli", batchsize=8, **common)
    with pytest.raises(ValueError, match="not divisible by the 8 devices"):
        finetune(FineTuneConfig.from_kwargs(task="xnli", batch_size=12, **common))
    with pytest.raises(FileNotFoundError, match="INITIAL_CHECKPOINT_PATH .* does not exist"):
        finetune(FineTuneConfig.from_kwargs(
            task="xnli", **{**common, "initial_checkpoint_path": "/no/ckpt"}))
    with pytest.raises(ValueError, match="exceeds the encoder's 129 positions"):
        finetune(FineTuneConfig.from_kwargs(task="xnli", max_seq_length=256, **common))
    with pytest.raises(errors.UserError, match="unknown arguments"):
        finetune_cli.main(["--gin_file=finetune/xnli.gin", "--steps=3"])
    with pytest.raises(errors.UserError, match="argument --seeds: needs a positive integer"):
        finetune_cli.main(["--gin_file=finetune/xnli.gin", "--seeds=0"])


def test_a_model_dir_holding_another_tasks_results_is_refused(shared_data, vocab, tmp_path):
    results = {"task": "xnli", "model": {"checkpoint": "init:tiny"}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    before = (tmp_path / "results.json").read_bytes()
    with pytest.raises(errors.UserError, match=r"holds the results of task xnli; pawsx would "
                       r"replace them: choose another MODEL_DIR"):
        finetune(FineTuneConfig.from_kwargs(task="pawsx", initial_checkpoint_path="init:tiny",
                                            model_dir=str(tmp_path), vocab_path=vocab,
                                            data_dir=str(shared_data)))
    assert (tmp_path / "results.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_second_evaluation_into_one_model_dir_is_refused(shared_data, vocab, tmp_path):
    # Another process holds MODEL_DIR (a fine-tune in progress): this one is refused at
    # once, naming it, and writes nothing. The holder is a real second process.
    import subprocess
    import sys

    model_dir = tmp_path / "eval"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from xlmeta_jax.pretrain import run_dir\n"
         "lock = run_dir.RunLock(sys.argv[1]).acquire()\n"
         "print('locked', flush=True)\n"
         "sys.stdin.read()\n", str(model_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(errors.UserError, match=rf"MODEL_DIR {model_dir} is in use by pid "
                           rf"{holder.pid}"):
            finetune(FineTuneConfig.from_kwargs(
                task="xnli", initial_checkpoint_path="init:tiny", model_dir=str(model_dir),
                vocab_path=vocab, data_dir=str(shared_data)))
        assert sorted(p.name for p in model_dir.iterdir()) == [".lock"]
    finally:
        holder.communicate("", timeout=60)


def test_an_evaluation_that_fails_on_its_inputs_leaves_no_model_dir(vocab, tmp_path):
    model_dir = tmp_path / "eval"
    with pytest.raises(FileNotFoundError, match="no_data"):
        finetune(FineTuneConfig.from_kwargs(
            task="xnli", initial_checkpoint_path="init:tiny", model_dir=str(model_dir),
            vocab_path=vocab, data_dir=str(tmp_path / "no_data")))
    assert not model_dir.exists()


def _random_params(cfg):
    """Random XLMRForMaskedLM params of the right tree (no XLA init compile)."""
    shapes = jax.eval_shape(
        lambda: nn.unbox(XLMRForMaskedLM(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
    )["params"]
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype), shapes)


def test_hugging_face_checkpoint_is_accepted(english_lines, tmp_path):
    hf = pytest.importorskip("xlmeta_jax.interop.hf.weights")
    # XLM-R's SentencePiece specials; fairseq ids put pad at 1.
    spm_path = vocabulary.train_sentencepiece(
        tmp_path / "spm", 500, sentences=english_lines[:3000],
        trainer_options=dict(pad_id=-1, eos_id=2, unk_id=0, bos_id=1, control_symbols=[]),
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
    params = training.init_params(model, encoder, 32, seed=0)
    assert set(params) == {"encoder", "head"}
    assert params["head"]["out_proj"]["kernel"].shape == (64, 3)
    for a, b in zip(jax.tree.leaves(params["encoder"]), jax.tree.leaves(encoder)):
        np.testing.assert_array_equal(a, b)
    bad = jax.tree.map(lambda x: x, encoder)
    bad["embeddings"]["word_embeddings"] = np.zeros((299, 64), np.float32)
    with pytest.raises(ValueError, match=r"encoder\['embeddings'\]\['word_embeddings'\] has shape"):
        training.init_params(model, bad, 32, seed=0)


def test_pretraining_checkpoint_dispatch(vocab, tmp_path, monkeypatch):
    from xlmeta_jax.pretrain import loading

    cfg = get_config("tiny", vocab_size=1024, pad_token_id=0)
    params = _random_params(cfg)
    calls = []

    def fake_load_pretrained(path):
        calls.append(path)
        return cfg, params, vocab

    monkeypatch.setattr(loading, "load_pretrained", fake_load_pretrained)
    monkeypatch.setattr(loading, "recorded_tokenizer", lambda path: None)  # written before
    (tmp_path / "run").mkdir()
    loaded = encoders.load_encoder(str(tmp_path / "run"))
    assert calls == [str(tmp_path / "run")]
    assert loaded.source == "pretraining" and loaded.tokenizer.kind == "seqio"
    assert loaded.params is params["encoder"]
    # A recorded vocabulary that does not fit the embedding table is refused.
    monkeypatch.setattr(
        loading, "load_pretrained",
        lambda path: (cfg.replace(vocab_size=500), params, vocab),
    )
    with pytest.raises(ValueError, match="has 1000 ids but the encoder"):
        encoders.load_encoder(str(tmp_path / "run"))


def test_selection_on_english_dev_and_seeds(shared_data, vocab, tmp_path, monkeypatch):
    """The parameters evaluated are those that scored best on the English selection set
    (XTREME's --save_only_best_checkpoint: strictly better, first best wins), not the
    final ones; selection runs at multiples of eval_every only (XTREME's save_steps: not
    at the last step, 13); --seeds=2 reports mean ± std over two runs."""
    # English-dev scores at steps 3, 6, 9, 12 of seed 42, then of seed 43.
    scripted = iter([50.0, 60.0, 60.0, 55.0, 10.0, 20.0, 30.0, 40.0])
    monkeypatch.setattr(type(tasks.get("pawsx")), "selection_score",
                        lambda self, scores: next(scripted))
    seen = []  # a fingerprint of the parameters behind every prediction
    predict = training.Runner.predict

    def spy(self, input_ids, batch_size):
        seen.append(float(np.asarray(jax.tree.leaves(self.params)[0]).sum()))
        return predict(self, input_ids, batch_size)

    monkeypatch.setattr(training.Runner, "predict", spy)
    results = finetune(FineTuneConfig.from_kwargs(
        task="pawsx", initial_checkpoint_path="init:tiny", vocab_path=vocab,
        data_dir=str(shared_data), languages=["en", "de"], train_steps=13, batch_size=8,
        learning_rate=2e-3, warmup_steps=2, max_train_examples=96, max_eval_examples=48,
        max_seq_length=64, eval_batch_size=48, log_every=6, eval_every=3, num_seeds=2,
        model_dir=str(tmp_path),
    ))
    first, second = results["seeds"]
    assert [h["step"] for h in first["selection"]] == [3, 6, 9, 12]
    assert first["selected_step"] == 6 and second["selected_step"] == 12
    assert second["train"]["steps"] == 13
    # Seed 42: 4 selection passes, then en and de with the step-6 parameters.
    assert seen[4] == seen[5] == seen[1] and seen[4] != seen[3]
    # Seed 43 improves until its last pass: the step-12 parameters are evaluated, not
    # step 13's (which XTREME never scores).
    assert seen[10] == seen[11] == seen[9]
    # Mean and sample std over the two seeds, per language and of the average.
    assert [r["seed"] for r in results["seeds"]] == [42, 43]
    de = [r["languages"]["de"]["accuracy"] for r in results["seeds"]]
    assert results["languages"]["de"]["accuracy"] == pytest.approx(np.mean(de))
    assert results["languages"]["de"]["accuracy_std"] == pytest.approx(np.std(de, ddof=1))
    averages = [r["average"] for r in results["seeds"]]
    assert results["average"] == pytest.approx(np.mean(averages))
    assert results["average_std"] == pytest.approx(np.std(averages, ddof=1))
    assert "±" in format_table(results)
    assert results["settings"]["num_seeds"] == 2


def test_optimizer_constants_and_schedule_are_hugging_faces():
    # A warm-up longer than training (XTREME's QA recipe on a small set) never peaks.
    sched = training.hf_linear_schedule(1e-3, warmup_steps=500, total_steps=100)
    assert float(sched(0)) == 0.0 and float(sched(99)) == pytest.approx(1e-3 * 99 / 500)
    sched = training.hf_linear_schedule(1e-3, warmup_steps=10, total_steps=110)
    assert float(sched(10)) == pytest.approx(1e-3) and float(sched(60)) == pytest.approx(5e-4)
    # run_tag.py steps the scheduler first: its first update uses the rate of step 1.
    tagging = training.hf_linear_schedule(1e-3, 0, 100, offset=1)
    assert float(tagging(0)) == pytest.approx(1e-3 * 99 / 100)
    # beta2 / epsilon reach the update (a gin binding changes the numbers).
    grads = {"w": jnp.array([1e-3, -2.0])}
    params = {"w": jnp.zeros(2)}

    def update(b2, eps):
        tx = training.make_finetune_optimizer(
            learning_rate=1.0, warmup_steps=0, total_steps=10, weight_decay=0.0, b1=0.9,
            b2=b2, eps=eps, max_grad_norm=0.0)
        state = tx.init(params)
        _, state = tx.update(grads, state, params)  # b2 shows from the second step on
        return np.asarray(tx.update({"w": grads["w"][::-1]}, state, params)[0]["w"])

    assert not np.allclose(update(0.999, 1e-8), update(0.98, 1e-8))
    assert not np.allclose(update(0.999, 1e-8), update(0.999, 1e-3))


def test_xnli_large_encoder_uses_xtreme_large_learning_rate():
    """train_xnli.sh: LR=3e-5 for xlm-roberta-large (24 layers), 2e-5 otherwise."""
    import gin

    from xlmeta_jax.cli import flags as gin_cli

    gin_cli.apply_gin(["finetune/xnli.gin"], [
        "MODEL_DIR = '/tmp/unused_model_dir'", "INITIAL_CHECKPOINT_PATH = '/tmp/unused_ckpt'",
    ], finalize=False)
    s = settings.FineTuneSettings(
        learning_rate=gin.query_parameter("finetune.learning_rate"),
        large_learning_rate=gin.query_parameter("finetune.large_learning_rate"),
    )
    assert settings.settings_for_encoder(s, 12).learning_rate == 2e-5
    assert settings.settings_for_encoder(s, 24).learning_rate == 3e-5
    # Tasks whose scripts keep one rate leave it unset: large trains at `learning_rate`.
    plain = settings.FineTuneSettings(learning_rate=2e-5)
    assert settings.settings_for_encoder(plain, 24).learning_rate == 2e-5
