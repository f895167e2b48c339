"""The results of an evaluation: aggregation over seeds, the table, results.json.

results.json (written by :func:`write_results`)::

    {"task", "metric",
     "languages": {lang: {metric: mean over seeds, metric + "_std": ..., ...}},
     "average":        mean over all evaluated languages (XTREME's convention),
     "average_std":    std over seeds of the per-seed averages,
     "average_target": mean over the languages other than English,
     "english":        the English score,
     "transfer_gap":   english - average_target,
     "seeds": [{"seed", "languages", "average", "selected_step", ...} per seed],
     "provenance": {data source, train / selection / eval data, scoring,
                    comparable_to_xtreme, differences},
     "model": {...}, "train": {...}, "settings": {...}}

Retrieval tasks write the same summary keys (no English row: English is the retrieval
side) with their layer, pooling and per-layer sweep.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from xlmeta_jax import files
from xlmeta_jax.evaluation import scorers


def format_table(results: dict[str, Any]) -> str:
    """Markdown table of one results.json.

    Args:
      results: a results.json dictionary.

    Returns:
      One row per language, then the summary (``mean ± std`` over seeds when there
      are several) and, for a run not comparable with XTREME, why.
    """
    metric = results["metric"]
    seeded = len(results.get("seeds", [])) > 1
    extra = [m for m in ("exact_match", "accuracy", "accuracy_xx2en")
             if m != metric and any(m in v for v in results["languages"].values())]
    header = ["language", metric, *extra, "examples"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def cell(v, key):
        if key not in v:
            return ""
        std = v.get(f"{key}_std")
        return f"{v[key]:.2f} ± {std:.2f}" if seeded and std is not None else f"{v[key]:.2f}"

    for lang, v in results["languages"].items():
        cells = [lang, *(cell(v, m) for m in (metric, *extra))]
        cells.append(str(v.get("num_examples", "")))
        lines.append("| " + " | ".join(cells) + " |")
    for key in ("average", "average_target", "english", "transfer_gap"):
        value = results.get(key)
        shown = "n/a" if value is None else f"{value:.2f}"
        if seeded and key == "average" and results.get("average_std") is not None:
            shown += f" ± {results['average_std']:.2f}"
        lines.append("| **" + key + "** | " + shown + " |" + " |" * (len(header) - 2))
    if "provenance" in results and not results["provenance"].get("comparable_to_xtreme"):
        lines.append("")
        lines.append("Not comparable with XTREME's published numbers: "
                     + "; ".join(results["provenance"].get("differences", [])) + ".")
    return "\n".join(lines)


def write_results(model_dir: str | os.PathLike, results: dict[str, Any]) -> pathlib.Path:
    """Writes MODEL_DIR/results.json (atomically) and returns its path."""
    path = pathlib.Path(model_dir) / "results.json"
    files.write_atomic(path, json.dumps(results, indent=2, ensure_ascii=False, sort_keys=False))
    return path


def aggregate(runs: list[dict], metric: str) -> dict[str, Any]:
    """Mean (and sample std over seeds, 0 for one seed) per language and of the average.

    Args:
      runs: per-seed results, each with ``languages`` and ``average``.
      metric: the headline metric.

    Returns:
      ``languages`` (each score with its ``_std``; ``num_*`` counts as in the first
      run), the transfer summary of the means, and ``average_std``.
    """

    def std(xs):
        return float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0

    languages = {}
    for lang in runs[0]["languages"]:
        entry = {}
        for key, value in runs[0]["languages"][lang].items():
            values = [r["languages"][lang][key] for r in runs]
            if key.startswith("num_"):
                entry[key] = value
                continue
            entry[key] = float(np.mean(values))
            entry[f"{key}_std"] = std(values)
        languages[lang] = entry
    return {
        "languages": languages,
        **scorers.transfer_summary(languages, metric),
        "average_std": std([r["average"] for r in runs]),
    }
