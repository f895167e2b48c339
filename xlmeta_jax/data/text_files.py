"""Language sampling rates (n_l^alpha) and the corpus counts they need.

XLM-R samples a language with probability ``q_l = p_l^alpha / sum_k p_k^alpha``
where ``p_l = n_l / sum_k n_k`` (alpha = 0.3); the normaliser cancels, so a seqio
mixture can use rates ``n_l^alpha`` directly. ``n_l`` is either given (``Corpora.cc100_counts``) or
counted once by :func:`corpus_stats`, which reads every file a single time and
caches the result next to the data (``xlmeta_corpus_stats.json`` in the files'
folder; in the user's cache folder where that folder is read-only). In tokens (the
default; fairseq's XLM-R counts token blocks), n_l is the language's text bytes times
the tokens per byte the vocabulary gives a sample of its lines
(:func:`xlmeta_jax.data.line_sample.estimate_tokens`): line lengths differ widely between
languages, so counting lines would misstate how much text a language has.

The same pass validates the text: it counts the lines the pipeline skips —
lines that are not valid UTF-8 and lines longer than ``max_line_bytes`` — with
exactly the rules the tf.data reader applies (:mod:`xlmeta_jax.data.providers`),
and it rejects files without any usable text.

Nothing here imports TensorFlow at module import (``tf.io.gfile`` is imported
only for paths with a ``scheme://``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import gzip
import hashlib
import itertools
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence

from xlmeta_jax import errors, files

STATS_FILENAME = "xlmeta_corpus_stats.json"
_STATS_VERSION = 1
# A folder written by `python -m xlmeta_jax.data.prepare`: its statistics file has this key
# and the folder this marker, written last. Its entries are trusted by name and size (a copy
# to another file system changes modification times, not contents).
PREPARED_KEY = "prepared"
COMPLETED_FILENAME = "COMPLETED"
# Files are read in blocks this large; lines are split out of the blocks so that
# an enormous line never has to be held in memory by the counting pass.
_READ_BLOCK_BYTES = 8 << 20
# Compressions TensorFlow's TextLineDataset reads; CC-100 ships .xz, which it cannot.
_UNSUPPORTED_SUFFIXES = (".xz", ".bz2", ".zst", ".lz4", ".7z", ".zip")

COUNT_UNITS = ("tokens", "lines", "bytes")
_progress = logging.getLogger("xlmeta_jax.train")

DEFAULT_MAX_LINE_BYTES = 1 << 20
# A file with a larger share of lines that are not UTF-8 is refused: it is binary, or
# in another encoding, and training on its few decodable lines would be meaningless.
MAX_UNDECODABLE_SHARE = 0.1
# UTF-8 text has no NUL bytes, while UTF-16/32 text has them in (nearly) every line:
# split at b"\n" those lines still decode as "valid" UTF-8, so the share of undecodable
# lines cannot catch them. The head of each file is checked for NULs and for a UTF-16/32
# byte-order mark instead. A few stray NULs in scraped text stay below this share.
_ENCODING_SNIFF_BYTES = 64 << 10
MAX_NUL_SHARE = 0.01
# Longest first: the UTF-32-LE mark starts with the UTF-16-LE one.
_FOREIGN_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


class CorpusError(errors.UserError, ValueError):
    """Missing, empty or unreadable corpus files, or invalid mixture settings."""


class UncountedError(CorpusError):
    """Files that have no cached or prepared counts, where counting is not allowed."""

    def __init__(self, message: str, paths: Sequence[str]):
        super().__init__(message)
        self.paths = list(paths)


@dataclasses.dataclass(frozen=True)
class FileStats:
    """What one pass over a text file found (CC-100 layout).

    Attributes:
      path: the file.
      size: bytes on disk (compressed size for .gz), part of the cache key.
      mtime_ns: modification time, part of the cache key.
      max_line_bytes: the long-line limit the counts were made with.
      lines: non-blank lines kept (paragraphs).
      documents: runs of kept lines between blank lines.
      text_bytes: UTF-8 bytes of the kept lines.
      skipped_invalid_utf8: lines dropped because they are not valid UTF-8.
      skipped_long_lines: lines dropped because they exceed ``max_line_bytes``.
    """

    path: str
    size: int
    mtime_ns: int
    max_line_bytes: int
    lines: int
    documents: int
    text_bytes: int
    skipped_invalid_utf8: int
    skipped_long_lines: int


def _is_remote(path: str) -> bool:
    return "://" in path


def _gfile():
    import tensorflow as tf  # noqa: PLC0415 - only for non-local file systems

    return tf.io.gfile


def check_readable_suffix(path: str) -> None:
    """Raises CorpusError for compressions that tf.data cannot read."""
    for suffix in _UNSUPPORTED_SUFFIXES:
        if path.endswith(suffix):
            raise CorpusError(
                f"{path}: {suffix} files cannot be read by tf.data; decompress them "
                f"(e.g. `xz -d {os.path.basename(path)}`) or recompress with gzip (.gz)"
            )


def list_text_files(patterns: str | Sequence[str], *, what: str) -> list[str]:
    """Expands paths/globs (any file system TF reads) to a sorted file list.

    Raises:
      CorpusError: if a pattern matches nothing, a file is empty, has an
        unsupported compression or is not UTF-8 (:func:`check_utf8_encoding`).
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    patterns = list(patterns)
    if not patterns:
        raise CorpusError(f"{what}: no file patterns given")
    files: list[str] = []
    for pattern in patterns:
        if _is_remote(pattern):
            matched = sorted(_gfile().glob(pattern))
        else:
            found = glob.glob(os.path.expanduser(pattern))
            matched = sorted(p for p in found if os.path.isfile(p))
            if not matched:
                for path in sorted(found):
                    _check_link(path, what)
        if not matched:
            raise CorpusError(f"{what}: no file matches {pattern!r}")
        files.extend(matched)
    files = sorted(set(files))
    for path in files:
        check_readable_suffix(path)
        size, _ = _stat(path)
        if size == 0:
            raise CorpusError(f"{what}: file {path} is empty")
        # Here too, not only when counting: with given counts (cc100_counts) no file is.
        check_utf8_encoding(path)
    return files


