"""`python -m t5x.train` with gin/meta.gin refuses what our trainer refuses, before t5x
builds anything: one line on stderr naming the bad setting, no traceback, exit status 2,
nothing written; a non-finite loss stops the run before it is checkpointed."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
from t5x_toy import corpus_flags, require_t5x, write_corpus

require_t5x()

pytestmark = pytest.mark.extras

from xlmeta_jax import errors  # noqa: E402
from xlmeta_jax.interop.t5x import checks as t5x_checks  # noqa: E402
from xlmeta_jax.pretrain import run_dir  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    return write_corpus(shared_data, str(tmp_path_factory.mktemp("corpus")))


def _t5x_train(model_dir, corpus, *extra, command="t5x.train"):
    cmd = [
        sys.executable, "-m", command, "--gin_file=gin/meta.gin",
        "--gin_file=gin/models/tiny.gin", f"--gin.MODEL_DIR='{model_dir}'",
        *corpus_flags(corpus), "--gin.META_STEPS=4", "--gin.XLING_STEPS=2",
        "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.WARMUP_STEPS=2", *extra,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # As from a shell (conftest sets TensorFlow's log level for the tests' own process).
    env.pop(errors.DEBUG_ENV, None)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _assert_refused(out, *parts):
    assert out.returncode == errors.EXIT_USER_ERROR, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("t5x.train: error: "), last
    for part in parts:
        assert part in last, (part, last)


@pytest.mark.parametrize("extra, parts", [
    # The toy vocabulary has 1000 pieces.
    (["--gin.xlmeta_jax.model.network.get_config.vocab_size=512"],
     ["EncoderConfig.vocab_size=512 does not cover the 1000 pieces of VOCAB_PATH"]),
    (["--gin.xlmeta_jax.model.network.get_config.pad_token_id=3"],
     ["EncoderConfig.pad_token_id=3 differs from the pad id"]),
    (["--gin.WARMUP_STEPS=10000"],
     ["WARMUP_STEPS: must be in [0, total_steps=4], got 10000"]),
    # Phase 2's corpus, checked by phase 2 (phase 1 registers only the English it reads).
    (["--gin.CC100_LANGUAGES=['en', 'af']", "--gin.PHASE=2"],
     ["CC-100 language 'af': no file matches"]),
    (["--gin.PHASE=2"], ["phase 2 starts from phase 1's final checkpoint", "--gin.PHASE=1"]),
    (["--gin.MASK_RATE=1.5"], ["MASK_RATE: masking rate must be a number in (0, 1), got 1.5"]),
    (["--gin.SEQUENCE_LENGTH=2"],
     ["sequence length (SEQUENCE_LENGTH) = 2 must be an integer of at least 8"]),
    # gin takes any NAME = VALUE as a macro: a misspelt one would train on BATCH_SIZE's default.
    (["--gin.BATCH_SIZ=4"], ["unknown gin macro 'BATCH_SIZ'", "did you mean BATCH_SIZE?"]),
    (["--gin_bindings=NOT_A_MACRO = 1"], ["unknown gin macro 'NOT_A_MACRO'"]),
])
def test_bad_setting_is_one_line_before_t5x_builds_anything(corpus, tmp_path, extra, parts):
    model_dir = tmp_path / "run"
    out = _t5x_train(model_dir, corpus, *extra)
    _assert_refused(out, *parts)
    assert not model_dir.exists()


def test_the_quiet_command_prints_the_error_line_alone(corpus, tmp_path):
    # python -m xlmeta_jax.t5x_train: t5x's command without TensorFlow's start-up lines, so
    # a setting refused before t5x builds anything is all there is on the terminal.
    out = _t5x_train(tmp_path / "run", corpus, "--gin.WARMUP_STEPS=10000",
                     command="xlmeta_jax.t5x_train")
    _assert_refused(out,
                    "WARMUP_STEPS: must be in [0, total_steps=4], got 10000")
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr


def test_model_dir_in_use_is_refused(corpus, tmp_path):
    model_dir = tmp_path / "run"
    with run_dir.RunLock(os.fspath(model_dir)):
        out = _t5x_train(model_dir, corpus)
    _assert_refused(out, f"MODEL_DIR {model_dir} is in use by pid {os.getpid()}")
    assert not (model_dir / "phase1").exists()


def _scalar(value):
    from clu import values

    return values.Scalar(value)


def test_non_finite_loss_stops_before_the_checkpoint_naming_the_step():
    action = t5x_checks.StopOnNonFiniteLoss()
    state = types.SimpleNamespace(step=np.int32(7))
    assert action.run(state, {"train": {"loss": _scalar(2.5), "accuracy": _scalar(0.1)}}) is False
    for bad in (float("nan"), float("inf")):
        with pytest.raises(t5x_checks.NonFiniteLossError, match="steps up to 7"):
            action.run(state, {"train": {"loss": _scalar(bad)}})
    assert isinstance(t5x_checks.actions()["TRAIN"][0], t5x_checks.StopOnNonFiniteLoss)
    assert errors.user_message(t5x_checks.NonFiniteLossError("x")) == "x"


def test_progress_lines_replace_t5x_info_log(tmp_path):
    """The progress action's line per LOG_EVERY; t5x's INFO records become lines or nothing."""
    import logging

    from absl import logging as absl_logging

    from xlmeta_jax import logs
    from xlmeta_jax.interop.t5x import progress as t5x_progress

    lines = []

    class _Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    keep = _Keep()
    logs.progress.addHandler(keep)
    handler = absl_logging.get_absl_handler()
    try:
        action = t5x_progress.ProgressAction(str(tmp_path / "run" / "phase1"), total_steps=40)
        quiet = t5x_progress._QUIET
        if not errors.debug_requested(()):
            assert quiet in handler.filters  # installed by the import, as run.gin's is

        def passes(level, msg, *args):
            return quiet.filter(logging.LogRecord("absl", level, "t5x", 1, msg, args, None))

        assert not passes(logging.INFO, "Gin Configuration:")
        assert not passes(logging.ERROR, "DatasetIterator.load() is deprecated. Please use "
                                         "restore().")
        assert passes(logging.WARNING, "something t5x warns about")
        assert not passes(logging.INFO, "Starting main loop over steps %d-%d", 20, 40)
        metrics = {"loss": _scalar(6.5), "accuracy": _scalar(0.25),
                   "learning_rate/current": _scalar(3e-4),
                   "timing/steps_per_second": _scalar(4.0),
                   "timing/tokens_per_second": _scalar(12345.0)}
        state = types.SimpleNamespace(step=np.int32(30))
        assert action.run(state, {"train": metrics}) is False
        assert not passes(logging.INFO, "Finished.")
        assert lines[0].startswith("[phase1] resuming from step 20/40 on ")
        assert lines[1] == ("[phase1] step 30/40 | loss 6.5000 | acc 0.2500 | lr 0.0003 | "
                            "12.3k tok/s | ETA 0:00:02")
        assert lines[2].startswith(f"[phase1] done at step 30: {tmp_path}/run/phase1 ")
        assert not passes(logging.WARNING, "Total training steps and checkpoint step were "
                                           "both %d, so no training will be done.", 40)
        assert lines[3] == f"[phase1] already complete at step 40 ({tmp_path}/run/phase1)"
        assert isinstance(t5x_checks.actions(action)["TRAIN"][0], t5x_progress.ProgressAction)
    finally:
        logs.progress.removeHandler(keep)


@pytest.mark.parametrize("extra, parts", [
    (["--phase=stage9"], ["--phase=stage9: the run's phases are stage1, stage2, stage3"]),
    (["--phase=stage1", "--gin.STAGE_SHARE=(1, 1, 1)"],
     ["unknown gin macro 'STAGE_SHARE'", "STAGE_SHARES"]),
    (["--phase"], ["--phase needs a phase"]),
])
def test_a_phase_of_our_run_file_refused_in_one_line(corpus, tmp_path, extra, parts):
    """``python -m xlmeta_jax.t5x_train --phase``: our run file's settings and the phase are
    refused as our trainer refuses them, one line before t5x starts, nothing written (the
    phases t5x cannot run: tests/test_t5x_gin.py's table)."""
    model_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "xlmeta_jax.t5x_train", "--gin_file=gin/native/annealed.gin",
           "--gin_file=gin/models/tiny.gin", f"--gin.MODEL_DIR='{model_dir}'",
           f"--gin.VOCAB_PATH='{corpus['vocab']}'", f"--gin.CC100_DIR='{corpus['cc100_dir']}'",
           "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", *extra]
    env = dict(os.environ, PYTHONPATH=os.fspath(REPO) + os.pathsep + os.environ.get(
        "PYTHONPATH", ""))
    env.pop(errors.DEBUG_ENV, None)
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == errors.EXIT_USER_ERROR, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m xlmeta_jax.t5x_train: error: "), \
        out.stderr[-3000:]
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert not (model_dir / "stage1").exists() and not (model_dir / "stage2").exists()
