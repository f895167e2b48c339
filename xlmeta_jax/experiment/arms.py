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
``annealed``   gin/native/annealed.gin's stages at META_STEPS + XLING_STEPS on the
               mixture (:data:`CURRICULA`): each stage takes its share of the file's
               steps (70/20/10%) and as large a share of the experiment's languages,
               largest first by CC-100 size, as the file's stage takes of CC-100's 100
               (30%, 60%, all); its alpha (0.7, 0.5, 0.3), masking rate (30, 15, 5%),
               hand-offs and schedule shape (warm-up-stable-decay, a 1-sqrt cool-down
               over stage 3) are the file's. Not among the default arms; name it in
               ``experiment.arms``.
``mmbert``     mmBERT's recipe at the tokens of META_STEPS + XLING_STEPS (a ModernBERT
               size): gin/native/mmbert.gin's stages base, ext and two of its decay
               branches, with the file's languages (as a share, as ``annealed``),
               alpha, masking, RoPE bases, hand-offs, schedule shape and TIES merge
               (against ext). The budget is the arm's (:data:`MMBERT_ARM_STAGES`): base
               77% of the tokens, ext 20% at twice the sequence length, each branch 3%
               (the continued mixture and every language; the file's English-heavy
               branch and its batch-size ramp are left out, a small batch has no ramp).
               Not a default arm.
