"""Every library text our filters and error checks match is still in the library.

xlmeta_jax.library_text.declare records each with the module whose source holds it; this
reads the installed source. A failure names the text, the module and the matcher to update.
"""

from __future__ import annotations

import importlib
import os

import pytest
import t5x_toy

from xlmeta_jax import library_text

# The modules that declare library texts (importing one records its texts).
MATCHERS = [
    "xlmeta_jax.errors",
    "xlmeta_jax.logs",
    "xlmeta_jax.cli.flags",
    "xlmeta_jax.data.beam_runs",
    "xlmeta_jax.pretrain.checkpoints",
]
T5X_MATCHERS = ["xlmeta_jax.interop.t5x.progress"]


def _check(matchers):
    for name in matchers:
        importlib.import_module(name)
    declared = [d for d in library_text.DECLARED if d.matcher in matchers]
    assert {d.matcher for d in declared} == set(matchers), "a matcher declares nothing"
    gone = [f"{d.matcher}: {d.text!r} (read from {d.package} {d.version}) is not in "
            f"{d.module}'s source" for d in declared if not d.found()]
    assert not gone, "\n".join(gone)


def test_library_texts_are_in_the_installed_libraries():
    _check(MATCHERS)


@pytest.mark.extras
def test_t5x_texts_are_in_t5x():
    t5x_toy.require_t5x()
    _check(T5X_MATCHERS)


def test_every_declaring_module_is_checked():
    # A new matcher outside these lists would go unchecked: find them by their source.
    root = os.path.dirname(os.path.dirname(os.path.abspath(library_text.__file__)))
    found = set()
    for folder, _, files in os.walk(os.path.join(root, "xlmeta_jax")):
        for f in files:
            path = os.path.join(folder, f)
            if f.endswith(".py") and "library_text.declare(" in open(path, encoding="utf-8").read():
                found.add(os.path.relpath(path, root)[:-3].replace(os.sep, "."))
    assert found == set(MATCHERS + T5X_MATCHERS)


def test_a_missing_text_is_reported():
    entry = library_text.LibraryText("no library prints this", "json", "python", "3.11",
                                     "test", "tests")
    assert entry.found() is False
    assert library_text.LibraryText("x", "no_such_module_xyz", "p", "0", "w", "t").found() is None
