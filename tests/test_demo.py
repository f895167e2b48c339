"""README's demo (gin/demo.gin) end to end, shortened: corpus from installed packages,
vocabulary, the real seqio pipeline, phase 1 then phase 2, and the fine-tuning handoff;
then gin/demo_modernbert.gin on the same data and its Hugging Face export; and
gin/demo_mmbert.gin (every stage of mmBERT's recipe, the merge, the export) on the toy corpus."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from xlmeta_jax.pretrain import loading

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]

MMBERT = "xlmeta_jax.pretrain.recipes.mmbert"


def test_demos_run_both_phases_hand_off_and_export(demo_run, tmp_path):
    """gin/demo.gin on the session's demo corpus and vocabulary (what its first run writes,
    the conftest fixture: the run reuses them), then gin/demo_modernbert.gin on the same."""
    model_dir = pathlib.Path(demo_run["model_dir"])
    stdout, stderr = demo_run["stdout"], demo_run["stderr"]
    # TensorFlow, imported when the first pipeline is built, without its start-up lines.
    assert stderr.strip() == "", stderr[-4000:]
    assert "[phase1] step 6/6" in stdout and "[phase2] step 6/6" in stdout
    assert f"[phase2] initialised from {model_dir}/phase1/6" in stdout
    assert f"tensorboard --logdir {model_dir}" in stdout

    data = model_dir / "demo_data"
    assert sorted(p.name for p in (data / "xling").iterdir())[:3] == ["ar.txt", "bg.txt", "de.txt"]
    assert (data / "spm.model").is_file()
    summary = json.loads((model_dir / "summary.json").read_text())
    assert [p["phase"] for p in summary["phases"]] == ["phase1", "phase2"]
    assert [p["task"] for p in summary["phases"]] == ["xlmeta_english_text", "xlmeta_cc100"]

    # What fine-tuning loads: phase 2's final params, its config and the demo vocabulary.
    cfg, params, vocab_path = loading.load_pretrained(model_dir)
    assert vocab_path == os.fspath(data / "spm.model")
    assert cfg.vocab_size == 2000 and cfg.pad_token_id == 0
    assert params["encoder"]["embeddings"]["word_embeddings"].shape == (2000, cfg.hidden_size)
    # A rerun of a finished run (both phases complete, nothing trained):
    # tests/test_errors_cli.py::test_rerun_of_finished_run_is_quiet_and_changes_nothing.

    # The ModernBERT demo on the same corpus and vocabulary (preparing them is most of a
    # demo's time on CPU, and the same code as above).
    _modernbert_demo(tmp_path, data)


def test_a_demo_whose_data_paths_are_all_overridden_builds_nothing(tmp_path):
    from xlmeta_jax.data import demo_corpus

    elsewhere = [os.fspath(tmp_path / "spm.model"), os.fspath(tmp_path / "xling"),
                 [os.fspath(tmp_path / "en" / "*.txt")]]
    assert demo_corpus.prepare_demo(os.fspath(tmp_path / "run"), paths=elsewhere) is None
    assert not (tmp_path / "run").exists()


def _modernbert_demo(tmp_path, data):
    """gin/demo_modernbert.gin: both phases with the ModernBERT family on rows packed from
    whole documents (on ``data``, the XLM-R demo's corpus and vocabulary, which the same
    code prepared there), then its HF export, which transformers' Auto classes load as a
    ModernBertForMaskedLM with its tokenizer."""
    transformers = pytest.importorskip("transformers")
    from xlmeta_jax.interop.hf import convert

    model_dir = tmp_path / "demo_modernbert"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               JAX_DISABLE_MOST_OPTIMIZATIONS="true")
    cmd = [
        sys.executable, "-m", "xlmeta_jax.train", "--gin_file=gin/demo_modernbert.gin",
        f"--gin.MODEL_DIR='{model_dir}'", "--gin.META_STEPS=2", "--gin.XLING_STEPS=2",
        "--gin.WARMUP_STEPS=1", "--gin.xlmeta_jax.pretrain.trainer.train.log_every=2",
        f"--gin.VOCAB_PATH='{data / 'spm.model'}'", f"--gin.CC100_DIR='{data / 'xling'}'",
        f"--gin.ENGLISH_FILES=['{data / 'english' / '*.txt'}']",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "[phase1] step 2/2" in out.stdout and "[phase2] step 2/2" in out.stdout
    assert f"[phase2] initialised from {model_dir}/phase1/2" in out.stdout
    # Rows packed from whole documents, the padding share logged per phase.
    for phase in ("phase1", "phase2"):
        assert f"[{phase}] packing: " in out.stdout and "% of tokens are text" in out.stdout
    cfg, _, _ = loading.load_pretrained(model_dir)
    assert (cfg.family, cfg.num_layers, cfg.vocab_size) == ("modernbert", 4, 2000)

    said = []
    folder = convert.to_hf(os.fspath(model_dir), os.fspath(tmp_path / "hf"), report=said.append)
    assert len(said) == 1 and said[0].startswith("parity: max |logits - transformers'"), said
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    # Its logits against ours, tokenised by AutoTokenizer: tests/test_hf_modernbert.py.
    tokens = transformers.AutoTokenizer.from_pretrained(folder)("All human beings are free.")
    assert tokens["input_ids"][0] == 0 and tokens["input_ids"][-1] == 2  # XLM-R's <s>, </s>


def test_mmbert_demo_runs_every_stage_merges_and_exports(toy_cc100, tmp_path):
    """gin/demo_mmbert.gin, in fewer tokens: the English stage, the batch ramp, base, ext at
    twice the length with RoPE base 160k, two decay branches, their TIES merge (the run's
    product), its HF export, and a rerun that finds the run complete. On the session's toy
    CC-100 folder and its 2000-piece vocabulary (a copy: the run writes its statistics
    there), so it runs beside the demo test rather than after it."""
    transformers = pytest.importorskip("transformers")
    from data_toy import TOY_LANGUAGES

    from xlmeta_jax.interop.hf import convert

    data = tmp_path / "data"
    shutil.copytree(toy_cc100["cc_dir"], data / "xling")
    model_dir = tmp_path / "demo_mmbert"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               JAX_DISABLE_MOST_OPTIMIZATIONS="true")
    cmd = [
        sys.executable, "-m", "xlmeta_jax.train", "--gin_file=gin/demo_mmbert.gin",
        f"--gin.MODEL_DIR='{model_dir}'", "--gin.ENGLISH_TOKENS=2048",
        "--gin.BASE_TOKENS=2048", "--gin.EXT_TOKENS=4096", "--gin.DECAY_TOKENS=2048",
        "--gin.CHECKPOINT_TOKENS=2048",
        # The recipe's other settings, bound by name (gin/native/mmbert.gin's header).
        f"--gin.{MMBERT}.ramp_tokens=512", f"--gin.{MMBERT}.warmup_tokens=256",
        f"--gin.VOCAB_PATH='{toy_cc100['vocab']}'", f"--gin.CC100_DIR='{data / 'xling'}'",
        f"--gin.ENGLISH_FILES=['{data / 'xling' / 'en.txt'}']",
        # Fewer languages than the demo's 15 and 5: each is one more seqio task to build
        # per stage (about 0.8 s of tf.data tracing each, 8 stages).
        f"--gin.CC100_LANGUAGES={list(TOY_LANGUAGES[:6])!r}",
        f"--gin.{MMBERT}.base_languages=['en', 'de', 'ru']",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    # Stages in tokens, each at its own shape; the ramp rounds 512 / (12 x 64) to 1 step.
    for line in ["[english] 2.048k tokens = 2 steps of 16 x 64",
                 "[ramp1] 512 tokens = 2 steps of 4 x 64",
                 "[ramp3] 512 tokens = 1 step of 12 x 64 (rounded to whole steps: 768 tokens,",
                 "[ext] 4.096k tokens = 2 steps of 16 x 128",
                 "[decay_all] 2.048k tokens = 1 step of 16 x 128",
                 # Tokens seen along each branch's chain: english, ramp, base, ext, decay.
                 "[decay_cont] step 1/1 | 12.03k tokens | loss",
                 "[decay_all] initialised from " + os.fspath(model_dir / "ext" / "2"),
                 "[ramp1] initialised from " + os.fspath(model_dir / "english" / "2")
                 + " (reset_optimizer=True, reset_schedule=True)",
                 "[merged] merging decay_cont, decay_all (ties against ext)"]:
        assert line in out.stdout, line
    for stage, length in (("base", 64), ("ext", 128)):
        assert f"[{stage}] packing: " in out.stdout and f"in {length}-token rows" in out.stdout
    # The merged model is the run's product, with ext's RoPE bases.
    cfg, _, _ = loading.load_pretrained(model_dir)
    assert loading.find_step_dir(model_dir) == model_dir / "merged" / "0"
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (160000.0, 160000.0)
    folder = convert.to_hf(os.fspath(model_dir), os.fspath(tmp_path / "mmbert_hf"),
                           report=lambda _: None)
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    assert model.config.rope_parameters["full_attention"]["rope_theta"] == 160000.0

    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    assert "[merged] already complete at " + os.fspath(model_dir / "merged" / "0") in (
        rerun.stdout)
    assert "compiling" not in rerun.stdout
