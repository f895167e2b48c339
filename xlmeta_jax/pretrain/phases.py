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
import math
import re
from collections.abc import Sequence

from xlmeta_jax import errors
from xlmeta_jax.data import feeding, rates
from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.data.languages import language_problem
from xlmeta_jax.model import mlm
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import merging

# Phase.task of a stream of random tokens (no corpus).
SYNTHETIC = feeding.SYNTHETIC
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
    # Optimizer steps in this phase (or give num_tokens).
    num_steps: int | None = None
    # Global batch size (sequences per step, across all processes).
    batch_size: int | None = None
    # Tokens per packed sequence (may differ between phases: the step compiles once per
    # shape, and a checkpoint continues into a phase of another length as it is).
    sequence_length: int | None = None
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
    # The phase's length in tokens instead of num_steps: the steps are num_tokens /
    # (batch_size x sequence_length), rounded to the nearest whole step (at least 1; the
    # trainer logs the rounding: steps_note()).
    num_tokens: int | float | None = None
    # modernbert: the phase's own RoPE bases (None: the model's), e.g. mmBERT's context
    # extension raises the global layers' base from 10k to 160k at 8192 tokens. RoPE has
    # no parameters, so a checkpoint continues into a phase with other bases as it is.
    global_rope_theta: float | None = None
    local_rope_theta: float | None = None

    def __post_init__(self):
        if self.languages is not None and not isinstance(self.languages, str):
            self.languages = tuple(self.languages)
        if (self.num_tokens is not None and self._problem_of_shape() is None
                and _positive(self.num_tokens)):
            steps = self.steps_for_tokens()
            if self.num_steps is None:
                self.num_steps = steps
            elif self.num_steps != steps:  # (equal: a copy of a phase given in tokens)
                raise PhaseSettingError(
                    CONFIGURABLE, "num_tokens", self.num_tokens,
                    f"and num_steps={self.num_steps} are both set; give one",
                    scope=self.name, context=f"phase {self.name!r}: ")
        # The phase's values, checked once, here: the trainer, the task registration and
        # the AOT tool trust them (checks.validate checks what spans several objects).
        problem = self._problem()
        if problem is not None:
            field, message = problem
            raise PhaseSettingError(CONFIGURABLE, field, getattr(self, field), message,
                                    scope=self.name, context=f"phase {self.name!r}: ")

    def _problem_of_shape(self) -> tuple[str, str] | None:
        for field in ("batch_size", "sequence_length"):
            if problem := errors.count_problem(getattr(self, field)):
                return (field, problem)
        return None

    def _problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) of the phase's first bad value, or None."""
        if problem := self._problem_of_shape():
            return problem
        if self.num_tokens is not None:
            if not _positive(self.num_tokens):
                return ("num_tokens", "must be a number of tokens > 0")
        elif self.num_steps is None:
            return ("num_steps", "is not set (give num_steps, or num_tokens)")
        if problem := errors.count_problem(self.num_steps):
            return ("num_steps", problem)
        for field in ("global_rope_theta", "local_rope_theta"):
            value = getattr(self, field)
            if value is not None and not (_positive(value) and value > 1):
                return (field, "must be a RoPE base > 1 (mmBERT: 10000, 160000)")
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

    def tokens_per_step(self) -> int:
        """Tokens of one step's global batch (padding included)."""
        return self.batch_size * self.sequence_length

    def steps_for_tokens(self) -> int:
        """``num_tokens`` in whole steps of ``batch_size x sequence_length`` (nearest, >= 1)."""
        return max(1, round(self.num_tokens / self.tokens_per_step()))

    def steps_note(self) -> str | None:
        """For a phase given in tokens, the line that says what its steps are."""
        if self.num_tokens is None:
            return None
        trained = self.num_steps * self.tokens_per_step()
        exact = trained == self.num_tokens
        steps = f"{self.num_steps:,} step{'s' if self.num_steps > 1 else ''}"
        return (f"[{self.name}] {fmt_tokens(self.num_tokens)} tokens = {steps} "
                f"of {self.batch_size:,} x {self.sequence_length:,}"
                + ("" if exact else f" (rounded to whole steps: {trained:,} tokens, "
                   f"{100 * (trained - self.num_tokens) / self.num_tokens:+.2f}%)"))

    def model(self, run_model):
        """The run's EncoderConfig with this phase's own RoPE bases."""
        changes = {f: getattr(self, f) for f in ("global_rope_theta", "local_rope_theta")
                   if getattr(self, f) is not None}
        return run_model.replace(**{k: float(v) for k, v in changes.items()}) if changes \
            else run_model

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

    def registered_source(self, run_phases: Sequence[Phase], run_corpora: Corpora) -> str:
        """Registers the run's seqio tasks, with each phase's own data once more under its
        own names (:meth:`source`), and returns the registered name this phase reads.

        Our trainer and the t5x command of one phase (:mod:`xlmeta_jax.interop.t5x.stages`)
        register a run's corpora this one way.
        """
        from xlmeta_jax.data import tasks  # noqa: PLC0415 - seqio/TensorFlow only to read a corpus

        views = {p.view_suffix(): tasks.reading(p.task, p.corpora(run_corpora))
                 for p in run_phases if p.source() != p.task}
        registered = tasks.register(run_corpora, views=views)
        return tasks.check_registered(self.source(), registered)

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



