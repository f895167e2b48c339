"""The 100 XLM-R pretraining languages, as CC-100 names its files (one place).

CC-100 (Conneau et al., 2020; Wenzek et al., 2020) ships one file per language,
``{code}.txt.xz``; XLM-R was pretrained on 100 of its 116 languages. The codes
below are CC-100's file names, including its romanised (``*_rom``), Zawgyi
(``my_zaw``) and Chinese script (``zh-Hans``/``zh-Hant``) variants. This module
imports nothing heavy: the trainer, tests and tools all read the list from here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from xlmeta_jax import errors

# code -> English name, in CC-100's alphabetical order (XLM-R paper, Table 6).
XLMR_LANGUAGE_NAMES: dict[str, str] = {
    "af": "Afrikaans",
    "am": "Amharic",
    "ar": "Arabic",
    "as": "Assamese",
    "az": "Azerbaijani",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "bn_rom": "Bengali (romanised)",
    "br": "Breton",
    "bs": "Bosnian",
    "ca": "Catalan",
    "cs": "Czech",
    "cy": "Welsh",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "fy": "Western Frisian",
    "ga": "Irish",
    "gd": "Scottish Gaelic",
    "gl": "Galician",
    "gu": "Gujarati",
    "ha": "Hausa",
    "he": "Hebrew",
    "hi": "Hindi",
    "hi_rom": "Hindi (romanised)",
    "hr": "Croatian",
    "hu": "Hungarian",
    "hy": "Armenian",
    "id": "Indonesian",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "jv": "Javanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "km": "Khmer",
    "kn": "Kannada",
    "ko": "Korean",
    "ku": "Kurdish (Kurmanji)",
    "ky": "Kyrgyz",
    "la": "Latin",
    "lo": "Lao",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mg": "Malagasy",
    "mk": "Macedonian",
    "ml": "Malayalam",
    "mn": "Mongolian",
    "mr": "Marathi",
    "ms": "Malay",
    "my": "Burmese",
    "my_zaw": "Burmese (Zawgyi)",
    "ne": "Nepali",
    "nl": "Dutch",
    "no": "Norwegian",
    "om": "Oromo",
    "or": "Oriya",
    "pa": "Punjabi",
    "pl": "Polish",
    "ps": "Pashto",
    "pt": "Portuguese",
    "ro": "Romanian",
    "ru": "Russian",
    "sa": "Sanskrit",
    "sd": "Sindhi",
    "si": "Sinhala",
    "sk": "Slovak",
    "sl": "Slovenian",
    "so": "Somali",
    "sq": "Albanian",
    "sr": "Serbian",
    "su": "Sundanese",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "ta_rom": "Tamil (romanised)",
    "te": "Telugu",
    "te_rom": "Telugu (romanised)",
    "th": "Thai",
    "tl": "Filipino",
    "tr": "Turkish",
    "ug": "Uyghur",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "ur_rom": "Urdu (romanised)",
    "uz": "Uzbek",
    "vi": "Vietnamese",
    "xh": "Xhosa",
    "yi": "Yiddish",
    "zh-Hans": "Chinese (Simplified)",
    "zh-Hant": "Chinese (Traditional)",
}

XLMR_LANGUAGES: tuple[str, ...] = tuple(XLMR_LANGUAGE_NAMES)

# mC4 (TFDS ``c4/multilingual``) names some languages differently and has no
# romanised/Zawgyi/Traditional-Chinese splits; None marks "no mC4 split".
_MC4_RENAMES = {"he": "iw", "tl": "fil", "hi_rom": "hi-Latn", "zh-Hans": "zh"}
_NOT_IN_MC4 = frozenset({"bn_rom", "my_zaw", "ta_rom", "te_rom", "ur_rom", "zh-Hant"})

# The 100 languages from the largest to the smallest in CC-100 tokens (XLM-R paper, Table 6;
# my = Burmese 56M, my_zaw = Burmese (Zawgyi) 15M): the order staged curricula add them in.
BY_CC100_SIZE: tuple[str, ...] = (
    "en", "vi", "ru", "id", "fa", "sv", "ro", "de", "fr", "es", "no", "pt", "da", "hu", "uk",
    "fi", "pl", "ko", "bg", "nl", "it", "el", "sk", "he", "hr", "ar", "tr", "cs", "lt", "th",
    "ca", "hi", "sl", "ms", "lv", "sq", "et", "sr", "az", "ur", "ta", "tl", "ja", "bn", "is",
    "gl", "kk", "ka", "mk", "hy", "la", "be", "ml", "sw", "eu", "zh-Hans", "te", "mn", "si",
    "af", "ne", "zh-Hant", "mr", "kn", "eo", "cy", "gu", "ps", "ky", "uz", "hi_rom", "ga",
    "ur_rom", "bn_rom", "am", "pa", "ku", "so", "ha", "my", "sd", "te_rom", "km", "or",
    "ta_rom", "yi", "fy", "ug", "mg", "jv", "gd", "lo", "sa", "br", "my_zaw", "bs", "xh", "su",
    "om", "as",
)

# Scripts written without spaces between words: tokens/word means little there,
# so the vocabulary report also shows characters per token.
UNSPACED_LANGUAGES = frozenset({"ja", "km", "lo", "my", "my_zaw", "th", "zh-Hans", "zh-Hant"})


class UnknownLanguageError(errors.UserError, ValueError):
    """A language code that is not one of the 100 XLM-R/CC-100 codes."""


def check_languages(languages: Iterable[str], *, what: str = "language") -> tuple[str, ...]:
    """Validates language codes against :data:`XLMR_LANGUAGES`.

    Args:
      languages: CC-100 codes (e.g. ``["en", "zh-Hans", "hi_rom"]``).
      what: how the error names the list (e.g. ``"languages"``).

    Returns:
      The codes as a tuple, in the given order.

    Raises:
      UnknownLanguageError: for an empty list, a duplicate or an unknown code
        (with the closest valid codes).
    """
    langs = languages if isinstance(languages, str) else tuple(languages)  # read once
    problem = language_problem(langs)
    if problem is not None:
        raise UnknownLanguageError(f"{what}: {problem}")
    return langs


def language_problem(languages: Iterable[str]) -> str | None:
    """What is wrong with a list of CC-100 codes (see :func:`check_languages`), or None."""
    if isinstance(languages, str):
        return f"expected a list of codes, got the string {languages!r}"
    langs = tuple(languages)
    if not langs:
        return "the language list is empty"
    seen = set()
    for lang in langs:
        if lang not in XLMR_LANGUAGE_NAMES:
            close = _suggestions(str(lang))
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            return (f"{lang!r} is not one of the 100 XLM-R/CC-100 language codes{hint} "
                    "(see xlmeta_jax/data/languages.py)")
        if lang in seen:
            return f"language {lang!r} is listed twice"
        seen.add(lang)
    return None


# Codes other lists use for languages CC-100 names differently.
_ALIASES = {"iw": "he", "fil": "tl", "nb": "no", "nn": "no", "zh": "zh-Hans", "ji": "yi"}


def _suggestions(code: str) -> list[str]:
    out = [_ALIASES[code]] if code in _ALIASES else []
    out += [c for c in XLMR_LANGUAGES if c.startswith((f"{code}-", f"{code}_")) and c not in out]
    if not out:
        out = difflib.get_close_matches(code, XLMR_LANGUAGES, n=3, cutoff=0.5)
    return out[:3]


def mc4_split_name(lang: str) -> str | None:
    """The TFDS ``c4/multilingual`` split holding ``lang`` (a checked code), or None if mC4
    lacks it."""
    if lang in _NOT_IN_MC4:
        return None
    return _MC4_RENAMES.get(lang, lang)


def task_suffix(lang: str) -> str:
    """``lang`` as it appears in a seqio task name (``-`` is not allowed there)."""
    return lang.replace("-", "_")
