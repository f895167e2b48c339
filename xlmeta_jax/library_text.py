"""Words of other libraries that our code matches, each declared once with its source.

A log filter that drops a library's notice, or a test of an exception's message, breaks
silently when the library rewords it: the notice comes back, or the error loses its one
line. Each such text is declared where it is matched, with :func:`declare`: the library's
module whose source holds it, the version it was read from, and why neither a logger level
nor an option of the library does the job. ``tests/test_library_text.py`` reads every
declared module's installed source and fails, naming the matcher, when the text is gone.

Texts that come from compiled code (XLA's status codes, TensorStore's messages, the C
library's ``strerror``) have no Python source to read; they are matched with a comment
beside them instead, and their commands' tests trigger them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect


@dataclasses.dataclass(frozen=True)
class LibraryText:
    """One matched text: ``text`` is a literal of ``module``'s source (a format string's
    literal part), read from ``package`` ``version``; ``why`` says why it is matched."""

    text: str
    module: str
    package: str
    version: str
    why: str
    matcher: str  # the module of ours that matches it

    def found(self) -> bool | None:
        """Whether the installed ``module``'s source holds ``text`` (None: not installed)."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            return None
        with open(spec.origin, encoding="utf-8") as f:
            return self.text in f.read()


DECLARED: list[LibraryText] = []


def declare(text: str, *, module: str, package: str, version: str, why: str) -> str:
    """Records a library's ``text`` that the calling module matches; returns ``text``.

    Args:
      text: the literal as it stands in the library's source.
      module: the library's module that prints or raises it.
      package: its distribution (``pip show`` name), or ``python`` for the standard library.
      version: the version it was read from.
      why: why a logger level or the library's own option does not replace the match.
    """
    caller = inspect.getmodule(inspect.stack()[1].frame)
    entry = LibraryText(text, module, package, version, why,
                        caller.__name__ if caller is not None else "?")
    if entry not in DECLARED:
        DECLARED.append(entry)
    return text
