"""Where the pretraining text lives: the corpus settings :func:`tasks.register` takes.

:class:`Corpora` names every corpus of a run (plain values, no gin; gin binds them
through ``xlmeta_jax.data.corpora.Corpora``, see ``gin/data/*.gin``). Which tasks and
mixtures a setting registers (names in ``xlmeta_jax/data/task_names.py``):

=========================  ==========================================================
task / mixture             setting(s)
=========================  ==========================================================
``xlmeta_english_text``    ``english_files`` (``english_validation_files``)
``xlmeta_english_tfds``    ``english_tfds_name`` (``tfds_data_dir``, ``english_tfds_*``)
``xlmeta_cc100`` (+ tasks) ``cc100_dir``, ``languages``, ``alpha``, ``cc100_counts``
``xlmeta_mc4`` (+ tasks)   ``mc4_tfds_name``, ``languages``, ``alpha``, ``tfds_data_dir``
``xlmeta_joint``           ``joint_english_share`` (with an English and a multilingual corpus)
=========================  ==========================================================

Nothing here imports TensorFlow (except ``tf.io.gfile`` for ``scheme://`` paths).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from collections.abc import Mapping, Sequence

from xlmeta_jax import errors, files
from xlmeta_jax.data import line_sample, prepared, rates, text_files
from xlmeta_jax.data.languages import XLMR_LANGUAGES, language_problem, mc4_split_name
from xlmeta_jax.model import mlm

# Where </s> can go: after every line (fairseq) or after each document (Corpora.eos_after).
EOS_AFTER = ("line", "document")
# How rows are built (Corpora.packing): fairseq's full blocks cut anywhere, or whole
# documents packed with their segment ids.
PACKING = ("blocks", "documents")


def packs_documents(packing: str) -> bool:
    """Whether ``Corpora.packing`` packs whole documents (rows carry segment ids)."""
    return packing == "documents"


@dataclasses.dataclass(frozen=True)
class Corpora:
    """The corpora of a run and how their blocks are built; see :func:`tasks.register`."""

    # SentencePiece .model of every task (`python -m xlmeta_jax.data.vocabulary`).
    vocab_path: str | None = None
    # Phase-1 English text files: paths or globs on any file system TF reads (gs://...),
    # plain or .gz, one paragraph per line, blank lines between documents.
    english_files: Sequence[str] | None = None
    # The same for the English task's 'validation' split (optional).
    english_validation_files: Sequence[str] | None = None
    # Phase-1 English from TFDS, a versioned name, e.g. 'wikipedia/20230601.en:1.0.0'.
    english_tfds_name: str | None = None
    # The TFDS feature holding the document text.
    english_tfds_text_feature: str = "text"
    # TFDS split (or slice) for 'train', e.g. 'train[:99%]'.
    english_tfds_train_split: str = "train"
    # TFDS split for 'validation', e.g. 'train[99%:]' (None: no validation split).
    english_tfds_validation_split: str | None = None
    # Phase-2 CC-100 folder with {lang}.txt* per language (decompressed or .gz).
    cc100_dir: str | None = None
    # Optional folder of the same layout for the 'validation' split.
    cc100_validation_dir: str | None = None
    # Phase-2 languages (CC-100 codes, xlmeta_jax/data/languages.py); None: all 100
    # (for mC4: the 94 of them mC4 has).
    languages: Sequence[str] | None = None
    # Sampling exponent in (0, 1]: q_l proportional to n_l^alpha (XLM-R: 0.3).
    alpha: float = 0.3
    # n_l per CC-100 language in count_unit; None: counted once from the files (cached).
    cc100_counts: Mapping[str, float] | None = None
    # What CC-100's n_l counts: 'tokens' (of the vocabulary: text bytes x tokens per byte
    # of a sample, as fairseq's XLM-R counts token blocks), 'lines' (paragraphs) or 'bytes'.
    count_unit: str = "tokens"
    # 'tokens': paragraphs per language whose tokens per byte are measured.
    token_sample_lines: int = 2000
    # Phase-2 mC4 from TFDS, e.g. 'c4/multilingual:3.1.0' (None: no mC4 tasks).
    mc4_tfds_name: str | None = None
    # n_l (documents) per mC4 language; None: the TFDS split sizes.
    mc4_counts: Mapping[str, float] | None = None
    # TFDS data folder of the TFDS corpora (None: TFDS's default).
    tfds_data_dir: str | None = None
    # Text lines longer than this are skipped (and counted).
    max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES
    # Where the file counts are cached (None: next to the data, else ~/.cache/xlmeta_jax).
    stats_cache_dir: str | None = None
    # Blocks held for shuffling over a whole task or mixture (each language of a mixture
    # holds max(16, size x its sampling rate)); several times the per-host batch.
    shuffle_buffer_size: int = 1024
    # Where </s> goes in the token stream: 'line' after every line and once more at each
    # document's end (fairseq's binarised text, so RoBERTa and XLM-R); 'document' only
    # after each document.
    eos_after: str = "line"
    # How rows are built: 'blocks' (fairseq, XLM-R: the token stream cut every L - 1
    # tokens, across documents) or 'documents' (ModernBERT, mmBERT: whole documents
    # packed into rows with segment ids, attention and positions per document, padding
    # only at a row's end; a document longer than L - 1 tokens is cut into pieces of
    # L - 1, each its own segment). 'documents' needs eos_after='document'.
    packing: str = "blocks"
    # How blocks are masked; the number of prediction slots follows from it.
    masking: mlm.Masking = mlm.DEFAULT_MASKING
    # Share of the joint mixture's tokens (xlmeta_joint) from the English task, the rest
    # from the multilingual mixture; None: no joint mixture (the experiment sets it).
    joint_english_share: float | None = None

    def __post_init__(self):
        # Paths as a shell user means them (~, $HOME), once, whichever command built us.
        for field, setting in _PATH_SETTINGS.items():
            value = getattr(self, field)
            object.__setattr__(self, field, files.user_paths(value, setting))
        # Every value's range, once: whatever receives a Corpora trusts it.
        problems = {
            "languages": self.languages is not None and language_problem(self.languages),
            "alpha": rates.alpha_problem(self.alpha),
            "token_sample_lines": errors.count_problem(self.token_sample_lines),
            "count_unit": self.count_unit not in text_files.COUNT_UNITS and (
                f"must be one of {text_files.COUNT_UNITS}, got {self.count_unit!r}"),
            "max_line_bytes": errors.count_problem(self.max_line_bytes),
            "eos_after": self.eos_after not in EOS_AFTER and (
                f"must be one of {EOS_AFTER}, got {self.eos_after!r}"),
            "packing": (self.packing not in PACKING and (
                f"must be one of {PACKING}, got {self.packing!r}")) or (
                self.packing == "documents" and self.eos_after != "document" and (
                    "'documents' finds a document's end by its one </s>: it needs "
                    f"eos_after='document', got eos_after={self.eos_after!r}")),
            "shuffle_buffer_size": errors.count_problem(self.shuffle_buffer_size),
            "english_tfds_name": _tfds_name_problem(self.english_tfds_name),
            "mc4_tfds_name": _tfds_name_problem(self.mc4_tfds_name),
            "cc100_counts": self.cc100_counts is not None and language_problem(
                list(self.cc100_counts)),
            "joint_english_share": self.joint_english_share is not None and not (
                0.0 < self.joint_english_share < 1.0) and (
                f"must be in (0, 1), got {self.joint_english_share!r}"),
        }
        for field, problem in problems.items():
            if problem:
                raise CorpusSettingError(CONFIGURABLE, field, getattr(self, field), problem)

    @property
    def packed(self) -> bool:
        """Rows packed from whole documents: batches carry ``mlm.PACKED_FEATURES``."""
        return packs_documents(self.packing)

    def cc100_languages(self) -> tuple[str, ...]:
        """The CC-100 mixture's languages."""
        return XLMR_LANGUAGES if self.languages is None else tuple(self.languages)

    def mc4_languages(self) -> tuple[str, ...]:
        """The mC4 mixture's languages (those mC4 has)."""
        if self.languages is None:
            return tuple(lang for lang in XLMR_LANGUAGES if mc4_split_name(lang))
        langs = tuple(self.languages)
        missing = [lang for lang in langs if mc4_split_name(lang) is None]
        if missing:
            raise text_files.CorpusError(f"mC4 has no split for {missing}")
        return langs


