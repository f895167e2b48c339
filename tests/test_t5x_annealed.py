"""gin/native/annealed.gin, our trainer's run file, through t5x: ``python -m
xlmeta_jax.t5x_train --phase=stageN``, one command per stage, on real text and the tiny
model: each stage reads its own languages, alpha and masking rate, starts from the whole
final state of the stage before (parameters, AdamW moments, step) and follows the one
warm-up-stable-decay schedule of the three, each setting derived from the run's Phase list."""

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
from t5x_toy import require_t5x, write_corpus

require_t5x()

pytestmark = pytest.mark.extras

from xlmeta_jax.interop.t5x import phases as t5x_phases  # noqa: E402
from xlmeta_jax.model import mlm, optimizer  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS, BATCH, LENGTH, LR, WARMUP = 2, 8, 32, 1e-3, 2
STAGES = {  # stage: (languages, alpha, mask rate)
    1: (["en", "de"], 0.7, 0.3),
    2: (["en", "de", "sw"], 0.5, 0.15),
    3: (["en", "de", "sw"], 0.3, 0.05),
}


def _stage(model_dir, corpus, phase, log, *extra):
    """``python -m xlmeta_jax.t5x_train --phase=stageN`` on gin/native/annealed.gin, the run
    file our trainer reads, with our trainer's flags (and ``extra``)."""
    languages = [langs for langs, _, _ in STAGES.values()]
    flags = [f"--gin.xlmeta_jax.pretrain.recipes.annealed.languages={languages!r}"]
    cmd = [
        sys.executable, "-m", "xlmeta_jax.t5x_train", "--gin_file=gin/native/annealed.gin",
        "--gin_file=gin/models/tiny.gin", f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.VOCAB_PATH='{corpus['vocab']}'", f"--gin.CC100_DIR='{corpus['cc100_dir']}'",
        f"--gin.CC100_LANGUAGES={corpus['languages']!r}", *flags, f"--phase=stage{phase}",
        # Equal stages of STEPS: the recipe's shares of META_STEPS + XLING_STEPS.
        f"--gin.META_STEPS={STEPS}", f"--gin.XLING_STEPS={STEPS * (len(STAGES) - 1)}",
        f"--gin.STAGE_SHARES={(1,) * len(STAGES)!r}",
        f"--gin.BATCH_SIZE={BATCH}", f"--gin.SEQUENCE_LENGTH={LENGTH}",
        f"--gin.LEARNING_RATE={LR}", f"--gin.WARMUP_STEPS={WARMUP}",
        f"--gin.xlmeta_jax.pretrain.trainer.train.checkpoint_every={STEPS}",
        "--gin.xlmeta_jax.pretrain.trainer.train.log_every=1", *extra,
    ]
    env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="true",
               XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=os.fspath(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=900, check=False)
    text = pathlib.Path(log).read_text()
    assert proc.returncode == 0, text[-6000:]
    return text


def _state(step_dir):
    import orbax.checkpoint as ocp

    return ocp.PyTreeCheckpointer().restore(os.fspath(step_dir / "state"))


def _scalars(run_dir, tag) -> dict[int, float]:
    import tensorflow as tf

    values = {}
    for path in sorted((run_dir / "train").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(os.fspath(path)):
            for v in event.summary.value:
                if v.tag == tag:
                    values[event.step] = float(tf.make_ndarray(v.tensor))
    return values


@pytest.mark.slow
def test_annealed_stages_under_t5x(shared_data, tmp_path):
    corpus = write_corpus(shared_data, str(tmp_path / "corpus"))
    run = tmp_path / "run"
    # Stage 3 on t5x's explicit mesh (its add-on file and macro go to t5x, the rest of the
    # flags to the run file).
    mesh = {3: ["--gin_file=gin/t5x/mesh.gin", "--gin.MESH_SHAPE=(1, 1)"]}
    logs = {n: _stage(run, corpus, n, tmp_path / f"stage{n}.log", *mesh.get(n, []))
            for n in STAGES}

    # Each stage says what it reads, under the names (and so the data seeds) our trainer
    # gives these stages.
    for n, (langs, alpha, rate) in STAGES.items():
        assert (f"[stage{n}] reads xlmeta_cc100.stage{n}, {len(langs)} languages, "
                f"alpha {alpha:g}, mask rate {rate:g}") in logs[n], logs[n]
        info = json.loads((run / f"stage{n}" / t5x_phases.MODEL_INFO).read_text())
        assert info["task"] == f"xlmeta_cc100.stage{n}" and info["phase"] == n
        assert info["phases"] == ["stage1", "stage2", "stage3"]
        assert info["train_steps"] == n * STEPS

    # Stage N+1 starts from stage N's final state whole: its first checkpoint (t5x saves the
    # state it starts from) equals stage N's last, AdamW moments and step included.
    for n in (1, 2):
        end = _state(run / f"stage{n}" / f"checkpoint_{n * STEPS}")
        start = _state(run / f"stage{n + 1}" / f"checkpoint_{n * STEPS}")
        a, b = jax.tree_util.tree_leaves_with_path(end), jax.tree.leaves(start)
        assert len(a) == len(b)
        for (path, x), y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
        assert int(start["state"]["step"]) == n * STEPS
        assert any(np.any(m) for m in jax.tree.leaves(start["state"]["param_states"]))
        assert f"state from {run / f'stage{n}' / f'checkpoint_{n * STEPS}'}" in logs[n + 1]
        # A start from the stage before is no resume.
        assert f"[stage{n + 1}] steps {n * STEPS + 1} to {(n + 1) * STEPS} on " in logs[n + 1]
    assert t5x_phases.checkpoint_steps(run / "stage3") == [2 * STEPS, 3 * STEPS]

    # One schedule over the three stages: the rate logged at step s is the WSD schedule's
    # (warm-up, stable, 1-sqrt cool-down over stage 3) at s - 1, the step it was applied at.
    schedule = optimizer.learning_rate_schedule(optimizer.OptimizerConfig(
        learning_rate=LR, warmup_steps=WARMUP, total_steps=3 * STEPS, schedule="wsd",
        decay_steps=STEPS, decay_shape="1-sqrt"))
    pattern = re.compile(r"\] step (\d+)/\d+ .*?\| lr ([-0-9.e]+) ")
    logged = {int(s): float(v) for n in STAGES for s, v in pattern.findall(logs[n])}
    assert sorted(logged) == list(range(1, 3 * STEPS + 1))
    for s, lr in logged.items():
        assert lr == pytest.approx(float(schedule(s - 1)), rel=5e-3, abs=1e-9), s

    # Each stage masks at its own rate: floor(rate * n + u) of a block's n candidates, so a
    # stage predicts more per step than the next one's rate could give any batch.
    per_step = {n: np.mean(list(_scalars(run / f"stage{n}", "mlm/predictions_per_step")
                                .values())) for n in STAGES}
    for n in (1, 2):
        rate_next = STAGES[n + 1][2]
        assert per_step[n] > BATCH * (rate_next * LENGTH + 1), per_step
    for n, (_, _, rate) in STAGES.items():
        assert 0 < per_step[n] <= BATCH * mlm.max_predictions(LENGTH, rate), per_step
