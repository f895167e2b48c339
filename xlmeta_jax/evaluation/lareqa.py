"""LAReQA (Roy et al., 2020): language-agnostic answer retrieval from a multilingual pool.

XQuAD-R and MLQA-R turn the extractive QA sets into retrieval: every question, in every
language, retrieves from one pool holding every sentence of every paragraph of every
language; its correct answers are the sentences holding its answer in each language (the
question's translations share its id: 11 answers in XQuAD-R, 2 to 4 in MLQA-R's dev set).
The score is mAP@20. The pool is built as the authors' evaluation code
(``utils_lareqa.load_data``/``generate_examples``) builds it, and the score as its
``mean_avg_prec_at_k`` computes it: questions and candidates in file order, a candidate per
(paragraph, sentence position), the answer's sentence the one whose span holds
``answer_start`` (a question whose answer start falls between sentences is skipped), the
dot product of the unit embeddings ranked by ``numpy.argsort`` descending, and AP@k divided
by ``min(answers, k)``.

Differences, stated with every result (``DIFFERENCES``):

* sentence breaks: the released XQuAD-R / MLQA-R files carry the authors' breaks; the
  shared data holds XQuAD and MLQA without them, so :func:`sentence_breaks` splits after
  sentence-final punctuation (``. ! ?`` followed by a space; ``。！？`` anywhere; Arabic
  ``؟``, Devanagari ``। ॥``). Candidate counts differ from the paper's table (Thai, which
  has no sentence punctuation, keeps its paragraphs mostly whole, as the paper's 852
  Thai candidates suggest theirs did too);
* candidates are embedded from their sentence alone (the paper's dual encoders read the
  sentence with its paragraph as context).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xlmeta_jax.evaluation import readers
from xlmeta_jax.evaluation.tasks.base import TaskError

K = 20
XQUAD_R_LANGUAGES = ("ar", "de", "el", "en", "es", "hi", "ru", "th", "tr", "vi", "zh")
MLQA_R_LANGUAGES = ("ar", "de", "en", "es", "hi", "vi", "zh")
DIFFERENCES = (
    "sentence breaks by punctuation (the released XQuAD-R/MLQA-R breaks are not in the "
    "shared data); candidates embedded from the sentence alone, without its paragraph")

# A sentence ends after . ! ? (and Arabic/Devanagari marks) before whitespace, or after a
# CJK full stop, exclamation or question mark.
_BREAK = re.compile(r"(?<=[.!?؟।॥])\s+|(?<=[。！？])")


@dataclasses.dataclass(frozen=True)
class Pool:
    """Questions, candidates and which candidates answer which question."""

    # (text, xling id, language) in file order, language after language.
    questions: list[tuple[str, str, str]]
    # (sentence, language) in order of first appearance.
    candidates: list[tuple[str, str]]
    # xling id -> candidate indices (one per language that has the answer).
    answers: dict[str, list[int]]
    skipped: int


def sentence_breaks(context: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the context's sentences, without outer spaces."""
    spans, start = [], 0
    for m in _BREAK.finditer(context):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(context)))
    out = []
    for a, b in spans:
        text = context[a:b]
        stripped = text.strip()
        if stripped:
            a += len(text) - len(text.lstrip())
            out.append((a, a + len(stripped)))
    return out


def build_pool(squad_by_language: dict[str, dict]) -> Pool:
    """The pool of SQuAD-format data per language (see module doc)."""
    questions, candidates = [], []
    index: dict[tuple[str, int], int] = {}
    answers: dict[str, list[int]] = collections.defaultdict(list)
    skipped = 0
    for lang, squad in squad_by_language.items():
        paragraphs = 0
        for article in squad["data"]:
            for paragraph in article["paragraphs"]:
                paragraphs += 1
                context = paragraph["context"]
                breaks = sentence_breaks(context)
                for qa in paragraph["qas"]:
                    start = qa["answers"][0]["answer_start"]
                    position = next((i for i, (a, b) in enumerate(breaks) if a <= start < b),
                                    None)
                    if position is None:
                        skipped += 1
                        continue
                    questions.append((qa["question"], qa["id"], lang))
                    sentence = context[slice(*breaks[position])]
                    for pos, (a, b) in enumerate(breaks):
                        key = (f"{lang}_{paragraphs}", pos)
                        if key not in index:
                            index[key] = len(candidates)
                            candidates.append((context[a:b], lang))
                        # As the reference: every sentence of the paragraph equal to the
                        # answer's is an answer.
                        if context[a:b] == sentence and index[key] not in answers[qa["id"]]:
                            answers[qa["id"]].append(index[key])
    return Pool(questions, candidates, dict(answers), skipped)


