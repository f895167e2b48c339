"""The arms of the experiment: which pretraining phases each one trains.

The arms isolate the method. All share the model, batch, sequence length, peak
learning rate, warm-up, vocabulary and seeds; ``meta``, ``xlmr`` and ``joint`` also
share the number of tokens:

=============  ==========================================================================
``meta``       English for META_STEPS, then the mixture for XLING_STEPS from phase 1's
               parameters (fresh optimizer and schedule), as gin/meta.gin.
``xlmr``       the mixture for META_STEPS + XLING_STEPS (single-phase XLM-R).
``joint``      one phase of META_STEPS + XLING_STEPS on ``xlmeta_joint``: the mixture
               with English mixed in at META / (META + XLING) of the tokens (meta's
               data, no phases; registered by ``tasks.register`` with
               ``Corpora.joint_english_share``).
``xling_only`` the mixture for XLING_STEPS: meta without its phase 1.
``annealed``   the annealed-language curriculum (``recipes.annealed``, as
               gin/native/annealed.gin) at META_STEPS + XLING_STEPS on the mixture: each
               stage takes its share of the steps (70/20/10%) and as large a share of the
               experiment's languages, largest first by CC-100 size, as the recipe's
               stage takes of CC-100's 100 (30%, 60%, all); its alpha (0.7, 0.5, 0.3),
               masking rate (30, 15, 5%), hand-offs and schedule shape (warm-up-stable-
               decay, a 1-sqrt cool-down over stage 3) are the recipe's. Not among the
               default arms; name it in ``experiment.arms``.
``mmbert``     mmBERT's recipe (``recipes.mmbert``, as gin/native/mmbert.gin) at the tokens
               of META_STEPS + XLING_STEPS (a ModernBERT size), in its shares (2.3 : 0.6 :
               0.1): base, ext at twice the sequence length, and two decay branches (the
               continued mixture and every language) merged with TIES against ext, with
               the recipe's languages (as a share, as ``annealed``), alpha, masking, RoPE
               bases, hand-offs and schedule shape. The batch-size ramp and the
               English-heavy branch are left out (a small batch has no ramp). Not a
               default arm.
``meta_mmbert`` the same with the English stage in front: English for META_STEPS (its own
               schedule, as meta's phase 1), then mmBERT's stages in XLING_STEPS' tokens
               from its parameters with fresh moments and schedule. Not a default arm.
=============  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence

from xlmeta_jax import errors
from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.languages import BY_CC100_SIZE, XLMR_LANGUAGES
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import recipes as recipes_lib
from xlmeta_jax.pretrain import trainer

# The default arms; every arm the experiment accepts is in ALL_ARMS.
ARMS = ("meta", "xlmr", "joint", "xling_only")
ALL_ARMS = (*ARMS, "annealed", "mmbert", "meta_mmbert")
# The recipe arms and the recipe each calls (xlmeta_jax/pretrain/recipes.py: the stages are
# written once, there, for our trainer's run files, t5x's stages and the experiment alike). The
# experiment's command passes gin's configurable of each, so a binding of a recipe's parameter
# in the experiment's gin file reaches the arm (the arm's budget and shape are its own).
RECIPES = {"annealed": recipes_lib.annealed, "mmbert": recipes_lib.mmbert,
           "meta_mmbert": recipes_lib.mmbert}
# What the mmBERT arms train of the recipe's branches.
MMBERT_ARM_BRANCHES = ("decay_cont", "decay_all")


class ArmError(errors.UserError, ValueError):
    """An unknown arm or a budget an arm cannot train with."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """The compute every arm shares (xling_only: the XLING part only)."""

    # English (phase 1) steps of the meta arm.
    meta_steps: int
    # Mixture (phase 2) steps of the meta arm.
    xling_steps: int
    # Global batch (sequences per step) of every phase of every arm.
    batch_size: int
    # Tokens per packed sequence of every phase of every arm.
    sequence_length: int

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.sequence_length

    @property
    def english_share(self) -> float:
        """English share of the meta arm's tokens: META / (META + XLING)."""
        return self.meta_steps / (self.meta_steps + self.xling_steps)


