"""A pod's start on a prepared folder, and resumes on another process count.

* Two processes of ``python -m xlmeta_jax.train`` on a folder written by
  ``python -m xlmeta_jax.data.prepare`` start without counting anything; on a copy of
  the same shards without the statistics they stop at once with one line naming the
  command and ``CC100_COUNTS`` (one process counts, and says so).
* A phase checkpointed by 2 processes resumes on 1, and one checkpointed by 1 on 2,
  with ``train.new_process_count='reseed'`` (parameters and optimizer state restored,
  the streams restarted from a logged seed); without it the refusal is one line.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from multihost import env, run_two

pytest.importorskip("apache_beam")
pytest.importorskip("seqio")

from xlmeta_jax.data import prepare, prepared  # noqa: E402
from xlmeta_jax.pretrain import checkpoints  # noqa: E402

LANGUAGES = ("en", "de", "sw")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN_GIN = """
import xlmeta_jax.pretrain.trainer
include 'pretrain.gin'
include 'native/run.gin'
include 'data/cc100.gin'
MODEL_DIR = %gin.REQUIRED
xlmeta_jax.pretrain.trainer.train.checkpoint_every = 1
xlmeta_jax.pretrain.trainer.train.keep_checkpoints = None
xlmeta_jax.pretrain.trainer.train.log_every = 1
xlmeta_jax.pretrain.trainer.train.phases = [@xlmeta_jax.pretrain.trainer.Phase()]
xlmeta_jax.pretrain.trainer.Phase.name = 'xlmr'
xlmeta_jax.pretrain.trainer.Phase.task = 'xlmeta_cc100'
xlmeta_jax.pretrain.trainer.Phase.num_steps = 4
xlmeta_jax.pretrain.trainer.Phase.batch_size = 16
xlmeta_jax.pretrain.trainer.Phase.sequence_length = 32
LEARNING_RATE = 1e-3
WARMUP_STEPS = 2
"""


@pytest.fixture(scope="module")
def pod(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("pod")
    inputs = root / "xz"
    inputs.mkdir()
    source = os.path.join(shared_data, "leipzig_sentences", "sentences")
    for lang in LANGUAGES:
        with open(os.path.join(source, f"{lang}.txt"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()][:400]
        text = "".join("\n".join(lines[i:i + 4]) + "\n\n" for i in range(0, len(lines), 4))
        (inputs / f"{lang}.txt.xz").write_bytes(lzma.compress(text.encode()))
    out = root / "cc100"
    assert prepare.main([f"--input={inputs}/*", f"--output={out}", "--shard_bytes=15000",
                         "--vocab_sample_lines=900"]) == 0
    from xlmeta_jax.data import vocabulary

    vocab = vocabulary.train_vocabulary(None, str(root / "spm" / "v"), 600, num_threads=2,
                                        print_report=False, prepared_dir=str(out))
    gin_path = root / "run.gin"
    gin_path.write_text(RUN_GIN)
    return {"root": root, "out": out, "vocab": vocab, "gin": gin_path}


def _cmd(pod, model_dir, cc100_dir=None, *extra):
    return [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=models/tiny.gin",
            f"--gin_file={pod['gin']}", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.VOCAB_PATH='{pod['vocab']}'",
            f"--gin.CC100_DIR='{cc100_dir or pod['out']}'",
            f"--gin.CC100_LANGUAGES={list(LANGUAGES)!r}", *extra]


def _one(cmd):
    done = subprocess.run(cmd, env=env(8), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    return done.returncode, done.stdout + done.stderr


def _unfinished(model_dir, at=3):
    """The run as a preemption after step ``at`` leaves it: the later checkpoints gone."""
    for step in range(at + 1, 5):
        shutil.rmtree(model_dir / "xlmr" / str(step))
    os.remove(model_dir / "summary.json")


@pytest.mark.slow
def test_pod_start_reads_prepared_statistics_and_resumes_on_another_process_count(
        pod, tmp_path):
    # One test: the two-process run on the prepared folder is also the run that resumes
    # on one process below (pytest-xdist would build a shared fixture once per worker).
    run = tmp_path / "two_to_one"
    codes, outs = run_two(_cmd(pod, run), salt=401)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "[xlmr] step 4/4" in outs[0]
    assert not any("counting" in out for out in outs), outs[0][-3000:]
    # The same shards without the statistics: no host counts, one line says what to do.
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in pod["out"].glob("*.txt-*.gz"):
        shutil.copy(path, bare)
    codes, outs = run_two(_cmd(pod, tmp_path / "bare_run", bare), salt=409, expected=(2, 2))
    assert codes == [2, 2], outs[0][-3000:]
    for out in outs:
        errors_ = [line for line in out.splitlines() if "error:" in line]
        assert len(errors_) == 1 and "Traceback" not in out, out[-3000:]
        assert "python -m xlmeta_jax.data.prepare" in errors_[0]
        assert "CC100_COUNTS" in errors_[0]
    assert not (bare / prepared.STATS_FILENAME).exists()
    # One process still counts (and says so).
    code, out = _one(_cmd(pod, tmp_path / "one_run", bare,
                          "--gin.xlmeta_jax.pretrain.trainer.Phase.num_steps=1"))
    assert code == 0 and "counting" in out, out[-3000:]

    reseed = "--gin.train.new_process_count='reseed'"
    # 2 -> 1: preempted after step 2.
    _unfinished(run, at=2)
    at_2 = checkpoints.restore_params(run / "xlmr" / "2")
    code, out = _one(_cmd(pod, run))
    lines = [line for line in out.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1 and "new_process_count" in lines[0], out[-3000:]
    assert "written by 2 processes, this run has 1" in lines[0]
    assert not (run / "xlmr" / "3").exists()
    code, out = _one(_cmd(pod, run, None, reseed))
    assert code == 0, out[-3000:]
    assert "restarts from seed" in out and "[xlmr] step 4/4" in out
    meta = checkpoints.read_meta(run / "xlmr" / "4")
    assert meta["process_count"] == 1 and meta["stream_seed"] != meta["data_seed"]
    # It continued from step 2's parameters (not a fresh start): step 3's update is small.
    after = checkpoints.restore_params(run / "xlmr" / "4")
    moved = [np.abs(np.asarray(a) - np.asarray(b)).max()
             for a, b in zip(_leaves(at_2), _leaves(after))]
    assert 0 < max(moved) < 1.0
    # 1 -> 2: the same run preempted after step 3, which the one process wrote.
    assert checkpoints.read_meta(run / "xlmr" / "3")["process_count"] == 1
    _unfinished(run, at=3)
    codes, outs = run_two(_cmd(pod, run), salt=431, expected=(2, 2))
    assert codes == [2, 2] and "written by 1 process, this run has 2" in outs[0]
    codes, outs = run_two(_cmd(pod, run, None, reseed), salt=437)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "restarts from seed" in outs[0] and "[xlmr] step 4/4" in outs[0]
    assert checkpoints.read_meta(run / "xlmr" / "4")["process_count"] == 2


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.slow
def test_a_run_on_the_prepared_token_cache_resumes_exactly(pod, tmp_path):
    """The cache added to a prepared folder (the vocabulary trained on its sample), then a
    run reading it (found in CC100_DIR/cache)."""
    out = tmp_path / "cc100"
    shutil.copytree(pod["out"], out)
    shards = sorted(p.name for p in out.glob("*.txt-*"))
    assert prepare.main([f"--output={out}", "--tokenize", f"--vocab={pod['vocab']}"]) == 0
    assert sorted(p.name for p in out.glob("*.txt-*")) == shards
    assert sorted(p.name for p in (out / prepared.CACHE_DIR).iterdir()) == [
        f"xlmeta_cc100_{lang}" for lang in sorted(LANGUAGES)]
    cached = "--gin.xlmeta_jax.pretrain.trainer.Phase.use_cached=True"
    run = tmp_path / "run"
    code, log = _one(_cmd(pod, run, out, cached))
    assert code == 0 and "[xlmr] step 4/4" in log, log[-3000:]
    assert "tokens from the offline cache" in log and "counting" not in log
    assert checkpoints.read_meta(run / "xlmr" / "4")["use_cached"] is True
    whole = _leaves(checkpoints.restore_params(run / "xlmr" / "4"))
    _unfinished(run)
    # The stream's saved state is the cache reader's: the text reader cannot take it.
    code, log = _one(_cmd(pod, run, out))
    lines = [line for line in log.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in log, log[-3000:]
    assert "was trained reading the offline token cache (use_cached=True)" in lines[0]
    code, log = _one(_cmd(pod, run, out, cached))
    assert code == 0 and "resuming from" in log, log[-3000:]
    for a, b in zip(whole, _leaves(checkpoints.restore_params(run / "xlmr" / "4"))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
