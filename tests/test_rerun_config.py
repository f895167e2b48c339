"""A rerun that fails before writing a checkpoint leaves the run's config.gin alone."""

from __future__ import annotations

import os
import shutil

import gin
import pytest
from errors_fixtures import STEPS, copy_run, train_argv, write_gin

from xlmeta_jax import errors
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.pretrain import checkpoints


def _train(argv) -> int:
    gin.clear_config()
    try:
        return errors.run_command(train_cli.main, argv, prog="xlmeta_jax.train")
    except FloatingPointError:  # a diverged step may surface as an error or a traceback
        return 1
    finally:
        gin.clear_config()


def test_failed_rerun_keeps_config_gin(tmp_path, monkeypatch):
    run_gin = write_gin(tmp_path)
    finished = tmp_path / "finished"
    assert _train(train_argv(run_gin, finished)) == 0
    model_dir = copy_run(finished, tmp_path / "run")
    shutil.rmtree(model_dir / "phase2" / str(STEPS))  # phase 2 resumes from step 2
    config = (model_dir / "config.gin").read_bytes()
    # The rerun diverges: its first checkpoint is refused as non-finite.
    monkeypatch.setattr(checkpoints, "all_finite", lambda tree: False)
    code = _train(train_argv(run_gin, model_dir,
                             "--gin.xlmeta_jax.model.optimizer.OptimizerConfig.learning_rate=1e6"))
    assert code != 0
    assert not (model_dir / "phase2" / str(STEPS)).exists()
    assert (model_dir / "config.gin").read_bytes() == config


def test_finetune_refuses_model_dir_of_another_checkpoint(tmp_path):
    import json

    import pytest

    from xlmeta_jax.evaluation.finetune import FineTuneConfig, finetune

    model_dir = tmp_path / "eval"
    model_dir.mkdir()
    (model_dir / "results.json").write_text(json.dumps({"model": {"checkpoint": "/runs/a"}}))
    (model_dir / "config.gin").write_text("# a's config\n")
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    with pytest.raises(errors.UserError, match=r"holds the results of checkpoint /runs/a, not "):
        finetune(FineTuneConfig(task="xnli", initial_checkpoint_path="/runs/b",
                                model_dir=str(model_dir)))
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before


@pytest.mark.parametrize("jax_dir, setting, want", [
    (None, None, "run/compilation_cache"),  # the run's own folder by default
    ("shared", None, "shared"),  # JAX_COMPILATION_CACHE_DIR (shared between runs) kept
    (None, "own", "own"),
    ("shared", "own", "own"),  # train.compilation_cache_dir wins
    ("shared", "", None),  # '': no cache
], ids=["default", "jax_env", "setting", "setting_over_env", "off"])
def test_compilation_cache_folder(tmp_path, jax_dir, setting, want):
    """Where train() points JAX's persistent compilation cache, and that a compile of the
    process then lands there (and nowhere when it is off)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.compilation_cache import compilation_cache

    from xlmeta_jax.pretrain import run_dir

    def path(name):
        return name if not name else os.fspath(tmp_path / name)

    saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)
    try:
        jax.config.update("jax_compilation_cache_dir", path(jax_dir))
        compilation_cache.reset_cache()
        got = run_dir.use_compilation_cache(path("run"), path(setting))
        assert got == path(want)
        # A program of this case's own (its constant), so it is compiled, not reused.
        own = float(sum(map(ord, os.fspath(tmp_path))))
        jax.jit(lambda x: jnp.sin(x) * own)(jnp.ones(7))
        for name in ("run/compilation_cache", "shared", "own"):
            entries = os.listdir(path(name)) if os.path.isdir(path(name)) else []
            assert bool(entries) == (name == want), (name, entries)
    finally:
        jax.config.update("jax_compilation_cache_dir", saved[0])
        jax.config.update("jax_enable_compilation_cache", saved[1])
        compilation_cache.reset_cache()
