"""A pretraining phase: what one stretch of a run trains on, for how long, and how.

Meta-pretraining is two phases (English, then 100 languages), the XLM-R baseline one,
and a staged curriculum (gin/native/annealed.gin, in mmBERT's manner) three, each with
its own languages, sampling temperature and masking rate. A phase checks its own values
when built; :mod:`.checks` checks what spans several objects (a rate against a length,
the phases against each other); the trainer (:mod:`xlmeta_jax.pretrain.trainer`) runs them
in order.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from xlmeta_jax import errors
from xlmeta_jax.data import rates
from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.data.languages import language_problem
from xlmeta_jax.model import mlm
from xlmeta_jax.model.optimizer import OptimizerConfig

# Phase.task of a stream of random tokens (no corpus).
SYNTHETIC = "synthetic"
# Tasks with no languages or alpha to set (a phase of theirs may set its mask rate only).
MONOLINGUAL = (names.ENGLISH_TEXT_TASK, names.ENGLISH_TFDS_TASK, SYNTHETIC)


# The name gin files bind Phase by (errors name a bad value's setting from it).
CONFIGURABLE = "xlmeta_jax.pretrain.trainer.Phase"


class PhaseSettingError(errors.SettingError):
    """A phase's own data setting out of range (its scoped binding named)."""


@dataclasses.dataclass
class Phase:
    """One pretraining phase. Meta-pretraining has two; the XLM-R baseline one."""

    # Name of the phase; also its checkpoint directory under MODEL_DIR.
    name: str
    # SeqIO task or mixture to train on ('synthetic' for random tokens).
    task: str
    # Optimizer steps in this phase.
    num_steps: int
    # Global batch size (sequences per step, across all processes).
    batch_size: int
    # Tokens per packed sequence.
    sequence_length: int
    # Optimizer and schedule; default: AdamW as RoBERTa, 6% warm-up over num_steps.
    optimizer: OptimizerConfig | None = None
    # Name of an earlier phase whose final checkpoint initialises this one.
    init_from: str | None = None
    # With init_from: start from fresh AdamW moments (else carry them over).
    reset_optimizer: bool = True
    # With init_from: restart the learning-rate schedule at step 0 (else continue it).
    reset_schedule: bool = True
    # The phase's own data, for staged curricula; None keeps the run's setting
    # (CC100_LANGUAGES, ALPHA, MASK_RATE). With any set, the phase's task or mixture is
    # registered once more under a name of its own, '{task}.{name}' (see source()).
    # Languages of its multilingual mixture (CC-100 codes).
    languages: Sequence[str] | None = None
    # Sampling exponent of its mixture (q_l proportional to n_l^alpha).
    alpha: float | None = None
    # Share of the tokens selected for prediction in its blocks.
    mask_rate: float | None = None
    # Read the task's tokens from seqio's offline token cache (CC100_DIR/cache, written
    # by python -m xlmeta_jax.data.prepare --tokenize; or make_mlm_iterator.cache_dir).
    # None: the feeder's own setting (make_mlm_iterator.use_cached).
    use_cached: bool | None = None

    def __post_init__(self):
        if self.languages is not None and not isinstance(self.languages, str):
            self.languages = tuple(self.languages)
        # The phase's values, checked once, here: the trainer, the task registration and
        # the AOT tool trust them (checks.validate checks what spans several objects).
        problem = self._problem()
        if problem is not None:
            field, message = problem
            raise PhaseSettingError(CONFIGURABLE, field, getattr(self, field), message,
                                    scope=self.name, context=f"phase {self.name!r}: ")

    def _problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) of the phase's first bad value, or None."""
        for field in ("num_steps", "batch_size", "sequence_length"):
            if problem := errors.count_problem(getattr(self, field)):
                return (field, problem)
        if not self.has_own_data():
            return None
        if not isinstance(self.name, str) or not re.fullmatch(r"\w+", self.name):
            return ("name", "a phase with languages, alpha or mask_rate of its own registers "
                    "its data under its name, which must be letters, digits and '_'")
        if self.task in MONOLINGUAL:
            for field in ("languages", "alpha"):
                if getattr(self, field) is not None:
                    return (field, f"is for a multilingual mixture; task {self.task!r} has "
                            "none (only mask_rate applies)")
        if self.languages is not None and (problem := language_problem(self.languages)):
            return ("languages", problem)
        if self.alpha is not None and (problem := rates.alpha_problem(self.alpha)):
            return ("alpha", problem)
        if self.mask_rate is not None:
            try:
                mlm.Masking(rate=self.mask_rate)  # the masking rate's one check
            except errors.SettingError as e:
                return ("mask_rate", e.message)
        return None

    def optimizer_config(self) -> OptimizerConfig:
        if self.optimizer is not None:
            return self.optimizer
        return OptimizerConfig(total_steps=self.num_steps,
                               warmup_steps=max(1, int(0.06 * self.num_steps)))

    def masking_rate(self, run_rate: float) -> float:
        """The share of tokens the phase masks: its own ``mask_rate``, else the run's."""
        return run_rate if self.mask_rate is None else self.mask_rate

    def has_own_data(self) -> bool:
        """Whether the phase sets its languages, alpha or masking rate itself."""
        return any(v is not None for v in (self.languages, self.alpha, self.mask_rate))

    def source(self) -> str:
        """The registered task or mixture the phase reads (and its seeds derive from).

        ``task`` itself, or for a corpus phase with data of its own ``'{task}.{name}'``,
        the name its own registration has (``tasks.register(views=...)``).
        """
        if self.task == SYNTHETIC or not self.has_own_data():
            return self.task
        return f"{self.task}{self.view_suffix()}"

    def view_suffix(self) -> str:
        """What the names of the phase's own tasks and mixture end with."""
        return f".{self.name}"

    def corpora(self, run_corpora: Corpora) -> Corpora:
        """The run's corpus settings with this phase's own languages, alpha and masking."""
        changes = {}
        if self.languages is not None:
            changes["languages"] = tuple(self.languages)
        if self.alpha is not None:
            changes["alpha"] = self.alpha
        if self.mask_rate is not None:
            changes["masking"] = dataclasses.replace(run_corpora.masking, rate=self.mask_rate)
        return dataclasses.replace(run_corpora, **changes) if changes else run_corpora

    def describe_data(self, run_corpora: Corpora) -> str:
        """One line on what the phase reads: its task, languages, alpha and masking rate."""
        c = self.corpora(run_corpora)
        parts = [self.source()]
        if self.task not in MONOLINGUAL:
            parts.append(f"{len(c.languages)} languages" if c.languages is not None
                         else "every language")
            parts.append(f"alpha {c.alpha:g}")
        parts.append(f"mask rate {c.masking.rate:g}")
        if self.use_cached:
            parts.append("tokens from the offline cache")
        return ", ".join(parts)

