"""The pretraining corpus of the CPU experiment, written from ``../shared/data``.

* English (phase 1 of ``meta``): the public-domain texts of ``english_pd``
  (:mod:`xlmeta_jax.data.english_pd`).
* The multilingual mixture: the Leipzig corpora sentences of
  ``leipzig_sentences`` (1000 sentences of each of 75 languages).
* A SentencePiece vocabulary trained on both (alpha-sampled over languages).

Evaluation text stays out of pretraining: every line that also occurs (after
Unicode NFKC, case folding and whitespace normalisation) in Tatoeba, FLORES-200,
XNLI or PAWS-X is dropped, and ``manifest.json`` records how many were.

Everything is written to ``MODEL_DIR/corpus/`` in CC-100's layout (one paragraph
per line, a blank line between documents, ``{lang}.txt`` per language) through a
temporary folder that is renamed at the end, so an interrupted preparation leaves
nothing half-written and a finished one is reused.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence

from xlmeta_jax import files
from xlmeta_jax.data import english_pd, vocabulary

log = logging.getLogger("xlmeta_jax.train")

# Leipzig file code -> the language code of its file in the corpus (CC-100's names).
LEIPZIG_TO_CC100 = {"zh": "zh-Hans", "nb": "no"}
ENGLISH_DIR, XLING_DIR, VOCAB_PREFIX = "english", "xling", "spm"
# Evaluation sets kept out of pretraining (folders of ../shared/data).
EVALUATION_SETS = ("tatoeba", "flores200", "xnli", "pawsx")
_SPACE = re.compile(r"\s+")


def corpus_path(model_dir: str, name: str) -> str:
    """``MODEL_DIR/corpus/<name>`` (gin: the corpus and vocabulary locations)."""
    return os.path.join(files.user_path(model_dir, "MODEL_DIR"), "corpus", name)


def leipzig_languages(shared_data_dir: str) -> list[str]:
    """Corpus codes of every language in ``leipzig_sentences/sentences``."""
    files = sorted(glob.glob(os.path.join(shared_data_dir, "leipzig_sentences", "sentences",
                                          "*.txt")))
    codes = [os.path.basename(f)[: -len(".txt")] for f in files]
    return [LEIPZIG_TO_CC100.get(c, c) for c in codes]


def _key(text: str) -> bytes:
    norm = _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()
    return hashlib.blake2b(norm.encode("utf-8"), digest_size=8).digest()


def _evaluation_lines(shared_data_dir: str, sets: Sequence[str]) -> Iterable[str]:
    for name in sets:
        folder = os.path.join(shared_data_dir, name)
        if name == "tatoeba":
            paths = glob.glob(os.path.join(folder, "tatoeba.*-eng.*"))
        elif name == "flores200":
            paths = glob.glob(os.path.join(folder, "devtest", "*.devtest"))
        else:
            paths = glob.glob(os.path.join(folder, "*.tsv"))
        if not paths:
            raise FileNotFoundError(f"evaluation set {name!r}: no files under {folder}")
        for path in sorted(paths):
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    # XNLI / PAWS-X: sentence pairs and a label per line.
                    yield from line.rstrip("\n").split("\t")[:2] if path.endswith(".tsv") \
                        else [line.rstrip("\n")]


def evaluation_keys(shared_data_dir: str, sets: Sequence[str] = EVALUATION_SETS) -> set[bytes]:
    """Hashes of every normalised sentence of the evaluation sets."""
    return {_key(line) for line in _evaluation_lines(shared_data_dir, sets) if line.strip()}


def _filter_file(path: str, exclude: set[bytes]) -> int:
    """Drops the lines of a corpus file that occur in ``exclude``; returns how many."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    kept = [line for line in lines if not line.strip() or _key(line) not in exclude]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(kept))
    return len(lines) - len(kept)


