"""Training recipes as functions: a run's phases and merge from the few numbers a user sets.

A recipe writes its stage list, its schedule and its hand-offs once, in Python; a gin file
binds only what a user changes (the budget, the data, a knob or two) and hands the result to
the trainer (``train.phases = @phases_of()``, ``train.merge = @merge_of()``, with
``phases_of.recipe = @continued()``: gin/native/continue.gin).

* :func:`continued` — continued pretraining of a released model: a warm-up, then a decay;
  optionally mmBERT's context extension (a longer length, other RoPE bases) and decay
  branches TIES-merged against the stage they start from, as mmBERT merges its variants;
* :func:`with_english_stage` — the paper's order in front of any recipe: English first,
  then the recipe's own stages from its final checkpoint (meta-pretraining from a release).

``Phase`` stays the one type of a stage: every value a recipe derives is checked where the
Phase is built, and the message names the phase.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain.phases import Merge, Phase, PhaseSettingError


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A run's phases, in training order, and its merge (None: the last phase is the
    product)."""

    phases: tuple[Phase, ...]
    merge: Merge | None = None


# What a decay branch may set of its data (the rest is the run's).
_BRANCH_FIELDS = ("name", "languages", "alpha", "mask_rate")


def continued(*, task: str, steps: int, batch_size: int, sequence_length: int,
              optimizer: OptimizerConfig, warmup_steps: int,
              extension_steps: int = 0, extension_length: int | None = None,
              extension_rope_theta: float | None = None,
              decay_steps: int = 0, branches: Sequence[Mapping] = (),
              merge_density: float | None = None) -> Recipe:
    """Continued pretraining of a released model (gin/native/continue.gin).

    Stages, each from the previous one's final checkpoint with its AdamW state and schedule:
    ``continue`` (``steps``), then with ``extension_steps`` ``ext`` (``extension_length``
    tokens a row, ``extension_rope_theta`` for every layer's RoPE), then with ``branches``
    one decay of ``decay_steps`` per branch from the last of those, merged with TIES
    against it. Without branches the schedule is a warm-up and a linear decay to 0 over
    the whole chain; with them it is warm-up-stable-decay, the decay in the branches.

    Args:
      task: what the stages train on (a registered task or mixture).
      steps, batch_size, sequence_length: the first stage.
      optimizer: AdamW's settings (its learning rate, betas, decay ...); the recipe sets
        the schedule's shape and lengths.
      warmup_steps: the warm-up, at the start of ``continue``.
      extension_steps, extension_length, extension_rope_theta: the context extension
        (0 steps: none).
      decay_steps: each branch's length.
      branches: the decay variants: ``{"name": ..., "languages": ..., "alpha": ...,
        "mask_rate": ...}`` (all but the name optional; absent: the run's).
      merge_density: TIES' share of each task vector kept (None: Merge's default).
    """
    extended = bool(extension_steps)
    chain = steps + (extension_steps if extended else 0)
    if branches:
        schedule = dataclasses.replace(optimizer, schedule="wsd", warmup_steps=warmup_steps,
                                     total_steps=chain + decay_steps, decay_steps=decay_steps)
    else:
        schedule = dataclasses.replace(optimizer, schedule="linear", warmup_steps=warmup_steps,
                                     total_steps=chain)
    shared = dict(task=task, batch_size=batch_size, optimizer=schedule,
                  reset_optimizer=False, reset_schedule=False)
    phases = [Phase(name="continue", num_steps=steps, sequence_length=sequence_length,
                    **shared)]
    if extended:
        phases.append(Phase(
            name="ext", num_steps=extension_steps, init_from="continue",
            sequence_length=extension_length or sequence_length,
            global_rope_theta=extension_rope_theta, local_rope_theta=extension_rope_theta,
            **shared))
    if not branches:
        return Recipe(tuple(phases))
    base = phases[-1]
    for branch in branches:
        unknown = set(branch) - set(_BRANCH_FIELDS)
        if unknown or "name" not in branch:
            raise PhaseSettingError(
                "xlmeta_jax.pretrain.recipes.continued", "branches", dict(branch),
                f"a branch is a dict of {list(_BRANCH_FIELDS)} with a name"
                + (f" (unknown: {sorted(unknown)})" if unknown else ""))
        phases.append(Phase(
            num_steps=decay_steps, init_from=base.name, sequence_length=base.sequence_length,
            global_rope_theta=base.global_rope_theta, local_rope_theta=base.local_rope_theta,
            **shared, **branch))
    merge = Merge(branches=[b["name"] for b in branches], base=base.name, method="ties",
                  density=merge_density)
    return Recipe(tuple(phases), merge)


def with_english_stage(recipe: Recipe, *, steps: int, task: str,
                       sequence_length: int | None = None) -> Recipe:
    """``recipe`` after an English stage (the paper's order: English, then the mixture).

    The stage ``english`` trains ``steps`` steps on ``task`` with the first stage's batch,
    length and optimizer; the recipe's first stage then starts from its final checkpoint
    with fresh AdamW moments and its own schedule (as meta-pretraining's phase 2).
    """
    first = recipe.phases[0]
    english = dataclasses.replace(
        first, name="english", task=task, num_steps=steps, num_tokens=None, init_from=None,
        sequence_length=sequence_length or first.sequence_length,
        optimizer=dataclasses.replace(first.optimizer, schedule="linear", total_steps=steps,
                                      decay_steps=0),
        languages=None, alpha=None, mask_rate=None)
    rest = (dataclasses.replace(first, init_from="english", reset_optimizer=True,
                                reset_schedule=True), *recipe.phases[1:])
    return Recipe((english, *rest), recipe.merge)
