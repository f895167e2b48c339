r"""Gathers ``results.json`` files of several runs into one markdown report with plots.

Usage::

    python -m xlmeta_jax.tools.report runs/meta runs/xlmr --output reports/meta_vs_xlmr
    python -m xlmeta_jax.tools.report meta=runs/meta/tydiqa xlmr=runs/xlmr/tydiqa --output out

Each RUN argument is ``[LABEL=]DIR``: ``DIR/results.json`` itself, or every
``DIR/*/results.json`` (one sub-folder per task). The label defaults to the folder
name. Writes ``OUTPUT/report.md`` (one table per task: runs x languages, then the
average, the average over non-English languages, English and the transfer gap; mean ±
std over seeds where a run has several) and PNG plots: ``<task>_languages.png``
(per-language bars, one colour per run), ``english_vs_transfer.png`` (English score
next to the non-English average, per task and run) and, for Tatoeba,
``<task>_layers.png`` (accuracy of every hidden state, the reported layer marked). The
figures are the experiment report's (:mod:`xlmeta_jax.experiment.plots`): chance drawn
where it is known, a y range that includes it, legends outside the data.

Under each table: every run's data source, training set and whether its numbers are
comparable with XTREME's published ones (results.json ``provenance``). Runs of one task
whose data source or settings differ are refused in one comparison (their numbers do
not measure the same thing) unless ``--allow_mixed`` is given; the table then names the
differences.
"""

from __future__ import annotations

import collections
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlmeta_jax import errors
from xlmeta_jax.experiment import plots

SUMMARY_KEYS = ("average", "average_target", "english", "transfer_gap")
# Settings that may differ between compared runs (bookkeeping, not protocol).
_FREE_SETTINGS = ("log_every", "eval_batch_size")


class ReportError(errors.UserError, ValueError):
    """A run argument or results.json the report cannot use (one line, exit 2)."""


def _parse_run(arg: str) -> tuple[str | None, pathlib.Path]:
    label, sep, path = arg.partition("=")
    if sep and label and "/" not in label:
        return label, pathlib.Path(path)
    return None, pathlib.Path(arg)