def arm_phases(arm: str, budget: Budget, *, english_task: str, xling_mixture: str,
               optimizer: OptimizerConfig, languages: Sequence[str] | None = None,
               recipes: Mapping[str, Callable[..., recipes_lib.Recipe]] | None = None
               ) -> list[trainer.Phase]:
    """The trainer phases of one arm.

    Every phase trains ``budget.batch_size`` x ``budget.sequence_length`` per step and
    has its own linear warm-up/decay schedule over its steps with ``optimizer``'s
    peak learning rate and warm-up (``optimizer.total_steps`` is replaced).

    Args:
      arm: one of :data:`ARMS`.
      budget: steps, batch and sequence length.
      english_task: seqio task of phase 1 (English).
      xling_mixture: seqio mixture of the multilingual phase.
      optimizer: AdamW settings shared by every phase.
      languages: the mixture's languages (None: all 100); the recipe arms' stages
        take the largest of them first.
      recipes: per arm of :data:`RECIPES`, the function to call instead (gin's
        configurable of it, whose bindings then apply).

    Raises:
      ArmError: for an unknown arm or a warm-up longer than a phase.
    """
    def phase(name, task, steps, **kw):
        if optimizer.warmup_steps > steps:
            raise ArmError(
                f"arm {arm!r}, phase {name!r}: warmup_steps={optimizer.warmup_steps} exceeds "
                f"its {steps} steps (lower WARMUP_STEPS or raise META_STEPS / XLING_STEPS)")
        return trainer.Phase(name=name, task=task, num_steps=steps,
                             batch_size=budget.batch_size,
                             sequence_length=budget.sequence_length,
                             optimizer=dataclasses.replace(optimizer, total_steps=steps), **kw)

    total = budget.meta_steps + budget.xling_steps
    if arm == "meta":  # the recipe of gin/phases/meta.gin at the budget
        for name, steps in (("phase1", budget.meta_steps), ("phase2", budget.xling_steps)):
            phase(name, english_task, steps)  # the arm's warm-up check
        return list(recipes_lib.meta(
            english_task=english_task, xling_mixture=xling_mixture,
            meta_steps=budget.meta_steps, xling_steps=budget.xling_steps,
            batch_size=budget.batch_size, sequence_length=budget.sequence_length,
            optimizer=optimizer).phases)
    if arm == "xlmr":  # gin/native/xlmr.gin's
        phase("xlmr", xling_mixture, total)
        return list(recipes_lib.xlmr(
            xling_mixture=xling_mixture, steps=total, batch_size=budget.batch_size,
            sequence_length=budget.sequence_length, optimizer=optimizer).phases)
    if arm == "joint":
        # tasks.register adds it when Corpora.joint_english_share is set (the experiment
        # sets budget.english_share).
        return [phase("joint", names.JOINT_MIXTURE, total)]
    if arm == "xling_only":
        return [phase("xling", xling_mixture, budget.xling_steps)]
    if arm not in ALL_ARMS:
        raise ArmError(f"unknown arm {arm!r}; expected some of {ALL_ARMS}")
    recipe = _arm_recipe(arm, budget, english_task=english_task, xling_mixture=xling_mixture,
                         optimizer=optimizer, languages=languages, recipes=recipes)
    return list(recipe.phases)


def arm_merge(arm: str, budget: Budget, *, english_task: str, xling_mixture: str,
              optimizer: OptimizerConfig, languages: Sequence[str] | None = None,
              recipes: Mapping[str, Callable[..., recipes_lib.Recipe]] | None = None
              ) -> trainer.Merge | None:
    """The arm's merge step (the mmBERT arms' branches, merged with TIES against ext);
    None for an arm without one. Arguments as :func:`arm_phases`."""
    if arm not in RECIPES:
        return None
    return _arm_recipe(arm, budget, english_task=english_task, xling_mixture=xling_mixture,
                       optimizer=optimizer, languages=languages, recipes=recipes).merge


def _largest(ordered: Sequence[str], count: int | None) -> tuple[str, ...]:
    """As large a share of ``ordered`` (largest first) as ``count`` of CC-100's 100
    languages (None: all)."""
    if count is None:
        return tuple(ordered)
    return tuple(ordered[:max(1, round(count / len(XLMR_LANGUAGES) * len(ordered)))])


