"""The demo corpus: real text that exists on a fresh machine without downloads.

* Phase 1 (English): Python's documentation topics (the standard library's
  ``pydoc_data`` package, ~465 kB of English prose), or the public-domain English
  texts of ``../shared/data/english_pd`` when that folder exists.
* Phase 2 (multilingual): the Universal Declaration of Human Rights sample texts
  that the ``gflanguages`` package ships (Google Fonts language metadata), for the
  15 XNLI languages; or, with ``shared_data_dir``, the Leipzig corpora sentences
  of ``../shared/data/leipzig_sentences`` (1000 sentences per language).

:func:`prepare_demo` writes the corpus in CC-100's layout under
``MODEL_DIR/demo_data/`` and trains the demo's SentencePiece vocabulary there.
gin/demo.gin names it as the step ``python -m xlmeta_jax.train`` runs before the
trainer (``prepare_data.prepare``); t5x's demo (gin/t5x/demo.gin), whose trainer has no
such step, binds it as VOCAB_PATH, so it runs when t5x first reads that path. It is
idempotent, so a resumed demo reuses what an earlier run prepared (and every later
call costs one ``stat``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence

import jax

from xlmeta_jax import errors, files
from xlmeta_jax.data import english_pd, vocabulary

log = logging.getLogger("xlmeta_jax.train")

# The 15 XNLI languages, as CC-100 codes.
DEMO_LANGUAGES = (
    "en", "fr", "es", "de", "el", "bg", "ru", "tr", "ar", "vi", "th", "zh-Hans", "hi", "sw", "ur",
)
# CC-100 code -> gflanguages id (language_Script).
_GFLANGUAGES_IDS = {
    "en": "en_Latn", "fr": "fr_Latn", "es": "es_Latn", "de": "de_Latn", "el": "el_Grek",
    "bg": "bg_Cyrl", "ru": "ru_Cyrl", "tr": "tr_Latn", "ar": "ar_Arab", "vi": "vi_Latn",
    "th": "th_Thai", "zh-Hans": "zh_Hans", "hi": "hi_Deva", "sw": "sw_Latn", "ur": "ur_Arab",
    "ja": "ja_Jpan", "ko": "ko_Kore", "it": "it_Latn", "pt": "pt_Latn", "nl": "nl_Latn",
    "pl": "pl_Latn", "id": "id_Latn", "fa": "fa_Arab", "he": "he_Hebr", "uk": "uk_Cyrl",
}
ENGLISH_DIR, XLING_DIR, VOCAB_PREFIX = "english", "xling", "spm"
# Prepared roots already announced in this process (gin evaluates VOCAB_PATH per read).
_announced: set[str] = set()


def demo_path(model_dir: str, name: str) -> str:
    """``MODEL_DIR/demo_data/<name>`` (gin: corpus and vocabulary locations)."""
    return os.path.join(files.user_path(model_dir, "MODEL_DIR"), "demo_data", name)


@functools.cache
def _gflanguages() -> dict:
    """gflanguages' metadata of every language (parsed from 1.7k text protos: about a
    second, so once per process rather than once per demo language)."""
    import gflanguages  # noqa: PLC0415 - its language metadata loads only for the UDHR demo

    return gflanguages.LoadLanguages()


def udhr_paragraphs(lang: str) -> list[str]:
    """UDHR sample paragraphs of one language from the ``gflanguages`` package."""
    key = _GFLANGUAGES_IDS.get(lang)
    if key is None:
        raise ValueError(f"demo language {lang!r} has no gflanguages sample text mapping")
    sample = _gflanguages()[key].sample_text
    paragraphs: list[str] = []
    for field in sample.DESCRIPTOR.fields:
        value = getattr(sample, field.name)
        if isinstance(value, str):
            for line in value.splitlines():
                line = line.strip()
                if len(line) > 20 and line not in paragraphs:
                    paragraphs.append(line)
    if not paragraphs:
        raise ValueError(f"gflanguages has no sample text for {key}")
    return paragraphs


def _leipzig_paragraphs(shared_data_dir: str, lang: str) -> list[str] | None:
    """Leipzig sentences (one per line) of ``lang``, or None when the file is absent."""
    code = "zh" if lang == "zh-Hans" else lang
    path = os.path.join(shared_data_dir, "leipzig_sentences", "sentences", f"{code}.txt")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.strip() for line in f if line.strip()]


def _write_documents(path: str, paragraphs: Sequence[str], per_document: int = 8) -> None:
    """CC-100 layout: one paragraph per line, a blank line between documents."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, len(paragraphs), per_document):
            f.write("\n".join(paragraphs[i : i + per_document]) + "\n\n")