# The name gin files bind Corpora by (errors name a bad value's setting from it).
CONFIGURABLE = "xlmeta_jax.data.corpora.Corpora"


class CorpusSettingError(errors.SettingError, text_files.CorpusError):
    """A corpus setting out of range (its binding named), before any file is read."""


def _tfds_name_problem(name) -> str | None:
    if name and ":" not in name:
        return f"{name!r} needs a version, e.g. 'c4/en:3.1.0'"
    return None


# The path settings, by the names errors give them (the gin macros where there is one).
_PATH_SETTINGS = {
    "vocab_path": "VOCAB_PATH",
    "english_files": "ENGLISH_FILES",
    "english_validation_files": "Corpora.english_validation_files",
    "cc100_dir": "CC100_DIR",
    "cc100_validation_dir": "Corpora.cc100_validation_dir",
    "tfds_data_dir": "TFDS_DATA_DIR",
    "stats_cache_dir": "Corpora.stats_cache_dir",
}



def as_patterns(patterns: str | Sequence[str] | None) -> tuple[str, ...]:
    """A path, glob or list of them as a tuple (None: empty)."""
    if not patterns:
        return ()
    return (patterns,) if isinstance(patterns, str) else tuple(patterns)


def cc100_files(folder: str, lang: str) -> list[str]:
    """The files of one language: ``{folder}/{lang}.txt*`` (checked, sorted).

    Files in a compression tf.data cannot read (``.xz``, ...) are ignored with a
    warning when readable files sit beside them, and are an error otherwise.
    """
    if "://" not in folder and not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        raise text_files.CorpusError(f"the CC-100 folder {folder} (CC100_DIR) {what}")
    pattern = os.path.join(folder, f"{lang}.txt*")
    if "://" in pattern:
        import tensorflow as tf  # noqa: PLC0415 - TensorFlow only where tf.data runs

        matched = sorted(tf.io.gfile.glob(pattern))
    else:
        matched = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    prepared.check_shards(folder, lang, matched)
    if not matched:
        stats = prepared.read_stats(folder)
        held = sorted((stats or {}).get("languages", {}))
        named = ", ".join(held[:12]) + (", ..." if len(held) > 12 else "")
        hint = (f" (the folder, prepared, holds {len(held)}: {named}; "
                "CC100_LANGUAGES chooses among them)") if held else ""
        raise text_files.CorpusError(
            f"CC-100 language {lang!r}: no file matches {pattern}{hint}")
    readable = []
    for path in matched:
        try:
            text_files.check_readable_suffix(path)
            readable.append(path)
        except text_files.CorpusError as e:
            if len(matched) == 1:
                raise
            logging.warning("ignoring %s", e)
    if not readable:
        raise text_files.CorpusError(
            f"CC-100 language {lang!r}: only compressed files tf.data cannot read: {matched}"
        )
    return text_files.list_text_files(readable, what=f"CC-100 language {lang!r}")


