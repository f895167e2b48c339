"""Readers of the evaluation data's file formats, and the example types they return.

The local layout is that of ``../shared/data`` (each subfolder has a README naming its
source): SQuAD v1.1 JSON for TyDi QA GoldP, XQuAD and MLQA; XTREME TSV for XNLI and
PAWS-X; CoNLL-style ``token<TAB>tag`` for PAN-X; CoNLL-U for UD POS; line-aligned text
for Tatoeba; ``id<TAB>sentence`` files for BUCC. Which files a task reads, and how its
train / selection / evaluation sets are cut from them, is the task object's business
(:mod:`xlmeta_jax.evaluation.tasks`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence

# Default location of the shared data: $XLMETA_SHARED_DATA, else ../shared/data next to
# the repository root.
DEFAULT_DATA_DIR = pathlib.Path(
    os.environ.get(
        "XLMETA_SHARED_DATA",
        pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data",
    )
)


# ----------------------------------------------------------------------------------------
# Example types
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClassificationExample:
    """A sentence pair with a label index."""

    id: str
    text_a: str
    text_b: str
    label: int


@dataclasses.dataclass(frozen=True)
class QAExample:
    """An extractive QA question with its context and gold answers."""

    id: str
    question: str
    context: str
    # Gold answer texts (several for dev sets with multiple annotations).
    answers: tuple[str, ...]
    # Character offset of each answer in `context`.
    answer_starts: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TaggingExample:
    """A sentence as words with one tag per word."""

    id: str
    tokens: tuple[str, ...]
    tags: tuple[str, ...]


# The universal part-of-speech tags of a CoNLL-U file's UPOS column.
UPOS_LABELS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
    "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)


# ----------------------------------------------------------------------------------------
# Format readers
# ----------------------------------------------------------------------------------------


def _require(path: pathlib.Path, what: str) -> pathlib.Path:
    if not path.is_file():
        raise FileNotFoundError(
            f"{what}: expected file {path} does not exist (is the data directory right? "
            f"see docs/evaluation.md for the layout)"
        )
    return path


def read_squad_json(path: str | os.PathLike) -> list[QAExample]:
    """Questions of a SQuAD v1.1 JSON file (``data/paragraphs/qas/answers``).

    Raises:
      ValueError: for a file that is not SQuAD-shaped or an answer whose
        ``answer_start`` does not point at its text in the context.
    """
    path = _require(pathlib.Path(path), "SQuAD-format QA data")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "data" not in doc:
        raise ValueError(f"{path}: not SQuAD v1.1 JSON (no top-level 'data')")
    out = []
    for article in doc["data"]:
        for para in article["paragraphs"]:
            context = para["context"]
            for qa in para["qas"]:
                texts, starts = [], []
                for ans in qa["answers"]:
                    start = int(ans["answer_start"])
                    if context[start : start + len(ans["text"])] != ans["text"]:
                        raise ValueError(
                            f"{path}: question {qa['id']}: answer {ans['text']!r} is not at "
                            f"answer_start={start} of its context"
                        )
                    texts.append(ans["text"])
                    starts.append(start)
                if not texts:
                    raise ValueError(f"{path}: question {qa['id']} has no answer")
                out.append(
                    QAExample(str(qa["id"]), qa["question"], context, tuple(texts), tuple(starts))
                )
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


def read_pair_tsv(
    path: str | os.PathLike, labels: Sequence[str], id_prefix: str = ""
) -> list[ClassificationExample]:
    """``sentence1<TAB>sentence2<TAB>label`` lines (XTREME's XNLI / PAWS-X files)."""
    path = _require(pathlib.Path(path), "sentence-pair data")
    index = {label: i for i, label in enumerate(labels)}
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f):
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ValueError(
                    f"{path}:{n + 1}: expected 3 tab-separated fields, got {len(fields)}"
                )
            a, b, label = fields
            if label not in index:
                raise ValueError(
                    f"{path}:{n + 1}: unknown label {label!r}; expected {list(labels)}"
                )
            out.append(ClassificationExample(f"{id_prefix}{n}", a, b, index[label]))
    return out


def read_token_tag_tsv(
    path: str | os.PathLike, labels: Sequence[str] | None = None, id_prefix: str = ""
) -> list[TaggingExample]:
    """CoNLL-style ``token<TAB>tag`` lines, a blank line between sentences (PAN-X).

    Raises:
      ValueError: naming the line of a malformed row or unknown tag.
    """
    path = _require(pathlib.Path(path), "token-tag data")
    allowed = set(labels) if labels is not None else None
    out, tokens, tags = [], [], []

    def flush():
        if tokens:
            out.append(TaggingExample(f"{id_prefix}{len(out)}", tuple(tokens), tuple(tags)))
            tokens.clear()
            tags.clear()

    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f):
            line = line.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0] or not fields[1]:
                raise ValueError(
                    f"{path}:{n + 1}: expected 'token<TAB>tag', got {line!r} (a corrupt export?)"
                )
            if allowed is not None and fields[1] not in allowed:
                raise ValueError(
                    f"{path}:{n + 1}: unknown tag {fields[1]!r}; expected {sorted(allowed)}"
                )
            tokens.append(fields[0])
            tags.append(fields[1])
    flush()
    return out


def read_conllu_upos(path: str | os.PathLike, id_prefix: str = "") -> list[TaggingExample]:
    """Words and UPOS tags of a CoNLL-U file (multi-word token ranges and empty nodes
    are skipped: their syntactic words carry the tags)."""
    path = _require(pathlib.Path(path), "CoNLL-U treebank")
    out, tokens, tags = [], [], []
    sent_id = None

    def flush():
        nonlocal sent_id
        if tokens:
            sid = sent_id or f"{id_prefix}{len(out)}"
            out.append(TaggingExample(sid, tuple(tokens), tuple(tags)))
        tokens.clear()
        tags.clear()
        sent_id = None

    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            line = line.rstrip("\n")
            if not line:
                flush()
                continue
            if line.startswith("#"):
                if line.startswith("# sent_id = "):
                    sent_id = line[len("# sent_id = ") :]
                continue
            fields = line.split("\t")
            if len(fields) != 10:
                raise ValueError(f"{path}:{n + 1}: expected 10 CoNLL-U columns, got {len(fields)}")
            if "-" in fields[0] or "." in fields[0]:
                continue
            if fields[3] not in UPOS_LABELS:
                raise ValueError(f"{path}:{n + 1}: unknown UPOS tag {fields[3]!r}")
            tokens.append(fields[1])
            tags.append(fields[3])
    flush()
    return out


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a UTF-8 text file without line ends."""
    path = _require(pathlib.Path(path), "text data")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def read_id_sentences(path: str | os.PathLike) -> dict[str, str]:
    """BUCC corpus files: ``id<TAB>sentence`` per line."""
    out = {}
    for n, line in enumerate(read_lines(path)):
        if not line:
            continue
        sid, sep, sentence = line.partition("\t")
        if not sep:
            raise ValueError(f"{path}:{n + 1}: expected 'id<TAB>sentence'")
        out[sid] = sentence
    return out


def resolve_data_dir(data_dir) -> pathlib.Path:
    """``data_dir`` (None: the default shared-data folder), checked to exist."""
    path = pathlib.Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {path} does not exist (pass data_dir / DATA_DIR pointing at a "
            f"folder laid out like ../shared/data)"
        )
    return path
