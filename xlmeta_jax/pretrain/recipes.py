"""Training recipes as functions: a run's phases and merge from the few numbers a user sets.

A recipe writes its stage list, its schedule and its hand-offs once, in Python; a gin file
binds only what a user changes (the budget, the data, a knob or two) and hands the result to
the trainer (``train.phases = @phases_of()``, ``train.merge = @merge_of()``, with
``phases_of.recipe = @continued()``: gin/native/continue.gin).

* :func:`meta` — meta-pretraining (arXiv 2109.11129): English, then the multilingual mixture
  from phase 1's parameters with fresh AdamW moments and schedule (gin/phases/meta.gin, for
  our trainer and t5x's); :func:`xlmr` — the single-phase baseline at the same steps;
* :func:`mmbert` — mmBERT's recipe (arXiv 2509.06888): a batch-size ramp, the base stage,
  the context extension and three decay branches TIES-merged against it, in mmBERT's token
  shares of the budget, optionally after an English stage (gin/native/mmbert.gin,
  meta_mmbert.gin, the experiment's ``mmbert`` arms);
* :func:`annealed` — an annealed-language curriculum in mmBERT's manner: three stages whose
  languages grow while the sampling exponent and the masking rate fall, on one
  warm-up-stable-decay schedule (gin/native/annealed.gin, the experiment's ``annealed`` arm);
* :func:`continued` — continued pretraining of a released model: a warm-up, then a decay;
  optionally mmBERT's context extension (a longer length, other RoPE bases) and decay
  branches TIES-merged against the stage they start from, as mmBERT merges its variants;
* :func:`with_english_stage` — the paper's order in front of any recipe: English first,
  then the recipe's own stages from its final checkpoint (meta-pretraining from a release).

``Phase`` stays the one type of a stage: every value a recipe derives is checked where the
Phase is built, and the message names the stage and the recipe's parameter (or the macro
bound to it: ``stage 'base': BASE_TOKENS: must be a number of tokens > 0``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence

from xlmeta_jax import errors
from xlmeta_jax.data.languages import BY_CC100_SIZE
from xlmeta_jax.model.optimizer import OptimizerConfig, OptimizerConfigError
from xlmeta_jax.pretrain.phases import Merge, Phase, PhaseSettingError

_MODULE = "xlmeta_jax.pretrain.recipes"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A run's phases, in training order, and its merge (None: the last phase is the
    product)."""

    phases: tuple[Phase, ...]
    merge: Merge | None = None
    # The recipe function's gin name (what its parameters are bound under).
    source: str = ""


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


# ---------------------------------------------------------------------------
# mmBERT.
# ---------------------------------------------------------------------------

# Fields of a stage that a recipe derives from its own parameters (bind those instead).
_DERIVED_FIELDS = ("name", "task", "num_steps", "num_tokens", "batch_size", "sequence_length",
                   "optimizer", "init_from")


def _overridden(recipe: str, stages: Sequence[Phase],
                overrides: Mapping[str, Mapping] | None) -> list[Phase]:
    """``stages`` with a stage's own settings replaced (``{"stage2": {"reset_schedule":
    True}}``): what a scoped ``Phase`` binding did when a run file listed its stages."""
    overrides = dict(overrides or {})
    names = [p.name for p in stages]
    for stage, fields in overrides.items():
        fields = dict(fields) if isinstance(fields, Mapping) else None
        derived = sorted(set(fields or {}) & set(_DERIVED_FIELDS))
        unknown = sorted(set(fields or {}) - {f.name for f in dataclasses.fields(Phase)})
        if stage not in names or fields is None or derived or unknown:
            raise errors.SettingError(
                f"{_MODULE}.{recipe}", "overrides", {stage: fields},
                f"{stage!r} is not a stage of the recipe ({', '.join(names)})"
                if stage not in names else "a stage's overrides are a dict of Phase fields"
                if fields is None else f"{derived} are the recipe's own: bind its parameters"
                if derived else f"{unknown} are not Phase fields")
    out = []
    for p in stages:
        fields = dict(overrides.get(p.name, {}))
        with _named(recipe, p.name, {f: "overrides" for f in fields}):
            out.append(dataclasses.replace(p, **fields) if fields else p)
    return out


# mmBERT's tokens per part (arXiv 2509.06888, JHU-CLSP/mmBERT configs): pre-training 2.3T
# (its batch-size ramp included), mid-training (the context extension) 600B, decay 100B.
MMBERT_SHARES = (2.3, 0.6, 0.1)
# Its decay variants: (languages, alpha) of each; languages an int: that many of CC-100's
# largest, 'ext': the extension's languages and alpha, None: every language.
MMBERT_BRANCHES = ("decay_eng", "decay_cont", "decay_all")


