"""Where the pretraining text lives: the gin-configurable corpus settings.

Each function below is called when a dataset is built (not when ``tasks`` is
imported), so bindings made after import — gin files, ``--gin.`` flags,
``gin.bind_parameter`` — take effect. See ``gin/data/*.gin`` and docs/data.md.

=========================  ==========================================================
task / mixture             binding(s)
=========================  ==========================================================
``xlmeta_english_text``    ``english_text_corpus.file_patterns = ['/data/en/*.txt']``
``xlmeta_english_tfds``    ``english_tfds_corpus.tfds_name = 'wikipedia/20230601.en:1.0.0'``
``xlmeta_cc100`` (+ tasks) ``cc100_corpus.data_dir``, ``.languages``, ``.alpha``, ``.counts``
``xlmeta_mc4`` (+ tasks)   ``mc4_corpus.languages``, ``.alpha``, ``.tfds_data_dir``
=========================  ==========================================================
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from collections.abc import Mapping, Sequence

import gin

from xlmeta_jax.data import mixtures
from xlmeta_jax.data.languages import XLMR_LANGUAGES, check_languages, mc4_split_name


@dataclasses.dataclass(frozen=True)
class EnglishTextConfig:
    """Validated :func:`english_text_corpus` settings."""

    file_patterns: tuple[str, ...]
    validation_file_patterns: tuple[str, ...]
    max_line_bytes: int
    stats_cache_dir: str | None


@gin.configurable
def english_text_corpus(
    file_patterns: Sequence[str] | None = None,
    validation_file_patterns: Sequence[str] | None = None,
    max_line_bytes: int = mixtures.DEFAULT_MAX_LINE_BYTES,
    stats_cache_dir: str | None = None,
) -> EnglishTextConfig:
    """Phase-1 English text files (task ``xlmeta_english_text``).

    Args:
      file_patterns: paths or globs, any file system TF reads (``gs://...``);
        plain text or ``.gz``, one paragraph per line, blank lines between
        documents.
      validation_file_patterns: the same for the ``validation`` split (optional).
      max_line_bytes: longer lines are skipped (and counted).
      stats_cache_dir: where the one-time file check caches its counts
        (default: next to the data).
    """
    file_patterns = [file_patterns] if isinstance(file_patterns, str) else file_patterns or ()
    validation_file_patterns = (
        [validation_file_patterns]
        if isinstance(validation_file_patterns, str)
        else validation_file_patterns or ()
    )
    if int(max_line_bytes) <= 0:
        raise mixtures.CorpusError(f"max_line_bytes must be positive, got {max_line_bytes}")
    return EnglishTextConfig(
        tuple(file_patterns), tuple(validation_file_patterns), int(max_line_bytes), stats_cache_dir
    )


@gin.configurable
def english_tfds_corpus(
    tfds_name: str | None = None,
    tfds_data_dir: str | None = None,
    text_feature: str = "text",
    train_split: str = "train",
    validation_split: str | None = None,
) -> tuple[str, str | None, str, dict[str, str]]:
    """Phase-1 English from TFDS (task ``xlmeta_english_tfds``).

    Args:
      tfds_name: a versioned TFDS name, e.g. ``'wikipedia/20230601.en:1.0.0'``
        or ``'c4/en:3.1.0'`` (prepared in ``tfds_data_dir`` beforehand).
      tfds_data_dir: TFDS data folder (default: TFDS's).
      text_feature: the feature holding the document text.
      train_split: TFDS split (or slice) for ``train``, e.g. ``'train[:99%]'``.
      validation_split: TFDS split for ``validation``, e.g. ``'train[99%:]'``.

    Returns:
      (tfds_name, tfds_data_dir, text_feature, {canonical split: TFDS split}).
    """
    if not tfds_name:
        raise mixtures.CorpusError(
            "no English TFDS dataset configured: set ENGLISH_TFDS_NAME (gin/data/english_tfds.gin "
            "binds english_tfds_corpus.tfds_name), e.g. 'wikipedia/20230601.en:1.0.0'"
        )
    if ":" not in tfds_name:
        raise mixtures.CorpusError(f"TFDS name {tfds_name!r} needs a version, e.g. 'c4/en:3.1.0'")
    splits = {"train": train_split}
    if validation_split:
        splits["validation"] = validation_split
    return tfds_name, tfds_data_dir, text_feature, splits


@dataclasses.dataclass(frozen=True)
class CC100Config:
    """Validated :func:`cc100_corpus` settings."""

    data_dir: str
    languages: tuple[str, ...]
    alpha: float
    counts: Mapping[str, float] | None
    count_unit: str
    max_line_bytes: int
    stats_cache_dir: str | None
    validation_dir: str | None


@gin.configurable
def cc100_corpus(
    data_dir: str | None = None,
    languages: Sequence[str] | None = None,
    alpha: float = 0.3,
    counts: Mapping[str, float] | None = None,
    count_unit: str = "lines",
    max_line_bytes: int = mixtures.DEFAULT_MAX_LINE_BYTES,
    stats_cache_dir: str | None = None,
    validation_dir: str | None = None,
) -> CC100Config:
    """CC-100 files (tasks ``xlmeta_cc100_{lang}``, mixture ``xlmeta_cc100``).

    Args:
      data_dir: folder with ``{lang}.txt*`` per language (e.g. ``en.txt`` or
        ``en.txt.00.gz``, ``en.txt.01.gz``, ...; decompress CC-100's ``.xz``
        first). Any file system TF reads.
      languages: the mixture's languages (CC-100 codes); None: all 100.
      alpha: sampling exponent in (0, 1]; 1 samples proportionally to n_l,
        smaller values up-sample low-resource languages (XLM-R: 0.3).
      count_unit: what n_l counts: ``'lines'`` (paragraphs, default) or
        ``'bytes'`` (UTF-8 bytes of text).
      counts: n_l per language, in ``count_unit``; default: counted once from
        the files and cached next to them (``xlmeta_corpus_stats.json``).
      max_line_bytes: longer lines are skipped (and counted).
      stats_cache_dir: cache the counts here instead of next to the data.
      validation_dir: optional folder with the same layout for ``validation``.
    """
    if not data_dir:
        raise mixtures.CorpusError(
            "no CC-100 folder configured: set CC100_DIR (gin/data/cc100.gin binds "
            "cc100_corpus.data_dir = %CC100_DIR)"
        )
    langs = check_languages(
        XLMR_LANGUAGES if languages is None else languages, what="cc100_corpus.languages"
    )
    alpha = mixtures.check_alpha(alpha)
    if count_unit not in mixtures.COUNT_UNITS:
        raise mixtures.CorpusError(
            f"cc100_corpus.count_unit must be one of {mixtures.COUNT_UNITS}, got {count_unit!r}"
        )
    if int(max_line_bytes) <= 0:
        raise mixtures.CorpusError(f"max_line_bytes must be positive, got {max_line_bytes}")
    if counts is not None:
        counts = dict(counts)
        check_languages(list(counts), what="cc100_corpus.counts")
    return CC100Config(
        data_dir=data_dir,
        languages=langs,
        alpha=alpha,
        counts=counts,
        count_unit=count_unit,
        max_line_bytes=int(max_line_bytes),
        stats_cache_dir=stats_cache_dir,
        validation_dir=validation_dir,
    )


def cc100_files(config: CC100Config, lang: str, split: str = "train") -> list[str]:
    """The files of one language: ``{dir}/{lang}.txt*`` (checked, sorted).

    Files in a compression tf.data cannot read (``.xz``, ...) are ignored with a
    warning when readable files sit beside them, and are an error otherwise.
    """
    check_languages([lang])
    folder = config.data_dir if split == "train" else config.validation_dir
    if split not in ("train", "validation") or not folder:
        raise mixtures.CorpusError(f"CC-100 has no {split!r} split configured")
    pattern = os.path.join(folder, f"{lang}.txt*")
    if "://" in pattern:
        import tensorflow as tf

        matched = sorted(tf.io.gfile.glob(pattern))
    else:
        matched = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not matched:
        raise mixtures.CorpusError(f"CC-100 language {lang!r}: no file matches {pattern}")
    readable = []
    for path in matched:
        try:
            mixtures.check_readable_suffix(path)
            readable.append(path)
        except mixtures.CorpusError as e:
            if len(matched) == 1:
                raise
            logging.warning("ignoring %s", e)
    if not readable:
        raise mixtures.CorpusError(
            f"CC-100 language {lang!r}: only compressed files tf.data cannot read: {matched}"
        )
    return mixtures.list_text_files(readable, what=f"CC-100 language {lang!r}")


def cc100_counts(config: CC100Config, languages: Sequence[str]) -> dict[str, float]:
    """n_l for ``languages``: the configured counts, or counted (cached) from the files."""
    if config.counts is not None:
        return mixtures.given_counts(config.counts, languages, what="cc100_corpus.counts")
    out = {}
    for lang in languages:
        stats = mixtures.corpus_stats(
            cc100_files(config, lang),
            max_line_bytes=config.max_line_bytes,
            cache_dir=config.stats_cache_dir,
        )
        out[lang] = mixtures.count(stats, config.count_unit)
    return out


@dataclasses.dataclass(frozen=True)
class MC4Config:
    """Validated :func:`mc4_corpus` settings."""

    languages: tuple[str, ...]
    alpha: float
    counts: Mapping[str, float] | None
    tfds_name: str
    tfds_data_dir: str | None


@gin.configurable
def mc4_corpus(
    languages: Sequence[str] | None = None,
    alpha: float = 0.3,
    counts: Mapping[str, float] | None = None,
    tfds_name: str = "c4/multilingual:3.1.0",
    tfds_data_dir: str | None = None,
) -> MC4Config:
    """mC4 through TFDS (tasks ``xlmeta_mc4_{lang}``, mixture ``xlmeta_mc4``).

    Args:
      languages: CC-100 codes (mapped to mC4's split names, e.g. he -> iw);
        None: the XLM-R languages mC4 has (all but the romanised, Zawgyi and
        Traditional Chinese variants).
      alpha: sampling exponent in (0, 1].
      counts: n_l (documents) per language; default: the TFDS split sizes.
      tfds_name: versioned TFDS name of mC4.
      tfds_data_dir: TFDS data folder where mC4 was prepared.
    """
    if languages is None:
        languages = [lang for lang in XLMR_LANGUAGES if mc4_split_name(lang)]
    langs = check_languages(languages, what="mc4_corpus.languages")
    missing = [lang for lang in langs if mc4_split_name(lang) is None]
    if missing:
        raise mixtures.CorpusError(f"mC4 has no split for {missing}")
    alpha = mixtures.check_alpha(alpha)
    return MC4Config(langs, alpha, dict(counts) if counts else None, tfds_name, tfds_data_dir)
