"""Language sampling rates: XLM-R's ``q_l = n_l^alpha / sum_k n_k^alpha``.

The counts ``n_l`` come from :func:`xlmeta_jax.data.text_files.corpus_stats` (or are
given); the mixtures (:mod:`xlmeta_jax.data.tasks`) and the vocabulary's training
sample (:mod:`xlmeta_jax.data.vocabulary`) are drawn with these rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from xlmeta_jax.data.text_files import CorpusError


def given_counts(
    counts: Mapping[str, float], languages: Sequence[str], *, what: str
) -> dict[str, float]:
    """n_l of ``languages`` from user-given ``counts``; names ``what`` when one lacks it."""
    missing = [lang for lang in languages if lang not in counts]
    if missing:
        raise CorpusError(f"{what} lacks {missing}")
    return {lang: counts[lang] for lang in languages}


def check_alpha(alpha: float) -> float:
    """Validates the sampling exponent: 0 < alpha <= 1 (a command's own flag)."""
    problem = alpha_problem(alpha)
    if problem is not None:
        raise CorpusError(problem)
    return float(alpha)


def alpha_problem(alpha) -> str | None:
    """What is wrong with a sampling exponent (it must be in (0, 1]), or None."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        return f"alpha must be a number in (0, 1], got {alpha!r}"
    if not (0.0 < alpha <= 1.0) or math.isnan(alpha):
        return (f"alpha must be in (0, 1] (1 = proportional to size, XLM-R uses 0.3), "
                f"got {alpha!r}")
    return None


def alpha_probabilities(counts: Mapping[str, float], alpha: float) -> dict[str, float]:
    """Sampling probabilities ``q_l = n_l^alpha / sum_k n_k^alpha``.

    ``alpha`` is a checked setting (``Corpora``, a phase's own, a command's flag).

    Raises:
      CorpusError: if the mapping is empty or a count is not a positive finite number.
    """
    if not counts:
        raise CorpusError("no languages to mix")
    for lang, n in counts.items():
        if not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0:
            raise CorpusError(f"language {lang!r}: count n_l must be a positive number, got {n!r}")
    # Computed in log space: n**alpha of 1e12 lines stays finite either way, but
    # the log form keeps tiny languages exact relative to huge ones.
    logs = {lang: alpha * math.log(n) for lang, n in counts.items()}
    top = max(logs.values())
    weights = {lang: math.exp(v - top) for lang, v in logs.items()}
    total = sum(weights.values())
    return {lang: w / total for lang, w in weights.items()}


def sample_counts(
    probabilities: Mapping[str, float], total: int
) -> dict[str, int]:
    """Splits ``total`` draws by probability (largest remainder; every language >= 1)."""
    if total < len(probabilities):
        raise CorpusError(f"cannot draw {total} samples over {len(probabilities)} languages")
    raw = {lang: p * total for lang, p in probabilities.items()}
    out = {lang: max(1, int(math.floor(v))) for lang, v in raw.items()}
    rest = total - sum(out.values())
    order = sorted(raw, key=lambda lang: raw[lang] - math.floor(raw[lang]), reverse=True)
    i = 0
    while rest > 0:
        out[order[i % len(order)]] += 1
        rest -= 1
        i += 1
    while rest < 0:  # the max(1, .) floor overshot: take from the largest
        lang = max(out, key=out.get)
        out[lang] -= 1
        rest += 1
    return out
