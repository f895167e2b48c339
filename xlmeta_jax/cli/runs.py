"""gin's view of our own commands: the trainer's run, the experiment, the fine-tuning.

Registered under the module path of the object each configures
(``xlmeta_jax.pretrain.trainer.train.log_every``); the gin files of our commands
(gin/native/run.gin, gin/demo.gin, gin/experiments/*.gin, gin/finetune/*.gin) import
this module, t5x's do not (its own ``train`` would be ambiguous with ours). The
settings both trainers share: :mod:`xlmeta_jax.cli.configurables`.

* ``xlmeta_jax.pretrain.trainer.{train,Merge}`` — our trainer's run (gin/native/*.gin;
  its ``Phase`` is in :mod:`.configurables`, which t5x's gin/meta.gin reads too);
* ``xlmeta_jax.experiment.runner.experiment`` — the experiment (gin/experiments/*.gin);
* ``finetune.*`` and ``evaluate_retrieval.*`` — the evaluation command
  (gin/finetune/*.gin): :func:`finetune_config` builds a
  :class:`xlmeta_jax.evaluation.finetune.FineTuneConfig`;
* ``xlmeta_jax.data.demo_corpus.*``, ``xlmeta_jax.data.experiment_corpus.*`` — the
  corpora the demo and the CPU experiment write before they train;
* helpers of the gin files themselves, named after this module: ``total_steps``,
  ``steps_for_tokens`` and ``prepare_data``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gin

from xlmeta_jax.cli import flags as gin_flags
from xlmeta_jax.data import demo_corpus, demo_released, experiment_corpus
from xlmeta_jax.evaluation import tasks as evaluation_tasks
from xlmeta_jax.evaluation.finetune import FineTuneConfig
from xlmeta_jax.evaluation.settings import RetrievalSettings
from xlmeta_jax.experiment import arms as experiment_arms
from xlmeta_jax.experiment import runner
from xlmeta_jax.pretrain import trainer

# --------------------------------------------------------------------- corpus builders
demo_path = gin.external_configurable(
    demo_corpus.demo_path, module="xlmeta_jax.data.demo_corpus")
prepare_demo = gin.external_configurable(
    demo_corpus.prepare_demo, module="xlmeta_jax.data.demo_corpus")
released_model = gin.external_configurable(
    demo_released.released_model, module="xlmeta_jax.data.demo_released")
new_text = gin.external_configurable(
    demo_released.new_text, module="xlmeta_jax.data.demo_released")
corpus_path = gin.external_configurable(
    experiment_corpus.corpus_path, module="xlmeta_jax.data.experiment_corpus")
prepare_shared_corpus = gin.external_configurable(
    experiment_corpus.prepare_shared_corpus, module="xlmeta_jax.data.experiment_corpus")

# ---------------------------------------------------------------------------- pretraining
Merge = gin.external_configurable(trainer.Merge, module="xlmeta_jax.pretrain.trainer")
train = gin.external_configurable(
    trainer.train, module="xlmeta_jax.pretrain.trainer",
    denylist=["corpora", "feeder", "config_text", "describe", "prepare"])

# ----------------------------------------------------------------------------- experiment
experiment = gin.external_configurable(runner.experiment, module="xlmeta_jax.experiment.runner",
                                       denylist=["corpora", "feeder", "config_text", "train",
                                                 "train_settings", "finetunes", "curricula"])


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


@gin.configurable(module="xlmeta_jax.cli.runs")
def total_steps(steps: Sequence[int] = gin.REQUIRED) -> int:
    """Sum of step counts (gin: the baseline's budget = META_STEPS + XLING_STEPS)."""
    return int(sum(steps))


@gin.configurable(module="xlmeta_jax.cli.runs")
def steps_for_tokens(tokens: float = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                     sequence_length: int = gin.REQUIRED) -> int:
    """Tokens as whole steps of ``batch_size x sequence_length`` (nearest, at least 1).

    For a schedule given in tokens (gin: a warm-up of 3B tokens in the first stage's
    steps, a decay stage's length); a phase itself takes ``Phase.num_tokens``, rounded
    the same way (``Phase.steps_for_tokens``).
    """
    return trainer.Phase("tokens", trainer.SYNTHETIC, batch_size=batch_size,
                         sequence_length=sequence_length, num_tokens=tokens).num_steps


@gin.configurable(module="xlmeta_jax.cli.runs")
def prepare_data(prepare: Callable[[], Any] | None = None) -> None:
    """Runs the data preparation the config names (e.g. the demo's corpus), if any.

    The trainer calls it (``train(prepare=...)``) once it holds MODEL_DIR's lock and the
    checks that need no data passed, so a second start or a bad setting never builds a
    corpus; a gin value such as ``VOCAB_PATH`` stays a plain path, read without effect.
    """
    if prepare is not None:
        prepare()


# ----------------------------------------------------------------------------------------
# Evaluation (gin/finetune/*.gin): `finetune.<field>` and `evaluate_retrieval.<field>`
# ----------------------------------------------------------------------------------------


@gin.configurable(module="xlmeta_jax.cli.runs", allowlist=[
    "layer", "neighbourhood", "pooling"])
def evaluate_retrieval(layer: int | None = None, neighbourhood: int = 4,
                       pooling: str | None = None) -> RetrievalSettings:
    """The retrieval tasks' settings (``evaluate_retrieval.layer`` etc. in gin).

    Args:
      layer: XTREME's ``--specific_layer``; None: the task's XTREME layer.
      neighbourhood: BUCC margin's k.
      pooling: "mean" or "cls"; None: the task's XTREME pooling.
    """
    return RetrievalSettings(layer=layer, neighbourhood=neighbourhood, pooling=pooling)


@gin.configurable("finetune", module="xlmeta_jax.cli.runs")
def finetune_config(
    task: str = gin.REQUIRED,
    initial_checkpoint_path: str = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    data_dir: str | None = None,
    vocab_path: str | None = None,
    languages: list[str] | None = None,
    allow_pickle: bool = False,
    data_source: str = "local",
    tfds_data_dir: str | None = None,
    num_seeds: int = 1,
    **settings,
) -> FineTuneConfig:
    """The evaluation the gin bindings describe (gin name: ``finetune``).

    ``finetune.<field>`` binds a field of
    :class:`~xlmeta_jax.evaluation.finetune.FineTuneConfig`, or of its
    :class:`~xlmeta_jax.evaluation.settings.FineTuneSettings` (``finetune.batch_size``);
    a retrieval task also reads :func:`evaluate_retrieval`. MODEL_DIR/config.gin gets
    the operative config.

    Returns:
      The config :func:`xlmeta_jax.evaluation.finetune.finetune` runs.
    """
    # Only a retrieval task calls evaluate_retrieval, so only its config.gin lists it.
    retrieval = (RetrievalSettings() if evaluation_tasks.get(task).fine_tunes
                 else evaluate_retrieval())
    return FineTuneConfig.from_kwargs(
        task=task, initial_checkpoint_path=initial_checkpoint_path, model_dir=model_dir,
        data_dir=data_dir, vocab_path=vocab_path, languages=languages,
        allow_pickle=allow_pickle, data_source=data_source, tfds_data_dir=tfds_data_dir,
        num_seeds=num_seeds, retrieval=retrieval, config_text=gin.operative_config_str(),
        **settings,
    )
