"""What ``python -m xlmeta_jax.data.prepare`` leaves in its output folder, for its readers.

Layout of a prepared folder ``OUT`` (a CC-100 folder the tasks read as ``CC100_DIR``)::

  OUT/{lang}.txt-00000-of-000NN.gz   document-whole shards (one paragraph a line)
  OUT/xlmeta_corpus_stats.json       per-file and per-language counts (corpus_stats' cache)
  OUT/token_sample/{lang}.json       the paragraphs the tokens-per-byte estimate reads
  OUT/vocab_sample/{lang}.txt        with --vocab_sample_lines: the vocabulary's sample
  OUT/vocab_sample/sample.json       ... its q_l, counts, draws, alpha and seed
  OUT/cache/                         with --tokenize: seqio's offline token cache
  OUT/COMPLETED                      written last; readers trust nothing without it

Nothing here imports TensorFlow (except ``tf.io.gfile`` for ``scheme://`` paths).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

from xlmeta_jax.data import text_files

STATS_FILENAME = text_files.STATS_FILENAME
COMPLETED = text_files.COMPLETED_FILENAME
TOKEN_SAMPLE_DIR = "token_sample"
VOCAB_SAMPLE_DIR = "vocab_sample"
VOCAB_SAMPLE_META = "sample.json"
CACHE_DIR = "cache"
TEMP_DIR = ".prepare-tmp"
# A token cache being written (--tokenize without --input), and the one it replaces while
# the two swap: the old cache stays until the new one is complete.
NEW_CACHE_DIR = ".cache-new"
OLD_CACHE_DIR = ".cache-old"
# Everything the command writes into OUT (an --overwrite removes these and nothing else).
OWN_ENTRIES = (STATS_FILENAME, COMPLETED, TOKEN_SAMPLE_DIR, VOCAB_SAMPLE_DIR, CACHE_DIR,
               TEMP_DIR, NEW_CACHE_DIR, OLD_CACHE_DIR)
# Beside OUT while an --overwrite runs: the new folder is built under OUT + NEW_SUFFIX and
# replaces OUT's entries only once it is complete; OUT's old entries wait under
# OUT + OLD_SUFFIX during the swap.
NEW_SUFFIX = ".prepare-new"
OLD_SUFFIX = ".prepare-old"


def shard_name(lang: str, index: int, count: int) -> str:
    """``{lang}.txt-{index:05d}-of-{count:05d}.gz``: read by the CC-100 task's ``{lang}.txt*``."""
    return f"{lang}.txt-{index:05d}-of-{count:05d}.gz"


def is_own_entry(name: str) -> bool:
    """Whether ``name`` in OUT is something the command writes."""
    if name in OWN_ENTRIES:
        return True
    stem, sep, rest = name.partition(".txt-")
    return bool(sep and stem and rest.endswith(".gz") and "-of-" in rest)


def is_complete(folder: str) -> bool:
    """Whether ``folder`` is a prepared folder whose job finished."""
    return text_files.exists(os.path.join(folder, COMPLETED)) and text_files.exists(
        os.path.join(folder, STATS_FILENAME))


def check_shards(folder: str, lang: str, present: Sequence[str]) -> None:
    """Refuses a prepared folder's language that a run must not trust.

    A folder is prepared where its statistics say so, or where a prepare job was
    writing into it (its temporary folder is there). Then it must be complete
    (``COMPLETED``), and ``lang``'s shards on disk must be the ones its statistics list,
    by name and size (not contents). Shards copied without the statistics are plain
    files: counted where they are read.

    Args:
      folder: the CC-100 folder (CC100_DIR).
      lang: the language.
      present: the language's files found there (``{lang}.txt*``).

    Raises:
      CorpusError: naming the folder and what is missing or different.
    """
    names = {os.path.basename(p): p for p in present}
    shards = sorted(n for n in names if is_own_entry(n))
    data = _statistics(*_signature(os.path.join(folder, STATS_FILENAME)))
    if not (data or {}).get(text_files.PREPARED_KEY) and not text_files.exists(
            os.path.join(folder, TEMP_DIR)):
        return  # plain CC-100 files, counted where they are read
    if not text_files.exists(os.path.join(folder, COMPLETED)):
        raise text_files.CorpusError(
            f"CC100_DIR {folder} is a prepared folder without {COMPLETED}: its prepare job "
            "did not finish; run python -m xlmeta_jax.data.prepare into it again")
    if data is None:
        raise text_files.CorpusError(
            f"CC100_DIR {folder} has {COMPLETED} but no readable {STATS_FILENAME}: run "
            "python -m xlmeta_jax.data.prepare into it again")
    listed = {n: e for n, e in data.get("files", {}).items() if n.startswith(f"{lang}.txt-")}
    for name in sorted(listed):
        if name not in names:
            raise text_files.CorpusError(
                f"CC100_DIR {folder}: {name} is listed in {STATS_FILENAME} but absent")
        size, _ = text_files.stat(names[name])
        if size != listed[name]["size"]:
            raise text_files.CorpusError(
                f"CC100_DIR {folder}: {name} has {size} bytes, {STATS_FILENAME} lists "
                f"{listed[name]['size']}: the folder was changed after it was prepared")
    extra = [n for n in shards if n not in listed]
    if extra:
        raise text_files.CorpusError(
            f"CC100_DIR {folder}: {extra[0]} is not listed in {STATS_FILENAME} (a shard of "
            "another job?): prepare the folder again")


