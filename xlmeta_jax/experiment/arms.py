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
=============  ==========================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from xlmeta_jax import errors
from xlmeta_jax.data import task_names as names
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import trainer

ARMS = ("meta", "xlmr", "joint", "xling_only")


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
               optimizer: OptimizerConfig) -> list[trainer.Phase]:
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
    if arm == "meta":
        return [
            phase("phase1", english_task, budget.meta_steps),
            # Fresh AdamW moments and schedule, as gin/meta.gin.
            phase("phase2", xling_mixture, budget.xling_steps, init_from="phase1",
                  reset_optimizer=True, reset_schedule=True),
        ]
    if arm == "xlmr":
        return [phase("xlmr", xling_mixture, total)]
    if arm == "joint":
        # tasks.register adds it when Corpora.joint_english_share is set (the experiment
        # sets budget.english_share).
        return [phase("joint", names.JOINT_MIXTURE, total)]
    if arm == "xling_only":
        return [phase("xling", xling_mixture, budget.xling_steps)]
    raise ArmError(f"unknown arm {arm!r}; expected some of {ARMS}")


def phase_tokens(phases: Sequence[trainer.Phase]) -> int:
    """Tokens an arm trains on: sum of steps x batch x sequence length."""
    return sum(p.num_steps * p.batch_size * p.sequence_length for p in phases)
