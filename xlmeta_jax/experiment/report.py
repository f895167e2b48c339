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
* ``retrieval_layers.png``: retrieval accuracy of every layer per arm;
* ``pretraining_loss.png``: MLM loss over tokens seen, per arm and seed;
* the paired comparison of ``meta`` with every other arm, per task and score: the
  per-seed differences' mean ± std, 95% interval, exact sign-flip p-value and its Holm
  adjustment over all comparisons, and what the number of seeds can detect
  (:mod:`xlmeta_jax.experiment.statistics`).

The input format (``runs`` is what the experiment measured; nothing else is read)::

    {"experiment": {"name", "arms", "seeds", "tasks", ...},
     "runs": {"<arm>/seed<k>": {
        "arm", "seed",
        "pretraining": {"tokens", "phases": [...],
                        "loss_curve": {"tokens": [...], "loss": [...], "phase": [...]}},
        "evaluations": {task: {"metric", "english", "average_target", "transfer_gap",
                                "languages": {lang: score}, "layer_sweep": {layer: acc}}}}}}
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlmeta_jax import files
from xlmeta_jax.experiment import statistics

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
        metric = next((r["evaluations"][task].get("metric", "") for r in results["runs"].values()
                       if task in r.get("evaluations", {})), "")
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


def _pyplot():
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when plotting

    return plt


def _save(fig, path: str) -> bool:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    _pyplot().close(fig)
    return True


def _colors(arms: Sequence[str]) -> dict[str, Any]:
    cmap = _pyplot().get_cmap("tab10")
    return {arm: cmap(i % 10) for i, arm in enumerate(arms)}


def plot_english_vs_target(results: Mapping[str, Any], path: str) -> bool:
    """English score against target-language average, per task, arm and seed."""
    by_arm = _runs_by_arm(results)
    tasks = [t for t in _tasks(results) if any(
        r.get("evaluations", {}).get(t, {}).get("english") is not None
        and r["evaluations"][t].get("average_target") is not None
        for runs in by_arm.values() for r in runs)]
    if not tasks:
        return False
    plt = _pyplot()
    colors = _colors(list(by_arm))
    markers = "osD^v<>pP*X"
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for arm, runs in by_arm.items():
            for i, run in enumerate(runs):
                ev = run.get("evaluations", {}).get(task)
                if not ev or ev.get("english") is None or ev.get("average_target") is None:
                    continue
                ax.scatter(ev["english"], ev["average_target"], color=colors[arm],
                           marker=markers[i % len(markers)],
                           label=f"{arm} seed {run['seed']}")
        ax.set_title(task)
        ax.set_xlabel("English")
        ax.set_ylabel("target-language average")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def plot_languages(results: Mapping[str, Any], task: str, path: str) -> bool:
    """Per-language bars of one task, one colour per arm (mean, std error bars)."""
    data = per_language(results, task)
    if not data:
        return False
    langs = sorted({lang for v in data.values() for lang in v})
    langs = (["en"] if "en" in langs else []) + [lang for lang in langs if lang != "en"]
    plt = _pyplot()
    colors = _colors(list(data))
    width = 0.8 / len(data)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(langs) * len(data)), 3.5))
    x = np.arange(len(langs))
    for i, (arm, by_lang) in enumerate(data.items()):
        means = [by_lang.get(lang, {}).get("mean") or 0.0 for lang in langs]
        errs = [by_lang.get(lang, {}).get("std") or 0.0 for lang in langs]
        ax.bar(x + i * width - 0.4 + width / 2, means, width, yerr=errs, color=colors[arm],
               label=arm, capsize=1.5)
    ax.set_xticks(x, langs, rotation=90 if len(langs) > 20 else 0, fontsize=7)
    ax.set_title(task)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_layers(results: Mapping[str, Any], path: str) -> bool:
    """Retrieval accuracy (xx->en, averaged over languages) per layer, per arm."""
    tasks = [t for t in _tasks(results) if layer_sweep(results, t)]
    if not tasks:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        data = layer_sweep(results, task)
        colors = _colors(list(data))
        for arm, layers in data.items():
            xs = list(layers)
            means = [layers[x]["mean"] for x in xs]
            errs = [layers[x]["std"] or 0.0 for x in xs]
            ax.errorbar(xs, means, yerr=errs, color=colors[arm], marker="o", label=arm,
                        capsize=2)
        ax.set_title(f"{task}: accuracy per layer")
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_loss(results: Mapping[str, Any], path: str) -> bool:
    """Pretraining MLM loss over tokens seen, one line per arm and seed."""
    by_arm = _runs_by_arm(results)
    curves = [(arm, run) for arm, runs in by_arm.items() for run in runs
              if (run.get("pretraining") or {}).get("loss_curve", {}).get("loss")]
    if not curves:
        return False
    plt = _pyplot()
    colors = _colors(list(by_arm))
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
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
    return _save(fig, path)


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

