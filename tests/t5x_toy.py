"""Shared set-up of the t5x tests: the skip when t5x is absent, a toy corpus on real text.

English: the Leipzig English sentences; phase 2: Leipzig en/de/sw in CC-100's layout
(``data_toy``); a 1000-piece SentencePiece vocabulary trained on them.
"""

from __future__ import annotations

import os

import pytest
from data_toy import train_toy_vocabulary, write_cc100_dir

LANGUAGES = ("en", "de", "sw")
INSTALL_HINT = (
    "pip install --no-deps ../shared/wheels/*.whl (t5x, airio, jestimator) and "
    "pip install -e '.[t5x]'; see docs/t5x.md"
)


def require_t5x() -> None:
    """Skips the calling module, naming the missing module, when t5x cannot be imported.

    .ci/run's second pass installs the wheels and sets XLMETA_EXPECT_EXTRAS, so there a
    missing module fails instead (its first pass, README's command, has no t5x: it skips).
    """
    try:
        import t5x.train  # noqa: F401
        import t5x.trainer  # noqa: F401
    except ImportError as e:
        message = f"the t5x tests need {e.name or e}: {INSTALL_HINT}"
        if os.environ.get("XLMETA_EXPECT_EXTRAS"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


def write_corpus(shared_data, root) -> dict:
    """Writes the toy corpus and vocabulary under ``root``; returns their paths."""
    cc_dir = os.path.join(root, "cc100")
    write_cc100_dir(shared_data, cc_dir, languages=LANGUAGES)
    vocab = train_toy_vocabulary(
        cc_dir, os.path.join(root, "spm", "toy"), languages=LANGUAGES, vocab_size=1000
    )
    return {
        "vocab": vocab,
        "english": [os.path.join(cc_dir, "en.txt")],
        "cc100_dir": cc_dir,
        "languages": list(LANGUAGES),
    }


def corpus_flags(corpus: dict) -> list[str]:
    """The README's corpus and vocabulary macros for this corpus (command-line form)."""
    return [
        f"--gin.VOCAB_PATH='{corpus['vocab']}'",
        f"--gin.ENGLISH_FILES={corpus['english']!r}",
        f"--gin.CC100_DIR='{corpus['cc100_dir']}'",
        f"--gin.CC100_LANGUAGES={corpus['languages']!r}",
    ]


def register_corpus(corpus: dict) -> tuple[str, ...]:
    """Registers the corpus' seqio tasks for in-process use; returns their names."""
    from xlmeta_jax.data import tasks

    return tasks.register(
        vocab_path=corpus["vocab"], english_files=corpus["english"],
        cc100_dir=corpus["cc100_dir"], languages=corpus["languages"],
    )
