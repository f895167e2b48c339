"""gin's view of the experiment command (gin/experiments/*.gin): the experiment, and the
recipes its recipe arms call. Imported by the experiment's command and the AOT tool, not by
the trainer."""

from __future__ import annotations

import gin

from xlmeta_jax.cli import (
    configurables,
    evaluation_runs,  # noqa: F401 - the experiment's gin files bind finetune
    runs,  # noqa: F401 - the trainer's names, which the experiment's gin files bind
)
from xlmeta_jax.experiment import arms as experiment_arms
from xlmeta_jax.experiment import runner

# (Unlocked: a process that ran the trainer first holds gin's config locked; see
# evaluation_runs.)
with gin.unlock_config():
    experiment = gin.external_configurable(
        runner.experiment, module="xlmeta_jax.experiment.runner",
        denylist=["corpora", "feeder", "config_text", "train", "train_settings", "finetunes",
                  "recipes"])


def recipes() -> dict:
    """Per recipe arm (``arms.RECIPES``), gin's configurable of its recipe: a parameter the
    experiment's gin file binds (``xlmeta_jax.pretrain.recipes.mmbert.ext_alpha = 0.45``)
    reaches the arm; the arm passes its budget, shape and languages itself."""
    configurable = {experiment_arms.recipes_lib.mmbert: configurables.mmbert,
                    experiment_arms.recipes_lib.annealed: configurables.annealed}
    return {arm: configurable[f] for arm, f in experiment_arms.RECIPES.items()}
