"""gin's view of the experiment command (gin/experiments/*.gin): the experiment, and the
curriculum arms read from our trainer's run files. Imported by the experiment's command
and the AOT tool, not by the trainer."""

from __future__ import annotations

from collections.abc import Sequence

import gin

from xlmeta_jax.cli import (
    evaluation_runs,  # noqa: F401 - the experiment's gin files bind finetune
    runs,  # noqa: F401 - the trainer's names, which the arms' files bind
)
from xlmeta_jax.cli import flags as gin_flags
from xlmeta_jax.experiment import arms as experiment_arms
from xlmeta_jax.experiment import runner

# (Unlocked: a process that ran the trainer first holds gin's config locked; see
# evaluation_runs.)
with gin.unlock_config():
    experiment = gin.external_configurable(
        runner.experiment, module="xlmeta_jax.experiment.runner",
        denylist=["corpora", "feeder", "config_text", "train", "train_settings", "finetunes",
                  "curricula"])


def curricula(arms: Sequence[str], search_paths: Sequence[str] = ()
              ) -> dict[str, experiment_arms.Curriculum]:
    """What the run file of each curriculum arm among ``arms`` binds.

    Each file of ``xlmeta_jax.experiment.arms.CURRICULA`` (gin/native/annealed.gin,
    gin/native/mmbert.gin) is parsed on its own, as our trainer parses it, and its
    ``train.phases`` and ``train.merge`` read: the stages are defined once, there. gin
    holds one config at a time, so this replaces the parsed config; callers read theirs
    first and parse it again after.
    """
    read: dict[str, experiment_arms.Curriculum] = {}
    for arm in dict.fromkeys(arms):
        path = experiment_arms.CURRICULA.get(arm)
        if path is not None and path not in read:
            gin_flags.apply_gin([path], [], search_paths, finalize=False)
            q = "xlmeta_jax.pretrain.trainer.train."
            read[path] = experiment_arms.Curriculum(
                tuple(gin_flags.bound(q + "phases", ())), gin_flags.bound(q + "merge", None))
    return {arm: read[experiment_arms.CURRICULA[arm]]
            for arm in dict.fromkeys(arms) if arm in experiment_arms.CURRICULA}


