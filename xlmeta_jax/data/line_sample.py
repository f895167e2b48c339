"""The vocabulary's training sample: lines drawn over languages as XLM-R samples them.

``q_l`` proportional to ``n_l^alpha`` over languages (``n_l``: usable lines); within a
language, lines uniformly without replacement, a language whose share exceeds its size
repeated whole, as the pretraining sampler does. Seeded per language, so adding a
language does not change another's lines.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from xlmeta_jax.data import rates, text_files


def _lang_seed(seed: int, lang: str) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(lang.encode())]


def draw(
    line_counts: Mapping[str, int],
    *,
    num_lines: int,
    alpha: float,
    seed: int,
    weights: Mapping[str, float] | None = None,
) -> tuple[dict[str, float], dict[str, tuple[int, np.ndarray, int]]]:
    """Which lines of each language the sample takes, from the languages' line counts.

    Args:
      line_counts: usable lines per language (indices run over them in file order).
      num_lines: the sample's size.
      alpha: q_l proportional to n_l^alpha.
      seed: the sample's seed (per language: adding one changes no other's lines).
      weights: n_l for q_l when not the line counts (given counts).

    Returns:
      (q per language, per language (times every line is taken, the sorted indices
      taken once more, the language's draws)).
    """
    q = rates.alpha_probabilities(dict(weights) if weights else dict(line_counts), alpha)
    draws = rates.sample_counts(q, int(num_lines))
    out = {}
    for lang, n in line_counts.items():
        m = draws[lang]
        rng = np.random.default_rng(_lang_seed(seed, lang))
        repeats, rest = divmod(m, n)
        chosen = rng.choice(n, size=rest, replace=False) if rest else np.zeros(0, np.int64)
        out[lang] = (repeats, np.sort(chosen), m)
    return q, out


def sample_training_lines(
    text_files_by_lang: Mapping[str, Sequence[str]],
    *,
    num_lines: int,
    alpha: float,
    seed: int,
    max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES,
    counts: Mapping[str, int] | None = None,
    stats_cache_dir: str | None = None,
) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Draws ``num_lines`` paragraphs over languages with ``q_l ∝ n_l^alpha``.

    Within a language, lines are drawn uniformly without replacement; a language
    whose share exceeds its size is repeated whole (upsampling), as the
    pretraining sampler does.

    Returns:
      (lines per language, q per language).
    """
    alpha = rates.check_alpha(alpha)
    files_by_lang = {}
    for lang, files in text_files_by_lang.items():
        files_by_lang[lang] = text_files.list_text_files(
            files, what=f"vocabulary text for {lang!r}")
    line_counts = {}
    for lang, files in files_by_lang.items():
        stats = text_files.corpus_stats(
            files, max_line_bytes=max_line_bytes, cache_dir=stats_cache_dir
        )
        line_counts[lang] = text_files.count(stats, "lines")
    q, chosen_by_lang = draw(line_counts, num_lines=num_lines, alpha=alpha, seed=seed,
                             weights=counts)
    out: dict[str, list[str]] = {}
    for lang, files in files_by_lang.items():
        repeats, chosen, _ = chosen_by_lang[lang]
        multiplicity = dict.fromkeys(chosen.tolist(), 1)
        lines: list[str] = []
        index = 0
        for path in files:
            for text in text_files.iter_paragraphs(path, max_line_bytes):
                k = repeats + multiplicity.get(index, 0)
                if k:
                    lines.extend([text] * k)
                index += 1
        out[lang] = lines
    return out, q
