"""gin's view of the evaluation command (gin/finetune/*.gin): ``finetune.<field>`` and
``evaluate_retrieval.<field>``, registered under ``xlmeta_jax.cli.runs`` as the gin files
name them. Imported by the commands that evaluate (``xlmeta_jax.finetune``, the
experiment), not by the trainer."""

from __future__ import annotations

import dataclasses

import gin

from xlmeta_jax.evaluation import tasks as evaluation_tasks
from xlmeta_jax.evaluation.embedding_config import EmbeddingConfig
from xlmeta_jax.evaluation.finetune import FineTuneConfig
from xlmeta_jax.evaluation.settings import RetrievalSettings


def evaluate_retrieval(layer: int | None = None, neighbourhood: int = 4,
                       pooling: str | None = None) -> RetrievalSettings:
    """The retrieval tasks' settings (``evaluate_retrieval.layer`` etc. in gin).

    Args:
      layer: XTREME's ``--specific_layer``; None: the task's XTREME layer.
      neighbourhood: BUCC margin's k.
      pooling: "mean" or "cls"; None: the task's XTREME pooling.
    """
    return RetrievalSettings(layer=layer, neighbourhood=neighbourhood, pooling=pooling)


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


def embeddings_config(initial_checkpoint_path: str = gin.REQUIRED,
                      model_dir: str = gin.REQUIRED, steps: int = gin.REQUIRED,
                      **fields) -> EmbeddingConfig:
    """The contrastive run the gin bindings describe (gin name: ``embeddings``): every
    field of :class:`~xlmeta_jax.evaluation.embedding_config.EmbeddingConfig`."""
    return EmbeddingConfig(initial_checkpoint_path=initial_checkpoint_path,
                           model_dir=model_dir, steps=steps,
                           config_text=gin.operative_config_str(), **fields)


def bound_task() -> str | None:
    """``finetune.task`` as the gin files bind it (None: unbound)."""
    try:
        return gin.query_parameter("xlmeta_jax.cli.runs.finetune.task")
    except ValueError:
        return None


# Registered here rather than by decorators: a process that ran the trainer first (a
# notebook's training cell) holds gin's config locked, and these names, which bind nothing
# yet, are still safe to add then.
with gin.unlock_config():
    evaluate_retrieval = gin.configurable(module="xlmeta_jax.cli.runs", allowlist=[
        "layer", "neighbourhood", "pooling"])(evaluate_retrieval)
    finetune_config = gin.configurable("finetune", module="xlmeta_jax.cli.runs")(
        finetune_config)
    embeddings_config = gin.configurable("embeddings", module="xlmeta_jax.cli.runs", allowlist=[
        f.name for f in dataclasses.fields(EmbeddingConfig) if f.name != "config_text"])(
        embeddings_config)
