"""Extractive-QA answer text from start / end logits, as XTREME computes it.

XTREME's ``run_squad.py`` decodes with Hugging Face's ``compute_predictions_logits``
(SQuAD v1.1: no null answer) and this module follows it step by step:

1. per window, the ``n_best`` highest start and end logits over *all* positions
   (``_get_best_indexes``; ties: lower position first);
2. a (start, end) pair is kept when both are context tokens, the window gives the
   start token its most context (``token_is_max_context``), ``end >= start`` and
   ``end - start + 1 <= max_answer_length``;
3. kept pairs of all windows are ranked by ``start_logit + end_logit``;
4. the text of a pair is :func:`get_final_text` of the pieces' text
   (``convert_tokens_to_string``: pieces joined, ``▁`` -> space, whitespace
   collapsed) within the *whole* whitespace words of the context that hold the span
   (``doc_tokens[orig_start : orig_end + 1]`` joined by spaces). The pieces are those
   of ``convert_ids_to_tokens``, so an unknown piece reads ``<unk>``, which is never
   found in the words: a span with one is answered with its whole words
   (``unknown_pieces="xtreme"``, the default; ``"text"`` keeps the piece's text);
5. the answer is the first such text (``"empty"`` when no pair is valid, as Hugging
   Face).

Step 4 is what makes answers whole words: when the piece text cannot be found in the
words tokenised by BERT's ``BasicTokenizer`` (e.g. Chinese, whose characters that
tokenizer spaces apart), the whole words are returned.
"""

from __future__ import annotations

import collections
import unicodedata
from collections.abc import Sequence

import numpy as np

from xlmeta_jax.evaluation.features import QAFeatures, doc_words
from xlmeta_jax.evaluation.readers import QAExample

SPIECE_UNDERLINE = "\u2581"
# XLM-R's unknown token, what convert_ids_to_tokens gives for the unknown id.
UNK_TOKEN = "<unk>"
UNKNOWN_PIECES = ("xtreme", "text")


# ----------------------------------------------------------------------------------------
# BERT's BasicTokenizer (do_lower_case=False), as get_final_text uses it
# ----------------------------------------------------------------------------------------


def _is_whitespace(c: str) -> bool:
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def _is_control(c: str) -> bool:
    if c in "\t\n\r":
        return False
    return unicodedata.category(c).startswith("C")


def _is_punctuation(c: str) -> bool:
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def basic_tokenize(text: str) -> list[str]:
    """``BasicTokenizer(do_lower_case=False).tokenize``: clean, space CJK characters,
    split on whitespace and around every punctuation character."""
    cleaned = []
    for c in text:
        cp = ord(c)
        if cp == 0 or cp == 0xFFFD or _is_control(c):
            continue
        if _is_whitespace(c):
            cleaned.append(" ")
        elif _is_chinese_char(cp):
            cleaned.extend((" ", c, " "))
        else:
            cleaned.append(c)
    out = []
    for token in "".join(cleaned).split():
        current = ""
        for c in token:
            if _is_punctuation(c):
                if current:
                    out.append(current)
                out.append(c)
                current = ""
            else:
                current += c
        if current:
            out.append(current)
    return out


def get_final_text(pred_text: str, orig_text: str) -> str:
    """Hugging Face's ``get_final_text`` (``do_lower_case=False``): the part of
    ``orig_text`` that ``pred_text`` covers, or ``orig_text`` when they do not align."""

    def strip_spaces(text):
        ns_chars, ns_to_s = [], {}
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s[len(ns_chars)] = i
            ns_chars.append(c)
        return "".join(ns_chars), ns_to_s

    tok_text = " ".join(basic_tokenize(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_ns_to_s = strip_spaces(orig_text)
    tok_ns, tok_ns_to_s = strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
    if start not in tok_s_to_ns or end not in tok_s_to_ns:
        return orig_text
    orig_start = orig_ns_to_s.get(tok_s_to_ns[start])
    orig_end = orig_ns_to_s.get(tok_s_to_ns[end])
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start : orig_end + 1]


def tokens_to_string(pieces: Sequence[str]) -> str:
    """XLM-R's ``convert_tokens_to_string`` followed by run_squad's whitespace cleanup."""
    return " ".join("".join(pieces).replace(SPIECE_UNDERLINE, " ").split())


# ----------------------------------------------------------------------------------------
# compute_predictions_logits
# ----------------------------------------------------------------------------------------


def _best_indexes(logits: np.ndarray, n_best: int) -> np.ndarray:
    return np.argsort(-logits, kind="stable")[:n_best]


def compute_predictions(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    features: QAFeatures,
    examples: Sequence[QAExample],
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    unknown_pieces: str = "xtreme",
) -> dict[str, str]:
    """Answer text per question id (see the module docstring).

    Args:
      start_logits, end_logits: [N, L] model outputs for the N windows of ``features``.
      features: the windows (:func:`xlmeta_jax.evaluation.features.qa_features`).
      examples: the questions the windows were built from.
      n_best: start / end candidates per window, and answers kept per question.
      max_answer_length: longest answer in tokens.
      unknown_pieces: "xtreme" reads a piece of the unknown id as ``<unk>`` (XTREME's
        tokens; the span then falls back to its whole words); "text" uses the piece's
        text from the context.
    """
    if unknown_pieces not in UNKNOWN_PIECES:
        raise ValueError(
            f"unknown_pieces must be one of {UNKNOWN_PIECES}, got {unknown_pieces!r}")
    start_logits = np.asarray(start_logits, dtype=np.float32)
    end_logits = np.asarray(end_logits, dtype=np.float32)
    if start_logits.shape != features.input_ids.shape or end_logits.shape != start_logits.shape:
        raise ValueError(
            f"compute_predictions: logits {start_logits.shape}/{end_logits.shape} do not "
            f"match features {features.input_ids.shape}"
        )
    by_example = collections.defaultdict(list)
    for f, ex in enumerate(features.example_index):
        by_example[int(ex)].append(f)
    out = {}
    for i, ex in enumerate(examples):
        prelim = []
        for f in by_example[i]:
            words, ok_start = features.word_index[f], features.max_context[f]
            for s in _best_indexes(start_logits[f], n_best):
                for e in _best_indexes(end_logits[f], n_best):
                    if words[s] < 0 or words[e] < 0 or not ok_start[s]:
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    prelim.append((start_logits[f, s] + end_logits[f, e], f, int(s), int(e)))
        # Stable: equal sums keep window / start / end order, as Hugging Face's sort.
        prelim.sort(key=lambda p: -p[0])
        answer = "empty"
        if prelim:
            _, f, s, e = prelim[0]
            context_words, _ = doc_words(ex.context)
            orig_text = " ".join(
                context_words[features.word_index[f][s] : features.word_index[f][e] + 1]
            )
            pieces = features.tokens[f][s : e + 1]
            if unknown_pieces == "xtreme" and features.unk_id is not None:
                ids = features.input_ids[f][s : e + 1]
                pieces = [UNK_TOKEN if i == features.unk_id else p for p, i in zip(pieces, ids)]
            answer = get_final_text(tokens_to_string(pieces), orig_text)
        out[ex.id] = answer
    return out
