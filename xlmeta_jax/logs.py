"""Start-up hygiene of the commands: no third-party noise that reads like a failure.

TensorFlow (the input pipeline's tf.data) logs at import, before its log level
applies, and on hosts without NVIDIA GPUs an ERROR line about ``cuInit``: our
TensorFlow never runs on an accelerator (JAX owns them), so both are noise.
Setting ``TF_CPP_MIN_LOG_LEVEL=0`` yourself (more than JAX's default "1") keeps
TensorFlow's own lines; "2" or "3" (fewer) get the quiet start too. The backend
choice on hosts with libtpu but no TPU is :mod:`xlmeta_jax.platforms`'s.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys

from xlmeta_jax import library_text, platforms


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


class _QuietImport(importlib.abc.Loader):
    """TensorFlow's own loader, run with fd 2 silenced (its import-time C++ lines)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Python exceptions raised by the import still surface (after fd 2 is back).
        with _stderr_silenced():
            self._loader.exec_module(module)


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Imports TensorFlow quietly whenever something first imports it (seqio, tf.data).

    A command that refuses its input before reading data never pays TensorFlow's import
    (3 to 4 s); one that reads data gets it without the start-up lines.
    """

    _looking = False

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow" or self._looking:
            return None
        self._looking = True  # the lookup below asks every finder again, this one too
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._looking = False
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietImport(spec.loader)
        return spec


def quiet_start(*, import_tensorflow: bool = False) -> None:
    """Quiets TensorFlow's start-up lines (call first in a command's ``main``).

    TensorFlow is then imported without them when something first needs it.

    Args:
      import_tensorflow: import TensorFlow now (a worker process that needs it at once).
    """
    platforms.prefer_cpu_without_tpu()
    # A user who asks for TensorFlow's info lines ("0") gets them; "2" and "3" ask for
    # fewer, and TensorFlow's import-time lines ignore the level, so they are dropped too.
    verbose = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "0"
    if not verbose and not platforms.has_nvidia_device():
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if verbose or "tensorflow" in sys.modules:
        return
    if not any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
    if import_tensorflow:
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            pass


# Orbax warns (on stderr, through absl) whenever a save waited more than a few seconds for
# the previous one: on a loaded machine or a slow disk that is routine and not a failure.
# Only a wait this long is worth a line, and then as one of our progress lines.
SLOW_SAVE_SECONDS = 60.0
_SAVE_WAIT = library_text.declare(
    "Waiting for previous save to complete took", module="orbax.checkpoint.checkpoint_manager",
    package="orbax-checkpoint", version="0.12.8",
    why="its threshold is a module constant, not an option; the filter turns a long wait "
        "into one of our progress lines instead of dropping it")


class _SaveWaitFilter(logging.Filter):
    """Turns Orbax's "waiting for previous save" warning into a progress line when long."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_SAVE_WAIT):
            return True
        try:
            seconds = float(record.args[0]) if record.args else 0.0
        except (TypeError, ValueError, IndexError):
            seconds = 0.0
        if seconds >= SLOW_SAVE_SECONDS:
            progress.info("checkpoint saves are slow: waited %.0f s for the previous save "
                          "(a larger CHECKPOINT_EVERY saves less often)", seconds)
        return False


_SAVE_WAIT_FILTER = _SaveWaitFilter()
# The progress lines of both entry points (xlmeta_jax.train, python -m t5x.train).
progress = logging.getLogger("xlmeta_jax.train")


class _InterruptedFilter(logging.Filter):
    """Drops records logged while a Ctrl-C unwinds (seqio's "Failed to load task ..."
    from its ``except:`` block): the command's one "interrupted" line says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(sys.exc_info()[1], KeyboardInterrupt)


_INTERRUPTED_FILTER = _InterruptedFilter()


def quiet_save_waits() -> None:
    """Installs the "waiting for previous save" filter on absl's logger (idempotent),
    and the one that drops what libraries log while a Ctrl-C unwinds."""
    logging.getLogger("absl").addFilter(_SAVE_WAIT_FILTER)
    logging.getLogger("absl").addFilter(_INTERRUPTED_FILTER)


class _CurrentStdout(logging.StreamHandler):
    """A StreamHandler on whatever ``sys.stdout`` is at each line.

    The handler outlives the command that installed it (one per process): a later
    ``contextlib.redirect_stdout``, a notebook's or a test's capture replaces
    ``sys.stdout``, and the one seen at install time may be closed by then.
    """

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value):  # StreamHandler.__init__ assigns it; the property decides
        pass


def show_progress() -> None:
    """Prints the progress lines on stdout, whatever absl's verbosity (idempotent)."""
    if not progress.handlers:
        handler = _CurrentStdout()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    # Not also through absl's handler on the root logger, in absl's format.
    progress.propagate = False