# Per recipe, the parameter each stage's field comes from ("phase1/sequence_length" ->
# "sequence_length"), recorded as the recipe builds them: the run's checks name a stage's
# setting by the binding the user set (xlmeta_jax.cli.configurables.binding_source).
SOURCES: dict[str, dict[str, str]] = {}


@contextlib.contextmanager
def _named(recipe: str, stage: str, params: Mapping[str, str], kind: str = "stage"):
    """A stage's bad value named by the recipe parameter it came from (``params``: the
    stage's field -> the parameter), so the line names what the user bound; a stage's
    own setting says which stage (``kind`` 'stage' or 'phase'), a schedule's does not."""
    fields = SOURCES.pop(recipe, {})  # the recipe built last, last
    fields.update({f"{stage}/{f}": p for f, p in params.items()})
    SOURCES[recipe] = fields
    try:
        yield
    except (PhaseSettingError, OptimizerConfigError) as e:
        param = params.get(e.field)
        if param is None:
            raise
        context = f"{kind} {stage!r}: " if isinstance(e, PhaseSettingError) else ""
        raise errors.SettingError(f"{_MODULE}.{recipe}", param, e.value, e.message,
                                  context=context) from None


def largest_languages(languages: int | Sequence[str] | None) -> tuple[str, ...] | None:
    """A stage's languages: an int is that many of CC-100's largest (``BY_CC100_SIZE``), a
    list is itself, None every language."""
    if isinstance(languages, int) and not isinstance(languages, bool):
        return tuple(BY_CC100_SIZE[:languages]) if languages > 0 else ()
    return None if languages is None else tuple(languages)


def _steps(tokens: int | float, batch_size: int, sequence_length: int) -> int:
    """Tokens as whole steps (nearest; at least 1 unless there are none)."""
    return max(1, round(tokens / (batch_size * sequence_length))) if tokens else 0


