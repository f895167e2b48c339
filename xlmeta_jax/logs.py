"""Start-up hygiene of the commands: no third-party noise that reads like a failure.

TensorFlow (the input pipeline's tf.data) logs at import, before its log level
applies, and on hosts without NVIDIA GPUs an ERROR line about ``cuInit``: our
TensorFlow never runs on an accelerator (JAX owns them), so both are noise.
Setting ``TF_CPP_MIN_LOG_LEVEL`` yourself (to anything but JAX's default "1") keeps
TensorFlow's own behaviour.
"""

from __future__ import annotations

import contextlib
import os
import sys


def _has_nvidia_device() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


@contextlib.contextmanager
def _stderr_silenced():
    """Redirects the process's stderr (fd 2, where C++ logs go) to /dev/null."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quiet_start(*, import_tensorflow: bool = False) -> None:
    """Quiets TensorFlow's start-up lines (call first in a command's ``main``).

    Args:
      import_tensorflow: import TensorFlow now, with its import-time C++ lines
        dropped (for commands whose input pipeline needs it anyway).
    """
    # JAX's import sets "1" by default (os.environ.setdefault), so only another value
    # is the user's own choice.
    user_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") != "1"
    if not user_level and not _has_nvidia_device():
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if import_tensorflow and not user_level and "tensorflow" not in sys.modules:
        # Python exceptions raised by the import still surface (after fd 2 is back).
        with _stderr_silenced():
            try:
                import tensorflow  # noqa: F401
            except ImportError:
                pass