# Why a pod's hosts refuse to count, and the two ways out.
NO_COUNTING = ("no host of a multi-process run counts the corpus: prepare it with "
               "python -m xlmeta_jax.data.prepare (its statistics go next to the shards), or "
               "give CC100_COUNTS (Corpora.cc100_counts)")


def checked_files(corpora: Corpora, files: Sequence[str], *, may_count: bool = True,
                  needs_counts: bool = True) -> list[text_files.FileStats] | None:
    """Counts (once, cached) and validates ``files``: no file without usable text.

    Args:
      corpora: the settings (max_line_bytes, stats_cache_dir).
      files: the files.
      may_count: whether files without cached or prepared counts are counted (one
        process); else they are not read.
      needs_counts: whether the caller needs the counts (n_l of a mixture); else files
        that may not be counted are left unchecked (None).

    Raises:
      CorpusError: a file has no usable text, or needs counting where it may not be.
    """
    try:
        return text_files.corpus_stats(
            files, max_line_bytes=int(corpora.max_line_bytes),
            cache_dir=corpora.stats_cache_dir, count_missing=may_count)
    except text_files.UncountedError as e:
        if needs_counts:
            raise text_files.CorpusError(
                f"{e.paths[0]} has no prepared statistics ({len(e.paths)} of {len(files)} "
                f"files): {NO_COUNTING}") from None
        logging.info("%d files without prepared statistics (e.g. %s) are read unchecked: "
                     "a multi-process run counts nothing", len(e.paths), e.paths[0])
        return None