def _flat_paths(paths) -> list[str]:
    if paths is None:
        return []
    if isinstance(paths, str | os.PathLike):
        return [os.fspath(paths)]
    return [q for p in paths for q in _flat_paths(p)]


def _inside(path: str, root: str) -> bool:
    path, root = os.path.abspath(files.user_path(path, "the data path")), os.path.abspath(root)
    return path == root or path.startswith(root + os.sep)


class DemoCorpusError(errors.UserError, ValueError):
    """The demo corpus cannot be built here (one line)."""


def prepare_demo(
    model_dir: str,
    languages: Sequence[str] = DEMO_LANGUAGES,
    vocab_size: int = 2000,
    alpha: float = 0.3,
    shared_data_dir: str | None = None,
    seed: int = 0,
    paths: Sequence | None = None,
) -> str | None:
    """Writes the demo corpus and trains its vocabulary (once); returns the model path.

    Args:
      model_dir: the run's MODEL_DIR; everything goes to ``MODEL_DIR/demo_data``.
      languages: phase-2 languages (CC-100 codes with UDHR samples in gflanguages).
      vocab_size: SentencePiece pieces (the model's VOCAB_SIZE must be at least this).
      alpha: language sampling exponent of the vocabulary's training sample.
      shared_data_dir: ``../shared/data`` for a larger demo (english_pd, Leipzig).
      seed: vocabulary sample and training seed.
      paths: the data paths the run reads (VOCAB_PATH, CC100_DIR, ENGLISH_FILES; lists
        nest); when none lies in ``MODEL_DIR/demo_data`` (every one overridden) nothing
        is built and None is returned, so a bad override is reported in seconds.
    """
    root = demo_path(model_dir, "")
    if paths is not None and not any(_inside(p, root) for p in _flat_paths(paths)):
        log.info("the run reads none of the demo's data (%s): not preparing it", root)
        return None
    model_path = os.path.join(root, VOCAB_PREFIX + ".model")
    if os.path.exists(model_path):
        if root not in _announced:
            _announced.add(root)
            log.info("demo corpus and vocabulary already prepared in %s", root)
        return model_path
    if jax.process_count() > 1:
        # Each process would build its own copy in the same place, and a multi-process run
        # counts no corpus (the demo's has no prepared statistics).
        raise DemoCorpusError(
            f"the demo runs as one process ({jax.process_count()} were started, and {root} "
            "holds no corpus: each would build its own in the same folder): start it without "
            "--process_count or srun; for several processes prepare a corpus with python -m "
            "xlmeta_jax.data.prepare (docs/guide.md)")
    shared_data_dir = files.user_path(shared_data_dir, "prepare_demo.shared_data_dir")
    if shared_data_dir and not os.path.isdir(shared_data_dir):
        raise FileNotFoundError(f"prepare_demo.shared_data_dir {shared_data_dir!r} does not exist")

    log.info("preparing the demo corpus and vocabulary in %s (once per MODEL_DIR; about a "
             "minute on 2 CPU cores)", root)
    with files.built_whole(root) as tmp:
        english_pd_dir = os.path.join(shared_data_dir, "english_pd") if shared_data_dir else None
        english_files = english_pd.english_text_files(
            os.path.join(tmp, ENGLISH_DIR), english_pd_dir
        )
        os.makedirs(os.path.join(tmp, XLING_DIR))
        sources = {}
        for lang in languages:
            paragraphs = _leipzig_paragraphs(shared_data_dir, lang) if shared_data_dir else None
            sources[lang] = "Leipzig" if paragraphs else "UDHR (gflanguages)"
            if not paragraphs:
                paragraphs = udhr_paragraphs(lang)
            _write_documents(os.path.join(tmp, XLING_DIR, f"{lang}.txt"), paragraphs)
        files_by_lang = {lang: [os.path.join(tmp, XLING_DIR, f"{lang}.txt")] for lang in languages}
        files_by_lang["en"] = files_by_lang.get("en", []) + list(english_files)
        vocabulary.train_vocabulary(
            files_by_lang,
            os.path.join(tmp, VOCAB_PREFIX),
            vocab_size=vocab_size,
            alpha=alpha,
            seed=seed,
            num_lines=200_000,
            stats_cache_dir=tmp,
        )
    _announced.add(root)
    log.info(
        "demo corpus in %s: English from %s; %s",
        root,
        "english_pd" if shared_data_dir else "Python's pydoc_data topics",
        ", ".join(f"{lang}: {src}" for lang, src in sources.items()),
    )
    return model_path
