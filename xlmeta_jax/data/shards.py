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
import re
import zlib
from collections.abc import Callable, Iterator

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


# A run of two or more blank lines is one document end; so is a blank line at a start.
_BLANK_RUNS = re.compile(rb"\n\n+")


def _chunks(f, max_line_bytes: int, block_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines (each ending in b"\\n") and the over-long lines dropped between.

    A line longer than a block is never held: once it passes the limit it is dropped
    up to its newline, as :func:`text_files.iter_stream_lines` drops it. Every ``\\r`` is
    dropped first, as the reader drops it.
    """
    limit = max_line_bytes
    carry, dropping = b"", False
    while True:
        block = f.read(block_bytes)
        if not block:
            break
        block = block.replace(b"\r", b"")
        if dropping:
            end = block.find(b"\n")
            if end < 0:
                continue
            block, dropping = block[end + 1:], False
            yield b"", 1
        end = block.rfind(b"\n")
        if end < 0:
            carry += block
            if len(carry) > limit:
                carry, dropping = b"", True
            continue
        chunk, carry = carry + block[:end + 1], block[end + 1:]
        if len(carry) > limit:
            carry, dropping = b"", True
        yield chunk, 0
    if dropping:
        yield b"", 1
    elif carry:
        yield carry + b"\n", 0


def _kept(chunk: bytes, max_line_bytes: int, total: Counts) -> bytes:
    """``chunk``'s lines as the reader keeps them; blank ones empty, skipped ones counted.

    Most blocks are valid UTF-8 without long lines or lines of spaces, and are kept as
    they are, checked at C speed; the others go line by line. (``_chunks`` dropped every
    ``\\r``.)
    """
    lines = chunk[:-1].split(b"\n")
    try:
        chunk.decode("utf-8")
        # A line of spaces only is blank (bytes.strip), and only the slow path empties it.
        clean = (max(map(len, lines)) <= max_line_bytes
                 and not any(map(bytes.isspace, lines)))
    except UnicodeDecodeError:
        clean = False
    if clean:
        return chunk
    kept = []
    for line in lines:
        if len(line) > max_line_bytes:
            total.skipped_long_lines += 1
        elif not line.strip():
            kept.append(b"")
        else:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                total.skipped_invalid_utf8 += 1
                continue
            kept.append(line)
    kept.append(b"")
    return b"\n".join(kept)


class _ShardWriter:
    """Shards of one input file: opened on demand, closed at a document boundary.

    It is fed blocks of kept lines (:func:`_kept`: each line ends in ``\\n``, a blank
    line is empty) and writes them a slice at a time, counting with ``bytes.count``:
    after blank runs are collapsed, every ``\\n\\n`` is one document end.
    """

    def __init__(self, open_write, temp_prefix, shard_bytes, gzip_level, head_lines):
        self._open_write, self._prefix = open_write, temp_prefix
        self._shard_bytes, self._level, self._head_lines = shard_bytes, gzip_level, head_lines
        self.pieces: list[Piece] = []
        self._raw = self._gz = None
        self._in_doc = False

    def _open(self) -> None:
        path = f"{self._prefix}-{len(self.pieces):05d}.gz"
        self._raw = self._open_write(path)
        # No name or time in the header: the same text gives the same bytes.
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=self._level,
                                 mtime=0, filename="")
        self.pieces.append(Piece(path, Counts(), []))

    def write(self, kept: bytes) -> None:
        """Appends a block of kept lines, closing each shard at its first document end
        past ``shard_bytes``."""
        if b"\n\n\n" in kept:
            kept = _BLANK_RUNS.sub(b"\n\n", kept)
        if kept.startswith(b"\n"):
            kept = kept.lstrip(b"\n")
            if self._in_doc:
                self.end_document()
        pos, size = 0, len(kept)
        while pos < size:
            if self._gz is None:
                self._open()
            cut = self._cut(kept, pos, self._shard_bytes - self.pieces[-1].counts.text_bytes)
            self._segment(kept, pos, size if cut is None else cut)
            if cut is None:
                break
            self.close()
            pos = cut

    @staticmethod
    def _cut(kept: bytes, pos: int, need: int) -> int | None:
        """The end of the first document after which ``kept[pos:]`` holds ``need`` text
        bytes; None if the block ends first."""
        start, text = pos, 0
        search = pos + max(need, 0)
        while True:
            i = kept.find(b"\n\n", search)
            if i < 0:
                return None
            end = i + 2
            text += (end - start) - kept.count(b"\n", start, end)
            if text >= need:
                return end
            start, search = end, end + (need - text)

    def _segment(self, kept: bytes, pos: int, end: int) -> None:
        piece = self.pieces[-1]
        counts = piece.counts
        newlines, blanks = kept.count(b"\n", pos, end), kept.count(b"\n\n", pos, end)
        ends_document = kept.endswith(b"\n\n", pos, end)
        counts.lines += newlines - blanks
        counts.text_bytes += (end - pos) - newlines
        counts.documents += blanks - ends_document + (not self._in_doc)
        self._in_doc = not ends_document
        start = pos
        while len(piece.head) < self._head_lines and start < end:
            stop = kept.find(b"\n", start, end)  # a segment ends in a newline
            if stop > start:
                piece.head.append(kept[start:stop].decode("utf-8"))
            start = stop + 1
        self._gz.write(memoryview(kept)[pos:end])

    def end_document(self) -> None:
        """Closes the open document (a blank line); the shard too once it is full."""
        if self._in_doc:
            self._gz.write(b"\n")
            self._in_doc = False
            if self.pieces[-1].counts.text_bytes >= self._shard_bytes:
                self.close()

    def close(self) -> None:
        if self._gz is not None:
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
    block_bytes: int = 8 << 20,
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
      block_bytes: decompressed bytes read at a time.

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
            for chunk, long_lines in _chunks(f, max_line_bytes, block_bytes):
                total.skipped_long_lines += long_lines
                writer.write(_kept(chunk, max_line_bytes, total))
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
