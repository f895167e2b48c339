"""``shards.split_file`` against the reader's line rules, at block sizes small enough
that lines, blank runs and over-long lines straddle the blocks it reads.

The reference is the one-line-at-a-time code: ``text_files.scan_text_file`` for the
counts and ``reader_documents`` (``text_files.iter_lines``) for the documents.
"""

from __future__ import annotations

import gzip
import io
import random

import pytest
import reader_documents

from xlmeta_jax.data import shards, text_files

MAX_LINE = 24


def _text(seed: int) -> bytes:
    """Lines of every kind the reader treats apart, in random order."""
    rng = random.Random(seed)
    kinds = [b"", b"", b"", b" \t", b"\x0c", b"\r", b"x" * (MAX_LINE + 1), b"y" * (3 * MAX_LINE),
             b"z" * MAX_LINE + b"\r", b"bad \xff\xfe", "naïve façade".encode(), b"a\rb"]
    lines = []
    for _ in range(300):
        if rng.random() < 0.4:
            lines.append(rng.choice(kinds))
        else:
            lines.append(bytes(rng.choice(b"abcdef ") for _ in range(rng.randint(1, 20))))
    return b"\n".join(lines) + rng.choice([b"", b"\n", b"\n\n"])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_bytes", [5, 61, 1 << 20])
def test_split_keeps_the_readers_lines_and_counts(tmp_path, seed, block_bytes):
    data = _text(seed)
    path = tmp_path / "en.txt"
    path.write_bytes(data)
    written = {}

    class Out(io.BytesIO):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def close(self):
            written[self.name] = self.getvalue()
            super().close()

    total, pieces = shards.split_file(
        str(path), lambda p: open(p, "rb"), Out, str(tmp_path / "t"), shard_bytes=60,
        max_line_bytes=MAX_LINE, head_lines=3, block_bytes=block_bytes)

    reference = text_files.scan_text_file(str(path), MAX_LINE)
    for field in ("lines", "documents", "text_bytes", "skipped_invalid_utf8",
                  "skipped_long_lines"):
        assert getattr(total, field) == getattr(reference, field), field
    documents = []
    for k, piece in enumerate(pieces):
        text = gzip.decompress(written[piece.path])
        # A shard is whole documents, each followed by one blank line.
        assert text.endswith(b"\n\n") and b"\n\n\n" not in text and not text.startswith(b"\n")
        docs = [tuple(d.split(b"\n")) for d in text[:-2].split(b"\n\n")]
        assert piece.counts.documents == len(docs)
        assert piece.counts.lines == sum(map(len, docs))
        assert piece.counts.text_bytes == sum(len(line) for d in docs for line in d)
        assert piece.head == [line.decode() for d in docs for line in d][:3]
        # Full at its first document end past shard_bytes, the last one excepted.
        last_doc = sum(len(line) for line in docs[-1])
        assert k == len(pieces) - 1 or piece.counts.text_bytes - last_doc < 60 \
            <= piece.counts.text_bytes
        documents += docs
    assert [tuple(line.decode() for line in d) for d in documents] == \
        reader_documents.documents(str(path), MAX_LINE)
