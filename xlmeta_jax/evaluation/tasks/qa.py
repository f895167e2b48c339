"""Extractive QA: TyDi QA GoldP, XQuAD, MLQA (F1 and exact match).

QA has no English training data for XQuAD / MLQA here: all three fine-tune on TyDi QA
GoldP's English training set (3696 questions). Long contexts are read in windows
``doc_stride`` apart; answers are decoded as Hugging Face's ``compute_predictions_logits``
(:mod:`xlmeta_jax.evaluation.qa_decoding`). XTREME keeps the final parameters: no
selection set.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from xlmeta_jax.evaluation import features, qa_decoding, readers, scorers, tfds_readers
from xlmeta_jax.evaluation.tasks.base import FineTunedTask

TYDIQA_FOLDERS = {
    "ar": "arabic", "bn": "bengali", "en": "english", "fi": "finnish", "id": "indonesian",
    "ko": "korean", "ru": "russian", "sw": "swahili", "te": "telugu",
}
_TYDIQA_TRAIN = ("TyDi QA GoldP English train", None)
_SQUAD_INSTEAD = ("fine-tuned on TyDi QA GoldP English (3.7k questions) instead of SQuAD "
                  "v1.1 (88k)")


@dataclasses.dataclass(frozen=True)
class QATask(FineTunedTask):
    """A SQuAD-format task; subclasses say where each language's evaluation file is."""

    # TFDS (builder, split) of a language's evaluation set; "{lang}" is filled in.
    tfds_eval_source: tuple[str, str] = ("", "")

    head: ClassVar[str] = "qa"
    tfds_eval_data: ClassVar[str] = "each language's evaluation split (TFDS)"

    def _local_train(self, data_dir, train_fraction, select_fraction):
        return readers.read_squad_json(
            data_dir / "tydiqa" / "language_data" / "english" / "english_tydiqa_train.json"
        )

    def _local_select(self, data_dir, train_fraction, select_fraction):
        return None

    def _tfds_train(self, tfds_data_dir):
        rows, _ = tfds_readers.load("squad/v1.1", "train", tfds_data_dir)
        return tfds_readers.qa_examples(rows, training=True)

    def _tfds_eval(self, lang, tfds_data_dir):
        name, split = self.tfds_eval_source
        rows, _ = tfds_readers.load(name.format(lang=lang), split.format(lang=lang),
                                    tfds_data_dir)
        return tfds_readers.qa_examples(rows, training=False)

    def features(self, examples, tokenizer, settings):
        return features.qa_features(
            examples,
            tokenizer,
            max_seq_length=settings.max_seq_length,
            doc_stride=settings.doc_stride,
            max_query_length=settings.max_query_length,
        )

    def _normalization(self, lang: str) -> tuple[str, str | None]:
        """(answer normalisation of scorers.qa_scores, its language argument)."""
        return "squad", None

    def score(self, lang, examples, feats, outputs, settings):
        predictions = qa_decoding.compute_predictions(
            outputs[0], outputs[1], feats, examples,
            n_best=settings.n_best, max_answer_length=settings.max_answer_length,
            unknown_pieces=settings.qa_unknown_pieces,
        )
        refs = {e.id: list(e.answers) for e in examples}
        normalization, norm_lang = self._normalization(lang)
        scores = scorers.qa_scores(predictions, refs, normalization=normalization,
                                   lang=norm_lang)
        return scores, predictions


@dataclasses.dataclass(frozen=True)
class TyDiQATask(QATask):
    """TyDi QA GoldP: every language's dev file; TFDS trains on its English questions."""

    def _local_eval(self, lang, data_dir, train_fraction, select_fraction):
        folder = TYDIQA_FOLDERS[lang]
        return readers.read_squad_json(
            data_dir / "tydiqa" / "language_data" / folder / f"{folder}_tydiqa_dev.json"
        )

    def _tfds_train(self, tfds_data_dir):
        rows, _ = tfds_readers.load("tydi_qa/goldp", "train", tfds_data_dir)
        return tfds_readers.qa_examples(rows, training=True, id_prefix="english")


@dataclasses.dataclass(frozen=True)
class XQuADTask(QATask):
    """XQuAD: ``xquad.<lang>.json``."""

    def _local_eval(self, lang, data_dir, train_fraction, select_fraction):
        return readers.read_squad_json(data_dir / "xquad" / f"xquad.{lang}.json")


@dataclasses.dataclass(frozen=True)
class MLQATask(QATask):
    """MLQA dev, context and question in the same language; MLQA's answer normalisation."""

    def _local_eval(self, lang, data_dir, train_fraction, select_fraction):
        return readers.read_squad_json(
            data_dir / "mlqa" / "MLQA_V1" / "dev" / f"dev-context-{lang}-question-{lang}.json"
        )

    def _normalization(self, lang):
        # MLQA's evaluation script normalises answers per language.
        return "mlqa", lang


TYDIQA = TyDiQATask(
    name="tydiqa",
    languages=tuple(TYDIQA_FOLDERS),
    metric="f1",
    local_data=(*_TYDIQA_TRAIN, "TyDi QA GoldP dev per language"),
    # XTREME (838c13b) fine-tunes TyDi QA GoldP on its own English training set too.
    local_differences=(),
    tfds_languages=tuple(TYDIQA_FOLDERS),
    tfds_eval_source=("tydi_qa/goldp", "validation-{lang}"),
)

XQUAD = XQuADTask(
    name="xquad",
    languages=tuple("ar de el en es hi ro ru th tr vi zh".split()),
    metric="f1",
    local_data=(*_TYDIQA_TRAIN, "XQuAD per language"),
    local_differences=(_SQUAD_INSTEAD,),
    # XQuAD's Romanian is not in TFDS.
    tfds_languages=("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh"),
    tfds_eval_source=("xquad/{lang}", "test"),
)

MLQA_LANGUAGES = tuple("ar de en es hi vi zh".split())

MLQA = MLQATask(
    name="mlqa",
    languages=MLQA_LANGUAGES,
    metric="f1",
    local_data=(*_TYDIQA_TRAIN, "MLQA dev (context and question in the same language)"),
    local_differences=(_SQUAD_INSTEAD, "evaluated on dev instead of test"),
    tfds_languages=MLQA_LANGUAGES,
    tfds_eval_source=("mlqa/{lang}", "test"),
)
