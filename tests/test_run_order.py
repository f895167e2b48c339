"""The trainer takes MODEL_DIR and runs every check that needs no data before it prepares
or reads any: a second start on the same MODEL_DIR and a bad setting are refused before
the demo's corpus is built, without touching the corpus another start is building."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import gin
import pytest
from errors_fixtures import train_argv, write_gin

from xlmeta_jax import errors
from xlmeta_jax.cli import runs
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.pretrain import trainer

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def prepared(monkeypatch):
    """Records every data preparation the trainer asks for (none should happen here)."""
    calls = []
    monkeypatch.setattr(runs, "prepare_data", lambda: calls.append("prepare"))
    monkeypatch.chdir(REPO)
    gin.clear_config()
    yield calls
    gin.clear_config()


def test_config_error_comes_before_any_corpus_work(tmp_path, prepared, capsys):
    model_dir = tmp_path / "demo"
    code = errors.run_command(train_cli.main, [
        "--gin_file=gin/demo.gin", f"--gin.MODEL_DIR='{model_dir}'",
        "--gin.SEQUENCE_LENGTH=1000"], prog="xlmeta_jax.train")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == errors.EXIT_USER_ERROR, err
    assert err[-1].startswith(
        "xlmeta_jax.train: error: phase 'phase1': sequence_length (SEQUENCE_LENGTH) = 1000 "
        "exceeds the model's")
    assert prepared == []
    assert not model_dir.exists()


def _start(model_dir, log):
    cmd = [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=gin/demo.gin",
           f"--gin.MODEL_DIR='{model_dir}'"]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=os.fspath(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(errors.DEBUG_ENV, None)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _building(model_dir) -> list[pathlib.Path]:
    """The demo corpus's temporary build folders (files.built_whole) in MODEL_DIR."""
    return sorted(model_dir.glob(".demo_data.*")) if model_dir.is_dir() else []


@pytest.mark.slow
def test_second_start_is_refused_while_the_first_builds_the_corpus(tmp_path):
    model_dir = tmp_path / "demo"
    with open(tmp_path / "first.log", "w") as log:
        first = _start(model_dir, log)
    try:
        deadline = time.monotonic() + 300
        while not _building(model_dir):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first start never began the corpus"
            time.sleep(0.2)
        [build] = _building(model_dir)
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=gin/demo.gin",
             f"--gin.MODEL_DIR='{model_dir}'"], cwd=REPO, capture_output=True, text=True,
            env=dict(os.environ, PYTHONPATH=os.fspath(REPO)), timeout=300)
        refused_after = time.monotonic() - started
        assert second.returncode == errors.EXIT_USER_ERROR, second.stderr[-3000:]
        lines = [ln for ln in second.stderr.splitlines() if ln.startswith("xlmeta_jax.")]
        assert len(lines) == 1 and lines[0].startswith(
            f"xlmeta_jax.train: error: MODEL_DIR {model_dir} is in use by pid {first.pid} "), (
            second.stderr[-3000:])
        # The first start is still building its own copy; the second wrote nothing.
        assert first.poll() is None and build.is_dir()
        assert _building(model_dir) == [build] and not (model_dir / "demo_data").exists()
        # Start-up and the lock only (no corpus: that takes the first start ~100 s).
        assert refused_after < 60, refused_after
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=300)
    # Interrupted, the first start leaves no half-built corpus behind.
    assert not _building(model_dir) and not (model_dir / "demo_data").exists()


def test_ctrl_c_before_the_first_step_stops_at_once(tmp_path, capsys, monkeypatch):
    """Before the first step there is nothing to save: a Ctrl-C while the input pipelines
    are built stops the run there, in one line, before anything compiles or is saved."""
    build = trainer._make_iterator

    def interrupted_build(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C while seqio builds a pipeline
        return build(*args, **kwargs)

    monkeypatch.setattr(trainer, "_make_iterator", interrupted_build)
    model_dir = tmp_path / "run"
    gin.clear_config()
    code = errors.run_command(train_cli.main, train_argv(write_gin(tmp_path), model_dir),
                              prog="xlmeta_jax.train")
    gin.clear_config()
    captured = capsys.readouterr()
    assert code == errors.EXIT_INTERRUPTED, captured.err
    assert captured.err.splitlines() == [
        "xlmeta_jax.train: SIGINT before training started: nothing was trained in this run; "
        "rerunning the same command starts where this one would have"], captured.err
    assert "compiling the train step" not in captured.out
    assert not list(model_dir.glob("phase*/*")), "nothing may be saved"
    # The handler is gone with the run, as after any other end of training.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
