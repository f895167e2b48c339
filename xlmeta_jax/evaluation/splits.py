"""Leak-free splits of dev files that must both select checkpoints and be scored.

XNLI, PAWS-X (only labelled dev data here): line i of every language's dev file is a
translation of line i of English. Rows are joined into groups of pairs that share a
sentence word for word in any language, and train / model-selection / evaluation parts
are cut between groups, so that no evaluated sentence, nor its translation, is in the
fine-tuning data. PAN-X English (no labelled test data here): :func:`holdout_split`
keeps the selection sentences out of English's evaluation set.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from xlmeta_jax.evaluation.readers import ClassificationExample


def pair_groups(*files: Sequence[ClassificationExample]) -> list[list[int]]:
    """Row indices joined into groups of pairs that share a sentence (word for word).

    Connected components over the sentences: rows i and j are in one group when, in any
    of the line-aligned ``files`` (one per language), they share ``text_a`` or
    ``text_b`` (either side), directly or through other rows. Groups are listed by their
    first row, rows in file order.
    """
    n = len(files[0])
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_row: dict[tuple[int, str], int] = {}
    for f, rows in enumerate(files):
        for i, row in enumerate(rows):
            for sentence in (row.text_a, row.text_b):
                j = first_row.setdefault((f, sentence), i)
                a, b = find(i), find(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _check_fractions(train_fraction: float, select_fraction: float) -> None:
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    if not 0.0 <= select_fraction < train_fraction:
        raise ValueError(
            f"select_fraction must be in [0, train_fraction={train_fraction}), "
            f"got {select_fraction}"
        )


def dev_split(
    files: Sequence[Sequence[ClassificationExample]], train_fraction: float,
    select_fraction: float,
) -> dict[str, list[int]]:
    """Row indices of the "train", "select" and "eval" parts of parallel dev files.

    Whole groups of :func:`pair_groups` (over all languages' files) go, in file order,
    to training until ``train_fraction`` of the rows are reached; the last groups of
    that part (about ``select_fraction`` of all rows) become the model-selection set;
    the rest is evaluated. In no language does a sentence occur in two parts.
    """
    _check_fractions(train_fraction, select_fraction)
    n = len(files[0])
    parts: dict[str, list[int]] = {"train": [], "select": [], "eval": []}
    train_end = round(n * train_fraction)
    select_start = round(n * (train_fraction - select_fraction))
    taken = 0
    for group in pair_groups(*files):
        if taken >= train_end:
            parts["eval"].extend(group)
            continue
        parts["select" if taken >= select_start and select_fraction > 0 else "train"].extend(group)
        taken += len(group)
    return parts


def holdout_split(keys: Sequence[Hashable], fraction: float) -> dict[str, list[int]]:
    """Row indices of a "select" part (the first ``fraction`` of the rows) and an "eval" part.

    Rows with equal keys (the same sentence, repeated in the file) are kept on the side
    of their first occurrence, so that no evaluated example is also a selection example.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must be in (0, 1), got {fraction}")
    side: dict[Hashable, str] = {}
    parts: dict[str, list[int]] = {"select": [], "eval": []}
    select_rows = round(len(keys) * fraction)
    for i, key in enumerate(keys):
        if key not in side:
            side[key] = "select" if len(parts["select"]) < select_rows else "eval"
        parts[side[key]].append(i)
    return parts