# The name gin files bind Merge by.
MERGE_CONFIGURABLE = "xlmeta_jax.pretrain.trainer.Merge"


@dataclasses.dataclass(frozen=True)
class Merge:
    """A run's last step: its branches' final checkpoints merged into its product.

    mmBERT's decay runs as variants (branches: phases with the same ``init_from``, each
    with its own languages and alpha), merged with TIES against the stage they branched
    from. The merge is written as ``MODEL_DIR/<name>/0``, which ``MODEL_DIR`` then
    resolves to (fine-tuning, ``python -m xlmeta_jax.hf to_hf``).
    """

    # Names of the phases merged (two or more).
    branches: Sequence[str] = ()
    # 'ties' or 'linear' (merging.METHODS).
    method: str = "ties"
    # 'ties': the phase whose final checkpoint the task vectors are taken against.
    base: str | None = None
    # 'ties': the share of each task vector kept (default 0.2), the merged task vector's
    # factor (1) and the trimming: 'model' (the TIES authors' code) or 'tensor' (mergekit's).
    density: float | None = None
    scaling: float | None = None
    trim: str | None = None
    # 'linear', and 'ties' with trim='tensor': one weight per branch.
    weights: Sequence[float] | None = None
    # Its folder under MODEL_DIR.
    name: str = "merged"

    def __post_init__(self):
        object.__setattr__(self, "branches", tuple(self.branches))
        if self.weights is not None:
            object.__setattr__(self, "weights", tuple(self.weights))
        # The merge command's own checks of these settings (one place), its flags named as
        # this object's fields.
        try:
            merging.check_settings(self.branches, self.method, self.base, self.density, None,
                                   scaling=self.scaling, weights=self.weights, trim=self.trim,
                                   flag=_MERGE_FIELDS.get)
        except merging.MergeError as e:
            field = _MERGE_FIELDS[e.setting]
            raise PhaseSettingError(MERGE_CONFIGURABLE, field, getattr(self, field), str(e),
                                    context="merge: ") from None
        if not isinstance(self.name, str) or not re.fullmatch(r"\w+", self.name):
            raise PhaseSettingError(MERGE_CONFIGURABLE, "name", self.name,
                                    "must be letters, digits and '_' (a folder of MODEL_DIR)",
                                    context="merge: ")


# The merge command's flags as Merge's fields.
_MERGE_FIELDS = {"method": "method", "checkpoints": "branches", "base": "base",
                 "density": "density", "scaling": "scaling", "trim": "trim",
                 "weights": "weights"}


def tokens_before(phases: Sequence[Phase], phase: Phase) -> int:
    """Tokens the model trained on before ``phase``: those of its init_from chain."""
    by_name = {p.name: p for p in phases}
    total, current = 0, phase
    while current.init_from is not None and current.init_from in by_name:
        current = by_name[current.init_from]
        total += current.num_steps * current.tokens_per_step()
    return total


def fmt_tokens(n: float) -> str:
    """A token count as people write it: 600B, 3B, 1.25M, 4096."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:g}"


def _positive(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)