``meta_mmbert`` the same with the English stage in front: English for META_STEPS (its own
               schedule, as meta's phase 1), then mmBERT's stages in XLING_STEPS' tokens
               from its parameters with fresh moments and schedule. Not a default arm.
=============  ==========================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from xlmeta_jax import errors
from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.languages import BY_CC100_SIZE, XLMR_LANGUAGES
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import trainer

# The default arms; every arm the experiment accepts is in ALL_ARMS.
ARMS = ("meta", "xlmr", "joint", "xling_only")
ALL_ARMS = (*ARMS, "annealed", "mmbert", "meta_mmbert")
# The curriculum arms and the run file of our trainer whose stages each scales: the stages
# are defined once, there (python -m xlmeta_jax.train and t5x's stages read the same file);
# the experiment's command reads them (xlmeta_jax.cli.experiment_runs.curricula).
CURRICULA = {"annealed": "native/annealed.gin", "mmbert": "native/mmbert.gin",
             "meta_mmbert": "native/mmbert.gin"}
# The mmBERT arms' budget: which of gin/native/mmbert.gin's stages they train, each one's
# share of the tokens and its length (x the budget's). A decay branch's share is its own.
MMBERT_ARM_STAGES = {"base": (0.77, 1), "ext": (0.20, 2), "decay_cont": (0.03, 2),
                     "decay_all": (0.03, 2)}


class ArmError(errors.UserError, ValueError):
    """An unknown arm or a budget an arm cannot train with."""


@dataclasses.dataclass(frozen=True)
class Curriculum:
    """What a run file of our trainer binds: its phases (``train.phases``) and its
    merge step (``train.merge``)."""

    phases: tuple[trainer.Phase, ...]
    merge: trainer.Merge | None = None

    def stage(self, name: str) -> trainer.Phase:
        return next(p for p in self.phases if p.name == name)


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
               curricula: Mapping[str, Curriculum] | None = None
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
      languages: the mixture's languages (None: all 100); the annealed arm's stages
        take the largest of them first.
      curricula: per arm of :data:`CURRICULA`, what its run file binds, which the
        arm scales to the budget.

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
    if arm not in ALL_ARMS:
        raise ArmError(f"unknown arm {arm!r}; expected some of {ALL_ARMS}")
    curriculum = _curriculum(arm, curricula)
    if arm == "annealed":
        return _scaled_stages(arm, curriculum.phases, budget, xling_mixture, optimizer,
                              languages)
    if arm == "mmbert":
        return _mmbert(curriculum, budget, xling_mixture, optimizer, languages, total)
    return [phase("english", english_task, budget.meta_steps),
            *_mmbert(curriculum, budget, xling_mixture, optimizer, languages,
                     budget.xling_steps, after="english")]


def _curriculum(arm: str, curricula: Mapping[str, Curriculum] | None) -> Curriculum:
    """The run file's phases the arm scales, with the stages the arm needs (an edited
    file that lacks one is refused in one line)."""
    curriculum = (curricula or {}).get(arm)
    if curriculum is None:
        raise ValueError(f"arm {arm!r} scales gin/{CURRICULA[arm]}: pass what it binds as "
                         "curricula (xlmeta_jax.cli.experiment_runs.curricula reads it)")
    names = [p.name for p in curriculum.phases]
    needed = [] if arm == "annealed" else list(MMBERT_ARM_STAGES)
    if not names or any(n not in names for n in needed):
        raise ArmError(f"arm {arm!r} scales the phases of gin/{CURRICULA[arm]} "
                       f"(train.phases: {names}), which lacks "
                       + (", ".join(n for n in needed if n not in names) or "any phase"))
    return curriculum


def _largest(ordered: Sequence[str], stage: trainer.Phase) -> tuple[str, ...]:
    """As large a share of ``ordered`` (largest first) as the run file's stage takes of
    CC-100's 100 languages (its lists are the largest ones; None: all)."""
    if stage.languages is None:
        return tuple(ordered)
    count = max(1, round(len(stage.languages) / len(XLMR_LANGUAGES) * len(ordered)))
    return tuple(ordered[:count])


def _scaled_stages(arm: str, stages: Sequence[trainer.Phase], budget: Budget, mixture: str,
                   optimizer: OptimizerConfig, languages: Sequence[str] | None
                   ) -> list[trainer.Phase]:
    """A run file's chain of stages at the budget: META_STEPS + XLING_STEPS on ``mixture``.

    Each stage keeps its name, hand-off (init_from, resets), alpha and masking rate; it
    takes its share of the file's steps (the last stage the rest), and as large a share
    of the experiment's languages, largest first by CC-100 size, as the file's stage
    takes of CC-100's 100 (the file's lists are the largest languages). One schedule
    spans the stages, the experiment's ``optimizer`` with the file's schedule shape; its
    cool-down covers the stages the file's covers.
    """
    total = budget.meta_steps + budget.xling_steps
    file_steps = [stage.num_steps for stage in stages]
    steps = [round(n / sum(file_steps) * total) for n in file_steps[:-1]]
    steps.append(total - sum(steps))
    if min(steps) < 1 or optimizer.warmup_steps > steps[0]:
        raise ArmError(f"arm {arm!r}: its stages of {tuple(steps)} steps need each >= 1 and "
                       f"the first >= warmup_steps={optimizer.warmup_steps} (raise META_STEPS "
                       "/ XLING_STEPS or lower WARMUP_STEPS)")
    chosen = set(XLMR_LANGUAGES if languages is None else languages)
    ordered = [lang for lang in BY_CC100_SIZE if lang in chosen]
    shape = stages[-1].optimizer_config()
    tails = [sum(file_steps[k:]) for k in range(len(stages))]
    decay = (sum(steps[tails.index(shape.decay_steps):]) if shape.decay_steps in tails
             else round(shape.decay_steps / sum(file_steps) * total))
    schedule = dataclasses.replace(optimizer, total_steps=total, schedule=shape.schedule,
                                   decay_steps=decay, decay_shape=shape.decay_shape)
    return [dataclasses.replace(
        stage, task=mixture, num_steps=n, num_tokens=None, batch_size=budget.batch_size,
        sequence_length=budget.sequence_length, optimizer=schedule,
        languages=_largest(ordered, stage)) for stage, n in zip(stages, steps)]


def arm_merge(arm: str, curricula: Mapping[str, Curriculum] | None = None
              ) -> trainer.Merge | None:
    """The arm's merge step: its run file's, of the branches the arm trains (mmBERT's
    decay branches, merged with TIES against ext); None for an arm without one."""
    if arm not in CURRICULA:
        return None
    merge = _curriculum(arm, curricula).merge
    if merge is None or arm == "annealed":  # annealed trains every stage of its file
        return merge
    return dataclasses.replace(
        merge, branches=tuple(b for b in merge.branches if b in MMBERT_ARM_STAGES))


def _mmbert(curriculum: Curriculum, budget: Budget, mixture: str, optimizer: OptimizerConfig,
            languages: Sequence[str] | None, steps_of_budget: int, after: str | None = None
            ) -> list[trainer.Phase]:
    """The run file's mmBERT stages in ``steps_of_budget`` steps' tokens (MMBERT_ARM_STAGES).

    Each stage keeps the file's languages (as a share), alpha, masking rate, RoPE bases
    and hand-off; the first starts from ``after`` (fresh moments and schedule) or from
    scratch. One schedule of the file's shape spans a branch's chain, its cool-down the
    decay stage.
    """
    tokens = steps_of_budget * budget.tokens_per_step
    chosen = set(XLMR_LANGUAGES if languages is None else languages)
    ordered = [lang for lang in BY_CC100_SIZE if lang in chosen]
    steps = {name: max(1, round(share * tokens / (budget.tokens_per_step * scale)))
             for name, (share, scale) in MMBERT_ARM_STAGES.items()}
    chain = steps["base"] + steps["ext"] + steps["decay_all"]
    if optimizer.warmup_steps > steps["base"]:
        raise ArmError(f"arm 'mmbert': its base stage of {steps['base']} steps is shorter than "
                       f"warmup_steps={optimizer.warmup_steps} (raise XLING_STEPS or lower "
                       "WARMUP_STEPS)")
    shape = curriculum.stage("decay_all").optimizer_config()
    schedule = dataclasses.replace(optimizer, total_steps=chain, schedule=shape.schedule,
                                   decay_steps=steps["decay_all"],
                                   decay_shape=shape.decay_shape)
    phases = []
    for name, (_, scale) in MMBERT_ARM_STAGES.items():
        stage, first = curriculum.stage(name), name == "base"
        phases.append(dataclasses.replace(
            stage, task=mixture, num_steps=steps[name], num_tokens=None,
            batch_size=budget.batch_size, sequence_length=scale * budget.sequence_length,
            optimizer=schedule, languages=_largest(ordered, stage),
            init_from=after if first else stage.init_from,
            # From the English stage: fresh moments and schedule, as meta's phase 2.
            reset_optimizer=first or stage.reset_optimizer,
            reset_schedule=first or stage.reset_schedule))
    return phases


def phase_tokens(phases: Sequence[trainer.Phase]) -> int:
    """Tokens an arm trains on: sum of steps x batch x sequence length."""
    return sum(p.num_steps * p.batch_size * p.sequence_length for p in phases)
