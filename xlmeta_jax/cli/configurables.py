"""gin's view of what both trainers share: the model, the optimizer and the data.

The library knows no gin. The gin files that both ``python -m xlmeta_jax.train`` and
``python -m t5x.train`` include (gin/pretrain.gin, gin/models/*.gin, gin/data/*.gin)
import this module; each name is the module path of the object it configures, so a
binding names where its code is:

* ``xlmeta_jax.model.network.get_config`` — the encoder (gin/models/*.gin): always
  ``network.get_config(size, field=...)``; a binding of ``EncoderConfig`` itself would
  be a second, silently ignored way to configure it;
* ``xlmeta_jax.interop.hf.weights.config_of`` — a released model's encoder, read from its
  folder (gin/native/continue.gin);
* ``xlmeta_jax.model.optimizer.OptimizerConfig`` — the optimizer (gin/pretrain.gin);
* ``xlmeta_jax.data.corpora.Corpora`` — the corpora (gin/data/*.gin);
* ``xlmeta_jax.model.mlm.Masking`` — the one place of the masking rate (``MASK_RATE``):
  the registered tasks and the synthetic stream both take it from here
  (``Corpora.masking`` is not a gin binding);
* ``xlmeta_jax.data.feeding.make_mlm_iterator`` — the feeder's options;
* ``xlmeta_jax.pretrain.trainer.Phase`` — a phase of a run;
* ``xlmeta_jax.pretrain.recipes.*`` — the recipes (``meta``, ``xlmr``, ``annealed``,
  ``mmbert``, ``continued``, ``with_english_stage``), whose phases and merge a run file hands
  to the run with ``phases_of`` and ``merge_of`` (gin/phases/meta.gin, which our trainer's
  run files and t5x's gin/meta.gin both read);
* ``xlmeta_jax.cli.configurables.registered`` — registers the corpora a task reads and
  names it, e.g. t5x's ``mixture_or_task_name = @registered()``.

Our own commands' names (the trainer's ``train`` and ``Merge``, the experiment, the
fine-tuning, the corpus builders) are in :mod:`xlmeta_jax.cli.runs`, which t5x configs
do not import: ``--gin.train.X`` stays t5x's ``train``. Importing this module imports
neither TensorFlow nor seqio.
"""

from __future__ import annotations

import gin

from xlmeta_jax import errors
from xlmeta_jax.cli import flags as gin_flags
from xlmeta_jax.data import corpora, feeding
from xlmeta_jax.interop.hf import weights as hf_weights
from xlmeta_jax.model import mlm, network, optimizer
from xlmeta_jax.pretrain import phases, recipes

# A setting refused where its object is built (errors.SettingError) is named, in every
# command's line, by the gin binding or macro it came from: ours and t5x's trainer both
# import this module through their gin files.
errors.name_settings_by(gin_flags.setting_source)

# ----------------------------------------------------------------------------- the model
get_config = gin.external_configurable(
    network.get_config, name="get_config", module="xlmeta_jax.model.network"
)
# A released model's own configuration (its folder's config.json): continued pretraining.
config_of = gin.external_configurable(
    hf_weights.config_of, name="config_of", module="xlmeta_jax.interop.hf.weights"
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

# ---------------------------------------------------------------------------- the phases
Phase = gin.external_configurable(phases.Phase, module="xlmeta_jax.pretrain.trainer")


def masking() -> mlm.Masking:
    """The gin-bound ``Masking()`` (a bad value: an ``errors.SettingError``, which the
    command's line names by its binding, e.g. ``MASK_RATE``)."""
    return Masking()


def corpora_settings() -> corpora.Corpora:
    """The gin-bound ``Corpora()`` with the gin-bound, checked :func:`masking`."""
    return Corpora(masking=masking())


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
    """Registers the corpora ``name`` reads and returns its name, checked to be registered.

    Only those: a t5x run trains on one task or mixture (the XLM-R baseline's mixture;
    one phase of a run's ``Phase`` list registers its own, ``interop.t5x.stages.task``).

    Args:
      name: a task or mixture name (xlmeta_jax/data/task_names.py), e.g. ``'xlmeta_cc100'``.
      settings: the corpus settings (default: the gin-bound ones, see :func:`register`).

    Raises:
      CorpusError: naming the setting that registers ``name`` when it is missing.
    """
    from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio/TensorFlow only to read a corpus

    reading = tasks.reading(name, corpora_settings() if settings is None else settings)
    return tasks.check_registered(name, register(reading))


# Recipes (xlmeta_jax/pretrain/recipes.py): the phases and merge of a run, one function each,
# here so that t5x's run files (gin/meta.gin through gin/phases/meta.gin) have them too.
continued = gin.external_configurable(recipes.continued, module="xlmeta_jax.pretrain.recipes")
mmbert = gin.external_configurable(recipes.mmbert, module="xlmeta_jax.pretrain.recipes")
annealed = gin.external_configurable(recipes.annealed, module="xlmeta_jax.pretrain.recipes")
meta = gin.external_configurable(recipes.meta, module="xlmeta_jax.pretrain.recipes")
xlmr = gin.external_configurable(recipes.xlmr, module="xlmeta_jax.pretrain.recipes")
with_english_stage = gin.external_configurable(recipes.with_english_stage,
                                               module="xlmeta_jax.pretrain.recipes")


_PHASE = "xlmeta_jax.pretrain.trainer.Phase"


@gin.configurable(module="xlmeta_jax.pretrain.recipes")
def phases_of(recipe: recipes.Recipe = gin.REQUIRED) -> list:
    """A recipe's phases, for ``train.phases``.

    Raises:
      UserError: a scoped ``Phase`` binding names one of the recipe's stages
        (``stage2/...Phase.reset_schedule``): the recipe builds its stages itself, so the
        binding would do nothing; the line names the recipe's ``overrides`` instead.
    """
    names = {p.name for p in recipe.phases}
    for key in gin_flags.binding_keys():
        scope, _, selector = key.rpartition("/")
        configurable, _, field = selector.rpartition(".")
        # gin's config names a configurable by its shortest unique suffix ("Phase").
        if scope in names and _PHASE.endswith(configurable) and _PHASE.rpartition(".")[2] == (
                configurable.rpartition(".")[2]):
            key = f"{scope}/{_PHASE}.{field}"
            raise errors.UserError(
                f"{key}: this run's stages are built by {recipe.source or 'its recipe'}, not "
                f"by scoped Phase bindings; bind {recipe.source or 'the recipe'}.overrides = "
                f"{{'{scope}': {{'{field}': ...}}}} (or the recipe's own parameter)")
    return list(recipe.phases)


@gin.configurable(module="xlmeta_jax.pretrain.recipes")
def merge_of(recipe: recipes.Recipe = gin.REQUIRED):
    """A recipe's merge (None: none), for ``train.merge``."""
    return recipe.merge


def binding_source(key: str) -> str:
    """The macro or binding a setting's value comes from (``gin_flags.binding_source``);
    for a stage a recipe built (``stage2/...Phase.mask_rate``, bound nowhere), the recipe
    parameter it came from, or its macro (``recipes.SOURCES``)."""
    found = gin_flags.binding_source(key)
    stage, _, selector = key.rpartition("/")
    configurable, _, field = selector.rpartition(".")
    if found != key or configurable != _PHASE:
        return found
    for recipe, fields in reversed(recipes.SOURCES.items()):
        param = fields.get(f"{stage}/{field}")
        if param is not None:
            return gin_flags.binding_source(f"xlmeta_jax.pretrain.recipes.{recipe}.{param}")
    return key