def mmbert(*, task: str, optimizer: OptimizerConfig, total_tokens: int | float,
           base_tokens: int | float | None = None, ext_tokens: int | float | None = None,
           decay_tokens: int | float | None = None, shares: Sequence[float] = MMBERT_SHARES,
           batch_size: int = 4608, ramp_batches: Sequence[int] = (1152, 2304, 3456),
           ramp_tokens: int | float = 20_000_000_000, base_length: int = 1024,
           ext_length: int = 8192, warmup_tokens: int | float = 3_000_000_000,
           base_languages: int | Sequence[str] | None = 60,
           ext_languages: int | Sequence[str] | None = None,
           english_heavy_languages: int | Sequence[str] | None = 30,
           decay_languages: int | Sequence[str] | None = None,
           base_alpha: float = 0.7, ext_alpha: float = 0.5, decay_alpha: float = 0.3,
           base_mask_rate: float = 0.3, ext_mask_rate: float = 0.15,
           decay_mask_rate: float = 0.05, base_rope_theta: float = 10_000.0,
           ext_rope_theta: float = 160_000.0, branches: Sequence[str] = MMBERT_BRANCHES,
           merge_density: float | None = None, english_tokens: int | float = 0,
           english_task: str | None = None,
           overrides: Mapping[str, Mapping] | None = None) -> Recipe:
    """mmBERT's recipe at ``total_tokens`` (gin/native/mmbert.gin).

    Stages, each from the previous one's final checkpoint with its AdamW state and schedule
    (one warm-up-stable-decay schedule of 1-sqrt shape over a branch's whole chain):

    * ``ramp1``..``ramp3``: ``ramp_tokens`` each at ``ramp_batches`` rows (ModernBERT's
      batch-size warm-up; ``()``: none), ``base_length`` tokens a row;
    * ``base``: the rest of the first share at ``batch_size`` rows;
    * ``ext``: the context extension, ``ext_length`` tokens a row, ``ext_rope_theta`` for
      every layer's RoPE, its own languages, alpha and masking;
    * the decay branches from ``ext`` (``branches``, of :data:`MMBERT_BRANCHES`):
      ``decay_eng`` (the ``english_heavy_languages`` largest at alpha 1, sampled by size),
      ``decay_cont`` (ext's languages and alpha), ``decay_all`` (every language at
      ``decay_alpha``), each ``decay_tokens`` long, merged with TIES against ``ext``.

    Args:
      task: the mixture every stage trains on.
      optimizer: AdamW's settings; the recipe sets the schedule's shape and lengths.
      total_tokens: the budget (English stage included); ``shares`` (mmBERT's 2.3T : 600B :
        100B) divide what the English stage leaves into base (ramp included), ext and one
        decay branch.
      base_tokens, ext_tokens, decay_tokens: a stage's tokens instead of its share.
      warmup_tokens: the warm-up, at the start of the first stage.
      base_languages, ext_languages, english_heavy_languages, decay_languages: an int is
        that many of CC-100's largest languages, a list itself, None all 100 (the run's).
      english_tokens: with ``english_task``, an English stage in front (the paper's order,
        meta-pretraining): ``english`` trains that many tokens at ``batch_size``, its own
        linear schedule to 0; ``ramp1`` then starts from it with fresh moments and schedule.
      overrides: per stage, Phase fields of its own (``{"ext": {"use_cached": True}}``);
        the fields the recipe derives (lengths, shapes, schedule, hand-offs) are refused.
    """
    name = "mmbert"
    if not (isinstance(total_tokens, int | float) and not isinstance(total_tokens, bool)
            and total_tokens > 0):
        raise errors.SettingError(f"{_MODULE}.{name}", "total_tokens", total_tokens,
                                  "must be a number of tokens > 0")
    unknown = [b for b in branches if b not in MMBERT_BRANCHES]
    if unknown or not branches:
        raise errors.SettingError(f"{_MODULE}.{name}", "branches", list(branches),
                                  f"must be some of {list(MMBERT_BRANCHES)}, got "
                                  f"{list(branches)}")
    if english_tokens and not english_task:
        raise errors.SettingError(f"{_MODULE}.{name}", "english_task", english_task,
                                  "must name the English stage's task when english_tokens "
                                  "is set")
    mixture = total_tokens - (english_tokens or 0)
    parts = sum(shares)
    ramps = [(f"ramp{i + 1}", b) for i, b in enumerate(ramp_batches)]

    def share(given, k):
        return given if given is not None else int(round(mixture * shares[k] / parts))

    if not (isinstance(warmup_tokens, int | float) and not isinstance(warmup_tokens, bool)
            and warmup_tokens >= 0):
        raise errors.SettingError(f"{_MODULE}.{name}", "warmup_tokens", warmup_tokens,
                                  "must be a number of tokens >= 0")
    if base_tokens is None:
        base_tokens = share(None, 0) - len(ramps) * ramp_tokens
        if base_tokens <= 0:
            raise errors.SettingError(
                f"{_MODULE}.{name}", "total_tokens", total_tokens,
                f"leaves the base stage no tokens after the {len(ramps)} ramp stages of "
                f"{ramp_tokens:,} (raise it, or lower ramp_tokens)")
    ext_tokens, decay_tokens = share(ext_tokens, 1), share(decay_tokens, 2)

    base = dict(task=task, sequence_length=base_length, reset_optimizer=False,
                reset_schedule=False, languages=largest_languages(base_languages),
                alpha=base_alpha, mask_rate=base_mask_rate, global_rope_theta=base_rope_theta,
                local_rope_theta=base_rope_theta)
    data = {"languages": "base_languages", "alpha": "base_alpha",
            "mask_rate": "base_mask_rate", "global_rope_theta": "base_rope_theta",
            "local_rope_theta": "base_rope_theta", "sequence_length": "base_length"}
    stages, previous = [], None
    for stage, rows in ramps:
        with _named(name, stage, {**data, "batch_size": "ramp_batches",
                                  "num_tokens": "ramp_tokens"}):
            stages.append(Phase(name=stage, batch_size=rows, num_tokens=ramp_tokens,
                                init_from=previous, **base))
        previous = stage
    with _named(name, "base", {**data, "batch_size": "batch_size",
                               "num_tokens": "base_tokens"}):
        stages.append(Phase(name="base", batch_size=batch_size, num_tokens=base_tokens,
                            init_from=previous, **base))
    ext = dict(base, sequence_length=ext_length, languages=largest_languages(ext_languages),
               alpha=ext_alpha, mask_rate=ext_mask_rate, global_rope_theta=ext_rope_theta,
               local_rope_theta=ext_rope_theta)
    ext_data = {"languages": "ext_languages", "alpha": "ext_alpha",
                "mask_rate": "ext_mask_rate", "global_rope_theta": "ext_rope_theta",
                "local_rope_theta": "ext_rope_theta", "sequence_length": "ext_length",
                "batch_size": "batch_size"}
    with _named(name, "ext", {**ext_data, "num_tokens": "ext_tokens"}):
        stages.append(Phase(name="ext", batch_size=batch_size, num_tokens=ext_tokens,
                            init_from="base", **ext))
    variants = {
        "decay_eng": (largest_languages(english_heavy_languages), 1.0,
                      "english_heavy_languages", None),
        "decay_cont": (ext["languages"], ext_alpha, "ext_languages", "ext_alpha"),
        "decay_all": (largest_languages(decay_languages), decay_alpha, "decay_languages",
                      "decay_alpha"),
    }
    for branch in branches:
        languages, alpha, languages_param, alpha_param = variants[branch]
        with _named(name, branch, {**ext_data, "languages": languages_param,
                                   "alpha": alpha_param, "mask_rate": "decay_mask_rate",
                                   "num_tokens": "decay_tokens"}):
            stages.append(Phase(name=branch, batch_size=batch_size, num_tokens=decay_tokens,
                                init_from="ext", **dict(ext, languages=languages,
                                                        alpha=alpha,
                                                        mask_rate=decay_mask_rate)))
    # One schedule over a branch's chain: its warm-up in the first stage's rows.
    chain = [p for p in stages if p.init_from != "ext"] + [stages[-1]]
    with _named(name, stages[0].name, {"warmup_steps": "warmup_tokens",
                                       "decay_steps": "decay_tokens"}):
        schedule = dataclasses.replace(
            optimizer, schedule="wsd", decay_shape="1-sqrt",
            warmup_steps=_steps(warmup_tokens, stages[0].batch_size, base_length),
            decay_steps=stages[-1].num_steps, total_steps=sum(p.num_steps for p in chain))
    stages = [dataclasses.replace(p, optimizer=schedule) for p in stages]
    # One branch is the product itself; two or more are merged.
    merge = (Merge(branches=list(branches), base="ext", method="ties", density=merge_density)
             if len(branches) > 1 else None)
    if not english_tokens:
        return Recipe(tuple(_overridden(name, stages, overrides)), merge, f"{_MODULE}.{name}")
    with _named(name, "english", {"num_tokens": "english_tokens", "task": "english_task",
                                  "warmup_steps": "warmup_tokens"}):
        steps = _steps(english_tokens, batch_size, base_length) if english_tokens > 0 else 0
        english = Phase(
            name="english", num_tokens=english_tokens,
            batch_size=batch_size, optimizer=dataclasses.replace(
                schedule, schedule="linear", decay_steps=0, end_learning_rate=0.0,
                total_steps=max(steps, 1),
                warmup_steps=_steps(warmup_tokens, batch_size, base_length)),
            **dict(base, task=english_task, languages=None, alpha=None))
    first = dataclasses.replace(stages[0], init_from="english", reset_optimizer=True,
                                reset_schedule=True)
    return Recipe(tuple(_overridden(name, (english, first, *stages[1:]), overrides)), merge,
                  f"{_MODULE}.{name}")


