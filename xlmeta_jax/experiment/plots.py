"""Figures of evaluation scores that show where chance lies.

Shared by the experiment's report (:mod:`xlmeta_jax.experiment.report`, several arms
and seeds) and the notebooks (one results.json of ``python -m xlmeta_jax.finetune``:
:func:`finetune_languages`, :func:`tatoeba_layers`). Every builder returns the
matplotlib Figure without saving it, so a caller shows it, saves it (:func:`save`) or
reads its data back.

Accuracy plots draw the chance level where it is known (:func:`chance_by_language`):
100 / number of labels for a classification task, 100 / N for Tatoeba, where N is the
number of candidate sentences of the language. Their y axis always includes that line,
and 0 where the values are small, so a near-chance result looks near chance.

The layer plots' x axis counts hidden states as results.json's ``layer_sweep`` keys do
(0 = embedding output); the reported layer, counted as XTREME's ``--specific_layer``
(0 = first Transformer layer), is hidden state ``layer + 1``
(:mod:`xlmeta_jax.evaluation.tasks.retrieval`), and its marker says both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlmeta_jax.evaluation import tasks

# {series label: {x: (mean, spread)}}: one bar group or curve per series.
Series = Mapping[str, Mapping[Any, tuple[float, float]]]


def pyplot():
    """matplotlib.pyplot with the non-interactive backend unless one is chosen already."""
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting

    if not matplotlib.get_backend().startswith("module://"):
        # A notebook's backend (inline, widget) is a module:// one and stays; anywhere else
        # the figures are only saved, and Agg needs no display.
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when plotting

    return plt


def save(fig, path: str) -> bool:
    """Writes ``fig`` as PNG (legends outside the axes included) and closes it."""
    fig.savefig(path, dpi=80, bbox_inches="tight")
    pyplot().close(fig)
    return True


def colors(names: Sequence[str]) -> dict[str, Any]:
    """One tab10 colour per name, in order."""
    cmap = pyplot().get_cmap("tab10")
    return {name: cmap(i % 10) for i, name in enumerate(names)}


# ----------------------------------------------------------------------------------------
# Chance
# ----------------------------------------------------------------------------------------


def chance_by_language(task: str, num_examples: Mapping[str, int | None]) -> dict[str, float]:
    """Chance accuracy (percent) of ``task`` per language; empty where it is not known.

    Args:
      task: a registered task name (:func:`xlmeta_jax.evaluation.tasks.get`).
      num_examples: {language: evaluated examples}; for retrieval the candidate
        sentences a query is matched against (None: unknown).

    Returns:
      A classification task's 100 / number of labels for every language, Tatoeba's
      100 / N per language with a known N; nothing for an F1 task or an unknown name.
    """
    try:
        spec = tasks.get(task)
    except tasks.TaskError:
        return {}
    if spec.metric != "accuracy":
        return {}
    if spec.labels:
        return {lang: 100.0 / len(spec.labels) for lang in num_examples}
    return {lang: 100.0 / n for lang, n in num_examples.items() if n}


def chance_label(task: str, chance: Mapping[str, float], average: bool = False) -> str:
    """The legend entry of a chance line (says how the level was computed)."""
    try:
        labels = tasks.get(task).labels
    except tasks.TaskError:
        labels = ()
    if labels:
        return f"chance (1 of {len(labels)} labels: {100 / len(labels):.1f}%)"
    if average:
        return f"chance: mean of 100/N over {len(chance)} languages (N = candidate sentences)"
    return "chance: 100/N (N = candidate sentences of the language)"


def _ordered(langs) -> list[str]:
    langs = sorted(set(langs))
    return (["en"] if "en" in langs else []) + [lang for lang in langs if lang != "en"]


def accuracy_limits(lows: Sequence[float], highs: Sequence[float],
                    chance: Sequence[float] = ()) -> tuple[float, float]:
    """Axis range over the values and the chance levels; from 0 when the values are small.

    "Small": the lowest value or chance level is under half the highest, so a range that
    left 0 out would magnify differences near chance.
    """
    low = min([*lows, *chance])
    high = max([*highs, *chance])
    pad = 0.05 * max(high - low, 1.0)
    bottom = 0.0 if low < 0.5 * high else low - pad
    return bottom, high + pad


# ----------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------


def language_bars(series: Series, *, title: str, ylabel: str,
                  chance: Mapping[str, float] | None = None, chance_text: str = "",
                  ax=None):
    """Per-language bars, one colour per series (error bars: the spread), and chance.

    Args:
      series: {label: {language: (mean, spread)}}.
      title, ylabel: the axes' texts.
      chance: {language: chance level}; one line when every language has the same, else
        a segment over each language's bars.
      chance_text: the chance line's legend entry.
      ax: the Axes to draw into (None: a new Figure).

    Returns:
      The Figure drawn into.
    """
    chance = dict(chance or {})
    langs = _ordered(lang for by_lang in series.values() for lang in by_lang)
    width = 0.8 / len(series)
    if ax is None:
        _, ax = pyplot().subplots(figsize=(max(6.0, 0.35 * len(langs) * len(series)), 3.5))
    x = np.arange(len(langs))
    highs = []
    for i, (color, (name, by_lang)) in enumerate(zip(colors(list(series)).values(),
                                                      series.items())):
        means = [by_lang.get(lang, (0.0, 0.0))[0] for lang in langs]
        errs = [by_lang.get(lang, (0.0, 0.0))[1] for lang in langs]
        highs += [m + e for m, e in zip(means, errs)]
        ax.bar(x + i * width - 0.4 + width / 2, means, width, yerr=errs, color=color,
               label=name, capsize=1.5)
    levels = [chance[lang] for lang in langs if lang in chance]
    if levels and len(set(levels)) == 1:
        ax.axhline(levels[0], color="black", ls="--", lw=1, label=chance_text, gid="chance")
    elif levels:
        # One segment per language group; NaN breaks the line between groups.
        xs, ys = [], []
        for i, lang in enumerate(langs):
            if lang in chance:
                xs += [i - 0.45, i + 0.45, np.nan]
                ys += [chance[lang]] * 2 + [np.nan]
        ax.plot(xs, ys, color="black", ls="--", lw=1, label=chance_text, gid="chance")
    ax.set_ylim(*accuracy_limits([0.0], highs, levels))
    ax.set_xticks(x, langs, rotation=90 if len(langs) > 20 else 0, fontsize=7)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    # Outside the axes: inside, it covers bars whatever corner it takes.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return ax.figure


def layer_curves(series: Series, *, title: str, ylabel: str,
                 reported: Mapping[str, int] | None = None, chance: float | None = None,
                 chance_text: str = "", ax=None):
    """Accuracy per hidden state (0 = embedding output), the reported layer and chance.

    Args:
      series: {label: {hidden-states index: (mean, spread)}}.
      title, ylabel: the axes' texts.
      reported: {label: hidden-states index of the reported layer}; a vertical line each,
        its legend naming the hidden state and XTREME's layer (one less).
      chance: the chance level (drawn when not None).
      chance_text: the chance line's legend entry.
      ax: the Axes to draw into (None: a new Figure).

    Returns:
      The Figure drawn into.
    """
    if ax is None:
        _, ax = pyplot().subplots(figsize=(6.0, 3.5))
    lows, highs, xs_all = [], [], set()
    for color, (name, points) in zip(colors(list(series)).values(), series.items()):
        xs = sorted(points)
        means = [points[x][0] for x in xs]
        errs = [points[x][1] for x in xs]
        lows += [m - e for m, e in zip(means, errs)]
        highs += [m + e for m, e in zip(means, errs)]
        xs_all.update(xs)
        ax.errorbar(xs, means, yerr=errs, color=color, marker="o", label=name, capsize=2)
    for who, index in (reported or {}).items():
        prefix = f"{who}: " if who else ""
        ax.axvline(index, color="grey", ls=":", lw=1.5, gid="reported",
                   label=f"{prefix}reported: hidden state {index} (XTREME layer {index - 1})")
    if chance is not None:
        ax.axhline(chance, color="black", ls="--", lw=1, label=chance_text, gid="chance")
    ax.set_ylim(*accuracy_limits(lows, highs, [] if chance is None else [chance]))
    ax.set_xticks(sorted(xs_all))
    ax.set_xlabel("hidden state (0 = embedding output; XTREME layer = hidden state − 1)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return ax.figure


# ----------------------------------------------------------------------------------------
# One results.json of python -m xlmeta_jax.finetune (the notebooks)
# ----------------------------------------------------------------------------------------


def finetune_languages(results: Mapping[str, Any]):
    """Per-language bars of one fine-tuning or retrieval results.json, with chance."""
    metric, task = results["metric"], results["task"]
    scores = {lang: (v[metric], v.get(f"{metric}_std") or 0.0)
              for lang, v in results["languages"].items() if v.get(metric) is not None}
    chance = chance_by_language(task, {lang: v.get("num_examples")
                                       for lang, v in results["languages"].items()})
    english, target = results.get("english"), results.get("average_target")
    title = f"{task} zero-shot transfer"
    if english is not None and target is not None:
        title += f": English {english:.1f}, other languages {target:.1f}"
    return language_bars({metric: scores}, title=title, ylabel=f"{metric} (%)",
                         chance=chance, chance_text=chance_label(task, chance))


def tatoeba_layers(results: Mapping[str, Any]):
    """Tatoeba's accuracy per hidden state, both directions, of one results.json."""
    sweep = results["layer_sweep"]
    series = {
        label: {int(i): (v[direction], 0.0) for i, v in sweep.items()}
        for direction, label in (("en2xx", "en → xx (XTREME's)"), ("xx2en", "xx → en"))
    }
    chance = chance_by_language(results["task"], {lang: v.get("num_examples")
                                                  for lang, v in results["languages"].items()})
    return layer_curves(
        series, title="Tatoeba retrieval per layer",
        ylabel=f"mean accuracy over {len(results['languages'])} languages (%)",
        reported={"": results["hidden_states_index"]},
        chance=float(np.mean(list(chance.values()))) if chance else None,
        chance_text=chance_label(results["task"], chance, average=True))
