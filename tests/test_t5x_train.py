"""`python -m t5x.train` with gin/meta.gin end to end, on real text and the tiny model:
phase 1 sharded on a (data=4, model=2) mesh, interrupted and resumed, against an
uninterrupted single-device run; phase 2 from phase 1's final parameters; the t5x
checkpoint through our fine-tuning command and the Hugging Face export."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from t5x_toy import corpus_flags, require_t5x, write_corpus

require_t5x()

pytestmark = pytest.mark.extras

from xlmeta_jax.interop.t5x import phases as t5x_phases  # noqa: E402
from xlmeta_jax.model import network  # noqa: E402
from xlmeta_jax.pretrain import loading  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
META_GIN = "gin/meta.gin"
META_STEPS, XLING_STEPS = 4, 2


def _command(model_dir, corpus, *extra):
    return [
        sys.executable, "-m", "t5x.train",
        f"--gin_file={META_GIN}", "--gin_file=gin/models/tiny.gin",
        "--gin_file=gin/t5x/mesh.gin",
        f"--gin.MODEL_DIR='{model_dir}'", *corpus_flags(corpus),
        f"--gin.META_STEPS={META_STEPS}", f"--gin.XLING_STEPS={XLING_STEPS}",
        "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.WARMUP_STEPS=2",
        "--gin.CHECKPOINT_EVERY=2", "--gin.LOG_EVERY=1", *extra,
    ]


def _start(cmd, devices, log):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # The tiny model compiles far longer than it runs.
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"
    out = open(log, "w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT), log


def _wait(started):
    proc, log = started
    proc.wait(timeout=900)
    text = pathlib.Path(log).read_text()
    assert proc.returncode == 0, text[-6000:]
    return text


def _run_both_phases(shared_data, root):
    """The four t5x.train runs every check below reads."""
    corpus = write_corpus(shared_data, str(root / "corpus"))
    single, sharded = root / "single", root / "sharded"
    logs = {}
    # Phase 1 on one device, uninterrupted; alongside, on a 4 x 2 mesh, stopped after step 2.
    a = _start(_command(single, corpus, "--gin.MESH_SHAPE=(1, 1)"), 1, root / "single.log")
    b = _start(_command(sharded, corpus, "--gin.MESH_SHAPE=(4, 2)",
                        "--gin.train.total_steps=2"), 8, root / "stopped.log")
    logs["single"], logs["stopped"] = _wait(a), _wait(b)
    # The same command again resumes from checkpoint_2 and finishes phase 1 ...
    logs["resumed"] = _wait(_start(_command(sharded, corpus, "--gin.MESH_SHAPE=(4, 2)"), 8,
                                   root / "resumed.log"))
    # ... and with --gin.PHASE=2 trains phase 2 from phase 1's final parameters.
    logs["phase2"] = _wait(_start(_command(sharded, corpus, "--gin.MESH_SHAPE=(4, 2)",
                                           "--gin.PHASE=2"), 8, root / "phase2.log"))
    return {"single": single, "sharded": sharded, "corpus": corpus, "logs": logs}


def _t5x_state(step_dir):
    """The whole t5x state dict of a checkpoint (target, optimizer state, step) on host."""
    import orbax.checkpoint as ocp

    return ocp.PyTreeCheckpointer().restore(os.fspath(step_dir / "state"))


def _train_metrics(log, name):
    """{step: value} of one train metric (loss, acc, lr) from the progress lines."""
    pattern = re.compile(rf"\] step (\d+)/\d+ .*?\| {re.escape(name)} ([-0-9.e]+|nan) ")
    return {int(s): float(v) for s, v in pattern.findall(log)}


def _check_logs_are_quiet(runs):
    # t5x's INFO log (the gin dump, its metrics lines) stays off the terminal; what is left of
    # python -m t5x.train's own is TensorFlow's start-up (xlmeta_jax.t5x_train drops it too).
    for name, log in runs["logs"].items():
        assert len(log.splitlines()) <= 40, (name, log)
        for noise in ("Gin Configuration", "collection=train", "deprecated", "Traceback"):
            assert noise not in log, (name, noise, log)


def _check_phase1_writes_t5x_layout(runs):
    phase1 = runs["sharded"] / "phase1"
    assert t5x_phases.checkpoint_steps(phase1) == [0, 2, 4]
    for step in (2, 4):
        assert {p.name for p in (phase1 / f"checkpoint_{step}").iterdir()} >= {"state", "dataset"}
    assert (phase1 / "config.gin").is_file() and (phase1 / "model-info.txt").is_file()
    assert list((phase1 / "train").glob("events.out.tfevents.*"))
    info = json.loads((phase1 / t5x_phases.MODEL_INFO).read_text())
    assert info["task"] == "xlmeta_english_text" and info["phase"] == 1
    assert info["model_config"]["hidden_size"] == 64
    assert info["vocab_path"] == runs["corpus"]["vocab"]
    losses = _train_metrics(runs["logs"]["single"], "loss")
    assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))


def _check_interrupted_sharded_run_resumes_to_the_single_device_result(runs):
    assert "[phase1] 2 steps on 8 x cpu: compiling" in runs["logs"]["stopped"]
    assert "[phase1] resuming from step 2/4 on 8 x cpu" in runs["logs"]["resumed"]
    single = _t5x_state(runs["single"] / "phase1" / "checkpoint_4")
    sharded = _t5x_state(runs["sharded"] / "phase1" / "checkpoint_4")
    flat_single = jax.tree_util.tree_leaves_with_path(single)
    flat_sharded = jax.tree.leaves(sharded)
    assert len(flat_single) == len(flat_sharded)
    for (path, x), y in zip(flat_single, flat_sharded):
        # Reduction order differs between 1 and 8 devices; nothing else does.
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
    # Steps 3 and 4 of the resumed run saw the batches the uninterrupted run saw.
    resumed = _train_metrics(runs["logs"]["resumed"], "loss")
    single_losses = _train_metrics(runs["logs"]["single"], "loss")
    assert resumed[3] == pytest.approx(single_losses[3], rel=1e-4)
    assert resumed[4] == pytest.approx(single_losses[4], rel=1e-4)


def _check_phase2_starts_from_phase1_final_params_with_fresh_optimizer(runs):
    phase1_end = _t5x_state(runs["sharded"] / "phase1" / f"checkpoint_{META_STEPS}")
    phase2_start = _t5x_state(runs["sharded"] / "phase2" / "checkpoint_0")
    a = jax.tree_util.tree_leaves_with_path(phase1_end["target"])
    b = jax.tree.leaves(phase2_start["target"])
    assert len(a) == len(b)
    for (path, x), y in zip(a, b):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
    assert int(phase1_end["state"]["step"]) == META_STEPS
    assert int(phase2_start["state"]["step"]) == 0
    moments = jax.tree.leaves(phase2_start["state"]["param_states"])
    assert moments and all(not np.any(m) for m in moments)
    assert t5x_phases.checkpoint_steps(runs["sharded"] / "phase2") == [0, 2]
    # A fresh schedule: warm-up from 0 again.
    lr = _train_metrics(runs["logs"]["phase2"], "lr")
    assert lr[1] == 0.0 and lr[2] > 0.0
    info = json.loads((runs["sharded"] / "phase2" / t5x_phases.MODEL_INFO).read_text())
    assert info["task"] == "xlmeta_cc100" and info["phase"] == 2


def test_phase2_before_phase1_names_the_missing_checkpoint(tmp_path):
    from xlmeta_jax.data.corpora import Corpora
    from xlmeta_jax.interop.t5x import stages
    from xlmeta_jax.model.optimizer import OptimizerConfig
    from xlmeta_jax.pretrain.phases import Phase

    phases = [Phase("phase1", "xlmeta_english_text", num_steps=4, batch_size=8,
                    sequence_length=64, optimizer=OptimizerConfig(total_steps=4, warmup_steps=1)),
              Phase("phase2", "xlmeta_cc100", num_steps=6, batch_size=8, sequence_length=64,
                    optimizer=OptimizerConfig(total_steps=6, warmup_steps=1), init_from="phase1",
                    reset_optimizer=True, reset_schedule=True)]

    def stage(phase):
        return stages.of_run(phases, phase, str(tmp_path), network.get_config("tiny"),
                             Corpora())

    with pytest.raises(t5x_phases.PhaseError, match=r"phase1/checkpoint_4, which does not exist"):
        stages.init_from(stage(2))
    for bad in (3, 0, True):
        with pytest.raises(t5x_phases.PhaseError, match=f"PHASE={bad}"):
            stage(bad)
    assert stages.init_from(stage(1)) is None
    (tmp_path / "phase1" / "checkpoint_4").mkdir(parents=True)
    assert stages.init_from(stage(2)) == str(tmp_path / "phase1" / "checkpoint_4")


def test_t5x_run_dirs_are_read_as_a_shell_would(tmp_path, monkeypatch):
    # MODEL_DIR='~/runs/meta' is the home folder's, for t5x's run too (t5x's own gfile
    # would take the '~' as a folder name).
    monkeypatch.setenv("HOME", str(tmp_path))
    assert t5x_phases.run_dir("~/runs/meta") == str(tmp_path / "runs" / "meta")
    assert t5x_phases.run_dir("$HOME/runs/xlmr") == str(tmp_path / "runs" / "xlmr")


def _check_t5x_checkpoint_fine_tunes_and_exports(runs, shared_data, tmp_path):
    import gin

    from xlmeta_jax.cli import finetune as finetune_cli
    from xlmeta_jax.interop.hf import convert as hf

    model_dir = runs["sharded"]
    cfg, params, vocab_path = loading.load_pretrained(model_dir)
    assert cfg.hidden_size == 64 and vocab_path == runs["corpus"]["vocab"]
    final = _t5x_state(model_dir / "phase2" / f"checkpoint_{XLING_STEPS}")["target"]
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(final)):
        np.testing.assert_array_equal(x, y)

    gin.clear_config()
    results = finetune_cli.main([
        "--gin_file=finetune/xnli.gin",
        "--gin_file=finetune/demo.gin",
        f"--gin.INITIAL_CHECKPOINT_PATH='{model_dir}'",
        f"--gin.MODEL_DIR='{tmp_path / 'xnli'}'",
        f"--gin.DATA_DIR='{shared_data}'",
        "--gin.finetune.train_steps=4",
        "--gin.finetune.max_train_examples=64",
        "--gin.finetune.max_eval_examples=8",
        "--gin.finetune.eval_every=4",
        "--gin.finetune.languages=['en', 'de', 'sw']",
    ])
    gin.clear_config()
    assert set(results["languages"]) == {"en", "de", "sw"}
    assert results["train"]["steps"] == 4

    out = hf.to_hf(os.fspath(model_dir), os.fspath(tmp_path / "hf"))
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 64


@pytest.mark.slow
def test_meta_pretraining_under_t5x_end_to_end(shared_data, tmp_path):
    """One test (pytest-xdist would run a shared module fixture once per worker)."""
    runs = _run_both_phases(shared_data, tmp_path / "runs")
    _check_logs_are_quiet(runs)
    _check_phase1_writes_t5x_layout(runs)
    _check_interrupted_sharded_run_resumes_to_the_single_device_result(runs)
    _check_phase2_starts_from_phase1_final_params_with_fresh_optimizer(runs)
    _check_t5x_checkpoint_fine_tunes_and_exports(runs, shared_data, tmp_path / "finetune")