# ---------------------------------------------------------------------------
# The annealed-language curriculum.
# ---------------------------------------------------------------------------


def annealed(*, task: str, optimizer: OptimizerConfig, total_steps: int, batch_size: int,
             sequence_length: int, shares: Sequence[float] = (0.7, 0.2, 0.1),
             languages: Sequence[int | Sequence[str] | None] = (30, 60, None),
             alphas: Sequence[float] = (0.7, 0.5, 0.3),
             mask_rates: Sequence[float] = (0.3, 0.15, 0.05),
             overrides: Mapping[str, Mapping] | None = None) -> Recipe:
    """Stages ``stage1``, ``stage2``, ... (one per share) on ``task`` (gin/native/annealed.gin).

    Each stage takes its share of ``total_steps`` (the last the rest), its languages (an
    int: that many of CC-100's largest; None: all), sampling exponent and masking rate, and
    continues the previous stage's parameters, AdamW moments and schedule. One
    warm-up-stable-decay schedule spans them (``optimizer``'s peak and warm-up), its 1-sqrt
    cool-down over the last stage. ``overrides``: per stage, Phase fields of its own, as
    :func:`mmbert`'s.
    """
    name = "annealed"
    if problem := errors.count_problem(total_steps):
        raise errors.SettingError(f"{_MODULE}.{name}", "total_steps", total_steps, problem)
    for param, values in (("languages", languages), ("alphas", alphas),
                          ("mask_rates", mask_rates)):
        if len(values) != len(shares):
            raise errors.SettingError(f"{_MODULE}.{name}", param, list(values),
                                      f"needs one value per stage ({len(shares)} shares)")
    steps = [round(share / sum(shares) * total_steps) for share in shares[:-1]]
    steps.append(total_steps - sum(steps))
    with _named(name, "stage1", {"decay_steps": "shares"}):
        schedule = dataclasses.replace(optimizer, total_steps=total_steps, schedule="wsd",
                                       decay_steps=steps[-1], decay_shape="1-sqrt")
    stages, previous = [], None
    for i, n in enumerate(steps):
        stage = f"stage{i + 1}"
        with _named(name, stage, {"num_steps": "shares", "batch_size": "batch_size",
                                  "sequence_length": "sequence_length",
                                  "languages": "languages", "alpha": "alphas",
                                  "mask_rate": "mask_rates"}):
            stages.append(Phase(
                name=stage, task=task, num_steps=n, batch_size=batch_size,
                sequence_length=sequence_length, optimizer=schedule, init_from=previous,
                reset_optimizer=False, reset_schedule=False,
                languages=largest_languages(languages[i]), alpha=alphas[i],
                mask_rate=mask_rates[i]))
        previous = stage
    return Recipe(tuple(_overridden(name, stages, overrides)), source=f"{_MODULE}.{name}")


