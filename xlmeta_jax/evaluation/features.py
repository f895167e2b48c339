"""Examples -> fixed-length numpy model inputs, and model outputs -> predictions.

* Sentence pairs: ``<s> a </s></s> b </s>``, longest side truncated first.
* Extractive QA: ``<s> question </s></s> context-window </s>``; a long context is cut
  into windows of at most ``max_seq_length`` tokens whose starts are ``doc_stride``
  context tokens apart (BERT's / XTREME's ``doc_stride``), so consecutive windows
  overlap. Answer spans are mapped through SentencePiece character offsets. Each
  context token also records its whitespace word of the context (SQuAD's
  ``doc_tokens``) and whether this window gives it the most context (BERT's
  ``_check_is_max_context``); decoding is
  :func:`xlmeta_jax.evaluation.qa_decoding.compute_predictions`.
* Tagging: every word is tokenised on its own; its tag is predicted at its first
  sub-token; sentences longer than a window are split into several windows at word
  boundaries so every word gets a prediction.

All arrays are padded to ``max_seq_length`` with the tokenizer's pad id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from xlmeta_jax.evaluation.readers import ClassificationExample, QAExample, TaggingExample
from xlmeta_jax.evaluation.tokenization import Tokenizer

IGNORE = -1


def _pad(rows: Sequence[Sequence[int]], length: int, value: int) -> np.ndarray:
    out = np.full((len(rows), length), value, dtype=np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


# ----------------------------------------------------------------------------------------
# Sentence-pair classification
# ----------------------------------------------------------------------------------------


def classification_features(
    examples: Sequence[ClassificationExample], tokenizer: Tokenizer, max_seq_length: int
) -> dict[str, np.ndarray]:
    """{"input_ids": [N, L], "labels": [N]}."""
    a_ids = tokenizer.encode_batch([e.text_a for e in examples])
    b_ids = tokenizer.encode_batch([e.text_b for e in examples])
    rows = [tokenizer.pair(a, b, max_seq_length) for a, b in zip(a_ids, b_ids)]
    return {
        "input_ids": _pad(rows, max_seq_length, tokenizer.pad_id),
        "labels": np.array([e.label for e in examples], dtype=np.int32),
    }


# ----------------------------------------------------------------------------------------
# Extractive QA
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class QAFeatures:
    """Windows of QA examples.

    Attributes:
      input_ids: [N, L] token ids.
      start_positions, end_positions: [N] gold token positions (0 = ``<s>`` when the
        window does not contain the whole first answer).
      offsets: [N, L, 2] character span in the example's context of every context
        token; -1 for question, special and padding tokens.
      example_index: [N] index of the window's example.
      word_index: [N, L] index of the context token's whitespace word (SQuAD
        ``doc_tokens``); -1 for other tokens.
      max_context: [N, L] whether this window is the one where the context token has
        the most context (``token_is_max_context``).
      tokens: per window, the piece string at every position ("" off the context);
        an unknown piece keeps its text (see ``unk_id``).
      unk_id: the tokenizer's unknown id, so that decoding can read unknown pieces as
        ``<unk>``, as XTREME's ``convert_ids_to_tokens`` does (None: unknown).
    """

    input_ids: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    offsets: np.ndarray
    example_index: np.ndarray
    word_index: np.ndarray
    max_context: np.ndarray
    tokens: list[list[str]]
    unk_id: int | None = None

    def __len__(self):
        return len(self.input_ids)

    def arrays(self) -> dict[str, np.ndarray]:
        """Model inputs and training targets."""
        return {
            "input_ids": self.input_ids,
            "start_positions": self.start_positions,
            "end_positions": self.end_positions,
        }


def _is_squad_whitespace(c: str) -> bool:
    return c in " \t\r\n" or ord(c) == 0x202F


def doc_words(context: str) -> tuple[list[str], np.ndarray]:
    """SQuAD's ``doc_tokens`` (whitespace-separated words) and each word's first char."""
    words, starts, prev_ws = [], [], True
    for i, c in enumerate(context):
        if _is_squad_whitespace(c):
            prev_ws = True
            continue
        if prev_ws:
            words.append(c)
            starts.append(i)
        else:
            words[-1] += c
        prev_ws = False
    return words, np.array(starts, dtype=np.int64)


def _max_context(window_starts: Sequence[int], window_lengths: Sequence[int], n: int):
    """Per window, a bool per context token: is this its best window (first on ties)?"""
    best = np.full(n, -1)
    best_score = np.full(n, -np.inf)
    for w, (start, length) in enumerate(zip(window_starts, window_lengths)):
        j = np.arange(length)
        score = np.minimum(j, length - 1 - j) + 0.01 * length
        idx = start + j
        better = score > best_score[idx]
        best[idx[better]] = w
        best_score[idx[better]] = score[better]
    return [best[s : s + length] == w
            for w, (s, length) in enumerate(zip(window_starts, window_lengths))]


def _answer_token_span(offsets, start_char: int, end_char: int) -> tuple[int, int] | None:
    """First / last context token overlapping ``[start_char, end_char)``."""
    first = last = None
    for i, (b, e) in enumerate(offsets):
        if b >= e:
            continue
        if e > start_char and b < end_char:
            if first is None:
                first = i
            last = i
    if first is None:
        return None
    return first, last


def qa_features(
    examples: Sequence[QAExample],
    tokenizer: Tokenizer,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> QAFeatures:
    """Sliding windows over the contexts (see the module docstring)."""
    if doc_stride <= 0:
        raise ValueError(f"doc_stride must be > 0, got {doc_stride}")
    question_ids = tokenizer.encode_batch([e.question for e in examples])
    ids_rows, starts, ends, offset_rows, ex_index = [], [], [], [], []
    word_rows, maxctx_rows, token_rows = [], [], []
    for idx, (ex, q_ids) in enumerate(zip(examples, question_ids)):
        q_ids = q_ids[:max_query_length]
        c_ids, c_pieces, c_offsets = tokenizer.encode_pieces(ex.context)
        _, word_starts = doc_words(ex.context)
        # A piece lies inside one whitespace word (SentencePiece splits at whitespace); a
        # piece with an empty span (a lone "▁") belongs to the word that follows it.
        c_words = np.searchsorted(word_starts, [b for b, _ in c_offsets], side="right") - 1
        c_words = np.maximum(c_words, 0)
        budget = max_seq_length - len(q_ids) - 2 - len(tokenizer.pair_middle)
        if budget < 1:
            raise ValueError(
                f"max_seq_length={max_seq_length} leaves no room for context after a "
                f"{len(q_ids)}-token question (lower max_query_length)"
            )
        answer = _answer_token_span(
            c_offsets, ex.answer_starts[0], ex.answer_starts[0] + len(ex.answers[0])
        )
        window_starts, window_lengths = [], []
        window_start = 0
        while True:
            window_end = min(window_start + budget, len(c_ids))
            window_starts.append(window_start)
            window_lengths.append(window_end - window_start)
            if window_end >= len(c_ids):
                break
            # BERT's run_squad (XTREME's): start_offset += min(length, doc_stride), so a
            # stride longer than the window never skips context.
            window_start += min(window_end - window_start, doc_stride)
        prefix = [tokenizer.cls_id, *q_ids, *tokenizer.pair_middle]
        p0 = len(prefix)
        for w_start, n_ctx, best in zip(
            window_starts, window_lengths, _max_context(window_starts, window_lengths, len(c_ids))
        ):
            w_end = w_start + n_ctx
            ids_rows.append(prefix + c_ids[w_start:w_end] + [tokenizer.sep_id])
            offs = np.full((max_seq_length, 2), -1, dtype=np.int32)
            words = np.full(max_seq_length, -1, dtype=np.int32)
            maxctx = np.zeros(max_seq_length, dtype=bool)
            if n_ctx:
                offs[p0 : p0 + n_ctx] = c_offsets[w_start:w_end]
                words[p0 : p0 + n_ctx] = c_words[w_start:w_end]
                maxctx[p0 : p0 + n_ctx] = best
            offset_rows.append(offs)
            word_rows.append(words)
            maxctx_rows.append(maxctx)
            token_rows.append([""] * p0 + c_pieces[w_start:w_end])
            if answer is not None and w_start <= answer[0] and answer[1] < w_end:
                starts.append(p0 + answer[0] - w_start)
                ends.append(p0 + answer[1] - w_start)
            else:
                starts.append(0)
                ends.append(0)
            ex_index.append(idx)
    empty = np.zeros((0, max_seq_length), np.int32)
    return QAFeatures(
        input_ids=_pad(ids_rows, max_seq_length, tokenizer.pad_id),
        start_positions=np.array(starts, dtype=np.int32),
        end_positions=np.array(ends, dtype=np.int32),
        offsets=np.stack(offset_rows) if offset_rows else np.zeros((0, max_seq_length, 2)),
        example_index=np.array(ex_index, dtype=np.int32),
        word_index=np.stack(word_rows) if word_rows else empty,
        max_context=np.stack(maxctx_rows) if maxctx_rows else empty.astype(bool),
        tokens=token_rows,
        unk_id=tokenizer.unk_id,
    )


# ----------------------------------------------------------------------------------------
# Token tagging
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class TaggingFeatures:
    """Windows of tagged sentences.

    Attributes:
      input_ids: [N, L] token ids.
      labels: [N, L] tag index at each word's first sub-token, -1 elsewhere.
      word_index: [N, L] index of the word whose first sub-token this is, -1 elsewhere.
      example_index: [N] index of the window's sentence.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    word_index: np.ndarray
    example_index: np.ndarray

    def __len__(self):
        return len(self.input_ids)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids, "labels": self.labels}


