"""gin's view of a run: every function and class the gin files configure.

The library modules know no gin; this module registers what the gin files bind,
under the name of the object's own module, so a binding names where the code is:

* ``xlmeta_jax.model.network.get_config`` — the encoder (gin/models/*.gin): always
  ``network.get_config(size, field=...)``; a binding of ``EncoderConfig`` itself
  would be a second, silently ignored way to configure it;
* ``xlmeta_jax.model.optimizer.OptimizerConfig`` — the optimizer (gin/pretrain.gin);
* ``xlmeta_jax.data.corpora.Corpora.*`` — :class:`xlmeta_jax.data.corpora.Corpora`
  (vocabulary, English files / TFDS, CC-100 / mC4, languages, alpha);
* ``xlmeta_jax.model.mlm.Masking.*`` — :class:`xlmeta_jax.model.mlm.Masking`, the one place of the
  masking rate (gin/pretrain.gin: ``MASK_RATE``): the registered tasks and the trainer's
  synthetic stream both take it from here (``Corpora.masking`` is not a gin binding);
* ``xlmeta_jax.data.feeding.make_mlm_iterator.*`` — the feeder's options;
* ``@xlmeta_jax.cli.configurables.registered()`` — registers the configured corpora
  (:func:`tasks.register`) and returns ``registered.name``, for configs that name a
  task, e.g. t5x's ``mixture_or_task_name = @xlmeta_jax.cli.configurables.registered()``;
* ``finetune.*`` and ``evaluate_retrieval.*`` — the evaluation command
  (gin/finetune/*.gin): :func:`finetune` builds a
  :class:`xlmeta_jax.evaluation.finetune.FineTuneConfig` and runs it.

Both entry points read them — our trainer (``python -m xlmeta_jax.train``) and t5x's
(``python -m t5x.train``). A t5x config that imports this module gets no second
``train`` next to t5x's own (``--gin.train.X`` stays unambiguous).
Importing this module imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

import gin

from xlmeta_jax.data import corpora, feeding
from xlmeta_jax.data import text_files as mixtures
from xlmeta_jax.evaluation import finetune as evaluation_finetune
from xlmeta_jax.evaluation import tasks as evaluation_tasks
from xlmeta_jax.evaluation.settings import RetrievalSettings
from xlmeta_jax.model import mlm, network
from xlmeta_jax.model.optimizer import OptimizerConfig

get_config = gin.external_configurable(
    network.get_config, name="get_config", module="xlmeta_jax.model.network"
)
OptimizerConfig = gin.external_configurable(OptimizerConfig, module="xlmeta_jax.model.optimizer")


Corpora = gin.external_configurable(
    corpora.Corpora, module="xlmeta_jax.data.corpora", denylist=["masking"]
)
Masking = gin.external_configurable(mlm.Masking, module="xlmeta_jax.model.mlm")
make_mlm_iterator = gin.external_configurable(
    feeding.make_mlm_iterator, module="xlmeta_jax.data.feeding"
)

# The setting that registers each task or mixture, for the error naming it.
_SETTING = {
    "xlmeta_english_text": "ENGLISH_FILES (Corpora.english_files; gin/data/english_files.gin)",
    "xlmeta_english_tfds": "ENGLISH_TFDS_NAME (Corpora.english_tfds_name; "
    "gin/data/english_tfds.gin)",
    "xlmeta_cc100": "CC100_DIR (Corpora.cc100_dir; gin/data/cc100.gin)",
    "xlmeta_mc4": "Corpora.mc4_tfds_name (gin/data/mc4.gin)",
}


def register(settings: corpora.Corpora | None = None) -> tuple[str, ...]:
    """Registers the seqio tasks of ``settings``.

    Args:
      settings: the corpus settings; default: the gin-bound ``Corpora()`` with the
        gin-bound ``Masking()``.

    Returns:
      The registered names (see :func:`tasks.register`).
    """
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio and TensorFlow only where data is read

    if settings is None:
        settings = Corpora(masking=Masking())
    return tasks.register(settings)


@gin.configurable(module="xlmeta_jax.cli.configurables")
def registered(name: str = gin.REQUIRED, settings: corpora.Corpora | None = None) -> str:
    """Registers the configured corpora and returns ``name``, checked to be registered.

    Args:
      name: a task or mixture name (xlmeta_jax/data/task_names.py), e.g. ``'xlmeta_cc100'``.
      settings: the corpus settings (default: the gin-bound ones, see :func:`register`).

    Raises:
      CorpusError: naming the setting that registers ``name`` when it is missing.
    """
    names = register(settings)
    if name not in names:
        hint = next(
            (v for k, v in _SETTING.items() if name == k or name.startswith(k + "_")), None
        )
        raise mixtures.CorpusError(
            f"{name} is not registered by the configured corpora (registered: "
            f"{sorted(names) or 'none'})" + (f"; set {hint}" if hint else "")
        )
    return name


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


@gin.configurable(module="xlmeta_jax.cli.configurables")
def finetune(
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
) -> dict:
    """Runs :func:`xlmeta_jax.evaluation.finetune.finetune` on the gin bindings.

    ``finetune.<field>`` binds a field of
    :class:`~xlmeta_jax.evaluation.finetune.FineTuneConfig`, or of its
    :class:`~xlmeta_jax.evaluation.settings.FineTuneSettings` (``finetune.batch_size``);
    a retrieval task also reads :func:`evaluate_retrieval`. MODEL_DIR/config.gin gets
    the operative config.

    Returns:
      The results written to MODEL_DIR/results.json.
    """
    # Only a retrieval task calls evaluate_retrieval, so only its config.gin lists it.
    retrieval = (RetrievalSettings() if evaluation_tasks.get(task).fine_tunes
                 else evaluate_retrieval())
    config = evaluation_finetune.FineTuneConfig.from_kwargs(
        task=task, initial_checkpoint_path=initial_checkpoint_path, model_dir=model_dir,
        data_dir=data_dir, vocab_path=vocab_path, languages=languages,
        allow_pickle=allow_pickle, data_source=data_source, tfds_data_dir=tfds_data_dir,
        num_seeds=num_seeds, retrieval=retrieval, config_text=gin.operative_config_str(),
        **settings,
    )
    return evaluation_finetune.finetune(config)