# ---------------------------------------------------------------------------
# Meta-pretraining and its baseline.
# ---------------------------------------------------------------------------


def meta(*, english_task: str, xling_mixture: str, meta_steps: int, xling_steps: int,
         batch_size: int, sequence_length: int, optimizer: OptimizerConfig,
         phase2_learning_rate: float | None = None, phase2_warmup_steps: int | None = None,
         xling_use_cached: bool | None = None,
         overrides: Mapping[str, Mapping] | None = None) -> Recipe:
    """Meta-pretraining's two phases (gin/phases/meta.gin).

    ``phase1`` trains ``meta_steps`` on ``english_task``; ``phase2`` ``xling_steps`` on
    ``xling_mixture`` from phase 1's final parameters, with fresh AdamW moments and its own
    schedule (``phase2_learning_rate`` and ``phase2_warmup_steps``, None: ``optimizer``'s).
    Each phase's schedule spans its own steps. ``xling_use_cached``: phase 2 reads the
    offline token cache (None: the feeder's setting). ``overrides`` as :func:`mmbert`'s.
    """
    name = "meta"
    shape = {"batch_size": "batch_size", "sequence_length": "sequence_length"}
    with _named(name, "phase1", {"total_steps": "meta_steps"}, "phase"):
        schedule1 = dataclasses.replace(optimizer, total_steps=meta_steps)
    with _named(name, "phase2", {"total_steps": "xling_steps", "learning_rate":
                                 "phase2_learning_rate", "warmup_steps": "phase2_warmup_steps"},
                "phase"):
        schedule2 = dataclasses.replace(
            optimizer, total_steps=xling_steps,
            learning_rate=(optimizer.learning_rate if phase2_learning_rate is None
                           else phase2_learning_rate),
            warmup_steps=(optimizer.warmup_steps if phase2_warmup_steps is None
                          else phase2_warmup_steps))
    with _named(name, "phase1", {**shape, "num_steps": "meta_steps"}, "phase"):
        phase1 = Phase(name="phase1", task=english_task, num_steps=meta_steps,
                       batch_size=batch_size, sequence_length=sequence_length,
                       optimizer=schedule1)
    with _named(name, "phase2", {**shape, "num_steps": "xling_steps"}, "phase"):
        phase2 = Phase(
            name="phase2", task=xling_mixture, num_steps=xling_steps, batch_size=batch_size,
            sequence_length=sequence_length, use_cached=xling_use_cached, optimizer=schedule2,
            init_from="phase1", reset_optimizer=True, reset_schedule=True)
    return Recipe(tuple(_overridden(name, (phase1, phase2), overrides)),
                  source=f"{_MODULE}.{name}")


def xlmr(*, xling_mixture: str, steps: int, batch_size: int, sequence_length: int,
         optimizer: OptimizerConfig, xling_use_cached: bool | None = None,
         overrides: Mapping[str, Mapping] | None = None) -> Recipe:
    """The single-phase XLM-R baseline (gin/native/xlmr.gin): ``xlmr`` trains ``steps`` on
    ``xling_mixture`` (meta-pretraining's two phases together), one schedule over them."""
    name = "xlmr"
    with _named(name, "xlmr", {"total_steps": "steps", "num_steps": "steps",
                               "batch_size": "batch_size", "sequence_length": "sequence_length"},
                "phase"):
        phase = Phase(name="xlmr", task=xling_mixture, num_steps=steps, batch_size=batch_size,
                      sequence_length=sequence_length, use_cached=xling_use_cached,
                      optimizer=dataclasses.replace(optimizer, total_steps=steps))
    return Recipe(tuple(_overridden(name, (phase,), overrides)), source=f"{_MODULE}.{name}")
