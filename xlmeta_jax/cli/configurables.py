"""gin's view of the project: every function and class the gin files configure.

The library knows no gin. This module registers what the gin files bind, under the
name of the module the object lives in, so a binding names where its code is
(``xlmeta_jax.pretrain.trainer.train.log_every`` is ``train``'s ``log_every`` in
xlmeta_jax/pretrain/trainer.py):

* ``xlmeta_jax.model.network.get_config`` — the encoder (gin/models/*.gin): always
  ``network.get_config(size, field=...)``; a binding of ``EncoderConfig`` itself would
  be a second, silently ignored way to configure it;
* ``xlmeta_jax.model.optimizer.OptimizerConfig`` — the optimizer (gin/pretrain.gin);
* ``xlmeta_jax.data.corpora.Corpora`` — the corpora (gin/data/*.gin);
* ``xlmeta_jax.model.mlm.Masking`` — the one place of the masking rate (``MASK_RATE``):
  the registered tasks and the synthetic stream both take it from here
  (``Corpora.masking`` is not a gin binding);
* ``xlmeta_jax.data.feeding.make_mlm_iterator`` — the feeder's options;
* ``xlmeta_jax.pretrain.trainer.{train,Phase}`` — our trainer's run (gin/native/*.gin);
* ``xlmeta_jax.experiment.runner.experiment`` — the experiment (gin/experiments/*.gin);
* ``xlmeta_jax.data.demo_corpus.*``, ``xlmeta_jax.data.experiment_corpus.*`` — the
  corpora the demo and the CPU experiment write before they train;
* helpers of the gin files themselves, named after this module: ``total_steps``,
  ``registered`` (t5x's ``mixture_or_task_name = @registered()``), ``prepare_data``;
* ``finetune.*`` and ``evaluate_retrieval.*`` — the evaluation command
  (gin/finetune/*.gin): :func:`finetune_config` builds a
  :class:`xlmeta_jax.evaluation.finetune.FineTuneConfig` (``finetune.<field>``).

A t5x config that imports this module gets no second ``train`` next to t5x's own
(t5x configs use ``dynamic_registration`` and name our functions by import path);
``--gin.train.X`` stays unambiguous. Importing it imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gin

from xlmeta_jax.data import corpora, demo_corpus, experiment_corpus, feeding
from xlmeta_jax.evaluation import tasks as evaluation_tasks
from xlmeta_jax.evaluation.finetune import FineTuneConfig
from xlmeta_jax.evaluation.settings import RetrievalSettings
from xlmeta_jax.experiment import runner
from xlmeta_jax.model import mlm, network, optimizer
from xlmeta_jax.pretrain import trainer

# ----------------------------------------------------------------------------- the model
get_config = gin.external_configurable(
    network.get_config, name="get_config", module="xlmeta_jax.model.network"
)
OptimizerConfig = gin.external_configurable(
    optimizer.OptimizerConfig, module="xlmeta_jax.model.optimizer"
)

# ------------------------------------------------------------------------------ the data
Corpora = gin.external_configurable(
    corpora.Corpora, module="xlmeta_jax.data.corpora", denylist=["masking"]
)
Masking = gin.external_configurable(mlm.Masking, module="xlmeta_jax.model.mlm")
make_mlm_iterator = gin.external_configurable(
    feeding.make_mlm_iterator, module="xlmeta_jax.data.feeding"
)
demo_path = gin.external_configurable(
    demo_corpus.demo_path, module="xlmeta_jax.data.demo_corpus")
prepare_demo = gin.external_configurable(
    demo_corpus.prepare_demo, module="xlmeta_jax.data.demo_corpus")
corpus_path = gin.external_configurable(
    experiment_corpus.corpus_path, module="xlmeta_jax.data.experiment_corpus")
prepare_shared_corpus = gin.external_configurable(
    experiment_corpus.prepare_shared_corpus, module="xlmeta_jax.data.experiment_corpus")

# ---------------------------------------------------------------------------- pretraining
Phase = gin.external_configurable(trainer.Phase, module="xlmeta_jax.pretrain.trainer")
train = gin.external_configurable(trainer.train, module="xlmeta_jax.pretrain.trainer",
                                  denylist=["corpora", "feeder", "config_text", "describe"])

# ----------------------------------------------------------------------------- experiment
experiment = gin.external_configurable(runner.experiment, module="xlmeta_jax.experiment.runner",
                                       denylist=["corpora", "feeder", "config_text"])


@gin.configurable(module="xlmeta_jax.cli.configurables")
def total_steps(steps: Sequence[int] = gin.REQUIRED) -> int:
    """Sum of step counts (gin: the baseline's budget = META_STEPS + XLING_STEPS)."""
    return int(sum(steps))


@gin.configurable(module="xlmeta_jax.cli.configurables")
def prepare_data(prepare: Callable[[], Any] | None = None) -> None:
    """Runs the data preparation the config names (e.g. the demo's corpus), if any.

    The commands call it after parsing and before the run is checked, so a gin
    value such as ``VOCAB_PATH`` stays a plain path and reading it has no side effect.
    """
    if prepare is not None:
        prepare()


def corpora_settings() -> corpora.Corpora:
    """The gin-bound ``Corpora()`` with the gin-bound ``Masking()``."""
    return Corpora(masking=Masking())


def register(settings: corpora.Corpora | None = None) -> tuple[str, ...]:
    """Registers the seqio tasks of ``settings`` (default: :func:`corpora_settings`).

    Returns:
      The registered names (see :func:`xlmeta_jax.data.tasks.register`).
    """
    # seqio and TensorFlow only where data is read: t5x configs import this module.
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio/TensorFlow only to read a corpus

    return tasks.register(corpora_settings() if settings is None else settings)


@gin.configurable(module="xlmeta_jax.cli.configurables")
def registered(name: str = gin.REQUIRED, settings: corpora.Corpora | None = None) -> str:
    """Registers the configured corpora and returns ``name``, checked to be registered.

    Args:
      name: a task or mixture name (xlmeta_jax/data/task_names.py), e.g. ``'xlmeta_cc100'``.
      settings: the corpus settings (default: the gin-bound ones, see :func:`register`).

    Raises:
      CorpusError: naming the setting that registers ``name`` when it is missing.
    """
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio/TensorFlow only to read a corpus

    return tasks.check_registered(name, register(settings))


# ----------------------------------------------------------------------------------------
# Evaluation (gin/finetune/*.gin): `finetune.<field>` and `evaluate_retrieval.<field>`
# ----------------------------------------------------------------------------------------


@gin.configurable(module="xlmeta_jax.cli.configurables", allowlist=[
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


@gin.configurable("finetune", module="xlmeta_jax.cli.configurables")
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
