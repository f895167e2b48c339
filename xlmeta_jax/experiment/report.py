"""The experiment's report: tables and plots from its ``results.json``.

:func:`write_report` turns the experiment's ``results.json`` (written by
:mod:`xlmeta_jax.experiment`) into ``report.md`` and PNG plots in the same folder:

* per task, mean ± standard deviation over seeds of the English score, the
  average over target languages and the transfer gap (English minus that average),
  one row per arm;
* ``english_vs_target.png``: English score against the target-language average,
  one point per arm and seed (generalisation against transfer);
* ``<task>_languages.png``: per-language bars, one colour per arm (mean over seeds,
  error bars: standard deviation);
* ``retrieval_layers.png``: retrieval accuracy of every hidden state per arm, with the
  reported layer marked;
* ``pretraining_loss.png``: MLM loss over tokens seen, per arm and seed;
* the paired comparison of ``meta`` with every other arm, per task and score: the
  per-seed differences' mean ± std, 95% interval, exact sign-flip p-value and its Holm
  adjustment over all comparisons, and what the number of seeds can detect
  (:mod:`xlmeta_jax.experiment.statistics`).

Accuracy plots draw the chance level and include it in their range
(:mod:`xlmeta_jax.experiment.plots`). ``figure_*`` build a plot's Figure without saving
it; ``plot_*`` save it as PNG.

The input format (``runs`` is what the experiment measured; nothing else is read)::

    {"experiment": {"name", "arms", "seeds", "tasks", ...},
     "runs": {"<arm>/seed<k>": {
        "arm", "seed",
        "pretraining": {"tokens", "phases": [...],
                        "loss_curve": {"tokens": [...], "loss": [...], "phase": [...]}},
        "evaluations": {task: {"metric", "english", "average_target", "transfer_gap",
                                "languages": {lang: score}, "num_examples": {lang: n},
                                "layer_sweep": {hidden_states index: acc},
                                "layer", "hidden_states_index"}}}}}
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlmeta_jax import files
from xlmeta_jax.experiment import plots, statistics

SUMMARY_KEYS = ("english", "average_target", "transfer_gap")


# ----------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------


def mean_std(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Mean and sample standard deviation (ddof=1) of the values that are not None."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"mean": None, "std": None, "n": 0}
    std = float(np.std(xs, ddof=1)) if len(xs) > 1 else None
    return {"mean": float(np.mean(xs)), "std": std, "n": len(xs)}


def _runs_by_arm(results: Mapping[str, Any]) -> dict[str, list[dict]]:
    arms = list(results.get("experiment", {}).get("arms") or [])
    out: dict[str, list[dict]] = {arm: [] for arm in arms}
    for run in results["runs"].values():
        out.setdefault(run["arm"], []).append(run)
    for runs in out.values():
        runs.sort(key=lambda r: r["seed"])
    return {arm: runs for arm, runs in out.items() if runs}


def _tasks(results: Mapping[str, Any]) -> list[str]:
    tasks = list(results.get("experiment", {}).get("tasks") or [])
    for run in results["runs"].values():
        for task in run.get("evaluations", {}):
            if task not in tasks:
                tasks.append(task)
    return tasks


def summarize(results: Mapping[str, Any]) -> dict[str, dict[str, dict[str, dict]]]:
    """{task: {arm: {english|average_target|transfer_gap: mean_std}}} over seeds."""
    by_arm = _runs_by_arm(results)
    out: dict[str, dict[str, dict]] = {}
    for task in _tasks(results):
        out[task] = {}
        for arm, runs in by_arm.items():
            evals = [r["evaluations"][task] for r in runs if task in r.get("evaluations", {})]
            if evals:
                out[task][arm] = {key: mean_std([e.get(key) for e in evals])
                                  for key in SUMMARY_KEYS}
    return out


def _scores_over_seeds(results, task: str, field: str, key=lambda k: k) -> dict:
    """{arm: {key(k): mean_std over seeds}} of a task's ``field`` mapping (k -> score)."""
    out = {}
    for arm, runs in _runs_by_arm(results).items():
        values: dict[Any, list[float]] = {}
        for run in runs:
            scores = run.get("evaluations", {}).get(task, {}).get(field) or {}
            for k, v in scores.items():
                values.setdefault(key(k), []).append(v)
        if values:
            out[arm] = {k: mean_std(vs) for k, vs in values.items()}
    return out


