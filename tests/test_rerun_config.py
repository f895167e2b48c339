"""A rerun that fails before writing a checkpoint leaves the run's config.gin alone."""

from __future__ import annotations

import shutil

import gin
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


def test_failed_rerun_keeps_config_gin(tmp_path, fast_compiles, monkeypatch):
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