def check_shares(what: str, stats: Sequence[text_files.FileStats] | None,
                 process_count: int) -> None:
    """Refuses files that leave a process of a multi-process run with nothing to read.

    A process reads whole files where there are at least as many files as processes,
    else every ``process_count``-th document of each file (``providers``): then each
    process needs a file with more documents than its index. An empty share would end
    that process's stream at its first batch while the others wait for it.

    Args:
      what: the language or setting, as errors name it.
      stats: the files' counts (None: not counted, nothing to check).
      process_count: the run's processes.

    Raises:
      CorpusError: naming ``what``, its files, documents and lines, and the process count.
    """
    if process_count < 2 or not stats or len(stats) >= process_count:
        return
    most = max(s.documents for s in stats)
    if most < process_count:
        raise text_files.CorpusError(
            f"{what}: {len(stats)} file(s) of {sum(s.documents for s in stats)} documents "
            f"({sum(s.lines for s in stats)} lines) cannot give each of the {process_count} "
            f"processes a document (at most {most} of them would read any): give it more "
            "text or more files, leave it out, or run on fewer processes")


def language_count(corpora: Corpora, stats: Sequence[text_files.FileStats], encode=None,
                   *, folder: str | None = None, lang: str | None = None) -> float:
    """n_l of one language's files in ``corpora.count_unit``.

    Args:
      corpora: the settings (count_unit, token_sample_lines).
      stats: the language's checked files.
      encode: for 'tokens': a list of strings -> a list of token-id lists.
      folder, lang: the prepared folder and language whose token sample, if it has one
        for these settings, replaces reading the files' heads (same paragraphs).
    """
    if corpora.count_unit == "tokens":
        if encode is None:
            raise text_files.CorpusError("count_unit='tokens' needs the vocabulary to encode with")
        sample = folder and prepared.token_sample(
            folder, lang, int(corpora.token_sample_lines), int(corpora.max_line_bytes))
        if sample:
            return line_sample.tokens_from_sample(sum(s.text_bytes for s in stats), sample[0],
                                                  encode, what=f"{folder} ({lang})")
        return line_sample.estimate_tokens(stats, encode,
                                           sample_lines=int(corpora.token_sample_lines))
    return text_files.count(stats, corpora.count_unit)


def cc100_counts(
    corpora: Corpora, files_by_lang: Mapping[str, Sequence[str]], encode=None
) -> dict[str, float]:
    """n_l per language: the given ``cc100_counts``, or counted (cached) from the files."""
    if corpora.cc100_counts is not None:
        return rates.given_counts(corpora.cc100_counts, list(files_by_lang), what="cc100_counts")
    return {
        lang: language_count(corpora, checked_files(corpora, files), encode)
        for lang, files in files_by_lang.items()
    }