def gather(runs: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{task: {run label: results}} from ``[LABEL=]DIR`` arguments.

    Raises:
      FileNotFoundError: a DIR without results.json (itself or one level down).
      ValueError: two results of the same task under the same label.
    """
    if not runs:
        raise ValueError("no run directories given")
    out: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for arg in runs:
        label, path = _parse_run(arg)
        if not path.is_dir():
            raise FileNotFoundError(f"run directory {path} does not exist")
        files = [path / "results.json"] if (path / "results.json").is_file() else sorted(
            path.glob("*/results.json")
        )
        if not files:
            if (path / "config.gin").is_file() and any(path.glob("phase*/*/meta")):
                raise FileNotFoundError(
                    f"{path} is a pretraining run (python -m xlmeta_jax.train), which has no "
                    "results.json: evaluate it first with python -m xlmeta_jax.finetune "
                    f"--gin.INITIAL_CHECKPOINT_PATH=\"'{path}'\" and give the fine-tuning "
                    "MODEL_DIR here"
                )
            raise FileNotFoundError(f"no results.json in {path} or its sub-folders")
        label = label or path.name
        for f in files:
            try:
                results = json.loads(f.read_bytes().decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise ValueError(f"{f}: not a results.json (not valid JSON: {e})") from None
            if not isinstance(results, dict):
                raise ValueError(f"{f}: not a results.json (not a JSON object)")
            for key in ("task", "metric", "languages"):
                if key not in results:
                    raise ValueError(f"{f}: not a results.json (no {key!r})")
            task = results["task"]
            if label in out[task]:
                raise ValueError(
                    f"two {task} results for run {label!r} ({f}); label runs as LABEL=DIR"
                )
            out[task][label] = results
    return dict(out)


def _languages(by_run: dict[str, dict]) -> list[str]:
    langs = sorted({lang for r in by_run.values() for lang in r["languages"]})
    return (["en"] if "en" in langs else []) + [lang for lang in langs if lang != "en"]


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def _comparison_key(r: dict) -> dict:
    """What must be equal for two runs' numbers to be compared: data and settings."""
    prov = r.get("provenance", {})
    settings = {k: v for k, v in r.get("settings", {}).items() if k not in _FREE_SETTINGS}
    return {
        "data_source": prov.get("data_source", r.get("data_source")),
        "train_data": prov.get("train_data"),
        "eval_data": prov.get("eval_data"),
        "settings": settings,
    }


def check_comparable(task: str, by_run: dict[str, dict]) -> list[str]:
    """Differences between the runs of one task (empty when they compare)."""
    keys = {label: _comparison_key(r) for label, r in by_run.items()}
    first_label, first = next(iter(keys.items()))
    out = []
    for label, key in keys.items():
        for field in ("data_source", "train_data", "eval_data"):
            if key[field] != first[field]:
                out.append(f"{label} {field}={key[field]!r} vs {first_label} {first[field]!r}")
        names = sorted(set(key["settings"]) | set(first["settings"]))
        for name in names:
            a, b = key["settings"].get(name), first["settings"].get(name)
            if a != b:
                out.append(f"{label} {name}={a!r} vs {first_label} {b!r}")
    return out


def _fmt_seeded(value, std) -> str:
    return _fmt(value) if std is None else f"{_fmt(value)} ± {std:.1f}"


def task_table(task: str, by_run: dict[str, dict], allow_mixed: bool = False) -> str:
    """Markdown table of one task: a row per run, a column per language + summary.

    Raises:
      ValueError: runs with different data sources or settings, unless ``allow_mixed``.
    """
    metrics = {r["metric"] for r in by_run.values()}
    if len(metrics) != 1:
        raise ValueError(f"{task}: runs report different metrics {sorted(metrics)}")
    metric = metrics.pop()
    differences = check_comparable(task, by_run)
    if differences and not allow_mixed:
        raise ValueError(
            f"{task}: runs differ in data or settings, so their numbers do not compare: "
            + "; ".join(differences) + " (pass --allow_mixed to tabulate them anyway)"
        )
    langs = _languages(by_run)
    header = ["run", *langs, *SUMMARY_KEYS]
    lines = [
        f"### {task} ({metric})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for label, r in by_run.items():
        seeded = len(r.get("seeds", [])) > 1
        cells = [label]
        for lang in langs:
            v = r["languages"].get(lang, {})
            cells.append(_fmt_seeded(v.get(metric), v.get(f"{metric}_std") if seeded else None))
        cells += [_fmt_seeded(r.get(k), r.get(f"{k}_std") if seeded else None)
                  for k in SUMMARY_KEYS]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for label, r in by_run.items():
        prov = r.get("provenance")
        if prov is None:
            lines.append(f"* {label}: no provenance recorded (an older results.json).")
            continue
        comparable = "comparable with XTREME" if prov.get("comparable_to_xtreme") else (
            "not comparable with XTREME: " + "; ".join(prov.get("differences", [])))
        lines.append(f"* {label}: {prov.get('data_source')} data; trained on "
                     f"{prov.get('train_data')} ({prov.get('train_examples')} examples); "
                     f"{comparable}.")
    if differences:
        lines.append(f"* Runs differ (shown together on request): {'; '.join(differences)}.")
    return "\n".join(lines)


def _num_examples(by_run: dict[str, dict]) -> dict[str, int | None]:
    """{language: evaluated examples} (the first run that recorded them); Tatoeba's chance."""
    out: dict[str, int | None] = {}
    for r in by_run.values():
        for lang, v in r["languages"].items():
            if out.get(lang) is None:
                out[lang] = v.get("num_examples")
    return out


def figure_languages(task: str, by_run: dict[str, dict]):
    """Per-language bars of one task, one colour per run (seeds: std error bars), chance."""
    metric = next(iter(by_run.values()))["metric"]
    series = {label: {lang: (v[metric], v.get(f"{metric}_std") or 0.0)
                      for lang, v in r["languages"].items() if v.get(metric) is not None}
              for label, r in by_run.items()}
    chance = plots.chance_by_language(task, _num_examples(by_run))
    return plots.language_bars(series, title=f"{task}: {metric} per language",
                               ylabel=f"{metric} (%)", chance=chance,
                               chance_text=plots.chance_label(task, chance))


def _reported_hidden_state(r: dict) -> int | None:
    """The reported layer as a hidden-states index (the sweep's keys): ``layer`` counts
    XTREME's way, one less, in results.json files that predate the index."""
    if r.get("hidden_states_index") is not None:
        return int(r["hidden_states_index"])
    return None if r.get("layer") is None else int(r["layer"]) + 1


def figure_layers(task: str, by_run: dict[str, dict]):
    """Accuracy per hidden state of the runs with a ``layer_sweep``, both directions, with
    each run's reported layer and the mean of the languages' chance levels."""
    series = {}
    for label, r in by_run.items():
        sweep = r["layer_sweep"]
        for direction, name in (("en2xx", "en → xx (XTREME's)"), ("xx2en", "xx → en")):
            series[f"{label}: {name}"] = {int(i): (v[direction], 0.0) for i, v in sweep.items()}
    reported = {label: index for label, r in by_run.items()
                if (index := _reported_hidden_state(r)) is not None}
    if len(set(reported.values())) == 1:
        # Every run reports the same layer: one line, not one per run.
        reported = {"": next(iter(reported.values()))}
    chance = plots.chance_by_language(task, _num_examples(by_run))
    return plots.layer_curves(
        series, title=f"{task}: retrieval accuracy per layer",
        ylabel="mean accuracy over languages (%)", reported=reported,
        chance=float(np.mean(list(chance.values()))) if chance else None,
        chance_text=plots.chance_label(task, chance, average=True))


def _plot_transfer(tasks, path):
    fig, axes = plots.pyplot().subplots(1, len(tasks), figsize=(3.5 * len(tasks), 4),
                                        squeeze=False)
    for ax, (task, by_run) in zip(axes[0], tasks.items()):
        labels = list(by_run)
        x = np.arange(len(labels))
        en = [np.nan if r.get("english") is None else r["english"] for r in by_run.values()]
        tgt = [np.nan if r.get("average_target") is None else r["average_target"]
               for r in by_run.values()]
        ax.bar(x - 0.2, en, 0.4, label="English")
        ax.bar(x + 0.2, tgt, 0.4, label="other languages")
        ax.set_xticks(x, labels)
        ax.set_title(f"{task} ({next(iter(by_run.values()))['metric']})")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2)
    fig.suptitle("English vs zero-shot transfer")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    plots.save(fig, path)


def write_report(
    runs: Sequence[str], output: str | pathlib.Path, allow_mixed: bool = False
) -> pathlib.Path:
    """Writes OUTPUT/report.md and the PNG plots; returns the report path.

    Raises:
      ValueError: runs of one task differ in data or settings (unless ``allow_mixed``),
        checked before anything is written.
    """
    tasks = gather(runs)
    tables = {task: task_table(task, tasks[task], allow_mixed) for task in sorted(tasks)}
    output = pathlib.Path(output)
    output.mkdir(parents=True, exist_ok=True)
    parts = ["# Zero-shot cross-lingual evaluation", ""]
    parts.append(
        "Scores in percent. average: all evaluated languages; average_target: languages "
        "other than English; transfer_gap: english − average_target."
    )
    for task in sorted(tasks):
        by_run = tasks[task]
        parts += ["", tables[task], "", f"![{task}]({task}_languages.png)"]
        plots.save(figure_languages(task, by_run), output / f"{task}_languages.png")
        if any("layer_sweep" in r for r in by_run.values()):
            swept = {k: r for k, r in by_run.items() if "layer_sweep" in r}
            plots.save(figure_layers(task, swept), output / f"{task}_layers.png")
            parts += ["", f"![{task} layers]({task}_layers.png)"]
    with_english = {t: b for t, b in tasks.items()
                    if any(r.get("english") is not None for r in b.values())}
    if with_english:
        _plot_transfer(dict(sorted(with_english.items())), output / "english_vs_transfer.png")
        parts += ["", "![English vs transfer](english_vs_transfer.png)"]
    path = output / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path


def main(argv: list[str] | None = None) -> pathlib.Path:
    parser = errors.ArgumentParser(
        prog="python -m xlmeta_jax.tools.report",
        description=__doc__.splitlines()[0].replace("``", ""),
        epilog="example: python -m xlmeta_jax.tools.report meta=runs/meta_eval "
               "xlmr=runs/xlmr_eval --output reports/meta_vs_xlmr (no gin files)",
    )
    parser.add_argument("runs", nargs="+", help="[LABEL=]DIR holding results.json files")
    parser.add_argument("--output", required=True, help="folder for report.md and PNG plots")
    parser.add_argument("--allow_mixed", action="store_true",
                        help="tabulate runs whose data source or settings differ")
    errors.add_debug_flag(parser)
    args = parser.parse_args(argv)
    try:
        path = write_report(args.runs, args.output, args.allow_mixed)
    except (ValueError, FileNotFoundError) as e:
        raise ReportError(str(e)) from None
    print(path.read_text())
    plots = sorted(p.name for p in path.parent.glob("*.png"))
    print(f"wrote {path}" + (f" and {len(plots)} plots in {path.parent}" if plots else ""))
    return path


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.report")