def tagging_features(
    examples: Sequence[TaggingExample],
    tokenizer: Tokenizer,
    labels: Sequence[str],
    max_seq_length: int,
) -> TaggingFeatures:
    """Windows of whole words with labels on first sub-tokens."""
    label_index = {t: i for i, t in enumerate(labels)}
    # Each sentence's words as its tokenizer segments them (SentencePiece: each word
    # alone; a byte-level BPE: the sentence, pieces to words by their offsets).
    word_ids = [p for ex in examples for p in tokenizer.encode_words(ex.tokens)]
    budget = max_seq_length - 2
    ids_rows, label_rows, word_rows, ex_index = [], [], [], []
    cursor = 0
    for idx, ex in enumerate(examples):
        pieces = word_ids[cursor : cursor + len(ex.tokens)]
        cursor += len(ex.tokens)
        windows = [([], [], [])]
        for w, (tag, p) in enumerate(zip(ex.tags, pieces)):
            # A word SentencePiece maps to nothing (e.g. a lone zero-width character)
            # still needs a position for its tag.
            p = (p or [tokenizer.unk_id])[:budget]
            if tag not in label_index:
                raise ValueError(f"sentence {ex.id}: tag {tag!r} not in {list(labels)}")
            ids, labs, widx = windows[-1]
            if ids and len(ids) + len(p) > budget:
                windows.append(([], [], []))
                ids, labs, widx = windows[-1]
            ids.extend(p)
            labs.extend([label_index[tag]] + [IGNORE] * (len(p) - 1))
            widx.extend([w] + [IGNORE] * (len(p) - 1))
        for ids, labs, widx in windows:
            ids_rows.append([tokenizer.cls_id, *ids, tokenizer.sep_id])
            label_rows.append([IGNORE, *labs, IGNORE])
            word_rows.append([IGNORE, *widx, IGNORE])
            ex_index.append(idx)
    return TaggingFeatures(
        input_ids=_pad(ids_rows, max_seq_length, tokenizer.pad_id),
        labels=_pad(label_rows, max_seq_length, IGNORE),
        word_index=_pad(word_rows, max_seq_length, IGNORE),
        example_index=np.array(ex_index, dtype=np.int32),
    )


def decode_tags(
    logits: np.ndarray,
    features: TaggingFeatures,
    examples: Sequence[TaggingExample],
    labels: Sequence[str],
) -> list[list[str]]:
    """Predicted tag per word of each sentence (argmax at first sub-tokens)."""
    pred = np.asarray(logits).argmax(-1)
    out = [[None] * len(ex.tokens) for ex in examples]
    rows, cols = np.nonzero(features.word_index >= 0)
    for r, c in zip(rows, cols):
        out[features.example_index[r]][features.word_index[r, c]] = labels[pred[r, c]]
    for ex, tags in zip(examples, out):
        if any(t is None for t in tags):
            raise AssertionError(f"sentence {ex.id}: a word got no prediction")
    return out