def _signature(path: str) -> tuple[str, int, int]:
    try:
        return (path, *text_files.stat(path))
    except (OSError, ValueError):
        return (path, -1, -1)


@functools.lru_cache(maxsize=8)
def _statistics(path: str, size: int, mtime_ns: int) -> dict | None:
    """The statistics file, read once per version of it (a run asks per language)."""
    if size < 0:
        return None
    try:
        return json.loads(text_files.read_text(path))
    except (OSError, ValueError):
        return None


def cache_dir(folder: str) -> str | None:
    """The token cache of a prepared folder (``--tokenize``), or None where it has none."""
    path = os.path.join(folder, CACHE_DIR)
    return path if is_complete(folder) and text_files.exists(path) else None


def read_stats(folder: str) -> dict | None:
    """The prepared statistics' ``prepared`` section, or None (not prepared, or incomplete)."""
    if not is_complete(folder):
        return None
    try:
        data = json.loads(text_files.read_text(os.path.join(folder, STATS_FILENAME)))
    except (OSError, ValueError):
        return None
    return data.get(text_files.PREPARED_KEY)


def token_sample(folder: str, lang: str, sample_lines: int,
                 max_line_bytes: int) -> tuple[list[str]] | None:
    """The paragraphs :func:`line_sample.estimate_tokens` would read of ``lang``'s shards.

    Returns:
      (the paragraphs,), or None where the folder has no complete sample for these
      settings (the caller then reads the shards' heads).
    """
    path = os.path.join(folder, TOKEN_SAMPLE_DIR, f"{lang}.json")
    if not text_files.exists(os.path.join(folder, COMPLETED)) or not text_files.exists(path):
        return None
    try:
        sample = json.loads(text_files.read_text(path))
    except (OSError, ValueError):
        return None
    if (sample.get("sample_lines"), sample.get("max_line_bytes")) != (
            int(sample_lines), int(max_line_bytes)):
        return None
    return (list(sample["lines"]),)


def vocab_sample(folder: str) -> tuple[dict[str, list[str]], dict[str, float], dict]:
    """The vocabulary's line sample a prepare job drew: (lines per language, q_l, its settings).

    Raises:
      CorpusError: the folder is not a complete prepared folder with a sample.
    """
    meta_path = os.path.join(folder, VOCAB_SAMPLE_DIR, VOCAB_SAMPLE_META)
    if not is_complete(folder):
        raise text_files.CorpusError(
            f"{folder} is not a complete prepared folder (no {COMPLETED}): run "
            "python -m xlmeta_jax.data.prepare --vocab_sample_lines=N to the end")
    if not text_files.exists(meta_path):
        raise text_files.CorpusError(
            f"{folder} has no vocabulary sample: prepare it with --vocab_sample_lines=N")
    meta = json.loads(text_files.read_text(meta_path))
    lines = {}
    for lang in meta["q"]:
        text = text_files.read_text(os.path.join(folder, VOCAB_SAMPLE_DIR, f"{lang}.txt"))
        lines[lang] = text.split("\n")[:-1] if text else []
    return lines, dict(meta["q"]), meta