def _check_link(path: str, what: str) -> None:
    """Names a symbolic link that leads nowhere: a loop, or a missing target."""
    if not os.path.islink(path):
        return
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorpusError(f"{what}: {path} is a symbolic link loop ({path} -> "
                              f"{os.readlink(path)} -> ... leads back to itself)") from None
        raise CorpusError(f"{what}: {path} is a symbolic link to {os.readlink(path)}, "
                          "which does not exist") from None


def _stat(path: str) -> tuple[int, int]:
    if _is_remote(path):
        st = _gfile().stat(path)
        return int(st.length), int(st.mtime_nsec)
    st = os.stat(path)
    return int(st.st_size), int(st.st_mtime_ns)


def stat(path: str) -> tuple[int, int]:
    """(size, modification time in ns) of a file, as the counts' cache keys it."""
    return _stat(path)


def _open_binary(path: str):
    raw = _gfile().GFile(path, "rb") if _is_remote(path) else open(path, "rb")  # noqa: SIM115
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


@contextlib.contextmanager
def _gzip_errors(path: str):
    """A ``.gz`` file that is not gzip, or is cut short, as a CorpusError naming it."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise CorpusError(f"{path}: not a readable gzip file ({errors.first_line(e)})") from e


def iter_lines(path: str, max_line_bytes: int) -> Iterator[bytes | None]:
    """Yields the file's lines as bytes, as ``tf.data.TextLineDataset`` reads them: split
    at ``\\n``, every ``\\r`` dropped (TensorFlow's ``BufferedInputStream.ReadLine``
    appends none, wherever it stands in the line).

    A line longer than ``max_line_bytes`` (without its ``\\r``) is yielded as None and is
    never held whole in memory.
    """
    with _gzip_errors(path), _open_binary(path) as f:
        yield from iter_stream_lines(f, max_line_bytes)


def iter_stream_lines(f, max_line_bytes: int) -> Iterator[bytes | None]:
    """:func:`iter_lines` of an open binary stream (a decompressing one included)."""
    pending: list[bytes] = []
    pending_len = 0
    too_long = False
    while True:
        block = f.read(_READ_BLOCK_BYTES)
        if not block:
            break
        block = block.replace(b"\r", b"")
        parts = block.split(b"\n")
        # parts[:-1] end lines; parts[-1] starts the line the next block continues.
        for part in parts[:-1]:
            if too_long:
                yield None
            else:
                line = b"".join(pending) + part if pending else part
                yield _finish_line(line, max_line_bytes)
            pending, pending_len, too_long = [], 0, False
        tail = parts[-1]
        if not too_long and tail:
            pending_len += len(tail)
            if pending_len > max_line_bytes:
                pending, too_long = [], True
            else:
                pending.append(tail)
    if too_long:
        yield None
    elif pending:
        yield _finish_line(b"".join(pending), max_line_bytes)


def _finish_line(line: bytes, max_line_bytes: int) -> bytes | None:
    if len(line) > max_line_bytes:
        return None
    return line


def iter_entries(path: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
                 ) -> Iterator[str | None]:
    """One whole file's entries as the tf.data reader (``providers._read_paragraphs``)
    yields them: each kept paragraph's text, and None where a document ends (the
    reader's ``("", True)``).

    The rules are the reader's: lines split as ``TextLineDataset`` splits them
    (:func:`iter_lines`); lines that are not UTF-8 or longer than ``max_line_bytes``
    dropped before anything else; a blank line (ASCII whitespace only) ends a document
    unless it follows the start of the file or another end; the end of the file ends its
    last document. The token cache job reads text files this way, without tf.data
    (:mod:`xlmeta_jax.data.token_cache`); tests/test_data_pipeline.py holds the two
    readers equal on a table of files.
    """
    after_end = True
    for line in itertools.chain(iter_lines(path, max_line_bytes), [b""]):
        if line is None:
            continue
        if not line.strip():
            if not after_end:
                yield None
            after_end = True
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            continue
        after_end = False
        yield text


def iter_paragraphs(path: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[str]:
    """Yields the lines the pipeline keeps (non-blank, valid UTF-8, not too long): the
    paragraphs of :func:`iter_entries`, without its document ends."""
    for entry in iter_entries(path, max_line_bytes):
        if entry is not None:
            yield entry


def check_utf8_encoding(path: str) -> None:
    """Refuses a file whose head shows it is UTF-16/32 (a byte-order mark, or NULs).

    A UTF-8 byte-order mark is accepted: the file is UTF-8 and the mark only puts an
    invisible U+FEFF at the start of its first line, as tf.data reads it.

    Raises:
      CorpusError: naming the file and the encoding it appears to have.
    """
    with _gzip_errors(path), _open_binary(path) as f:
        head = f.read(_ENCODING_SNIFF_BYTES)
    for bom, encoding in _FOREIGN_BOMS:
        if head.startswith(bom):
            raise CorpusError(
                f"{path}: starts with a {encoding} byte-order mark: the corpus must be UTF-8 "
                f"(convert it, e.g. iconv -f {encoding} -t UTF-8)"
            )
    nuls = head.count(0)
    if head and nuls / len(head) > MAX_NUL_SHARE:
        raise CorpusError(
            f"{path}: {100 * nuls / len(head):.0f}% of its first {len(head)} bytes are NUL: "
            "UTF-16/32 or binary, not UTF-8 text (convert it, e.g. iconv -f UTF-16 -t UTF-8)"
        )


def scan_text_file(path: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> FileStats:
    """Counts paragraphs, documents and skipped lines of one file (one pass)."""
    size, mtime_ns = _stat(path)
    lines = documents = text_bytes = invalid = long_lines = 0
    in_doc = False
    for line in iter_lines(path, max_line_bytes):
        if line is None:
            long_lines += 1
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            invalid += 1
            continue
        if not line.strip():
            in_doc = False
            continue
        if not in_doc:
            documents += 1
            in_doc = True
        lines += 1
        text_bytes += len(line)
    return FileStats(
        path=path,
        size=size,
        mtime_ns=mtime_ns,
        max_line_bytes=max_line_bytes,
        lines=lines,
        documents=documents,
        text_bytes=text_bytes,
        skipped_invalid_utf8=invalid,
        skipped_long_lines=long_lines,
    )


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return os.path.join(base, "xlmeta_jax", "corpus_stats")


def _cache_paths(folder: str, cache_dir: str | None) -> list[str]:
    digest = hashlib.sha1(folder.encode()).hexdigest()[:16]
    if cache_dir:
        return [os.path.join(cache_dir, f"{digest}.json")]
    return [
        os.path.join(folder, STATS_FILENAME),
        os.path.join(_default_cache_dir(), f"{digest}.json"),
    ]


def _exists(path: str) -> bool:
    return bool(_gfile().exists(path)) if _is_remote(path) else os.path.exists(path)


def _read_json(path: str) -> dict:
    try:
        if _is_remote(path):
            gf = _gfile()
            if not gf.exists(path):
                return {}
            with gf.GFile(path) as f:
                return json.load(f)
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        logging.warning("ignoring unreadable corpus stats cache %s: %s", path, e)
        return {}


def _write_json(path: str, data: dict) -> bool:
    try:
        if _is_remote(path):
            gf = _gfile()
            tmp = f"{path}.tmp{os.getpid()}"
            with gf.GFile(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            gf.rename(tmp, path, overwrite=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            files.write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
        return True
    except Exception as e:  # noqa: BLE001 - OSError locally, tf.errors.* on remote file systems
        logging.info("cannot write corpus stats cache %s: %s", path, e)
        return False


def corpus_stats(
    files: Sequence[str],
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    cache_dir: str | None = None,
    count_missing: bool = True,
) -> list[FileStats]:
    """Per-file counts, computed once and cached next to the data.

    The cache is ``xlmeta_corpus_stats.json`` in each file's folder (or
    ``~/.cache/xlmeta_jax/corpus_stats/`` when that folder is read-only), or
    only ``cache_dir`` when one is given. Entries are keyed by file name, size,
    modification time and ``max_line_bytes``; a changed file is counted again.
    A folder written by ``python -m xlmeta_jax.data.prepare`` (complete) is trusted
    by file name, size and ``max_line_bytes``.

    Args:
      files: the files.
      max_line_bytes: the long-line limit of the counts.
      cache_dir: the one cache folder (None: next to the data, else the user's).
      count_missing: count files that have no cached counts; if False, such files
        raise :class:`UncountedError` (a pod's hosts never count).

    Raises:
      CorpusError: if a file is not UTF-8 (:func:`check_utf8_encoding`) or has
        no usable text at all.
      UncountedError: files without counts when ``count_missing`` is False.
    """
    if count_missing:
        for path in files:
            check_utf8_encoding(path)  # before counting: such a file's counts are meaningless
    by_folder: dict[str, list[str]] = {}
    for path in files:
        by_folder.setdefault(os.path.dirname(path) or ".", []).append(path)
    result: dict[str, FileStats] = {}
    uncounted: list[str] = []
    for folder, paths in by_folder.items():
        cache_files = _cache_paths(folder, cache_dir)
        cached: dict = {}
        prepared = False
        for cache_file in reversed(cache_files):  # the copy next to the data wins
            data = _read_json(cache_file)
            if data.get("version") == _STATS_VERSION:
                cached.update(data.get("files", {}))
                prepared = cache_file == cache_files[0] and bool(data.get(PREPARED_KEY))
        prepared = prepared and _exists(os.path.join(folder, COMPLETED_FILENAME))
        fresh = 0
        for path in paths:
            size, mtime_ns = _stat(path)
            entry = cached.get(os.path.basename(path))
            stats = None
            if entry:
                stats = FileStats(path=path, **{k: v for k, v in entry.items() if k != "path"})
                if (stats.size, stats.max_line_bytes) != (size, max_line_bytes) or (
                        stats.mtime_ns != mtime_ns and not prepared):
                    stats = None
            if stats is None and not count_missing:
                uncounted.append(path)
                continue
            if stats is None:
                # A progress line of the commands: counting is the slow part of a start.
                _progress.info("counting %s (once; cached in %s)", path, cache_files[0])
                stats = scan_text_file(path, max_line_bytes)
                fresh += 1
                cached[os.path.basename(path)] = {
                    k: v for k, v in dataclasses.asdict(stats).items() if k != "path"
                }
            result[path] = stats
        if fresh:
            payload = {"version": _STATS_VERSION, "files": cached}
            if not any(_write_json(path, payload) for path in cache_files):
                logging.warning("corpus stats for %s could not be cached", folder)
    if uncounted:
        raise UncountedError(
            f"{len(uncounted)} files have no counts (e.g. {uncounted[0]})", uncounted)
    out = [result[p] for p in files]
    for stats in out:
        check_usable(stats.path, stats.lines, stats.skipped_invalid_utf8,
                     stats.skipped_long_lines, max_line_bytes)
    # Warned only once no file is refused: a refused file's line says it all.
    for stats in out:
        if stats.skipped_invalid_utf8 or stats.skipped_long_lines:
            logging.warning("%s: skipping %d lines that are not valid UTF-8 and %d lines "
                            "longer than %d bytes", stats.path, stats.skipped_invalid_utf8,
                            stats.skipped_long_lines, max_line_bytes)
    return out


def check_usable(path: str, lines: int, invalid: int, long_lines: int,
                 max_line_bytes: int) -> None:
    """Refuses a file's counts: no usable text, or mostly not UTF-8.

    Raises:
      CorpusError: naming the file.
    """
    undecodable = invalid / max(1, lines + invalid)
    if lines and undecodable > MAX_UNDECODABLE_SHARE:
        raise CorpusError(
            f"{path}: {100 * undecodable:.0f}% of its lines are not valid UTF-8 "
            f"(more than {100 * MAX_UNDECODABLE_SHARE:.0f}%): not a text corpus, or "
            "not UTF-8 encoded"
        )
    if lines == 0:
        raise CorpusError(
            f"{path} has no usable text: {invalid} lines are not valid UTF-8, {long_lines} "
            f"exceed {max_line_bytes} bytes, the rest are blank"
        )


def exists(path: str) -> bool:
    """Whether ``path`` exists, on any file system TF reads."""
    return _exists(path)


def read_text(path: str) -> str:
    """A whole (plain) file as UTF-8 text, on any file system TF reads."""
    if _is_remote(path):
        with _gfile().GFile(path) as f:
            return f.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def count(stats: Iterable[FileStats], unit: str) -> int:
    """n for a set of files in ``unit`` ("lines" = paragraphs, or "bytes").

    Tokens need the vocabulary: :func:`xlmeta_jax.data.line_sample.estimate_tokens`.
    """
    if unit not in ("lines", "bytes"):
        raise CorpusError(f"count unit {unit!r} is not one of ('lines', 'bytes')")
    stats = list(stats)
    return sum(s.lines for s in stats) if unit == "lines" else sum(s.text_bytes for s in stats)
