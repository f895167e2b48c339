"""What an experiment is: its arms, seeds, budget, model, tasks and folders (one object).

:func:`xlmeta_jax.experiment.runner.experiment` builds it from the settings; the runner,
the state of its folder and its results read it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from xlmeta_jax.data import feeding
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.experiment.arms import Budget, arm_merge, arm_phases
from xlmeta_jax.model import network
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import trainer


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A resolved experiment (see :func:`experiment` for the fields)."""

    name: str
    model_dir: str
    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    budget: Budget
    model: network.EncoderConfig
    optimizer: OptimizerConfig
    english_task: str
    xling_mixture: str
    tasks: tuple[str, ...]
    finetune_gin_files: tuple[str, ...]
    finetune_bindings: tuple[str, ...]
    finetune_seeds: int
    data_dir: str | None
    prepare: Callable[[], Any] | None
    # The corpora the arms' tasks are registered from (the joint arm's English share is
    # set from the budget), and the feeder of their batches (see trainer.train).
    corpora: Corpora = dataclasses.field(default_factory=Corpora)
    feeder: Callable[..., Any] = feeding.make_mlm_iterator
    # The experiment's configuration, written to MODEL_DIR/config.gin.
    config_text: str | None = None
    # Runs one arm x seed: trainer.train, or the command line's configured version of it
    # (the run settings of gin/native/run.gin: mesh, checkpoints, logging).
    train: Callable[..., dict] = trainer.train
    # The trainer settings the plan's step measurement uses (mesh_shape, rng_impl,
    # microbatches), as `train` applies them.
    train_settings: dict = dataclasses.field(default_factory=dict)
    # Each task's evaluation: its FineTuneConfig with the experiment's settings; the
    # checkpoint, folder and seed are filled in per run (see evaluation_config).
    finetunes: dict = dataclasses.field(default_factory=dict)
    # Per recipe arm (arms.RECIPES), the function it calls instead of the recipe's own (the
    # command's: gin's configurable of it, whose bindings then apply).
    recipes: dict = dataclasses.field(default_factory=dict)
    # Arms that are released models (arm -> Hugging Face folder): evaluated, not pretrained.
    released: dict = dataclasses.field(default_factory=dict)

    def phases(self, arm: str) -> list[trainer.Phase]:
        if arm in self.released:  # pretrained elsewhere
            return []
        return arm_phases(arm, self.budget, **self._arm_settings())

    def merge(self, arm: str) -> trainer.Merge | None:
        return None if arm in self.released else arm_merge(arm, self.budget,
                                                           **self._arm_settings())

    def _arm_settings(self) -> dict:
        return dict(english_task=self.english_task, xling_mixture=self.xling_mixture,
                    optimizer=self.optimizer, languages=self.corpora.languages,
                    recipes=self.recipes)

    def run_dir(self, arm: str, seed: int) -> str:
        return os.path.join(self.model_dir, "pretrain", arm, f"seed{seed}")

    def eval_dir(self, arm: str, seed: int, task: str) -> str:
        return os.path.join(self.model_dir, "eval", arm, f"seed{seed}", task)

    def fingerprint(self) -> dict:
        """What a resumed experiment must share with the one that wrote MODEL_DIR."""
        return {
            "budget": dataclasses.asdict(self.budget),
            "model": dataclasses.asdict(self.model),
            "optimizer": dataclasses.asdict(self.optimizer),
            "english_task": self.english_task,
            "xling_mixture": self.xling_mixture,
        }
