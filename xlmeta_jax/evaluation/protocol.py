"""Where each number's data comes from, and how it differs from XTREME's protocol.

Every results.json carries a ``provenance`` entry built here: the data source, the
training / selection / evaluation sets, and ``comparable_to_xtreme`` with the list of
``differences`` that make a number not comparable with XTREME's published ones.
``python -m xlmeta_jax.tools.report`` refuses to put runs whose data source or settings
differ in one comparison unless told to. docs/evaluation.md lists the same differences.
"""

from __future__ import annotations

from typing import Any

from xlmeta_jax.evaluation import readers, scorers

# What each task trains, selects and evaluates on, from the local shared data.
LOCAL_DATA = {
    "xnli": ("English dev, first half by premise groups, minus the selection part",
             "English dev, the last tenth of the training half",
             "each language's dev, second half (premises unseen in training)"),
    "pawsx": ("English dev, first half by groups of pairs sharing a sentence, minus the "
              "selection part",
              "English dev, the last tenth of the training half",
              "each language's dev, second half (no sentence shared with training)"),
    "tydiqa": ("TyDi QA GoldP English train", None, "TyDi QA GoldP dev per language"),
    "xquad": ("TyDi QA GoldP English train", None, "XQuAD per language"),
    "mlqa": ("TyDi QA GoldP English train", None, "MLQA dev (context and question in the "
             "same language)"),
    "panx": ("WikiANN English train (XTREME split)", "WikiANN English dev, the first tenth",
             "WikiANN dev per language; English: the rest of English dev"),
    "udpos": ("UD English-EWT dev", "UD English-EWT test",
              "the 19 PUD test treebanks, sentences in English-PUD's order"),
    "tatoeba": (None, None, "LASER Tatoeba v1 test pairs"),
    "bucc": (None, None, "BUCC 2018 zh-en dev (threshold tuned on the same dev gold)"),
}

# Why a local-data number is not XTREME's number (docs/evaluation.md lists the same).
LOCAL_DIFFERENCES = {
    "xnli": ["trained on ~1000 English dev pairs instead of MultiNLI's 393k training pairs",
             "evaluated on half of dev instead of test"],
    "pawsx": ["trained on ~800 English dev pairs instead of 49k PAWS training pairs",
              "evaluated on half of dev instead of test"],
    # XTREME (838c13b) fine-tunes TyDi QA GoldP on its own English training set too.
    "tydiqa": [],
    "xquad": ["fine-tuned on TyDi QA GoldP English (3.7k questions) instead of SQuAD v1.1 "
              "(88k)"],
    "mlqa": ["fine-tuned on TyDi QA GoldP English (3.7k questions) instead of SQuAD v1.1 "
             "(88k)", "evaluated on dev instead of test"],
    "panx": ["evaluated on dev instead of test",
             "selected on a tenth of English dev, English scored on the rest of it"],
    "udpos": ["trained on EWT dev (2k sentences) instead of the English UD training "
              "treebanks", "evaluated on PUD test sets only (XTREME: all test treebanks of "
              "each language); cs, is, sv are not XTREME languages"],
    "tatoeba": [],
    "bucc": ["dev instead of test, threshold tuned on the scored set (optimistic)",
             "zh-en only (XTREME: de fr ru zh)"],
}

# How a metric is defined where the versions of XTREME's scorers disagree.
SCORING = {
    "udpos": f"F1 as {scorers.POS_F1_READING} computes it (the whole tag is the chunk "
             "type; XTREME's published numbers), not seqeval 1.2 (which merges CCONJ and "
             "SCONJ into CONJ)",
}

# Differences that remain with TFDS data (none: TFDS has XTREME's splits).
TFDS_DIFFERENCES: dict[str, list[str]] = {}

# Settings whose non-default values make a run a demo or subsample, not XTREME's recipe.
_SUBSAMPLING = ("max_train_examples", "max_eval_examples", "train_steps")
# Retrieval fine-tunes nothing: of those settings only the evaluated sentences apply to it.
_RETRIEVAL_SUBSAMPLING = ("max_eval_examples",)


def provenance(task: str, data_source: str, data_dir: str | None, settings: dict,
               train_examples: int | None) -> dict[str, Any]:
    """The ``provenance`` entry of a results.json (see module docstring)."""
    differences: list[str] = []
    if data_source == "local":
        train, select, evaluate = LOCAL_DATA[task]
        differences += LOCAL_DIFFERENCES[task]
    else:
        train = "English training split (TFDS)"
        select = "English validation split (TFDS)" if task in ("xnli", "pawsx", "panx") else None
        evaluate = "each language's test split (TFDS)"
        differences += TFDS_DIFFERENCES.get(task, [])
        if task in ("xquad", "mlqa", "tydiqa"):
            evaluate = "each language's evaluation split (TFDS)"
    retrieval = readers.get_task(task).kind == "retrieval"
    for key in _RETRIEVAL_SUBSAMPLING if retrieval else _SUBSAMPLING:
        if settings.get(key) is not None:
            differences.append(f"{key}={settings[key]} (a subsample / demo run)")
    return {
        "data_source": data_source,
        "data_dir": data_dir,
        "train_data": train,
        "train_examples": train_examples,
        "selection_data": select,
        "eval_data": evaluate,
        "scoring": SCORING.get(task),
        "comparable_to_xtreme": not differences,
        "differences": differences,
    }
