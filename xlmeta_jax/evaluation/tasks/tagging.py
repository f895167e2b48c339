"""Sequence tagging on each word's first sub-token: PAN-X (NER) and UD POS.

PAN-X: English train trains; English dev is split (its first ``select_fraction``
selects the checkpoint, the rest is English's evaluation set); every other language's
dev set is evaluated. Entity F1 (seqeval).

UD POS: the English-EWT dev set trains, the English-EWT test set is the English
development set for model selection, and the 19 parallel PUD test sets (ar cs de en es
fi fr hi id is it ko pl pt ru sv th tr zh) are evaluated, every language's sentences put
in English-PUD's order by ``# sent_id`` (Icelandic lists them sorted by id), so that the
first N sentences are the same sentences in every language. The XTREME
``xtreme_udpos/test-*.tsv`` export is not used (it was corrupt);
:func:`xlmeta_jax.evaluation.readers.read_token_tag_tsv` rejects such files with the
line number. Headline: F1 over the tag sequence as XTREME's evaluate.py, accuracy beside.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from xlmeta_jax.evaluation import features, readers, scorers, splits, tfds_readers
from xlmeta_jax.evaluation.tasks.base import FineTunedTask, TaskError

PANX_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
PANX_LANGUAGES = tuple(
    "af ar az bg bn de el en es et eu fa fi fr gu he hi hu id it ja jv ka kk ko lt ml mr ms "
    "my nl pa pl pt qu ro ru sw ta te tl tr uk ur vi yo zh".split()
)
# English training (EWT dev) and model-selection (EWT test) treebanks of UD POS.
UD_TRAIN_FILE = "UD_English-EWT/en_ewt-ud-dev.conllu"
UD_SELECT_FILE = "UD_English-EWT/en_ewt-ud-test.conllu"
# The 19 parallel PUD test treebanks: language -> folder name.
UD_PUD = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fi": "Finnish", "fr": "French", "hi": "Hindi", "id": "Indonesian", "is": "Icelandic",
    "it": "Italian", "ko": "Korean", "pl": "Polish", "pt": "Portuguese", "ru": "Russian",
    "sv": "Swedish", "th": "Thai", "tr": "Turkish", "zh": "Chinese",
}
UD_TEST_FILES = {
    lang: f"UD_{name}-PUD/{lang}_pud-ud-test.conllu" for lang, name in UD_PUD.items()
}


@dataclasses.dataclass(frozen=True)
class TaggingTask(FineTunedTask):
    """A word-tagging task (tags predicted on each word's first sub-token)."""

    head: ClassVar[str] = "tagging"
    # run_tag.py steps its scheduler before the optimizer.
    schedule_offset: ClassVar[int] = 1

    def features(self, examples, tokenizer, settings):
        return features.tagging_features(examples, tokenizer, self.labels,
                                         settings.max_seq_length)

    def tag_scores(self, gold: list[list[str]], predicted: list[list[str]]) -> dict:
        """Scores of predicted tag sequences (default: entity F1, seqeval)."""
        return scorers.entity_f1(gold, predicted)

    def score(self, lang, examples, feats, outputs, settings):
        tags = features.decode_tags(outputs, feats, examples, self.labels)
        return self.tag_scores([list(e.tags) for e in examples], tags), None


@dataclasses.dataclass(frozen=True)
class PANXTask(TaggingTask):
    """PAN-X (WikiANN) NER, XTREME's split; ``wikiann/<lang>`` from TFDS."""

    tfds_select_data: ClassVar[str | None] = "English validation split (TFDS)"

    def _english_dev(self, data_dir, select_fraction, part):
        # XTREME selects on English dev and scores English test; without labelled test
        # data here, English dev is split so that selection and English's score do not
        # overlap.
        rows = readers.read_token_tag_tsv(data_dir / "panx" / "dev-en.tsv", self.labels,
                                          "panx-en-")
        if select_fraction == 0:
            return rows if part == "eval" else None
        parts = splits.holdout_split([e.tokens for e in rows], select_fraction)
        return [rows[i] for i in parts[part]]

    def _local_train(self, data_dir, train_fraction, select_fraction):
        return readers.read_token_tag_tsv(data_dir / "panx" / "train-en.tsv", self.labels,
                                          "panx-en-train-")

    def _local_select(self, data_dir, train_fraction, select_fraction):
        return self._english_dev(data_dir, select_fraction, "select")

    def _local_eval(self, lang, data_dir, train_fraction, select_fraction):
        if lang == "en":
            return self._english_dev(data_dir, select_fraction, "eval")
        return readers.read_token_tag_tsv(data_dir / "panx" / f"dev-{lang}.tsv", self.labels,
                                          f"panx-{lang}-")

    def _tfds_train(self, tfds_data_dir):
        return tfds_readers.wikiann("en", "train", tfds_data_dir, self.labels)

    def _tfds_select(self, tfds_data_dir):
        return tfds_readers.wikiann("en", "validation", tfds_data_dir, self.labels)

    def _tfds_eval(self, lang, tfds_data_dir):
        return tfds_readers.wikiann(lang, "test", tfds_data_dir, self.labels)


@dataclasses.dataclass(frozen=True)
class UDPOSTask(TaggingTask):
    """UD POS: EWT trains and selects, the PUD treebanks are evaluated (module docstring)."""

    def _local_train(self, data_dir, train_fraction, select_fraction):
        return readers.read_conllu_upos(data_dir / "ud" / UD_TRAIN_FILE)

    def _local_select(self, data_dir, train_fraction, select_fraction):
        return readers.read_conllu_upos(data_dir / "ud" / UD_SELECT_FILE)

    def _local_eval(self, lang, data_dir, train_fraction, select_fraction):
        rows = readers.read_conllu_upos(data_dir / "ud" / UD_TEST_FILES[lang])
        if lang == "en":
            return rows
        order = [ex.id for ex in readers.read_conllu_upos(data_dir / "ud" / UD_TEST_FILES["en"])]
        by_id = {ex.id: ex for ex in rows}
        if set(by_id) != set(order):
            raise TaskError(f"udpos: {UD_TEST_FILES[lang]} does not hold the same # sent_id "
                            "set as English PUD")
        return [by_id[i] for i in order]

    def tag_scores(self, gold, predicted):
        # XTREME scores UD-POS with seqeval's F1 over the tag sequence (evaluate.py).
        return scorers.tag_f1(gold, predicted)


PANX = PANXTask(
    name="panx",
    languages=PANX_LANGUAGES,
    metric="f1",
    labels=PANX_LABELS,
    local_data=("WikiANN English train (XTREME split)", "WikiANN English dev, the first tenth",
                "WikiANN dev per language; English: the rest of English dev"),
    local_differences=("evaluated on dev instead of test",
                       "selected on a tenth of English dev, English scored on the rest of it"),
    tfds_languages=PANX_LANGUAGES,
)

UDPOS = UDPOSTask(
    name="udpos",
    languages=tuple(UD_TEST_FILES),
    metric="f1",
    labels=readers.UPOS_LABELS,
    local_data=("UD English-EWT dev", "UD English-EWT test",
                "the 19 PUD test treebanks, sentences in English-PUD's order"),
    local_differences=("trained on EWT dev (2k sentences) instead of the English UD "
                       "training treebanks", "evaluated on PUD test sets only (XTREME: all "
                       "test treebanks of each language); cs, is, sv are not XTREME "
                       "languages"),
    scoring=f"F1 as {scorers.POS_F1_READING} computes it (the whole tag is the chunk type; "
            "XTREME's published numbers), not seqeval 1.2 (which merges CCONJ and SCONJ "
            "into CONJ)",
)
