"""README's t5x quick start (gin/t5x/demo.gin) end to end, shortened: phase 1, phase 2 from
phase 1's checkpoint, and the rerun of a finished phase, each printing a screenful at most: our
progress lines, no TensorFlow start-up lines, no gin dump, no deprecation notice, while t5x
still writes its config.gin, TensorBoard summaries and checkpoints."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from t5x_toy import require_t5x

require_t5x()

from xlmeta_jax import errors  # noqa: E402
from xlmeta_jax.interop.t5x import phases as t5x_phases  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.extras]

REPO = pathlib.Path(__file__).resolve().parents[1]
# What a quiet run never prints: TensorFlow's CUDA probe, clu's deprecation notice of the
# input pipeline's restore, t5x's INFO log (the gin dump, its metrics lines), tracebacks.
NOISE = re.compile(r"cuInit|deprecated|ERROR|Traceback|Gin Configuration|collection=train")
SCREEN = 40


def _demo(model_dir, *extra):
    cmd = [
        sys.executable, "-m", "xlmeta_jax.t5x_train", "--gin_file=gin/t5x/demo.gin",
        # Relative, as in README's command.
        f"--gin.MODEL_DIR='{os.path.relpath(model_dir, REPO)}'",
        "--gin.META_STEPS=2", "--gin.XLING_STEPS=2", "--gin.BATCH_SIZE=4",
        "--gin.SEQUENCE_LENGTH=32", "--gin.WARMUP_STEPS=1", "--gin.CHECKPOINT_EVERY=2",
        "--gin.LOG_EVERY=1", *extra,
    ]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # The tiny model compiles far longer than it runs.
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"
    # As from a shell: no debug, and TensorFlow's log level left to the command (conftest
    # sets one for the tests' own process).
    env.pop(errors.DEBUG_ENV, None)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    out = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=900)
    return out.returncode, out.stdout


def _assert_quiet(text):
    lines = text.splitlines()
    assert len(lines) <= SCREEN, text
    assert not [line for line in lines if NOISE.search(line)], text


def test_t5x_quick_start_runs_both_phases_on_one_screen(demo_data, tmp_path):
    model_dir = tmp_path / "t5x_demo"
    # The demo corpus and vocabulary its first run writes (the same function as
    # gin/demo.gin's, built once per session), which the run reuses.
    shutil.copytree(demo_data, model_dir / "demo_data")
    rc, text = _demo(model_dir)
    assert rc == 0, text[-6000:]
    _assert_quiet(text)
    assert "[phase1] 2 steps on 1 x cpu: compiling the train step" in text
    assert re.search(r"\[phase1\] step 2/2 \| loss [0-9.]+ \| acc ", text), text
    assert f"[phase1] done at step 2: {model_dir}/phase1" in text

    rc, text = _demo(model_dir, "--gin.PHASE=2")
    assert rc == 0, text[-6000:]
    _assert_quiet(text)
    assert f"parameters from {model_dir}/phase1/checkpoint_2; fresh optimizer state" in text
    assert re.search(r"\[phase2\] step 1/2 \| loss [0-9.]+ \| acc [0-9.]+ \| lr 0 \|", text)
    assert "[phase2] step 2/2" in text

    # A finished phase restores its last checkpoint (and input pipeline) and stops.
    rc, text = _demo(model_dir, "--gin.PHASE=2")
    assert rc == 0, text[-6000:]
    _assert_quiet(text)
    assert f"[phase2] already complete at step 2 ({model_dir}/phase2)" in text
    assert "step 1/2" not in text

    # What t5x writes is unchanged: its config, summaries and checkpoints.
    for phase in ("phase1", "phase2"):
        assert "MODEL_DIR" in (model_dir / phase / "config.gin").read_text()
        assert list((model_dir / phase / "train").glob("events.out.tfevents.*"))
        assert t5x_phases.checkpoint_steps(model_dir / phase)[-1] == 2