def per_language(results: Mapping[str, Any], task: str) -> dict[str, dict[str, dict]]:
    """{arm: {lang: mean_std over seeds}} of one task's per-language scores."""
    return _scores_over_seeds(results, task, "languages")


def layer_sweep(results: Mapping[str, Any], task: str) -> dict[str, dict[int, dict]]:
    """{arm: {layer: mean_std over seeds}} of a retrieval task's accuracy per layer."""
    sweeps = _scores_over_seeds(results, task, "layer_sweep", key=int)
    return {arm: dict(sorted(by_layer.items())) for arm, by_layer in sweeps.items()}


# ----------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------


def _cell(stats: Mapping[str, Any] | None) -> str:
    if not stats or stats.get("mean") is None:
        return "–"
    if stats.get("std") is None:
        return f"{stats['mean']:.1f}"
    return f"{stats['mean']:.1f} ± {stats['std']:.1f}"


def markdown(results: Mapping[str, Any], images: Sequence[str] = ()) -> str:
    """The report's markdown text (tables; ``images`` are linked below them)."""
    exp = results.get("experiment", {})
    summary = summarize(results)
    seeds = sorted({r["seed"] for r in results["runs"].values()})
    lines = [f"# Experiment {exp.get('name', '')}".rstrip(), ""]
    if exp.get("command"):
        lines += ["```", exp["command"], "```", ""]
    lines.append(
        f"Arms: {', '.join(_runs_by_arm(results))}; seeds: {', '.join(map(str, seeds))}. "
        "Cells: mean ± standard deviation over seeds (sample std, ddof=1; a bare number is "
        "a single seed). Target = average over the evaluated languages other than English; "
        "gap = English − target."
    )
    lines.append("")
    lines += _pretraining_table(results)
    for task, arms in summary.items():
        metric = _metric(results, task)
        lines += [f"## {task} ({metric})", "", "| arm | English | target avg | gap |",
                  "|---|---|---|---|"]
        for arm, stats in arms.items():
            lines.append(f"| {arm} | {_cell(stats['english'])} | "
                         f"{_cell(stats['average_target'])} | {_cell(stats['transfer_gap'])} |")
        lines.append("")
        differences = _differences(results, task)
        if differences:
            lines += ["Not XTREME's protocol: " + "; ".join(differences) + ".", ""]
    lines += _paired_section(results)
    if images:
        lines += ["## Plots", ""]
        lines += [f"![{os.path.splitext(name)[0]}]({name})" for name in images]
        lines.append("")
    return "\n".join(lines)