def average_precision_at_k(targets: Sequence[int], ranked: Sequence[int],
                           k: int | None = K) -> float:
    """AP@k of a ranking: the precision at each new correct candidate among the first k,
    summed, over ``min(len(targets), k)``."""
    ranked = list(ranked[:k] if k else ranked)
    targets = set(int(t) for t in targets)
    score, hits = 0.0, 0.0
    for i, prediction in enumerate(ranked):
        if prediction in targets and prediction not in ranked[:i]:
            hits += 1.0
            score += hits / (i + 1.0)
    return score / (min(len(targets), k) if k else len(targets))


def mean_average_precision(pool: Pool, question_vectors: np.ndarray,
                           candidate_vectors: np.ndarray, k: int = K,
                           block: int = 256) -> dict[str, Any]:
    """mAP@k over all questions, and over each question language's."""
    per_question = np.zeros(len(pool.questions))
    for i in range(0, len(pool.questions), block):
        scores = question_vectors[i:i + block] @ candidate_vectors.T
        for j, row in enumerate(scores):
            _, xling_id, _ = pool.questions[i + j]
            per_question[i + j] = average_precision_at_k(
                pool.answers[xling_id], row.argsort()[::-1], k)
    by_lang: dict[str, list[float]] = collections.defaultdict(list)
    for (_, _, lang), ap in zip(pool.questions, per_question):
        by_lang[lang].append(ap)
    return {"map": float(np.mean(per_question)),
            "languages": {lang: {"map_at_20": 100 * float(np.mean(v)), "num_examples": len(v)}
                          for lang, v in by_lang.items()}}


def read(dataset: str, data_dir=None, languages: Sequence[str] | None = None
         ) -> dict[str, dict]:
    """SQuAD-format data per language: XQuAD's test files, or MLQA's dev files
    (``dev-context-X-question-X.json``)."""
    root = readers.resolve_data_dir(data_dir)
    if dataset == "xquad_r":
        langs = languages or XQUAD_R_LANGUAGES
        paths = {lang: root / "xquad" / f"xquad.{lang}.json" for lang in langs}
        known = XQUAD_R_LANGUAGES
    elif dataset == "mlqa_r":
        langs = languages or MLQA_R_LANGUAGES
        folder = root / "mlqa" / "MLQA_V1" / "dev"
        paths = {lang: folder / f"dev-context-{lang}-question-{lang}.json" for lang in langs}
        known = MLQA_R_LANGUAGES
    else:
        raise TaskError(f"unknown LAReQA set {dataset!r}; one of ('xquad_r', 'mlqa_r')")
    unknown = [lang for lang in langs if lang not in known]
    if unknown:
        raise TaskError(f"{dataset}: unknown languages {unknown}; {dataset}'s: {known}")
    out = {}
    for lang, path in paths.items():
        if not pathlib.Path(path).is_file():
            raise TaskError(f"{dataset} {lang}: no {path}")
        out[lang] = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    return out


def evaluate(encode: Callable[[Sequence[str]], np.ndarray], squad_by_language: dict[str, dict],
             k: int = K) -> dict[str, Any]:
    """mAP@k of an embedder (``encode(texts) -> unit vectors``) on one LAReQA set."""
    pool = build_pool(squad_by_language)
    questions = encode([q for q, _, _ in pool.questions])
    candidates = encode([c for c, _ in pool.candidates])
    result = mean_average_precision(pool, questions, candidates, k)
    candidates_by_lang = collections.Counter(lang for _, lang in pool.candidates)
    for lang, v in result["languages"].items():
        v["candidates"] = candidates_by_lang[lang]
    return {**result, "pool": {"questions": len(pool.questions),
                               "candidates": len(pool.candidates), "skipped": pool.skipped},
            "differences": DIFFERENCES}
