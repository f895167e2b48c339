"""Metrics of the zero-shot cross-lingual benchmarks, computed as the official scripts do.

* Extractive QA (TyDi QA GoldP, XQuAD): exact match and token F1 of the SQuAD v1.1
  ``evaluate-v1.1.py`` script (lower-case, drop ASCII punctuation and English articles,
  split on whitespace; maximum over the gold answers; 100 x mean over questions).
* MLQA: the same metrics with the normalisation of MLQA's ``mlqa_evaluation_v1.py``:
  Unicode punctuation (every ``P*`` category plus ASCII punctuation), per-language
  articles, and for Chinese a mixed segmentation in which every CJK character and
  punctuation mark is its own token.
* Token tagging: micro F1 as ``seqeval`` computes it by default (conlleval chunking) —
  over entities of IOB/IOBES tags for NER, and, as XTREME's ``evaluate.py`` does for
  UD POS, over the raw tag sequence as seqeval 0.0.12 (behind XTREME's published
  numbers) reads it: a tag's first character is its prefix and the whole tag its type,
  so runs of one tag form a chunk; token accuracy for POS beside it.
* Sentence classification: accuracy.
* Sentence retrieval (Tatoeba): cosine nearest-neighbour accuracy in both directions.
* Bitext mining (BUCC): F1 of the mined pairs at the threshold tuned as XTREME's
  ``bucc_optimize`` (midpoint between consecutive scores), extracted as ``bucc_extract``.

All scores that the scripts report in percent are returned in percent.
"""

from __future__ import annotations

import collections
import functools
import re
import string
import sys
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

# ----------------------------------------------------------------------------------------
# SQuAD v1.1
# ----------------------------------------------------------------------------------------

_SQUAD_PUNCT = frozenset(string.punctuation)


def squad_normalize(text: str) -> str:
    """SQuAD v1.1 ``normalize_answer``: lower, drop punctuation, articles, extra spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _SQUAD_PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(prediction_tokens: Sequence[str], ground_truth_tokens: Sequence[str]) -> float:
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_f1(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 (in [0, 1]) of one prediction against one gold answer."""
    return _token_f1(squad_normalize(prediction).split(), squad_normalize(ground_truth).split())


def squad_exact_match(prediction: str, ground_truth: str) -> bool:
    """Whether the normalised prediction equals the normalised gold answer."""
    return squad_normalize(prediction) == squad_normalize(ground_truth)


# ----------------------------------------------------------------------------------------
# MLQA
# ----------------------------------------------------------------------------------------

@functools.cache
def mlqa_punctuation() -> frozenset[str]:
    """Every Unicode punctuation character plus ASCII punctuation (ASCII symbols such as
    '$' or '+' are category S*, so the union matters). Built on first use: a scan of
    every code point, which every command importing the scorers would otherwise pay."""
    return frozenset(
        {chr(i) for i in range(sys.maxunicode) if unicodedata.category(chr(i)).startswith("P")}
        | set(string.punctuation))

# Languages the MLQA script splits on whitespace / with mixed CJK segmentation.
MLQA_WHITESPACE_LANGS = ("en", "es", "hi", "vi", "de", "ar")
MLQA_MIXED_SEGMENTATION_LANGS = ("zh",)
MLQA_LANGUAGES = MLQA_WHITESPACE_LANGS + MLQA_MIXED_SEGMENTATION_LANGS

