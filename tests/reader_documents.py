"""A text file's documents as the pipeline's reader sees them, one line at a time.

The reference the prepared shards are checked against (tests/test_prepare.py,
tests/test_shards.py): kept lines (``text_files.iter_lines``' rules: not over-long, not
blank, valid UTF-8), a blank line ending a document, skipped lines ending nothing.
"""

from __future__ import annotations

from xlmeta_jax.data import text_files


def documents(path: str, max_line_bytes: int) -> list[tuple[str, ...]]:
    """The documents of ``path``: tuples of their kept lines, in order."""
    docs, doc = [], []
    for line in text_files.iter_lines(path, max_line_bytes):
        if line is None:
            continue
        if not line.strip():
            if doc:
                docs.append(tuple(doc))
            doc = []
            continue
        try:
            doc.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return docs + ([tuple(doc)] if doc else [])
