"""Paired comparisons of the experiment's arms over seeds, with honest statistics.

The experiment is paired by seed: for one seed every arm starts from the same
parameters (``train.seed``), reads the same mixture stream where it reads the mixture
from its start (``xlmeta_jax.data.seeds``), and is fine-tuned with the same seed and
subsample. So the unit of comparison is the per-seed difference ``d_s = meta_s -
baseline_s``, not two independent samples. For each task, baseline and score
(English, target-language average) the report gives:

* the mean and sample standard deviation of ``d_s`` and a 95% interval
  (Student's t with n - 1 degrees of freedom);
* the exact two-sided sign-flip permutation p-value: under "no difference" each
  ``d_s`` is as likely to have either sign, so the 2^n sign patterns are equally
  likely; p is the share of them whose |mean| reaches the observed one. With n seeds
  it is never below ``2 / 2^n`` (0.125 for 4 seeds);
* Holm's step-down adjustment over every comparison the report makes (tasks x
  baselines x scores), controlling the family-wise error rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# The scores compared (keys of a task's evaluation in results.json).
SCORES = ("english", "average_target")


def sign_flip_p_value(differences: Sequence[float]) -> float:
    """Exact two-sided p-value of the paired sign-flip permutation test.

    Args:
      differences: the per-seed differences ``d_s``.

    Returns:
      The share of the 2^n sign patterns ``(+-d_1, ..., +-d_n)`` whose mean has an
      absolute value at least the observed one (the observed pattern included).
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        return float("nan")
    observed = abs(d.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    means = np.abs(signs @ d) / d.size
    # A tolerance for the rounding of equal sums in another order.
    return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given; NaN stays NaN)."""
    p = np.asarray(p_values, dtype=np.float64)
    valid = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(p.shape, np.nan)
    order = valid[np.argsort(p[valid], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def t_interval(differences: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of the mean difference (None for fewer than two seeds)."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        return None
    from scipy import stats  # noqa: PLC0415 - scipy.stats: 1 s at import, for this one quantile

    half = stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def smallest_p(n: int) -> float:
    """The smallest p-value the exact sign-flip test reaches with ``n`` seeds."""
    return min(1.0, 2.0 / 2**n) if n else float("nan")


def seeds_needed(alpha: float, comparisons: int) -> int:
    """Seeds for which the sign-flip test can reach ``alpha`` after Holm over ``comparisons``.

    Holm's first (strictest) step compares the smallest p with ``alpha / comparisons``.
    """
    n = 1
    while smallest_p(n) > alpha / max(comparisons, 1):
        n += 1
    return n


def paired_comparisons(results: Mapping[str, Any], arm: str = "meta",
                       baselines: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every paired comparison of ``arm`` with each baseline, per task and score.

    Seeds are paired by their number; a seed missing from either arm (or a score that
    is None, e.g. English of a retrieval task) is left out of that comparison.

    Returns:
      One dict per comparison: ``task``, ``baseline``, ``score``, ``n``, ``mean``,
      ``std``, ``interval`` (95%), ``p`` (exact sign-flip), ``p_holm`` (Holm over all
      the returned comparisons that have at least one seed).
    """
    runs: dict[str, dict[int, dict]] = {}
    for run in results["runs"].values():
        runs.setdefault(run["arm"], {})[run["seed"]] = run.get("evaluations", {})
    if arm not in runs:
        return []
    if baselines is None:
        listed = list(results.get("experiment", {}).get("arms") or sorted(runs))
        baselines = [a for a in listed if a != arm and a in runs]
    tasks: list[str] = []
    for evaluations in runs[arm].values():
        tasks += [t for t in evaluations if t not in tasks]
    out = []
    for task, baseline, score in itertools.product(tasks, baselines, SCORES):
        d = []
        for seed, evaluations in sorted(runs[arm].items()):
            mine = evaluations.get(task, {}).get(score)
            theirs = runs[baseline].get(seed, {}).get(task, {}).get(score)
            if mine is not None and theirs is not None:
                d.append(float(mine) - float(theirs))
        if not d:
            continue
        out.append({
            "task": task, "baseline": baseline, "score": score, "n": len(d),
            "mean": float(np.mean(d)), "std": float(np.std(d, ddof=1)) if len(d) > 1 else None,
            "interval": t_interval(d), "p": sign_flip_p_value(d),
        })
    for row, adjusted in zip(out, holm([row["p"] for row in out])):
        row["p_holm"] = adjusted
    return out