def _paired_section(results: Mapping[str, Any], alpha: float = 0.05) -> list[str]:
    """The paired meta-vs-baseline table and what the seeds can detect."""
    rows = statistics.paired_comparisons(results)
    if not rows:
        return []

    def number(x, fmt="{:+.2f}"):
        return "–" if x is None or x != x else fmt.format(x)

    lines = ["## Paired comparison: meta − baseline, per seed", "",
             "| task | score | baseline | seeds | mean ± std | 95% interval | exact p | "
             "Holm p |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = "" if r["std"] is None else f" ± {r['std']:.2f}"
        interval = ("–" if r["interval"] is None
                    else f"[{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}]")
        lines.append(f"| {r['task']} | {r['score']} | {r['baseline']} | {r['n']} | "
                     f"{r['mean']:+.2f}{spread} | {interval} | {number(r['p'], '{:.3f}')} | "
                     f"{number(r['p_holm'], '{:.3f}')} |")
    n = min(r["n"] for r in rows)
    m = len(rows)
    significant = [r for r in rows if r["p_holm"] <= alpha]
    lines += ["", (
        f"Differences are paired by seed (same initial parameters, same mixture stream, same "
        f"fine-tuning seed and subsample). p: exact two-sided sign-flip permutation test over "
        f"the seeds; Holm: adjusted over all {m} comparisons above. With {n} seeds the exact "
        f"test cannot give p below {statistics.smallest_p(n):.3f}; a difference survives Holm "
        f"at {alpha} only with at least {statistics.seeds_needed(alpha, m)} seeds whose "
        f"differences all share a sign. Differences inside the 95% intervals cannot be told "
        f"from seed-to-seed variation. "
        + (f"Significant after Holm at {alpha}: "
           + ", ".join(f"{r['task']} {r['score']} vs {r['baseline']}" for r in significant)
           + "." if significant else f"No difference is significant after Holm at {alpha}.")
    ), ""]
    return lines


def _metric(results: Mapping[str, Any], task: str) -> str:
    """The task's headline metric as its evaluations name it ("" when none does)."""
    return next((r["evaluations"][task].get("metric", "") for r in results["runs"].values()
                 if task in r.get("evaluations", {})), "")


def _differences(results: Mapping[str, Any], task: str) -> list[str]:
    """How the task's evaluations differ from XTREME's protocol (union over runs)."""
    out: list[str] = []
    for run in results["runs"].values():
        for item in run.get("evaluations", {}).get(task, {}).get("differences_from_xtreme", []):
            if item not in out:
                out.append(item)
    return out


def _pretraining_table(results: Mapping[str, Any]) -> list[str]:
    lines = ["## Pretraining", "",
             "| arm | seed | phases (task: steps) | tokens | final loss |", "|---|---|---|---|---|"]
    for arm, runs in _runs_by_arm(results).items():
        for run in runs:
            pre = run.get("pretraining") or {}
            phases = ", ".join(f"{p['task']}: {p['steps']}" for p in pre.get("phases", []))
            last = (pre.get("phases") or [{}])[-1].get("final_loss")
            loss = "–" if last is None else f"{last:.3f}"
            tokens = pre.get("tokens")
            lines.append(f"| {arm} | {run['seed']} | {phases} | "
                         f"{'–' if tokens is None else f'{tokens:,}'} | {loss} |")
    return lines + [""]


# ----------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------


def _num_examples(results: Mapping[str, Any], task: str) -> dict[str, int]:
    """{lang: evaluated examples} of a task (the first run that recorded them)."""
    out: dict[str, int] = {}
    for run in results["runs"].values():
        for lang, n in (run.get("evaluations", {}).get(task, {}).get("num_examples")
                        or {}).items():
            if n:
                out.setdefault(lang, n)
    return out


def _chance(results: Mapping[str, Any], task: str, langs) -> dict[str, float]:
    """Chance level of ``task`` for each of ``langs`` where it is known."""
    counts = _num_examples(results, task)
    return plots.chance_by_language(task, {lang: counts.get(lang) for lang in langs})


def figure_english_vs_target(results: Mapping[str, Any]):
    """English score against target-language average, per task, arm and seed (None: no data).

    Chance (where known) is drawn on both axes and both ranges include it.
    """
    by_arm = _runs_by_arm(results)
    tasks = [t for t in _tasks(results) if any(
        r.get("evaluations", {}).get(t, {}).get("english") is not None
        and r["evaluations"][t].get("average_target") is not None
        for runs in by_arm.values() for r in runs)]
    if not tasks:
        return None
    plt = plots.pyplot()
    colors = plots.colors(list(by_arm))
    markers = "osD^v<>pP*X"
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        xs, ys, langs = [], [], set()
        for arm, runs in by_arm.items():
            for i, run in enumerate(runs):
                ev = run.get("evaluations", {}).get(task)
                if not ev or ev.get("english") is None or ev.get("average_target") is None:
                    continue
                xs.append(ev["english"])
                ys.append(ev["average_target"])
                langs.update(ev.get("languages") or {})
                ax.scatter(ev["english"], ev["average_target"], color=colors[arm],
                           marker=markers[i % len(markers)],
                           label=f"{arm} seed {run['seed']}")
        chance = _chance(results, task, langs)
        levels = sorted(set(chance.values()))
        if len(levels) == 1:
            ax.axhline(levels[0], color="black", ls="--", lw=1, gid="chance",
                       label=plots.chance_label(task, chance))
            ax.axvline(levels[0], color="black", ls="--", lw=1, gid="chance")
        # One range for both axes: a point's distance from the diagonal is its gap.
        limits = plots.accuracy_limits(xs + ys, xs + ys, levels)
        ax.set_xlim(*limits)
        ax.set_ylim(*limits)
        ax.set_title(task)
        ax.set_xlabel("English")
        ax.set_ylabel("target-language average")
        ax.grid(alpha=0.3)
    # One legend for all tasks (an arm x seed has one marker everywhere), outside the axes.
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    labels = list(handles)
    fig.legend([handles[label] for label in labels], labels, loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.tight_layout()
    return fig


def figure_languages(results: Mapping[str, Any], task: str):
    """Per-language bars of one task, one colour per arm (mean, std error bars), chance."""
    data = per_language(results, task)
    if not data:
        return None
    series = {arm: {lang: (s["mean"] or 0.0, s["std"] or 0.0) for lang, s in by_lang.items()}
              for arm, by_lang in data.items()}
    chance = _chance(results, task, {lang for by_lang in data.values() for lang in by_lang})
    metric = _metric(results, task)
    return plots.language_bars(series, title=task, ylabel=f"{metric} (%)", chance=chance,
                               chance_text=plots.chance_label(task, chance))


def figure_layers(results: Mapping[str, Any]):
    """Retrieval accuracy (en -> xx, averaged over languages) per hidden state, per arm.

    Draws the reported layer and the mean of the languages' chance levels (None: no sweep).
    """
    tasks = [t for t in _tasks(results) if layer_sweep(results, t)]
    if not tasks:
        return None
    # Wide: each plot's legend (long entries) sits right of its axes.
    fig, axes = plots.pyplot().subplots(1, len(tasks), figsize=(10.0 * len(tasks), 3.5),
                                        squeeze=False)
    for ax, task in zip(axes[0], tasks):
        series = {arm: {x: (s["mean"], s["std"] or 0.0) for x, s in by_layer.items()}
                  for arm, by_layer in layer_sweep(results, task).items()}
        langs = {lang for by_lang in per_language(results, task).values() for lang in by_lang}
        chance = _chance(results, task, langs)
        reported = {run["arm"]: run["evaluations"][task]["hidden_states_index"]
                    for run in results["runs"].values()
                    if run.get("evaluations", {}).get(task, {}).get("hidden_states_index")
                    is not None}
        if len(set(reported.values())) == 1:
            # Every arm reports the same layer: one line, not one per arm.
            reported = {"": next(iter(reported.values()))}
        plots.layer_curves(
            series, title=f"{task}: accuracy per layer", ylabel="accuracy (%)",
            reported=reported, chance=float(np.mean(list(chance.values()))) if chance else None,
            chance_text=plots.chance_label(task, chance, average=True), ax=ax)
    fig.tight_layout()
    return fig


def figure_loss(results: Mapping[str, Any]):
    """Pretraining MLM loss over tokens seen, one line per arm and seed (None: no curve)."""
    by_arm = _runs_by_arm(results)
    curves = [(arm, run) for arm, runs in by_arm.items() for run in runs
              if (run.get("pretraining") or {}).get("loss_curve", {}).get("loss")]
    if not curves:
        return None
    colors = plots.colors(list(by_arm))
    styles = ["-", "--", ":", "-."]
    fig, ax = plots.pyplot().subplots(figsize=(6.5, 3.8))
    for arm, run in curves:
        curve = run["pretraining"]["loss_curve"]
        seeds = [r["seed"] for r in by_arm[arm]]
        ax.plot(curve["tokens"], curve["loss"], color=colors[arm],
                linestyle=styles[seeds.index(run["seed"]) % len(styles)],
                label=f"{arm} seed {run['seed']}")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("MLM loss (training batches)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def _plot(fig, path: str) -> bool:
    return fig is not None and plots.save(fig, path)


def plot_english_vs_target(results: Mapping[str, Any], path: str) -> bool:
    """Saves :func:`figure_english_vs_target` to ``path``; False when there is nothing."""
    return _plot(figure_english_vs_target(results), path)


def plot_languages(results: Mapping[str, Any], task: str, path: str) -> bool:
    """Saves :func:`figure_languages` to ``path``; False when there is nothing."""
    return _plot(figure_languages(results, task), path)


def plot_layers(results: Mapping[str, Any], path: str) -> bool:
    """Saves :func:`figure_layers` to ``path``; False when there is nothing."""
    return _plot(figure_layers(results), path)


def plot_loss(results: Mapping[str, Any], path: str) -> bool:
    """Saves :func:`figure_loss` to ``path``; False when there is nothing."""
    return _plot(figure_loss(results), path)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def write_report(results: Mapping[str, Any], out_dir: str | os.PathLike) -> list[pathlib.Path]:
    """Writes ``report.md`` and the PNG plots into ``out_dir``; returns their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = []
    if plot_english_vs_target(results, os.fspath(out / "english_vs_target.png")):
        images.append("english_vs_target.png")
    for task in _tasks(results):
        name = f"{_safe(task)}_languages.png"
        if plot_languages(results, task, os.fspath(out / name)):
            images.append(name)
    if plot_layers(results, os.fspath(out / "retrieval_layers.png")):
        images.append("retrieval_layers.png")
    if plot_loss(results, os.fspath(out / "pretraining_loss.png")):
        images.append("pretraining_loss.png")
    text = markdown(results, images)
    files.write_atomic(out / "report.md", text)
    return [out / "report.md", *(out / name for name in images)]

