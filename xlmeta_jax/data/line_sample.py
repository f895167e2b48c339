"""Samples of a corpus' lines: the vocabulary's training sample, drawn over languages as
XLM-R samples them (:func:`draw`), and the paragraphs that give a language's tokens per
byte (:func:`estimate_tokens`).

``q_l`` proportional to ``n_l^alpha`` over languages (``n_l``: usable lines); within a
language, lines uniformly without replacement, a language whose share exceeds its size
repeated whole, as the pretraining sampler does. Seeded per language, so adding a
language does not change another's lines.
"""

from __future__ import annotations

import math
import os
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


def sample_paragraphs(path: str, n: int, max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES
                      ) -> list[str]:
    """About ``n`` kept paragraphs spread evenly over a file.

    A plain local file is sampled at ``n`` evenly spaced byte offsets (the line that
    starts after each offset), so that a file whose line lengths drift is sampled
    throughout; a compressed or remote file gives its first ``n`` paragraphs.
    """
    if n <= 0:
        return []
    if path.endswith(".gz") or "://" in path:
        out = []
        for line in text_files.iter_paragraphs(path, max_line_bytes):
            out.append(line)
            if len(out) == n:
                break
        return out
    size = os.path.getsize(path)
    out, seen = [], set()
    with open(path, "rb") as f:
        for i in range(n):
            offset = size * i // n
            f.seek(offset)
            if offset:
                f.readline()  # the rest of the line the offset fell into
            while True:
                start = f.tell()
                raw = f.readline()
                if not raw or start in seen:
                    break
                seen.add(start)
                line = raw.rstrip(b"\n").replace(b"\r", b"")  # as text_files.iter_lines reads it
                if not line.strip() or len(line) > max_line_bytes:
                    continue
                try:
                    out.append(line.decode("utf-8"))
                    break
                except UnicodeDecodeError:
                    continue
    return out


def estimate_tokens(
    stats: Sequence[text_files.FileStats],
    encode,
    *,
    sample_lines: int = 2000,
) -> float:
    """n in tokens of a set of files: text bytes x tokens per byte of a sample.

    Args:
      stats: the files' :func:`text_files.corpus_stats` (their ``text_bytes`` are exact).
      encode: a list of strings -> a list of token-id lists (the run's vocabulary).
      sample_lines: paragraphs sampled over all files (spread over and within them).

    Raises:
      CorpusError: if the sample holds no text.
    """
    stats = list(stats)
    per_file = sample_lines_per_file(sample_lines, len(stats))
    sample = [line for s in stats
              for line in sample_paragraphs(s.path, per_file, s.max_line_bytes)]
    return tokens_from_sample(sum(s.text_bytes for s in stats), sample, encode,
                              what=str([s.path for s in stats]))


def sample_lines_per_file(sample_lines: int, num_files: int) -> int:
    """Paragraphs :func:`estimate_tokens` reads from each of ``num_files`` files."""
    return max(1, math.ceil(sample_lines / max(1, num_files)))


def tokens_from_sample(text_bytes: int, sample: Sequence[str], encode, *, what: str) -> float:
    """``text_bytes`` in tokens, at the tokens per byte ``encode`` gives ``sample``."""
    sample_bytes = sum(len(line.encode("utf-8")) for line in sample)
    if not sample_bytes:
        raise text_files.CorpusError(f"no text to sample tokens from in {what}")
    sample_tokens = sum(len(ids) for ids in encode(list(sample)))
    return text_bytes * sample_tokens / sample_bytes
