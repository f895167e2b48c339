"""gin's view of our trainer's runs: the run, its recipes, the corpora it writes first.

Registered under the module path of the object each configures
(``xlmeta_jax.pretrain.trainer.train.log_every``); the gin files of our commands
(gin/native/run.gin, gin/demo.gin, gin/experiments/*.gin, gin/finetune/*.gin) import
this module, t5x's do not (its own ``train`` would be ambiguous with ours). The
settings both trainers share: :mod:`xlmeta_jax.cli.configurables`; the evaluation's
and the experiment's names: :mod:`.evaluation_runs`, :mod:`.experiment_runs` (so that
``python -m xlmeta_jax.train`` imports neither evaluation nor the experiment).

* ``xlmeta_jax.pretrain.trainer.{train,Merge}`` — our trainer's run (gin/native/*.gin;
  its ``Phase`` and the recipes, ``xlmeta_jax.pretrain.recipes.*`` with ``phases_of`` and
  ``merge_of``, are in :mod:`.configurables`, which t5x's gin/meta.gin reads too);
* ``xlmeta_jax.data.demo_corpus.*``, ``demo_released.*``, ``experiment_corpus.*`` — the
  corpora the demos and the CPU experiment write before they train;
* helpers of the gin files themselves, named after this module: ``total_steps``,
  ``steps_for_tokens`` and ``prepare_data``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gin

from xlmeta_jax import errors
from xlmeta_jax.data import demo_corpus, demo_released, experiment_corpus
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
    if isinstance(tokens, bool) or not isinstance(tokens, int | float) or not tokens > 0:
        # Named by the stage's scoped binding and the macro behind it (BASE_TOKENS), as a
        # phase's own settings are, not by the stand-in phase below.
        scope = gin.current_scope_str() or None
        raise errors.SettingError(
            "xlmeta_jax.cli.runs.steps_for_tokens", "tokens", tokens,
            "must be a number of tokens > 0", scope=scope,
            context=f"stage {scope!r}: " if scope else "")
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