def _default(function, parameter: str):
    return inspect.signature(function).parameters[parameter].default


def _arm_recipe(arm: str, budget: Budget, *, english_task: str, xling_mixture: str,
                optimizer: OptimizerConfig, languages: Sequence[str] | None,
                recipes: Mapping[str, Callable[..., recipes_lib.Recipe]] | None
                ) -> recipes_lib.Recipe:
    """A recipe arm's recipe at the budget: the arm sets the budget, the shape and the
    languages (shares of the experiment's, largest first); the recipe the rest."""
    function = (recipes or {}).get(arm) or RECIPES[arm]
    chosen = set(XLMR_LANGUAGES if languages is None else languages)
    ordered = [lang for lang in BY_CC100_SIZE if lang in chosen]
    total = budget.meta_steps + budget.xling_steps
    if arm == "annealed":
        shares = _default(recipes_lib.annealed, "shares")
        steps = [round(share / sum(shares) * total) for share in shares[:-1]]
        if min([*steps, total - sum(steps)]) < 1 or optimizer.warmup_steps > steps[0]:
            raise ArmError(f"arm {arm!r}: its stages of {(*steps, total - sum(steps))} steps "
                           "need each >= 1 and the first >= "
                           f"warmup_steps={optimizer.warmup_steps} (raise META_STEPS / "
                           "XLING_STEPS or lower WARMUP_STEPS)")
        return function(
            task=xling_mixture, optimizer=optimizer, total_steps=total,
            batch_size=budget.batch_size, sequence_length=budget.sequence_length,
            languages=[_largest(ordered, n)
                       for n in _default(recipes_lib.annealed, "languages")])
    english = budget.meta_steps if arm == "meta_mmbert" else 0
    tokens = (total - english) * budget.tokens_per_step
    parts = _default(recipes_lib.mmbert, "shares")
    base_steps = round(tokens * parts[0] / sum(parts) / budget.tokens_per_step)
    if optimizer.warmup_steps > base_steps:
        raise ArmError(f"arm {arm!r}: its base stage of {base_steps} steps is shorter than "
                       f"warmup_steps={optimizer.warmup_steps} (raise XLING_STEPS or lower "
                       "WARMUP_STEPS)")
    recipe = function(
        task=xling_mixture, optimizer=optimizer, total_tokens=tokens,
        batch_size=budget.batch_size, ramp_batches=(), base_length=budget.sequence_length,
        ext_length=2 * budget.sequence_length,
        warmup_tokens=optimizer.warmup_steps * budget.tokens_per_step,
        base_languages=_largest(ordered, _default(recipes_lib.mmbert, "base_languages")),
        ext_languages=_largest(ordered, _default(recipes_lib.mmbert, "ext_languages")),
        decay_languages=_largest(ordered, _default(recipes_lib.mmbert, "decay_languages")),
        branches=MMBERT_ARM_BRANCHES)
    if not english:  # the first stage starts from scratch: fresh moments and schedule
        return recipes_lib.Recipe((dataclasses.replace(
            recipe.phases[0], reset_optimizer=True, reset_schedule=True), *recipe.phases[1:]),
            recipe.merge)
    # English first (its own schedule, as meta's phase 1), then the recipe's stages from its
    # parameters with fresh moments and schedule, as meta's phase 2.
    if optimizer.warmup_steps > english:
        raise ArmError(f"arm {arm!r}, phase 'english': warmup_steps={optimizer.warmup_steps} "
                       f"exceeds its {english} steps (lower WARMUP_STEPS or raise META_STEPS)")
    first = recipe.phases[0]
    return recipes_lib.Recipe((
        trainer.Phase(name="english", task=english_task, num_steps=english,
                      batch_size=budget.batch_size, sequence_length=budget.sequence_length,
                      optimizer=dataclasses.replace(optimizer, total_steps=english)),
        dataclasses.replace(first, init_from="english", reset_optimizer=True,
                            reset_schedule=True),
        *recipe.phases[1:]), recipe.merge)


def phase_tokens(phases: Sequence[trainer.Phase]) -> int:
    """Tokens an arm trains on: sum of steps x batch x sequence length."""
    return sum(p.num_steps * p.batch_size * p.sequence_length for p in phases)
