"""Registers the zero-shot evaluation data as seqio Tasks (raw text, for inspection).

One Task per benchmark and language, named in :data:`NAMES` (``NAMES[task][lang]``),
e.g. ``xlmeta_eval_tydiqa_sw``. Split ``validation`` holds the evaluation examples of
that language; the English Task of each benchmark also has split ``train`` (the
English training data that fine-tuning uses). Examples are raw features, no
tokenisation (``output_features`` is empty):

* classification (xnli, pawsx): ``id, text_a, text_b, label``;
* QA (tydiqa, xquad, mlqa): ``id, question, context, answers, answer_starts``;
* tagging (panx, udpos): ``id, tokens, tags``;
* tatoeba: ``id, text, translation`` (the English side).

The sources are :class:`seqio.FunctionDataSource` wrappers of the same readers
(:mod:`xlmeta_jax.evaluation.readers`) that ``python -m xlmeta_jax.finetune`` uses, over
the data folder ``$XLMETA_SHARED_DATA`` (default ``../shared/data``). Fine-tuning
itself does not go through seqio (it needs no TensorFlow).
"""

from __future__ import annotations

import functools

import seqio
import tensorflow as tf

from xlmeta_jax.evaluation import readers

PREFIX = "xlmeta_eval"


def task_name(task: str, lang: str) -> str:
    """seqio name of one benchmark-language pair."""
    return f"{PREFIX}_{task}_{lang}"


# Every registered evaluation Task: NAMES[benchmark][language] -> seqio Task name.
NAMES: dict[str, dict[str, str]] = {
    task: {lang: task_name(task, lang) for lang in spec.languages}
    for task, spec in readers.TASKS.items()
    if task != "bucc"
}

_STR = tf.TensorSpec((), tf.string)
_STRS = tf.TensorSpec((None,), tf.string)
_INT = tf.TensorSpec((), tf.int32)
_SIGNATURES = {
    "classification": {"id": _STR, "text_a": _STR, "text_b": _STR, "label": _INT},
    "qa": {"id": _STR, "question": _STR, "context": _STR, "answers": _STRS,
           "answer_starts": tf.TensorSpec((None,), tf.int32)},
    "tagging": {"id": _STR, "tokens": _STRS, "tags": _STRS},
    "retrieval": {"id": _STR, "text": _STR, "translation": _STR},
}


def _examples(task: str, lang: str, split: str):
    spec = readers.get_task(task)
    if spec.kind == "retrieval":
        xx, en = readers.read_tatoeba(lang)
        for i, (a, b) in enumerate(zip(xx, en)):
            yield {"id": f"{lang}-{i}", "text": a, "translation": b}
        return
    examples = readers.load_train(task) if split == "train" else readers.load_eval(task, lang)
    for ex in examples:
        if spec.kind == "classification":
            yield {"id": ex.id, "text_a": ex.text_a, "text_b": ex.text_b, "label": ex.label}
        elif spec.kind == "qa":
            yield {"id": ex.id, "question": ex.question, "context": ex.context,
                   "answers": list(ex.answers), "answer_starts": list(ex.answer_starts)}
        else:
            yield {"id": ex.id, "tokens": list(ex.tokens), "tags": list(ex.tags)}


def _splits(task: str, lang: str) -> tuple[str, ...]:
    if lang == "en" and readers.get_task(task).kind != "retrieval":
        return ("train", "validation")
    return ("validation",)


def _dataset_fn(split: str, shuffle_files: bool, seed=None, *, task: str, lang: str):
    del shuffle_files, seed  # one file per split: nothing to shuffle
    if split not in _splits(task, lang):
        raise ValueError(
            f"{task_name(task, lang)} has no split {split!r}; it has {_splits(task, lang)}"
        )
    kind = readers.get_task(task).kind
    return tf.data.Dataset.from_generator(
        functools.partial(_examples, task, lang, split), output_signature=_SIGNATURES[kind]
    )


def _register() -> None:
    for task, by_lang in NAMES.items():
        for lang, name in by_lang.items():
            if name in seqio.TaskRegistry.names():
                continue
            seqio.TaskRegistry.add(
                name,
                source=seqio.FunctionDataSource(
                    functools.partial(_dataset_fn, task=task, lang=lang),
                    splits=_splits(task, lang),
                ),
                output_features={},
                preprocessors=[],
            )


_register()
