"""``python -m xlmeta_jax.t5x_train``: t5x's own ``python -m t5x.train``, started quietly.

The same command (its flags, gin files and run): t5x's module runs as the main module
(``runpy``), as ``python -m`` runs it. What differs is before it: TensorFlow is imported
as our commands import it (:func:`xlmeta_jax.logs.quiet_start`), so neither its
start-up lines nor, on a host without NVIDIA GPUs, the ``cuInit`` error line of t5x's
hiding the GPUs from TensorFlow are printed. Both come before t5x reads the gin files,
where the rest is set up (gin/t5x/run.gin: our checks, one-line errors and progress
lines), so only a command started before t5x can drop them. ``XLMETA_DEBUG=1`` keeps
them, and t5x's whole log.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from xlmeta_jax import errors, logs

T5X_MAIN = "t5x.train"


def main(argv: Sequence[str] | None = None) -> None:
    """Runs ``python -m t5x.train`` with ``argv`` (default: this command's arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not errors.debug_requested(()):
        logs.quiet_start(import_tensorflow=True)
    # absl parses sys.argv; runpy puts t5x's file in sys.argv[0].
    sys.argv = [T5X_MAIN, *argv]
    runpy.run_module(T5X_MAIN, run_name="__main__", alter_sys=True)
