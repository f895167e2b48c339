"""Public-domain English (``shared/data/english_pd``) as pretraining text files.

Writes the folder's texts in the CC-100 layout the text tasks read (one
paragraph per line, a blank line between documents):

* ``common_library.txt`` — novel chapters (HTML ``<p>`` paragraphs), one
  document per chapter;
* ``speeches.txt`` — US inaugural and State of the Union addresses, one
  document per speech;
* ``genesis.txt`` — the two English translations of Genesis;
* ``shakespeare.txt`` — tinyshakespeare, one document, a paragraph per speech.

Used by the throughput command, the tests and the demo. Without the shared
folder, :func:`fallback_text_files` writes Python's own documentation topics
(``pydoc_data``) in the same layout.
"""

from __future__ import annotations

import glob
import html
import os
import re
import zipfile
from collections.abc import Iterable

_TAG = re.compile(r"<[^>]+>")
_PARA = re.compile(r"<p\b[^>]*>(.*?)</p>", re.S | re.I)
_SPACE = re.compile(r"\s+")


def _clean(text: str) -> str:
    return _SPACE.sub(" ", html.unescape(_TAG.sub(" ", text))).strip()


def _blocks(text: str) -> list[str]:
    """Paragraphs of plain text: blank-line separated blocks, lines joined."""
    return [p for p in (_clean(b) for b in re.split(r"\n\s*\n", text)) if p]


def _write(path: str, documents: Iterable[list[str]]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for paragraphs in documents:
            paragraphs = [p for p in paragraphs if p]
            if not paragraphs:
                continue
            f.write("\n".join(paragraphs) + "\n\n")
            n += 1
    return n


def write_text_files(english_pd_dir: str, out_dir: str) -> list[str]:
    """Converts ``english_pd`` into CC-100-layout text files; returns their paths.

    Raises:
      FileNotFoundError: if ``english_pd_dir`` has none of the expected parts.
    """
    os.makedirs(out_dir, exist_ok=True)
    written = []

    chapters = sorted(glob.glob(os.path.join(english_pd_dir, "common-library", "texts", "*.html")))
    if chapters:
        docs = []
        for path in chapters:
            with open(path, encoding="utf-8", errors="replace") as f:
                docs.append([_clean(p) for p in _PARA.findall(f.read())])
        out = os.path.join(out_dir, "common_library.txt")
        _write(out, docs)
        written.append(out)

    speeches = []
    for name in ("inaugural", "state_union"):
        path = os.path.join(english_pd_dir, "nltk_data", f"{name}.zip")
        if os.path.exists(path):
            with zipfile.ZipFile(path) as z:
                for member in sorted(z.namelist()):
                    if member.endswith(".txt"):
                        speeches.append(_blocks(z.read(member).decode("utf-8", "replace")))
    if speeches:
        out = os.path.join(out_dir, "speeches.txt")
        _write(out, speeches)
        written.append(out)

    path = os.path.join(english_pd_dir, "nltk_data", "genesis.zip")
    if os.path.exists(path):
        with zipfile.ZipFile(path) as z:
            docs = [
                # Verses are wrapped lines without blank lines: one paragraph per line.
                [_clean(line) for line in z.read(m).decode("utf-8", "replace").splitlines()]
                for m in ("genesis/english-kjv.txt", "genesis/english-web.txt")
                if m in z.namelist()
            ]
        out = os.path.join(out_dir, "genesis.txt")
        if _write(out, docs):
            written.append(out)

    path = os.path.join(english_pd_dir, "tinyshakespeare", "input.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            out = os.path.join(out_dir, "shakespeare.txt")
            _write(out, [_blocks(f.read())])
            written.append(out)

    if not written:
        raise FileNotFoundError(f"{english_pd_dir} holds none of the english_pd texts")
    return written


def fallback_text_files(out_dir: str) -> list[str]:
    """Python's documentation topics (``pydoc_data``) as one English text file."""
    from pydoc_data import topics  # noqa: PLC0415 - pydoc's topics (~0.5 MB) only for the demo

    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "pydoc_topics.txt")
    _write(out, (_blocks(text) for _, text in sorted(topics.topics.items())))
    return [out]


def english_text_files(out_dir: str, english_pd_dir: str | None = None) -> list[str]:
    """english_pd's texts when the folder exists, else Python's documentation topics."""
    if english_pd_dir and os.path.isdir(english_pd_dir):
        return write_text_files(english_pd_dir, out_dir)
    return fallback_text_files(out_dir)
