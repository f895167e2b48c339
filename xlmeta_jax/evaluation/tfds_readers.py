"""The same examples as :mod:`xlmeta_jax.evaluation.readers`, from TFDS builders.

For users with internet access (TFDS downloads and prepares each dataset once into
``tfds_data_dir``). Splits follow XTREME: English training data, English validation data for model
selection (XNLI, PAWS-X, PAN-X), each language's test split (TyDi QA GoldP and XQuAD
have no other labelled split in TFDS):

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

from xlmeta_jax.evaluation import readers
from xlmeta_jax.evaluation.readers import ClassificationExample, QAExample, TaggingExample

log = logging.getLogger(__name__)

_QA_EVAL = {
    "tydiqa": ("tydi_qa/goldp", "validation-{lang}"),
    "xquad": ("xquad/{lang}", "test"),
    "mlqa": ("mlqa/{lang}", "test"),
}
# Languages with a TFDS config (XQuAD's Romanian is not in TFDS).
TFDS_LANGUAGES = {
    "tydiqa": readers.get_task("tydiqa").languages,
    "xquad": ("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh"),
    "mlqa": readers.get_task("mlqa").languages,
    "xnli": readers.get_task("xnli").languages,
    "pawsx": readers.get_task("pawsx").languages,
    "panx": readers.get_task("panx").languages,
}
# Label names of the TFDS builders -> our label names.
_PAWSX_NAMES = {"different_meaning": "0", "paraphrase": "1"}


def _tfds():
    import tensorflow_datasets as tfds

    return tfds


def _load(name: str, split: str, data_dir):
    tfds = _tfds()
    ds, info = tfds.load(name, split=split, data_dir=data_dir, with_info=True, shuffle_files=False)
    return tfds.as_numpy(ds), info


def _text(x) -> str:
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def check_task(task: str, lang: str | None = None) -> None:
    """Raises ValueError for a task or language without a TFDS builder here."""
    if task not in TFDS_LANGUAGES:
        raise ValueError(
            f"task {task!r} has no TFDS source; use the local files (data_source='local')"
        )
    if lang is not None and lang not in TFDS_LANGUAGES[task]:
        raise ValueError(
            f"{task}: language {lang!r} has no TFDS config; available: {list(TFDS_LANGUAGES[task])}"
        )


def _qa_examples(rows, *, training: bool, id_prefix: str | None = None) -> list[QAExample]:
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
            # A span the offsets do not point at would teach the wrong tokens.
            misaligned += 1
            continue
        if not texts:
            raise ValueError(f"TFDS question {qid} has no answer")
        out.append(QAExample(qid, _text(row["question"]), context, tuple(texts), tuple(starts)))
    if misaligned:
        log.warning("dropped %d training questions whose answer_start misses the text",
                    misaligned)
    return out


def _label_map(info, task: str) -> dict[int, int]:
    names = info.features["label"].names
    ours = readers.get_task(task).labels
    if task == "pawsx":
        names = [_PAWSX_NAMES.get(n, n) for n in names]
    if sorted(names) != sorted(ours):
        raise ValueError(f"{task}: TFDS labels {names} do not match {list(ours)}")
    return {i: ours.index(n) for i, n in enumerate(names)}


def load_train(task: str, data_dir=None) -> list:
    """English training examples of ``task`` from TFDS (see module table)."""
    check_task(task)
    if task == "tydiqa":
        rows, _ = _load("tydi_qa/goldp", "train", data_dir)
        return _qa_examples(rows, training=True, id_prefix="english")
    if task in ("xquad", "mlqa"):
        rows, _ = _load("squad/v1.1", "train", data_dir)
        return _qa_examples(rows, training=True)
    if task == "xnli":
        rows, info = _load("multi_nli", "train", data_dir)
        labels = _label_map(info, task)
        return [
            ClassificationExample(f"mnli-{i}", _text(r["premise"]), _text(r["hypothesis"]),
                                  labels[int(r["label"])])
            for i, r in enumerate(rows)
        ]
    if task == "pawsx":
        return _pawsx("en", "train", data_dir)
    return _wikiann("en", "train", data_dir)


def load_eval(task: str, lang: str, data_dir=None) -> list:
    """Evaluation examples of ``task`` in ``lang`` from TFDS (see module table)."""
    check_task(task, lang)
    if task in _QA_EVAL:
        name, split = _QA_EVAL[task]
        rows, _ = _load(name.format(lang=lang), split.format(lang=lang), data_dir)
        return _qa_examples(rows, training=False)
    if task == "xnli":
        return _xnli(lang, "test", data_dir)
    if task == "pawsx":
        return _pawsx(lang, "test", data_dir)
    return _wikiann(lang, "test", data_dir)


def load_select(task: str, data_dir=None) -> list | None:
    """English validation examples for XTREME's best-checkpoint selection (None for QA,
    where XTREME keeps the final parameters)."""
    check_task(task)
    if task == "xnli":
        return _xnli("en", "validation", data_dir)
    if task == "pawsx":
        return _pawsx("en", "validation", data_dir)
    if task == "panx":
        return _wikiann("en", "validation", data_dir)
    return None


def _xnli(lang, split, data_dir):
    rows, info = _load("xnli", split, data_dir)
    labels = _label_map(info, "xnli")
    out, missing = [], 0
    for i, r in enumerate(rows):
        hyp = dict(zip((_text(x) for x in r["hypothesis"]["language"]),
                       (_text(x) for x in r["hypothesis"]["translation"])))
        if lang not in hyp:
            missing += 1
            continue
        out.append(ClassificationExample(
            f"xnli-{lang}-{i}", _text(r["premise"][lang]), hyp[lang], labels[int(r["label"])],
        ))
    if missing:
        log.warning("xnli: %d %s rows have no %s hypothesis", missing, split, lang)
    return out


def _pawsx(lang, split, data_dir):
    rows, info = _load(f"paws_x_wiki/{lang}", split, data_dir)
    labels = _label_map(info, "pawsx")
    return [
        ClassificationExample(f"pawsx-{lang}-{i}", _text(r["sentence1"]), _text(r["sentence2"]),
                              labels[int(r["label"])])
        for i, r in enumerate(rows)
    ]


def _wikiann(lang, split, data_dir):
    rows, info = _load(f"wikiann/{lang}", split, data_dir)
    names = info.features["tags"].feature.names
    if sorted(names) != sorted(readers.PANX_LABELS):
        raise ValueError(f"wikiann tags {names} do not match {list(readers.PANX_LABELS)}")
    out = []
    for i, r in enumerate(rows):
        if len(r["tokens"]) != len(r["tags"]):
            raise ValueError(
                f"wikiann/{lang} {split} row {i}: {len(r['tokens'])} tokens, {len(r['tags'])} tags"
            )
        out.append(TaggingExample(f"panx-{lang}-{i}", tuple(_text(t) for t in r["tokens"]),
                                  tuple(names[int(t)] for t in r["tags"])))
    return out
