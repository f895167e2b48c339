r"""Any phase of our trainer's run, through t5x: ``python -m xlmeta_jax.t5x_train --phase``.

A run file of our trainer (gin/native/\*.gin) defines its phases once, as a list of
:class:`~xlmeta_jax.pretrain.phases.Phase`. Our trainer runs them all in one command;
t5x's ``train`` runs one dataset, optimizer and schedule per command, so there the same
run file runs one phase per command::

  python -m xlmeta_jax.t5x_train --gin_file=gin/native/annealed.gin --phase=stage2 \
    --gin.MODEL_DIR="'/runs/annealed_t5x'" ...the run's other flags...

The command parses the run file as our trainer does (the same gin flags, the same
checks), takes the phase (by name or number) and derives from it, here, everything the
t5x run of that phase needs: the task it reads (its own languages, alpha and masking
registered as our trainer registers them), its steps, batch, length, RoPE bases,
optimizer and schedule, its seeds, and the checkpoint it starts from. gin/t5x/stage.gin
binds t5x's settings to the functions below, which read that :class:`Stage`.

Phase N writes t5x's layout to ``MODEL_DIR/<name>/``. A phase that continues another's
optimizer state and schedule (``reset_optimizer=False, reset_schedule=False``) starts
from that phase's whole final state and continues its step; one that resets both starts
from its parameters alone, at step 0. t5x cannot hold one without the other (its train
state is restored whole or not at all), so a phase resetting only one is refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from xlmeta_jax import errors, logs
from xlmeta_jax.data import seeds, tasks
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.interop.t5x import phases as t5x_phases
from xlmeta_jax.model import mlm, network, optimizer
from xlmeta_jax.pretrain.phases import SYNTHETIC, Phase


class StageError(errors.UserError, ValueError):
    """A phase that t5x cannot run as the run file defines it, or no phase to run."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One phase of a run as a ``python -m t5x.train`` command runs it.

    Attributes:
      model_dir: the run's MODEL_DIR (absolute); the phase writes ``model_dir/<name>``.
      phases: the run's phases, in order (checked by our trainer's checks).
      index: which of them this command trains (0-based).
      model: the run's encoder (the phase's RoPE bases applied by :meth:`model_config`).
      corpora: the run's corpus settings (the phase's own data applied in :func:`task`).
      vocab_path: the SentencePiece model.
      seed: the run seed.
      microbatches: gradient accumulation (MICROBATCHES).
      checkpoint_every, keep_checkpoints, log_every: as our trainer's ``train``.
      by_number: the command names phases by number (gin/meta.gin's ``--gin.PHASE=2``),
        not by name (``--phase=stage2``).
    """

    model_dir: str
    phases: tuple[Phase, ...]
    index: int
    model: network.EncoderConfig
    corpora: Corpora
    vocab_path: str | None
    seed: int = 0
    microbatches: int = 1
    checkpoint_every: int = 1000
    keep_checkpoints: int | None = 3
    log_every: int = 100
    by_number: bool = False

    def __post_init__(self):
        phase = self.phase
        source = self.source_phase
        if source is not None and phase.reset_optimizer != phase.reset_schedule:
            reset, kept = (("optimizer", "schedule") if phase.reset_optimizer
                           else ("schedule", "optimizer"))
            raise StageError(
                f"phase {phase.name!r} resets its {reset} but not its {kept}: t5x "
                "restores a train state whole (parameters, AdamW moments and step) or takes "
                "the parameters alone; set reset_optimizer and reset_schedule alike, or train "
                "it with python -m xlmeta_jax.train")
        if self.corpora.packed and phase.task != SYNTHETIC:
            raise StageError(
                "xlmeta_jax.data.corpora.Corpora.packing packs rows from whole documents, which "
                "t5x's MaskedLMModel does not read (it reads fairseq blocks): add "
                "--gin.xlmeta_jax.data.corpora.Corpora.packing=\"'blocks'\", or train the run "
                "with python -m xlmeta_jax.train")

    @property
    def phase(self) -> Phase:
        """The phase this command trains."""
        return self.phases[self.index]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.phases)

    @property
    def source_phase(self) -> Phase | None:
        """The phase whose final checkpoint this one starts from (``init_from``)."""
        if self.phase.init_from is None:
            return None
        return self.phases[self.names.index(self.phase.init_from)]

    def keeps_state(self) -> bool:
        """Whether the phase continues its source's whole state (moments and step)."""
        return self.source_phase is not None and not self.phase.reset_schedule

    def start_step(self, index: int | None = None) -> int:
        """The t5x step phase ``index`` (default: this one) starts from."""
        index = self.index if index is None else index
        phase = self.phases[index]
        if phase.init_from is None or phase.reset_schedule:
            return 0
        return self.end_step(self.names.index(phase.init_from))

    def end_step(self, index: int | None = None) -> int:
        """The t5x step phase ``index`` (default: this one) ends at: ``TRAIN_STEPS``."""
        index = self.index if index is None else index
        return self.start_step(index) + self.phases[index].num_steps

    def source_words(self, index: int) -> tuple[str, str]:
        """What the error of a phase whose source (phase ``index``) has not finished says:
        who starts from its final checkpoint, and what to run first."""
        if self.by_number:
            n, m = self.index + 1, index + 1
            return (f"phase {n} starts from phase {m}'s", f"run phase {m} to step "
                    f"{self.end_step(index)} first (same command with --gin.PHASE={m})")
        name = self.phases[index].name
        return (f"phase {self.phase.name!r} starts from phase {name!r}'s",
                f"run it first (the same command with --phase={name})")

    def phase_dir(self, index: int | None = None) -> str:
        index = self.index if index is None else index
        return os.path.join(self.model_dir, self.phases[index].name)

    def model_config(self) -> network.EncoderConfig:
        """The run's encoder with the phase's own RoPE bases."""
        return self.phase.model(self.model)

    def masking(self) -> mlm.Masking:
        return self.phase.corpora(self.corpora).masking

    def data_seed(self) -> int:
        """The phase's data seed, as our trainer derives it (run seed, task, occurrence)."""
        return seeds.phase_seeds([p.source() for p in self.phases], self.seed)[self.index]


_current: list[Stage] = []


def set_current(stage: Stage) -> None:
    """Makes ``stage`` the one :func:`current` returns (``--phase``'s command sets it)."""
    _current[:] = [stage]


def current() -> Stage:
    """The stage ``python -m xlmeta_jax.t5x_train --phase`` derived (gin/t5x/stage.gin's
    ``STAGE``)."""
    if not _current:
        raise StageError(
            "gin/t5x/stage.gin trains one phase of a run file of our trainer: run it as "
            "python -m xlmeta_jax.t5x_train --gin_file=gin/native/RUN.gin --phase=NAME "
            "(docs/t5x.md)")
    return _current[0]


def of_run(phases: Sequence[Phase], phase: int, model_dir: str, model: network.EncoderConfig,
           corpora: Corpora, vocab_path: str | None = None, seed: int = 0) -> Stage:
    """Phase ``phase`` (1-based: the ``PHASE`` macro) of a phase list that a t5x run file
    includes (gin/meta.gin's ``STAGE``: the phases of gin/phases/meta.gin, which our
    trainer's gin/native/meta.gin runs in one command).

    Raises:
      t5x_phases.PhaseError: ``PHASE`` out of range, or ``MODEL_DIR`` unset.
    """
    phases = tuple(phases)
    index = t5x_phases.check_phase(phase, [p.name for p in phases]) - 1
    return Stage(model_dir=t5x_phases.run_dir(model_dir), phases=phases, index=index,
                 model=model, corpora=corpora, vocab_path=vocab_path, seed=seed,
                 by_number=True)


def select_phase(phases: Sequence[Phase], wanted: str) -> int:
    """The 0-based index of the phase ``--phase`` names (its name or 1-based number)."""
    names = [p.name for p in phases]
    if wanted in names:
        return names.index(wanted)
    if wanted.isdigit() and 1 <= int(wanted) <= len(names):
        return int(wanted) - 1
    raise StageError(f"--phase={wanted}: the run's phases are "
                     f"{', '.join(names)} (a name, or 1 to {len(names)})")


# ---------------------------------------------------------------------------------- gin
# What gin/t5x/phase.gin binds t5x's settings to, each a function of the stage (``STAGE``).


def model_dir(stage: Stage) -> str:
    """``MODEL_DIR``: the run's directory (the phase writes its own under it)."""
    return stage.model_dir


def phase_dir(stage: Stage) -> str:
    """The directory t5x writes this phase to: ``MODEL_DIR/<name>``."""
    return stage.phase_dir()


def vocab_path(stage: Stage) -> str | None:
    return stage.vocab_path


def task(stage: Stage) -> str:
    """Registers the corpora the phase reads, with its own data as our trainer registers
    it, and returns the task or mixture it reads (``MIXTURE_OR_TASK_NAME``).

    Only those corpora: a t5x command trains one phase (phase 1 of meta-pretraining on
    English neither needs nor checks phase 2's corpora, which its own command does).
    """
    phase = stage.phase
    reading = tasks.reading(phase.task, phase.corpora(stage.corpora))
    own = {phase.view_suffix(): reading} if phase.source() != phase.task else None
    source = tasks.check_registered(phase.source(), tasks.register(reading, views=own))
    if not _described:  # gin evaluates the name once per binding that reads it
        _described.append(source)
        if note := phase.steps_note():
            logs.progress.info("%s", note)
        logs.progress.info("[%s] reads %s", phase.name, phase.describe_data(stage.corpora))
    return source


_described: list[str] = []


def train_steps(stage: Stage) -> int:
    """``TRAIN_STEPS``: the state's step at which the phase ends."""
    return stage.end_step()


def start_step(stage: Stage) -> int:
    return stage.start_step()


def batch_size(stage: Stage) -> int:
    return stage.phase.batch_size


def sequence_length(stage: Stage) -> int:
    return stage.phase.sequence_length


def microbatches(stage: Stage) -> int:
    return stage.microbatches


def model_config(stage: Stage) -> network.EncoderConfig:
    return stage.model_config()


def masking(stage: Stage) -> mlm.Masking:
    return stage.masking()


def optimizer_config(stage: Stage) -> optimizer.OptimizerConfig:
    """The phase's optimizer and schedule (over the steps of the phases it continues)."""
    return stage.phase.optimizer_config()


def run_seed(stage: Stage) -> int:
    return stage.seed


def random_seed(stage: Stage) -> int:
    """t5x's ``RANDOM_SEED`` (init and dropout): the run seed for a phase that starts
    fresh, the phase's own data seed for one that starts from another phase."""
    return stage.seed if stage.source_phase is None else stage.data_seed()


def data_seed(stage: Stage) -> int:
    """The phase's data seed (each host's stream derives its own from it)."""
    return stage.data_seed()


def init_from(stage: Stage) -> str | None:
    """The checkpoint the phase starts from: its source phase's final one (None: fresh).

    Raises:
      t5x_phases.PhaseError: the source has not finished and this phase has no
        checkpoint of its own yet.
    """
    source = stage.source_phase
    if source is None:
        return None
    index = stage.names.index(source.name)
    return t5x_phases.source_checkpoint(stage.phase_dir(), stage.phase_dir(index),
                                        stage.end_step(index), *stage.source_words(index))


def keeps_state(stage: Stage) -> bool:
    return stage.keeps_state()


def phase_number(stage: Stage) -> int:
    return stage.index + 1


def phase_names(stage: Stage) -> tuple[str, ...]:
    return stage.names


def checkpoint_every(stage: Stage) -> int:
    return stage.checkpoint_every


def keep_checkpoints(stage: Stage) -> int | None:
    return stage.keep_checkpoints


def log_every(stage: Stage) -> int:
    return stage.log_every
