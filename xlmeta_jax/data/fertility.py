"""The fertility report of a vocabulary: how well its pieces cover each language.

:func:`xlmeta_jax.data.vocabulary.train_vocabulary` prints it and writes it next to
the model (``{prefix}.fertility.tsv``); a starved language (many tokens per word or
byte fallbacks) needs a larger share of the training sample (a lower alpha).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from xlmeta_jax.data.languages import UNSPACED_LANGUAGES, XLMR_LANGUAGE_NAMES


@dataclasses.dataclass(frozen=True)
class FertilityRow:
    """How well the vocabulary covers one language.

    Attributes:
      lang: language label.
      q: sampling probability used for the training sample.
      sample_lines: paragraphs of this language in the training sample.
      tokens_per_word: tokens / whitespace-separated words (high = starved).
      chars_per_token: non-space characters / tokens (low = starved; the useful
        number for scripts without spaces).
      fallback_share: share of tokens that are byte-fallback pieces or ``<unk>``.
    """

    lang: str
    q: float
    sample_lines: int
    tokens_per_word: float
    chars_per_token: float
    fallback_share: float


def fertility_report(
    model_path: str, lines_by_lang: Mapping[str, Sequence[str]], q: Mapping[str, float]
) -> list[FertilityRow]:
    """Tokens per word, characters per token and fallback share per language.

    Args:
      model_path: the SentencePiece ``.model`` file.
      lines_by_lang: paragraphs to tokenize, per language label.
      q: the sampling probability of each language (reported as is).

    Returns:
      One row per language, sorted by label.
    """
    # Imported here so that importing the data package does not load SentencePiece.
    import sentencepiece as spm  # noqa: PLC0415 - heavy optional dependency, loaded on use

    sp = spm.SentencePieceProcessor(model_file=model_path)
    rows = []
    for lang in sorted(lines_by_lang):
        lines = list(lines_by_lang[lang])
        tokens = words = chars = fallback = 0
        for ids in sp.encode(lines):
            tokens += len(ids)
            fallback += sum(1 for i in ids if sp.is_unknown(i) or sp.is_byte(i))
        for line in lines:
            words += len(line.split())
            chars += sum(1 for c in line if not c.isspace())
        rows.append(
            FertilityRow(
                lang=lang,
                q=float(q.get(lang, 0.0)),
                sample_lines=len(lines),
                tokens_per_word=tokens / max(words, 1),
                chars_per_token=chars / max(tokens, 1),
                fallback_share=fallback / max(tokens, 1),
            )
        )
    return rows


def _starved(row: FertilityRow, median_tpw: float) -> bool:
    if row.fallback_share > 0.01:
        return True
    if row.lang not in UNSPACED_LANGUAGES and median_tpw > 0:
        return row.tokens_per_word > 2.0 * median_tpw
    return False


def format_fertility_table(rows: Sequence[FertilityRow], *, tsv: bool = False) -> str:
    """The report as an aligned table (or TSV), flagging starved languages.

    A language is flagged when over 1% of its tokens are byte/unk fallbacks, or
    (for space-separated scripts) its tokens per word exceed twice the median.
    """
    spaced = [r.tokens_per_word for r in rows if r.lang not in UNSPACED_LANGUAGES]
    median_tpw = statistics.median(spaced) if spaced else 0.0
    header = ["lang", "name", "q", "sample_lines", "tokens/word", "chars/token", "fallback%",
              "starved?"]
    body = []
    for r in rows:
        body.append(
            [
                r.lang,
                XLMR_LANGUAGE_NAMES.get(r.lang, ""),
                f"{r.q:.4f}",
                str(r.sample_lines),
                f"{r.tokens_per_word:.2f}",
                f"{r.chars_per_token:.2f}",
                f"{100 * r.fallback_share:.2f}",
                "STARVED" if _starved(r, median_tpw) else "",
            ]
        )
    if tsv:
        return "\n".join("\t".join(row) for row in [header, *body]) + "\n"
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, body)])