_MLQA_ARTICLES = {
    "en": re.compile(r"\b(a|an|the)\b"),
    "es": re.compile(r"\b(un|una|unos|unas|el|la|los|las)\b"),
    "vi": re.compile(r"\b(của|là|cái|chiếc|những)\b"),
    "de": re.compile(r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b"),
    # Verbatim from the script: its first alternative can never match, so every "ال"
    # (the definite article, wherever it occurs) becomes a space.
    "ar": re.compile(r"\sال^|ال"),
}
_CJK = re.compile(r"[\u4e00-\u9fa5]")


def mlqa_mixed_segmentation(text: str) -> list[str]:
    """MLQA's Chinese tokenisation: each CJK character / punctuation mark is a token."""
    segs, pending, punct = [], "", mlqa_punctuation()
    for char in text:
        if _CJK.search(char) or char in punct:
            if pending:
                segs.extend(pending.split())
                pending = ""
            segs.append(char)
        else:
            pending += char
    if pending:
        segs.extend(pending.split())
    return segs


def _check_mlqa_lang(lang: str) -> None:
    if lang not in MLQA_LANGUAGES:
        raise ValueError(
            f"MLQA normalisation is defined for languages {list(MLQA_LANGUAGES)}; got "
            f"{lang!r} (use the SQuAD normalisation for other languages)"
        )


def mlqa_normalize(text: str, lang: str) -> str:
    """``normalize_answer(s, lang)`` of MLQA's evaluation script."""
    _check_mlqa_lang(lang)
    text = text.lower()
    punct = mlqa_punctuation()
    text = "".join(ch for ch in text if ch not in punct)
    if lang in _MLQA_ARTICLES:
        text = _MLQA_ARTICLES[lang].sub(" ", text)
    if lang in MLQA_MIXED_SEGMENTATION_LANGS:
        tokens = mlqa_mixed_segmentation(text)
    else:
        tokens = text.split()
    return " ".join(t for t in tokens if t.strip())


def mlqa_f1(prediction: str, ground_truth: str, lang: str) -> float:
    """MLQA token F1 (in [0, 1]); zh is compared character by character."""
    return _token_f1(
        mlqa_normalize(prediction, lang).split(), mlqa_normalize(ground_truth, lang).split()
    )


def mlqa_exact_match(prediction: str, ground_truth: str, lang: str) -> bool:
    """Whether MLQA-normalised prediction and gold answer are equal."""
    return mlqa_normalize(prediction, lang) == mlqa_normalize(ground_truth, lang)


# ----------------------------------------------------------------------------------------
# QA aggregation
# ----------------------------------------------------------------------------------------

def _squad_metrics(lang: str | None):
    return squad_exact_match, squad_f1


def _mlqa_metrics(lang: str | None):
    if lang is None:
        raise ValueError("qa_scores(normalization='mlqa') needs lang")
    _check_mlqa_lang(lang)
    return (lambda p, g: mlqa_exact_match(p, g, lang)), (lambda p, g: mlqa_f1(p, g, lang))


# Answer normalisation -> (exact match, F1) of a language.
_QA_METRICS: dict[str, Callable[[str | None], tuple[Callable, Callable]]] = {
    "squad": _squad_metrics, "mlqa": _mlqa_metrics,
}
QA_NORMALIZATIONS = tuple(_QA_METRICS)


def qa_scores(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    *,
    normalization: str = "squad",
    lang: str | None = None,
) -> dict[str, float]:
    """Exact match and F1 (percent) over questions, as the official ``evaluate`` functions.

    Args:
      predictions: question id -> predicted answer text.
      references: question id -> list of gold answer texts. Every reference counts in
        the denominator; a question without a prediction scores 0 (as the scripts do).
      normalization: "squad" (SQuAD v1.1; TyDi QA GoldP, XQuAD) or "mlqa".
      lang: language code, required for "mlqa".

    Returns:
      {"exact_match": ..., "f1": ..., "num_examples": ..., "num_missing": ...}.
    """
    if normalization not in _QA_METRICS:
        raise ValueError(
            f"unknown QA normalization {normalization!r}; expected one of {QA_NORMALIZATIONS}"
        )
    em_fn, f1_fn = _QA_METRICS[normalization](lang)
    if not references:
        raise ValueError("qa_scores: no reference questions")
    em = f1 = 0.0
    missing = 0
    for qid, golds in references.items():
        if not golds:
            raise ValueError(f"qa_scores: question {qid!r} has no gold answer")
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        em += max(float(em_fn(pred, g)) for g in golds)
        f1 += max(f1_fn(pred, g) for g in golds)
    n = len(references)
    return {
        "exact_match": 100.0 * em / n,
        "f1": 100.0 * f1 / n,
        "num_examples": n,
        "num_missing": missing,
    }


# ----------------------------------------------------------------------------------------
# Sequence labelling (seqeval's default, conlleval-compatible chunking)
# ----------------------------------------------------------------------------------------


# How a tag that is not IOB (a UPOS tag) is split into prefix and type.
# "seqeval-0.0.12": ``tag[0]`` and ``tag.split("-")[-1]`` — the whole tag is the type.
# XTREME's published UD-POS numbers were computed with this seqeval.
# "seqeval-1.2": ``tag[0]`` and ``tag[1:].split("-", 1)[-1] or "_"`` — so CCONJ and
# SCONJ share the type "CONJ" and "X" shares "O"'s type "_".
TAG_READINGS = ("seqeval-0.0.12", "seqeval-1.2")


def _split_tag(tag: str, reading: str | None = None) -> tuple[str, str]:
    if reading == "seqeval-0.0.12":
        return tag[0], tag.split("-")[-1]
    if reading == "seqeval-1.2":
        return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"
    if tag == "O":
        return "O", "_"
    prefix, sep, type_ = tag.partition("-")
    if prefix not in ("B", "I", "E", "S") or not sep or not type_:
        raise ValueError(
            f"invalid tag {tag!r}: expected 'O' or B-/I-/E-/S- followed by an entity type"
        )
    return prefix, type_


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    # Both seqeval versions exempt a "." prefix (their conlleval heritage).
    return prev_tag not in ("O", ".") and prev_type != type_


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def get_entities(
    tags: Sequence[str], reading: str | None = None
) -> list[tuple[str, int, int]]:
    """Entity chunks ``(type, first, last)`` of one tag sequence (IOB1/IOB2/IOBES).

    Matches ``seqeval.metrics.sequence_labeling.get_entities``: an ``I-X`` after ``O`` or
    after another type starts a new entity, a type change ends one. ``reading=None``
    accepts only IOB/IOBES tags; otherwise any tag is accepted and split as that
    version of seqeval splits it (one of :data:`TAG_READINGS`; POS tags).
    """
    if reading is not None and reading not in TAG_READINGS:
        raise ValueError(f"unknown tag reading {reading!r}; expected one of {TAG_READINGS}")
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, chunk in enumerate(list(tags) + ["O"]):
        tag, type_ = _split_tag(chunk, reading)
        if _end_of_chunk(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _start_of_chunk(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def entity_f1(
    y_true: Sequence[Sequence[str]],
    y_pred: Sequence[Sequence[str]],
    *,
    reading: str | None = None,
) -> dict[str, float]:
    """Micro-averaged entity precision / recall / F1 (percent), seqeval's default mode.

    Args:
      y_true: gold tag sequences, one per sentence.
      y_pred: predicted tag sequences, same lengths.
      reading: None rejects tags that are not IOB/IOBES (NER); one of
        :data:`TAG_READINGS` scores any tag set as that seqeval does (XTREME's UD-POS
        F1, see :func:`tag_f1`).
    """
    if len(y_true) != len(y_pred):
        raise ValueError(f"entity_f1: {len(y_true)} gold sentences but {len(y_pred)} predicted")
    for i, (t, p) in enumerate(zip(y_true, y_pred)):
        if len(t) != len(p):
            raise ValueError(
                f"entity_f1: sentence {i} has {len(t)} gold tags but {len(p)} predicted"
            )
    # As seqeval: one sequence, an "O" after every sentence (which matters for tags whose
    # type equals "O"'s, such as UPOS "X" read by seqeval 1.2).
    true_ents = set(get_entities([x for t in y_true for x in [*t, "O"]], reading))
    pred_ents = set(get_entities([x for p in y_pred for x in [*p, "O"]], reading))
    correct = len(true_ents & pred_ents)
    precision = correct / len(pred_ents) if pred_ents else 0.0
    recall = correct / len(true_ents) if true_ents else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "f1": 100.0 * f1,
        "precision": 100.0 * precision,
        "recall": 100.0 * recall,
        "num_examples": len(y_true),
    }


# The headline UD-POS F1's definition, recorded in every UD-POS results.json.
POS_F1_READING = "seqeval-0.0.12"


def tag_f1(
    y_true: Sequence[Sequence[str]],
    y_pred: Sequence[Sequence[str]],
    *,
    reading: str = POS_F1_READING,
) -> dict:
    """XTREME's UD-POS score: seqeval F1 over the raw tag sequences, plus token accuracy.

    Args:
      y_true: gold tag sequences, one per sentence.
      y_pred: predicted tag sequences, same lengths.
      reading: how seqeval splits a tag (:data:`TAG_READINGS`). The default is the
        seqeval (0.0.12) behind XTREME's published numbers, which keeps the whole tag as
        its type; "seqeval-1.2" merges CCONJ and SCONJ.

    Returns:
      {"f1", "precision", "recall", "accuracy", "num_examples"} (percent).
    """
    return {**token_accuracy(y_true, y_pred), **entity_f1(y_true, y_pred, reading=reading)}


def token_accuracy(
    y_true: Sequence[Sequence[str]], y_pred: Sequence[Sequence[str]]
) -> dict[str, float]:
    """Accuracy (percent) over all tokens of all sentences (UD POS)."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"token_accuracy: {len(y_true)} gold sentences, {len(y_pred)} predicted")
    correct = total = 0
    for i, (t, p) in enumerate(zip(y_true, y_pred)):
        if len(t) != len(p):
            raise ValueError(f"token_accuracy: sentence {i}: {len(t)} gold vs {len(p)} tags")
        correct += sum(a == b for a, b in zip(t, p))
        total += len(t)
    if total == 0:
        raise ValueError("token_accuracy: no tokens")
    return {"accuracy": 100.0 * correct / total, "num_examples": len(y_true)}


# ----------------------------------------------------------------------------------------
# Classification and retrieval
# ----------------------------------------------------------------------------------------


def accuracy(labels: Iterable, predictions: Iterable) -> dict[str, float]:
    """Accuracy (percent) of predicted labels."""
    labels, predictions = np.asarray(list(labels)), np.asarray(list(predictions))
    if labels.shape != predictions.shape:
        raise ValueError(f"accuracy: {labels.shape} labels vs {predictions.shape} predictions")
    if labels.size == 0:
        raise ValueError("accuracy: no examples")
    return {"accuracy": 100.0 * float(np.mean(labels == predictions)), "num_examples": labels.size}


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def retrieval_accuracy(source: np.ndarray, target: np.ndarray) -> dict[str, float]:
    """Cosine nearest-neighbour accuracy (percent) of aligned embeddings, both directions.

    Row i of ``source`` is the translation of row i of ``target`` (Tatoeba).

    Returns:
      {"src2tgt": share of source rows whose nearest target is their translation,
       "tgt2src": the reverse, "num_examples": rows}.
    """
    if source.ndim != 2 or source.shape != target.shape:
        raise ValueError(
            f"retrieval_accuracy: need two [n, d] arrays of one shape, got {source.shape} "
            f"and {target.shape}"
        )
    sim = _unit_rows(source) @ _unit_rows(target).T
    gold = np.arange(sim.shape[0])
    return {
        "src2tgt": 100.0 * float(np.mean(sim.argmax(axis=1) == gold)),
        "tgt2src": 100.0 * float(np.mean(sim.argmax(axis=0) == gold)),
        "num_examples": int(sim.shape[0]),
    }


def bitext_mining_f1(
    candidates: Sequence[tuple[str, str, float]], gold: set[tuple[str, str]]
) -> dict[str, float]:
    """BUCC F1 (percent) of mined pairs at the threshold XTREME tunes on gold pairs.

    As ``utils_retrieve.bucc_optimize`` / ``bucc_extract``: candidates ranked by score
    (ties by source then target id, so the result does not depend on input order); the
    threshold is the midpoint between the scores of the F1-maximising prefix's last pair
    and the next one; every pair scoring at least the threshold is extracted and scored.

    Args:
      candidates: (source id, target id, score) mined pairs (one per id pair).
      gold: set of gold (source id, target id) pairs.

    Returns:
      {"f1", "precision", "recall", "threshold", "num_mined"}.
    """
    if not gold:
        raise ValueError("bitext_mining_f1: no gold pairs")
    ranked = sorted(candidates, key=lambda c: (-c[2], c[0], c[1]))
    threshold, best_f1, correct = float("inf"), 0.0, 0
    for k, (s, t, score) in enumerate(ranked, start=1):
        correct += (s, t) in gold
        if correct == 0:
            continue
        f1 = 2 * correct / (k + len(gold))
        if f1 > best_f1:
            best_f1 = f1
            nxt = ranked[k][2] if k < len(ranked) else score
            threshold = (score + nxt) / 2
    extracted = {(s, t) for s, t, score in ranked if score >= threshold}
    ncorrect = len(extracted & set(gold))
    precision = ncorrect / len(extracted) if ncorrect else 0.0
    recall = ncorrect / len(gold)
    f1 = 2 * precision * recall / (precision + recall) if ncorrect else 0.0
    return {
        "f1": 100.0 * f1,
        "precision": 100.0 * precision,
        "recall": 100.0 * recall,
        "threshold": float(threshold),
        "num_mined": len(ranked),
    }


# ----------------------------------------------------------------------------------------
# Cross-lingual summary
# ----------------------------------------------------------------------------------------


def transfer_summary(
    per_language: Mapping[str, Mapping[str, float]], metric: str, source_language: str = "en"
) -> dict[str, float | None]:
    """Averages of one metric over languages and the cross-lingual transfer gap.

    Returns:
      {"average": mean over all evaluated languages (XTREME's convention),
       "average_target": mean over languages other than ``source_language``,
       "english": the source-language score (None if not evaluated),
       "transfer_gap": english - average_target (None without both)}.
    """
    if not per_language:
        raise ValueError("transfer_summary: no languages")
    for lang, scores in per_language.items():
        if metric not in scores:
            raise ValueError(f"transfer_summary: language {lang!r} has no metric {metric!r}")
    values = {lang: float(s[metric]) for lang, s in per_language.items()}
    targets = [v for lang, v in values.items() if lang != source_language]
    english = values.get(source_language)
    average_target = float(np.mean(targets)) if targets else None
    return {
        "average": float(np.mean(list(values.values()))),
        "average_target": average_target,
        "english": english,
        "transfer_gap": (
            english - average_target
            if english is not None and average_target is not None
            else None
        ),
    }
