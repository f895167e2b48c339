"""One corpus file into document-whole gzip shards, counted on the way (no Beam here).

CC-100 ships one ``{lang}.txt.xz`` per language: a paragraph per line, a blank line
between documents. :func:`split_file` reads such a file once (``.xz``, ``.gz`` or
plain), drops the lines the pipeline would skip (not UTF-8, longer than
``max_line_bytes``; :func:`xlmeta_jax.data.text_files.iter_stream_lines` applies the
reader's rules), and writes the rest as shards of about ``shard_bytes`` of text that
end at a document boundary, each document's lines followed by one blank line. The
counts it returns are those :func:`xlmeta_jax.data.text_files.scan_text_file` makes of
the same text, so a prepared folder needs no counting pass.

:mod:`xlmeta_jax.data.prepare` runs this per input file in an Apache Beam pipeline.
"""

from __future__ import annotations

import dataclasses
import gzip
import lzma
import os
import zlib
from collections.abc import Callable

from xlmeta_jax.data import text_files
from xlmeta_jax.data.languages import check_languages

# Input compressions: CC-100's .xz, gzip, or none.
XZ_MAGIC = b"\xfd7zXZ\x00"
GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass
class Counts:
    """What one pass found in a file, in :class:`text_files.FileStats`' units."""

    lines: int = 0
    documents: int = 0
    text_bytes: int = 0
    skipped_invalid_utf8: int = 0
    skipped_long_lines: int = 0

    def add(self, other: Counts) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


@dataclasses.dataclass
class Piece:
    """One shard written by :func:`split_file` (under a temporary name)."""

    path: str
    counts: Counts
    # The shard's first kept paragraphs (the token-count sample reads a shard's head).
    head: list[str]


def language_of(path: str) -> str:
    """The CC-100 code a file is named for: ``{lang}.txt*`` (``zh-Hans.txt.xz`` -> zh-Hans).

    Raises:
      CorpusError: the name is not ``{lang}.txt...`` or the code is not among the 100.
    """
    name = os.path.basename(path)
    lang, sep, _ = name.partition(".txt")
    if not sep or not lang:
        raise text_files.CorpusError(
            f"{path}: not a CC-100 file name ({{lang}}.txt.xz, {{lang}}.txt.gz or {{lang}}.txt)")
    check_languages([lang], what=f"the language of {path}")
    return lang


def check_header(path: str, head: bytes) -> None:
    """Refuses, from its first bytes, a file whose compression its name contradicts."""
    if path.endswith(".xz") and not head.startswith(XZ_MAGIC):
        raise text_files.CorpusError(f"{path}: not an .xz file (no xz header)")
    if path.endswith(".gz") and not head.startswith(GZIP_MAGIC):
        raise text_files.CorpusError(f"{path}: not a gzip file (no gzip header)")
    if not path.endswith((".xz", ".gz")):
        text_files.check_readable_suffix(path)


def _decompressing(path: str, raw):
    if path.endswith(".xz"):
        return lzma.LZMAFile(raw)
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


class _ShardWriter:
    """Shards of one input file: opened on demand, closed at a document boundary."""

    def __init__(self, open_write, temp_prefix, shard_bytes, gzip_level, head_lines):
        self._open_write, self._prefix = open_write, temp_prefix
        self._shard_bytes, self._level, self._head_lines = shard_bytes, gzip_level, head_lines
        self.pieces: list[Piece] = []
        self._raw = self._gz = None
        self._buffer: list[bytes] = []
        self._buffered = 0

    def _open(self) -> None:
        path = f"{self._prefix}-{len(self.pieces):05d}.gz"
        self._raw = self._open_write(path)
        # No name or time in the header: the same text gives the same bytes.
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=self._level,
                                 mtime=0, filename="")
        self.pieces.append(Piece(path, Counts(), []))

    def line(self, line: bytes, starts_document: bool) -> None:
        if self._gz is None:
            self._open()
        piece = self.pieces[-1]
        counts = piece.counts
        if starts_document:
            counts.documents += 1
        counts.lines += 1
        counts.text_bytes += len(line)
        if len(piece.head) < self._head_lines:
            piece.head.append(line.decode("utf-8"))
        self._buffer.append(line)
        self._buffered += len(line) + 1
        if self._buffered >= 1 << 20:
            self._flush()

    def end_document(self) -> None:
        """Closes the document (a blank line); the shard too once it is full."""
        if self._gz is None:
            return
        self._buffer.append(b"")
        self._flush()
        if self.pieces[-1].counts.text_bytes >= self._shard_bytes:
            self.close()

    def _flush(self) -> None:
        if self._buffer:
            self._buffer.append(b"")
            self._gz.write(b"\n".join(self._buffer))
            self._buffer, self._buffered = [], 0

    def close(self) -> None:
        if self._gz is not None:
            self._flush()
            self._gz.close()
            self._raw.close()
            self._raw = self._gz = None


def split_file(
    path: str,
    open_read: Callable[[str], object],
    open_write: Callable[[str], object],
    temp_prefix: str,
    *,
    shard_bytes: int,
    max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES,
    gzip_level: int = 1,
    head_lines: int = 0,
) -> tuple[Counts, list[Piece]]:
    """Reads ``path`` once and writes its documents into shards ``{temp_prefix}-NNNNN.gz``.

    Args:
      path: a ``{lang}.txt.xz``, ``.gz`` or plain file.
      open_read: path -> binary stream (Beam's ``FileSystems.open`` for ``gs://``).
      open_write: path -> writable binary stream.
      temp_prefix: where the shards go (renamed by the caller once all are known).
      shard_bytes: text bytes after which a shard ends, at the next document end.
      max_line_bytes: longer lines are dropped (and counted), as the reader drops them.
      gzip_level: the shards' gzip compression level (1 fastest .. 9 smallest).
      head_lines: kept paragraphs of each shard to return in ``Piece.head``.

    Returns:
      The input's counts (its skipped lines included) and the shards written, in order.

    Raises:
      CorpusError: naming ``path`` when it is damaged, truncated or not text.
    """
    total = Counts()
    writer = _ShardWriter(open_write, temp_prefix, shard_bytes, gzip_level, head_lines)
    try:
        with open_read(path) as raw:
            check_header(path, raw.read(len(XZ_MAGIC)))
        with open_read(path) as raw:
            f = _decompressing(path, raw)
            in_doc = False
            for line in text_files.iter_stream_lines(f, max_line_bytes):
                if line is None:
                    total.skipped_long_lines += 1
                    continue
                if not line.strip():
                    if in_doc:
                        writer.end_document()
                    in_doc = False
                    continue
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    total.skipped_invalid_utf8 += 1
                    continue
                writer.line(line, starts_document=not in_doc)
                in_doc = True
            if in_doc:
                writer.end_document()
    except lzma.LZMAError as e:
        raise text_files.CorpusError(f"{path}: damaged .xz file ({e})") from e
    except EOFError as e:
        raise text_files.CorpusError(f"{path}: truncated (it ends before its compressed "
                                     f"stream does: {e})") from e
    except (gzip.BadGzipFile, zlib.error) as e:
        raise text_files.CorpusError(f"{path}: damaged gzip file ({e})") from e
    finally:
        writer.close()
    for piece in writer.pieces:
        total.add(piece.counts)
    return total, writer.pieces
