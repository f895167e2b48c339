"""TFDS builders read into our example types (for users with internet access).

TFDS downloads and prepares each dataset once into ``tfds_data_dir``. Which builder and
split a task reads is said by the task object (:mod:`xlmeta_jax.evaluation.tasks`):
XTREME's splits, English training data, English validation data for model selection
(XNLI, PAWS-X, PAN-X) and each language's test split:

| task | training (English) | evaluation |
| --- | --- | --- |
| tydiqa | ``tydi_qa/goldp`` train, English questions | ``tydi_qa/goldp`` ``validation-<lang>`` |
| xquad | ``squad/v1.1`` train | ``xquad/<lang>`` test |
| mlqa | ``squad/v1.1`` train | ``mlqa/<lang>`` test |
| xnli | ``multi_nli`` train | ``xnli`` test, the language's translation |
| pawsx | ``paws_x_wiki/en`` train | ``paws_x_wiki/<lang>`` test |
| panx | ``wikiann/en`` train | ``wikiann/<lang>`` test |

UD POS, Tatoeba and BUCC have no TFDS builder here: use the local files. TensorFlow
is imported only when one of these functions runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from xlmeta_jax.evaluation.readers import ClassificationExample, QAExample, TaggingExample

log = logging.getLogger(__name__)


def load(name: str, split: str, data_dir):
    """(numpy rows, builder info) of one TFDS split, in file order."""
    import tensorflow_datasets as tfds  # noqa: PLC0415 - TFDS only when a TFDS source is asked for

    ds, info = tfds.load(name, split=split, data_dir=data_dir, with_info=True, shuffle_files=False)
    return tfds.as_numpy(ds), info


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def qa_examples(rows, *, training: bool, id_prefix: str | None = None) -> list[QAExample]:
    """SQuAD-shaped TFDS rows as QA examples.

    Args:
      rows: TFDS rows with ``id``, ``question``, ``context`` and ``answers``.
      training: drop questions whose answer offsets miss their text (they would teach
        the wrong tokens) instead of keeping them for scoring.
      id_prefix: keep only questions whose id starts with it (TyDi QA's language).
    """
    out, misaligned = [], 0
    for row in rows:
        qid = _text(row["id"])
        if id_prefix is not None and not qid.startswith(id_prefix):
            continue
        context = _text(row["context"])
        texts = [_text(t) for t in row["answers"]["text"]]
        starts = [int(s) for s in row["answers"]["answer_start"]]
        ok = bool(texts) and len(starts) == len(texts) and all(
            context[s : s + len(t)] == t for t, s in zip(texts, starts)
        )
        # Scoring needs only the texts; -1 marks an offset the data does not give.
        starts = (starts + [-1] * len(texts))[: len(texts)]
        if training and not ok:
            misaligned += 1
            continue
        if not texts:
            raise ValueError(f"TFDS question {qid} has no answer")
        out.append(QAExample(qid, _text(row["question"]), context, tuple(texts), tuple(starts)))
    if misaligned:
        log.warning("dropped %d training questions whose answer_start misses the text",
                    misaligned)
    return out


def label_map(info, task: str, labels: Sequence[str],
              rename: Mapping[str, str] | None = None) -> dict[int, int]:
    """Builder label index -> index in ``labels``, matched by name (after ``rename``)."""
    names = info.features["label"].names
    if rename:
        names = [rename.get(n, n) for n in names]
    if sorted(names) != sorted(labels):
        raise ValueError(f"{task}: TFDS labels {names} do not match {list(labels)}")
    return {i: list(labels).index(n) for i, n in enumerate(names)}


def multi_nli(split: str, data_dir, labels: Sequence[str]) -> list[ClassificationExample]:
    """MultiNLI premise / hypothesis pairs (XNLI's English training data)."""
    rows, info = load("multi_nli", split, data_dir)
    index = label_map(info, "xnli", labels)
    return [
        ClassificationExample(f"mnli-{i}", _text(r["premise"]), _text(r["hypothesis"]),
                              index[int(r["label"])])
        for i, r in enumerate(rows)
    ]


def xnli(lang: str, split: str, data_dir, labels: Sequence[str]) -> list[ClassificationExample]:
    """XNLI pairs in ``lang`` (rows without a hypothesis in ``lang`` are skipped)."""
    rows, info = load("xnli", split, data_dir)
    index = label_map(info, "xnli", labels)
    out, missing = [], 0
    for i, r in enumerate(rows):
        hyp = dict(zip((_text(x) for x in r["hypothesis"]["language"]),
                       (_text(x) for x in r["hypothesis"]["translation"])))
        if lang not in hyp:
            missing += 1
            continue
        out.append(ClassificationExample(
            f"xnli-{lang}-{i}", _text(r["premise"][lang]), hyp[lang], index[int(r["label"])],
        ))
    if missing:
        log.warning("xnli: %d %s rows have no %s hypothesis", missing, split, lang)
    return out


# Label names of the PAWS-X builder -> ours.
_PAWSX_NAMES = {"different_meaning": "0", "paraphrase": "1"}


def paws_x(lang: str, split: str, data_dir, labels: Sequence[str]) -> list[ClassificationExample]:
    """PAWS-X sentence pairs of ``paws_x_wiki/<lang>``."""
    rows, info = load(f"paws_x_wiki/{lang}", split, data_dir)
    index = label_map(info, "pawsx", labels, _PAWSX_NAMES)
    return [
        ClassificationExample(f"pawsx-{lang}-{i}", _text(r["sentence1"]), _text(r["sentence2"]),
                              index[int(r["label"])])
        for i, r in enumerate(rows)
    ]


def wikiann(lang: str, split: str, data_dir, labels: Sequence[str]) -> list[TaggingExample]:
    """WikiANN (PAN-X) sentences of ``wikiann/<lang>``, tags mapped by name."""
    rows, info = load(f"wikiann/{lang}", split, data_dir)
    names = info.features["tags"].feature.names
    if sorted(names) != sorted(labels):
        raise ValueError(f"wikiann tags {names} do not match {list(labels)}")
    out = []
    for i, r in enumerate(rows):
        if len(r["tokens"]) != len(r["tags"]):
            raise ValueError(
                f"wikiann/{lang} {split} row {i}: {len(r['tokens'])} tokens, {len(r['tags'])} tags"
            )
        out.append(TaggingExample(f"panx-{lang}-{i}", tuple(_text(t) for t in r["tokens"]),
                                  tuple(names[int(t)] for t in r["tags"])))
    return out
