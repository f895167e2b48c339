"""What an evaluation loads: checkpoint resolution of a run directory, and the attention
kernel a checkpoint's ``attention_impl='auto'`` stands for at evaluation time."""

from __future__ import annotations

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.model import network
from xlmeta_jax.pretrain import checkpoints, loading


def _run_dir(tmp_path, gin_file, steps, *, record_phases=True):
    """A run directory as the trainer leaves it: per phase, step dirs with a state item and
    the metadata the trainer writes, naming the run's phases as the gin file configures
    them (no parameters needed here)."""
    import xlmeta_jax.cli.runs  # noqa: F401 - registers the gin file's names

    gin.clear_config(clear_constants=True)
    try:
        gin_cli.apply_gin([gin_file], [
            "MODEL_DIR = '/tmp/unused'", "VOCAB_PATH = '/tmp/unused.model'",
            "INITIAL_CHECKPOINT_PATH = None",
        ], finalize=False)
        phases = [p.name for p in gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", [])]
    finally:
        gin.clear_config(clear_constants=True)
    for phase, (done, total) in steps.items():
        step_dir = tmp_path / phase / str(done)
        (step_dir / checkpoints.STATE).mkdir(parents=True)
        (step_dir / checkpoints.META).mkdir()
        meta = {"phase": phase, "phase_step": done, "num_steps": total}
        if record_phases:
            meta["run_phases"] = phases
        (step_dir / checkpoints.META / "metadata").write_text(json.dumps(meta))
    return tmp_path


def test_xlmr_baseline_run_resolves_to_its_only_phase(tmp_path):
    # The old rule looked for directories named phase*: the baseline's "xlmr" was missed.
    run = _run_dir(tmp_path, "native/xlmr.gin", {"xlmr": (500, 500)})
    assert loading.recorded_phases(run) == ["xlmr"]
    assert loading.find_step_dir(run) == run / "xlmr" / "500"


def test_meta_run_resolves_to_the_last_recorded_phase_and_refuses_it_unfinished(tmp_path):
    run = _run_dir(tmp_path, "native/meta.gin", {"phase1": (100, 100), "phase2": (40, 80)})
    assert loading.recorded_phases(run) == ["phase1", "phase2"]
    # The old rule returned phase2's latest (unfinished) step without a word.
    with pytest.raises(checkpoints.CheckpointError, match=r"'phase2' is not finished .*step 40 "
                       r"of 80.*name the step directory"):
        loading.find_step_dir(run)
    with pytest.raises(checkpoints.CheckpointError, match="not finished"):
        loading.find_step_dir(run / "phase2")
    # Named explicitly, an unfinished step is taken; a finished phase resolves itself.
    assert loading.find_step_dir(run / "phase2" / "40") == run / "phase2" / "40"
    assert loading.find_step_dir(run / "phase1") == run / "phase1" / "100"


def test_meta_run_whose_last_phase_has_not_started_is_refused(tmp_path):
    # Phase 1's checkpoint names phase 2, which has not started.
    run = _run_dir(tmp_path / "a", "native/meta.gin", {"phase1": (100, 100)})
    with pytest.raises(checkpoints.CheckpointError, match="'phase2' of .* has not started"):
        loading.find_step_dir(run)
    # Checkpoints that do not record the run's phases: one phase resolves, two are refused.
    old = _run_dir(tmp_path / "b", "native/meta.gin", {"phase1": (100, 100)},
                   record_phases=False)
    assert loading.find_step_dir(old) == old / "phase1" / "100"
    (old / "phase2" / "5" / checkpoints.STATE).mkdir(parents=True)
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"no checkpoint naming its run's phases .* holds phases "
                             r"\['phase1', 'phase2'\]"):
        loading.find_step_dir(old)


def _t5x_run(tmp_path, phases):
    """gin/meta.gin's MODEL_DIR as python -m t5x.train leaves it (t5x_phases.summarize_config)."""
    for phase, (steps, total) in phases.items():
        for step in steps:
            (tmp_path / phase / f"checkpoint_{step}" / checkpoints.STATE).mkdir(parents=True)
        (tmp_path / phase / checkpoints.T5X_MODEL_INFO).write_text(json.dumps(
            {"phases": ["phase1", "phase2"], "train_steps": total}))
    return tmp_path


def test_t5x_run_resolves_like_ours(tmp_path):
    run = _t5x_run(tmp_path / "a", {"phase1": ((0, 50, 100), 100), "phase2": ((0, 40), 80)})
    with pytest.raises(checkpoints.CheckpointError, match=r"'phase2' is not finished .*step 40 "
                       r"of 80.*checkpoint_40"):
        loading.find_step_dir(run)
    assert loading.find_step_dir(run / "phase1") == run / "phase1" / "checkpoint_100"
    named = run / "phase2" / "checkpoint_40"
    assert loading.find_step_dir(named) == named
    (run / "phase2" / "checkpoint_80" / checkpoints.STATE).mkdir(parents=True)
    assert loading.find_step_dir(run) == run / "phase2" / "checkpoint_80"
    only_phase1 = _t5x_run(tmp_path / "b", {"phase1": ((100,), 100)})
    with pytest.raises(checkpoints.CheckpointError, match="'phase2' of .* has not started"):
        loading.find_step_dir(only_phase1)


@pytest.mark.parametrize(
    ("impl", "dtype", "backend", "length", "expected"),
    [
        ("auto", "float32", "gpu", None, "xla"),  # cuDNN attention rejects fp32
        ("auto", "bfloat16", "gpu", None, "cudnn"),
        ("auto", "float16", "gpu", None, "cudnn"),
        ("auto", "bfloat16", "cpu", None, "xla"),
        ("auto", "bfloat16", "tpu", None, "splash"),
        ("auto", "float32", "tpu", 512, "splash"),
        ("auto", "bfloat16", "tpu", 8, "xla"),  # splash tiles rows of 128 tokens
        ("splash", "bfloat16", "tpu", 100, "xla"),
        ("splash", "bfloat16", "tpu", 1024, "splash"),
        ("cudnn", "float32", "gpu", None, "cudnn"),  # an explicit choice is kept
        ("xla", "bfloat16", "gpu", None, "xla"),
    ],
)
def test_auto_attention_resolution(impl, dtype, backend, length, expected):
    assert network.resolve_attention_impl(impl, dtype, backend, length) == expected


def test_fp32_evaluation_of_an_auto_checkpoint_stays_on_xla_on_gpu(monkeypatch):
    """A dropout-free fp32 pass of an 'auto' encoder, as fine-tuning evaluation and
    retrieval run it, on a backend that says "gpu": before, this took the cuDNN kernel
    (which JAX refuses for fp32, and which is absent on CPU); now it runs on XLA and
    equals the explicit XLA encoder."""
    cfg = network.get_config("tiny", vocab_size=64, pad_token_id=0, attention_impl="auto",
                             dropout_rate=0.0, attention_dropout_rate=0.0)
    ids = jnp.array([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]], jnp.int32)
    params = network.Encoder(cfg.replace(attention_impl="xla")).init(jax.random.key(0), ids)
    expected = network.Encoder(cfg.replace(attention_impl="xla")).apply(params, ids)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    got = network.Encoder(cfg).apply(params, ids)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