def prepare_shared_corpus(
    model_dir: str,
    shared_data_dir: str,
    languages: Sequence[str] | None = None,
    vocab_size: int = 8000,
    alpha: float = 0.3,
    vocab_lines: int = 200_000,
    lines_per_document: int = 8,
    seed: int = 0,
) -> str:
    """Writes the corpus and trains its vocabulary (once); returns the corpus folder.

    Args:
      model_dir: the experiment's MODEL_DIR (the corpus goes to ``MODEL_DIR/corpus``).
      shared_data_dir: the ``../shared/data`` folder.
      languages: mixture languages (corpus codes; None: all of Leipzig's).
      vocab_size: SentencePiece pieces (the model's vocab_size must be at least this).
      alpha: language sampling exponent of the vocabulary's training sample.
      vocab_lines: lines sampled to train the vocabulary.
      lines_per_document: Leipzig sentences per document (they are independent
        sentences; documents only matter to the packing of blocks).
      seed: vocabulary sample and training seed.
    """
    root = corpus_path(model_dir, "")
    shared_data_dir = files.user_path(shared_data_dir, "SHARED_DATA_DIR")
    if os.path.isfile(os.path.join(root, "manifest.json")):
        log.info("corpus and vocabulary prepared earlier in %s", root)
        return root
    if not os.path.isdir(shared_data_dir):
        raise FileNotFoundError(f"shared data folder {shared_data_dir!r} does not exist")
    available = leipzig_languages(shared_data_dir)
    languages = list(available if languages is None else languages)
    missing = [lang for lang in languages if lang not in available]
    if missing:
        raise FileNotFoundError(f"no Leipzig sentences for {missing} in {shared_data_dir}")
    to_leipzig = {v: k for k, v in LEIPZIG_TO_CC100.items()}

    with files.built_whole(root) as tmp:
        log.info("writing the corpus from %s (English: english_pd; %d languages: Leipzig)",
                 shared_data_dir, len(languages))
        exclude = evaluation_keys(shared_data_dir)
        english_files = english_pd.write_text_files(
            os.path.join(shared_data_dir, "english_pd"), os.path.join(tmp, ENGLISH_DIR))
        dropped = {"english": sum(_filter_file(p, exclude) for p in english_files)}
        os.makedirs(os.path.join(tmp, XLING_DIR))
        lines_kept = {}
        for lang in languages:
            source = os.path.join(shared_data_dir, "leipzig_sentences", "sentences",
                                  f"{to_leipzig.get(lang, lang)}.txt")
            with open(source, encoding="utf-8", errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
            kept = [line for line in lines if _key(line) not in exclude]
            dropped[lang] = len(lines) - len(kept)
            lines_kept[lang] = len(kept)
            with open(os.path.join(tmp, XLING_DIR, f"{lang}.txt"), "w", encoding="utf-8") as f:
                for i in range(0, len(kept), lines_per_document):
                    f.write("\n".join(kept[i: i + lines_per_document]) + "\n\n")
        files_by_lang = {lang: [os.path.join(tmp, XLING_DIR, f"{lang}.txt")]
                         for lang in languages}
        files_by_lang["en"] = files_by_lang.get("en", []) + list(english_files)
        log.info("training the %d-piece vocabulary on %d sampled lines", vocab_size, vocab_lines)
        vocabulary.train_vocabulary(files_by_lang, os.path.join(tmp, VOCAB_PREFIX),
                                    vocab_size=vocab_size, alpha=alpha, seed=seed,
                                    num_lines=vocab_lines, stats_cache_dir=tmp)
        manifest = {
            "shared_data_dir": os.path.abspath(shared_data_dir),
            "english_files": [os.path.basename(p) for p in english_files],
            "languages": languages,
            "lines": lines_kept,
            "evaluation_sets_excluded": list(EVALUATION_SETS),
            "lines_dropped_as_evaluation_text": dropped,
            "vocab_size": vocab_size,
        }
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
    log.info("corpus in %s: %d lines dropped as evaluation text", root,
             sum(manifest["lines_dropped_as_evaluation_text"].values()))
    return root
