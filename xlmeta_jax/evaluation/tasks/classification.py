"""Sentence-pair classification: XNLI and PAWS-X (accuracy).

Only labelled dev data is at hand locally, and the dev files are parallel (line i of
every language is a translation of line i of English). Lines are joined into groups of
pairs that share a sentence word for word in any language (XNLI: the three hypotheses
of a premise; PAWS-X: 411 of the second half's 1000 English pairs share a sentence with
the first half, and translations add a few more), and the split runs between groups:
the first ``train_fraction`` of the lines (whole groups) trains, the last
``select_fraction`` of that part is held out as the English development set for model
selection, and every language is evaluated on the remaining groups only — no evaluation
sentence, nor its translation, is in the training data
(:func:`xlmeta_jax.evaluation.splits.dev_split`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import ClassVar

import numpy as np

from xlmeta_jax.evaluation import features, readers, scorers, splits, tfds_readers
from xlmeta_jax.evaluation.tasks.base import FineTunedTask, TaskError

XNLI_LABELS = ("entailment", "neutral", "contradiction")
PAWSX_LABELS = ("0", "1")


@functools.lru_cache(maxsize=8)
def _parallel_files(task: ClassificationTask, data_dir: pathlib.Path) -> dict[str, list]:
    files = {
        lang: readers.read_pair_tsv(data_dir / task.name / f"dev-{lang}.tsv", task.labels,
                                    f"{task.name}-{lang}-")
        for lang in task.languages
    }
    for lang, rows in files.items():
        if len(rows) != len(files["en"]):
            raise TaskError(
                f"{task.name}: dev-{lang}.tsv has {len(rows)} lines but dev-en.tsv "
                f"{len(files['en'])}; the dev files must be line-aligned translations"
            )
    return files


@dataclasses.dataclass(frozen=True)
class ClassificationTask(FineTunedTask):
    """A sentence-pair task whose parallel dev files are split leak-free (module docstring)."""

    head: ClassVar[str] = "classification"
    # XTREME's run_classify.py selects on accuracy.
    selection_metric: ClassVar[str] = "accuracy"
    tfds_select_data: ClassVar[str | None] = "English validation split (TFDS)"

    def _parallel_dev(self, lang, data_dir, train_fraction, select_fraction, part):
        # The split is computed once over every language, so all use the same lines.
        files = _parallel_files(self, pathlib.Path(data_dir))
        parts = splits.dev_split(list(files.values()), train_fraction, select_fraction)
        return [files[lang][i] for i in parts[part]]

    def _local_train(self, data_dir, train_fraction, select_fraction):
        return self._parallel_dev("en", data_dir, train_fraction, select_fraction, "train")

    def _local_select(self, data_dir, train_fraction, select_fraction):
        if select_fraction == 0:
            return None
        return self._parallel_dev("en", data_dir, train_fraction, select_fraction, "select")

    def _local_eval(self, lang, data_dir, train_fraction, select_fraction):
        return self._parallel_dev(lang, data_dir, train_fraction, select_fraction, "eval")

    def features(self, examples, tokenizer, settings):
        return features.classification_features(examples, tokenizer, settings.max_seq_length)

    def score(self, lang, examples, feats, outputs, settings):
        return scorers.accuracy(feats["labels"], np.asarray(outputs).argmax(-1)), None


@dataclasses.dataclass(frozen=True)
class XNLITask(ClassificationTask):
    """XNLI: trained on MultiNLI from TFDS, the language's XNLI translation evaluated."""

    def _tfds_train(self, tfds_data_dir):
        return tfds_readers.multi_nli("train", tfds_data_dir, self.labels)

    def _tfds_select(self, tfds_data_dir):
        return tfds_readers.xnli("en", "validation", tfds_data_dir, self.labels)

    def _tfds_eval(self, lang, tfds_data_dir):
        return tfds_readers.xnli(lang, "test", tfds_data_dir, self.labels)


@dataclasses.dataclass(frozen=True)
class PAWSXTask(ClassificationTask):
    """PAWS-X: ``paws_x_wiki/<lang>`` from TFDS."""

    def _tfds_train(self, tfds_data_dir):
        return tfds_readers.paws_x("en", "train", tfds_data_dir, self.labels)

    def _tfds_select(self, tfds_data_dir):
        return tfds_readers.paws_x("en", "validation", tfds_data_dir, self.labels)

    def _tfds_eval(self, lang, tfds_data_dir):
        return tfds_readers.paws_x(lang, "test", tfds_data_dir, self.labels)


XNLI_LANGUAGES = tuple("ar bg de el en es fr hi ru sw th tr ur vi zh".split())
PAWSX_LANGUAGES = tuple("de en es fr ja ko zh".split())

XNLI = XNLITask(
    name="xnli",
    languages=XNLI_LANGUAGES,
    metric="accuracy",
    labels=XNLI_LABELS,
    local_data=("English dev, first half by premise groups, minus the selection part",
                "English dev, the last tenth of the training half",
                "each language's dev, second half (premises unseen in training)"),
    local_differences=("trained on ~1000 English dev pairs instead of MultiNLI's 393k "
                       "training pairs", "evaluated on half of dev instead of test"),
    tfds_languages=XNLI_LANGUAGES,
)

PAWSX = PAWSXTask(
    name="pawsx",
    languages=PAWSX_LANGUAGES,
    metric="accuracy",
    labels=PAWSX_LABELS,
    local_data=("English dev, first half by groups of pairs sharing a sentence, minus the "
                "selection part",
                "English dev, the last tenth of the training half",
                "each language's dev, second half (no sentence shared with training)"),
    local_differences=("trained on ~800 English dev pairs instead of 49k PAWS training "
                       "pairs", "evaluated on half of dev instead of test"),
    tfds_languages=PAWSX_LANGUAGES,
)
