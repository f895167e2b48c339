"""Training rows of contrastive fine-tuning, and their batches without duplicate texts.

A row is a query, its positive and any hard negatives (:class:`Pair`). They come from

* JSONL files, one object per line: ``{"query": …, "positive": …, "negatives": [...]}``
  (``negatives`` optional; a single string is one negative);
* TSV files, one row per line: ``query<TAB>positive[<TAB>negative…]``; a first line
  ``query<TAB>positive…`` is a header and is skipped;
* parallel text (FLORES-200's layout: ``<dir>/<language>.<split>``, line ``i`` of every
  file the same sentence): each language's line paired with the pivot language's
  (:func:`bitext_pairs`).

A malformed line is refused with its file and line number (:class:`PairsError`). Every
row of a batch has its own texts: :func:`no_duplicate_batches` is sentence-transformers'
``NoDuplicatesBatchSampler`` (a text already in the batch defers its row to a later
batch), over a seeded permutation per epoch, so that the batch of any step is a function
of the seed and the step alone and a resumed run reads the batches the uninterrupted run
reads (:class:`BatchOrder`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterator, Sequence

import numpy as np

from xlmeta_jax import errors

FORMATS = (".jsonl", ".tsv")


class PairsError(errors.UserError, ValueError):
    """A training file or setting that gives no usable rows; names the file and line."""


@dataclasses.dataclass(frozen=True)
class Pair:
    """One training row."""

    query: str
    positive: str
    negatives: tuple[str, ...] = ()

    def texts(self) -> tuple[str, ...]:
        return (self.query, self.positive, *self.negatives)


def _text(value, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PairsError(f"{where}: {what} must be a non-empty string, got {value!r}")
    return value


def _jsonl_row(line: str, where: str) -> Pair:
    try:
        row = json.loads(line)
    except ValueError as e:
        raise PairsError(f"{where}: not JSON ({errors.first_line(e)})") from None
    if not isinstance(row, dict):
        raise PairsError(f"{where}: expected an object with 'query' and 'positive', got "
                         f"{type(row).__name__}")
    missing = [k for k in ("query", "positive") if k not in row]
    if missing:
        raise PairsError(f"{where}: no {' and no '.join(repr(k) for k in missing)} "
                         f"(keys: {sorted(row)})")
    unknown = sorted(set(row) - {"query", "positive", "negatives"})
    if unknown:
        raise PairsError(f"{where}: unknown keys {unknown}; a row has 'query', 'positive' and "
                         "optionally 'negatives'")
    negatives = row.get("negatives", [])
    if isinstance(negatives, str):
        negatives = [negatives]
    if not isinstance(negatives, list):
        raise PairsError(f"{where}: 'negatives' must be a list of strings, got "
                         f"{type(negatives).__name__}")
    return Pair(_text(row["query"], where, "'query'"), _text(row["positive"], where, "'positive'"),
                tuple(_text(n, where, "each negative") for n in negatives))


def _tsv_row(line: str, where: str) -> Pair:
    fields = line.split("\t")
    if len(fields) < 2:
        raise PairsError(f"{where}: expected query<TAB>positive[<TAB>negative...], got "
                         f"{len(fields)} field")
    fields = [_text(f, where, f"field {i + 1}") for i, f in enumerate(fields)]
    return Pair(fields[0], fields[1], tuple(fields[2:]))


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    """The rows of one JSONL or TSV file (see module doc).

    Raises:
      PairsError: the file is missing, of another format, empty, or a line is malformed
        (named as ``file:line``); rows with different numbers of negatives.
    """
    path = pathlib.Path(path)
    if path.suffix not in FORMATS:
        raise PairsError(f"training file {path}: expected a .jsonl or .tsv file")
    if not path.is_file():
        raise PairsError(f"training file {path} does not exist")
    parse = _jsonl_row if path.suffix == ".jsonl" else _tsv_row
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PairsError(f"{path}: not UTF-8 ({errors.first_line(e)})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if (number == 1 and path.suffix == ".tsv"
                and line.split("\t")[:2] == ["query", "positive"]):
            continue
        rows.append(parse(line, f"{path}:{number}"))
    if not rows:
        raise PairsError(f"{path} holds no rows")
    check_columns(rows, str(path))
    return rows


def check_columns(rows: Sequence[Pair], where: str) -> None:
    """Every row must have as many negatives as the first (a batch is one array a column).

    Raises:
      PairsError: naming the first row that differs.
    """
    want = len(rows[0].negatives)
    for i, row in enumerate(rows):
        if len(row.negatives) != want:
            raise PairsError(f"{where}: row {i + 1} has {len(row.negatives)} negatives, the "
                             f"first has {want}; give every row the same number")


def bitext_pairs(folder: str | os.PathLike, languages: Sequence[str], *,
                 pivot: str = "eng_Latn", split: str = "devtest") -> list[Pair]:
    """Translation pairs of line-aligned files: (pivot line i, language line i).

    Args:
      folder: holds ``<language>.<split>`` files (FLORES-200's ``devtest/`` layout).
      languages: the languages paired with the pivot (the pivot itself is skipped).
      pivot: the language of every query.
      split: the files' suffix.

    Raises:
      PairsError: a missing file, or files of different line counts.
    """
    folder = pathlib.Path(folder)

    def lines(lang):
        path = folder / f"{lang}.{split}"
        if not path.is_file():
            have = sorted(p.name.split(".")[0] for p in folder.glob(f"*.{split}"))[:12]
            raise PairsError(f"bitext: no {path} (languages there: {have}...)")
        return path.read_text(encoding="utf-8").splitlines()

    queries = lines(pivot)
    rows = []
    for lang in languages:
        if lang == pivot:
            continue
        other = lines(lang)
        if len(other) != len(queries):
            raise PairsError(f"bitext: {folder}/{lang}.{split} has {len(other)} lines, "
                             f"{pivot}.{split} {len(queries)}; the files must be line-aligned")
        rows += [Pair(q.strip(), t.strip()) for q, t in zip(queries, other)
                 if q.strip() and t.strip()]
    return rows


def without_texts(rows: Sequence[Pair], excluded: set[str]) -> list[int]:
    """The indices of the rows none of whose texts (stripped) is in ``excluded``."""
    return [i for i, r in enumerate(rows) if not any(t.strip() in excluded for t in r.texts())]


def no_duplicate_batches(rows: Sequence[Pair], order: Sequence[int],
                         batch_size: int) -> list[list[int]]:
    """Full batches of row indices, in ``order``, with no text twice in a batch.

    sentence-transformers' ``NoDuplicatesBatchSampler``: a row whose texts meet one
    already in the batch waits for a later batch; an incomplete last batch is dropped
    (every step has the same shape).
    """
    remaining = dict.fromkeys(order)
    batches = []
    while remaining:
        seen: set[str] = set()
        batch: list[int] = []
        for index in remaining:
            texts = set(rows[index].texts())
            if texts & seen:
                continue
            batch.append(index)
            seen |= texts
            if len(batch) == batch_size:
                break
        if len(batch) < batch_size:
            break
        batches.append(batch)
        for index in batch:
            del remaining[index]
    return batches


class BatchOrder:
    """The batches of every step: epoch ``e`` is :func:`no_duplicate_batches` over
    ``default_rng([seed, e]).permutation(rows)``; step ``s`` (from 0) reads the batches
    of the epochs one after another."""

    def __init__(self, rows: Sequence[Pair], batch_size: int, seed: int):
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self._epochs: list[list[list[int]]] = []
        if not self._epoch(0):
            distinct = len({t for r in rows for t in r.texts()})
            raise PairsError(
                f"batch_size={batch_size} leaves no full batch without a repeated text: "
                f"{len(rows)} rows with {distinct} distinct texts")

    def _epoch(self, e: int) -> list[list[int]]:
        while len(self._epochs) <= e:
            order = np.random.default_rng([self.seed, len(self._epochs)]).permutation(
                len(self.rows))
            self._epochs.append(no_duplicate_batches(self.rows, order.tolist(),
                                                     self.batch_size))
        return self._epochs[e]

    def batches(self, start: int) -> Iterator[list[int]]:
        """Row indices of step ``start``'s batch, then of every later step."""
        e, step = 0, 0
        while step + len(self._epoch(e)) <= start:
            step += len(self._epoch(e))
            e += 1
        offset = start - step
        while True:
            yield from self._epoch(e)[offset:]
            e, offset = e + 1, 0
