"""User errors, and how every command reports them: one line, no traceback.

A bad input (a gin binding, a file, a language code), a damaged or locked run
directory, a full disk or Ctrl-C are not bugs: the command prints one line
naming the bad thing and exits non-zero. Anything else is a bug and keeps its
traceback. ``--debug`` on any command (or ``XLMETA_DEBUG=1``) shows the
traceback of user errors too.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from xlmeta_jax import library_text, platforms

DEBUG_ENV = "XLMETA_DEBUG"
DEBUG_FLAG = "--debug"

# Exit status for user errors (argparse uses 2 as well) and for an interrupted run.
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A bad input or a faulty run directory, reported as one line."""


class SettingError(UserError, ValueError):
    """A setting out of range, refused where its config object is built (its one check).

    The line names the setting by its class and field (``Masking.rate: masking rate must
    be ...``). A command that knows where the value came from (a gin macro such as
    ``MASK_RATE``, a phase's scoped binding) names that instead (:func:`name_settings_by`),
    so the check keeps the only copy of its words.
    """

    def __init__(self, configurable: str, field: str, value: Any, message: str, *,
                 scope: str | None = None, context: str = ""):
        super().__init__(configurable, field, value, message)
        # The configurable's full name (the one gin files bind), e.g. xlmeta_jax.model.mlm.Masking.
        self.configurable = configurable
        self.field = field
        self.value = value
        self.message = message
        # The object's own name where settings are scoped by it (a phase's), else None.
        self.scope = scope
        # What the line starts with, e.g. "phase 'stage1': ".
        self.context = context
        self.setting = f"{configurable.rpartition('.')[2]}.{field}"
        # gin re-raises an error from a configurable's call as a proxy of it: naming the
        # proxy's setting must reach the error its text comes from.
        self._original = self

    def name(self, setting: str) -> None:
        """Names the setting as the user gave it (a macro, a scoped binding)."""
        self._original.setting = setting

    def key(self) -> str:
        """The setting's binding key: ``[scope/]configurable.field``."""
        key = f"{self.configurable}.{self.field}"
        return f"{self.scope}/{key}" if self.scope else key

    def __str__(self) -> str:
        return f"{self.context}{self.setting}: {self.message}"

    def __reduce__(self):
        # Crosses processes whole (a Beam worker, a pool), whatever a subclass's constructor
        # takes: rebuilt from its args and attributes, not by calling the constructor.
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type[SettingError], args: tuple) -> SettingError:
    return cls.__new__(cls, *args)


# How commands that parse gin name a SettingError's setting (cli/flags.py sets it).
_setting_namer: Callable[[SettingError], str] | None = None


def name_settings_by(namer: Callable[[SettingError], str] | None) -> None:
    """Has every command's one line name a bad setting by ``namer(error)``."""
    global _setting_namer
    _setting_namer = namer


class Interrupted(UserError):
    """The run stopped on Ctrl-C / SIGTERM after leaving a resumable state."""


class NoSpaceError(UserError, OSError):
    """The disk filled up while writing (the partial output has been removed)."""


class NonFiniteError(UserError, FloatingPointError):
    """Training diverged: a non-finite loss, or parameters that would be checkpointed."""


class NothingTrainedError(UserError, RuntimeError):
    """Training steps that predict no token: nothing is learned (e.g. a tiny masking rate)."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, unreadable, damaged or inconsistent with the run."""


def is_count(value) -> bool:
    """Whether a setting is a count: an integer > 0 (a bool is not one).

    The one test of step counts, batch sizes and lengths, wherever they are checked
    (gin bindings, the trainer's phases, the experiment's budget).
    """
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def count_problem(value) -> str | None:
    """What is wrong with a count setting (:func:`is_count`), or None."""
    return None if is_count(value) else f"must be an integer > 0, got {value!r}"


def first_line(e: BaseException) -> str:
    """The message of ``e`` without gin's "In call to configurable ..." context lines."""
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0].strip()


# Write failures that mean "no room": the disk, a quota, or the file-size limit.
_NO_SPACE = {
    errno.ENOSPC: ("No space left on device", "no space left on device"),
    errno.EDQUOT: ("Disk quota exceeded", "disk quota exceeded"),
    errno.EFBIG: ("File too large", "file size limit exceeded (ulimit -f)"),
}


# How those failures read in other libraries' messages and logs.
NO_SPACE_TEXTS = tuple(text for text, _ in _NO_SPACE.values())


def no_space(e: BaseException) -> str | None:
    """What ran out when ``e`` (or its cause chain) is a write that found no room, else None.

    Python's OSError by errno, or the same condition in another library's text
    (TensorStore's, TensorFlow's ``SaveV2``).
    """
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for code, (text, what) in _NO_SPACE.items():
            if (isinstance(e, OSError) and e.errno == code) or text in str(e):
                return what
        e = e.__cause__ or e.__context__
    return None


def is_no_space(e: BaseException) -> bool:
    """True when ``e`` or its cause chain is a write that found no room (:func:`no_space`)."""
    return no_space(e) is not None


def _user_message(e: BaseException) -> str | None:
    """The one line for a user error, or None for a bug (which keeps its traceback)."""
    if isinstance(e, SettingError) and _setting_namer is not None:
        e.name(_setting_namer(e))
    if isinstance(e, UserError):
        return first_line(e)
    if is_no_space(e):
        return f"{no_space(e)} ({first_line(e)[:300]})"
    # A path the user gave that is missing, in the way or not accessible (the
    # message names it).
    if isinstance(e, (FileNotFoundError, FileExistsError, NotADirectoryError,
                      IsADirectoryError, PermissionError)):
        return first_line(e)
    if isinstance(e, OSError) and e.errno == errno.EROFS and e.filename:
        return f"{e.filename}: read-only file system"
    text = str(e)
    # Left-unset %gin.REQUIRED macros / parameters surface from gin at call time.
    if isinstance(e, ValueError) and any(t in text for t in _GIN_REQUIRED):
        return first_line(e)
    return None


def user_message(e: BaseException) -> str | None:
    """The one line a command prints for ``e``, or None when ``e`` is a bug."""
    return _user_message(e)


def _drop_unraisable(unraisable) -> None:
    del unraisable


def _drop_closed_loop_callbacks(unraisable) -> None:
    """Drops TensorStore callbacks that land on Orbax's already-closed event loop.

    When one read of a damaged checkpoint fails, Orbax closes its asyncio loop while
    TensorStore may still complete the other reads; their callbacks then fail in
    ``call_soon_threadsafe`` with "Event loop is closed", reported as unraisable
    (a bare traceback, possibly before the read's own error reaches the command).
    They carry nothing the command's one line does not say; anything else goes to the
    previous hook.
    """
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook
# asyncio's own wording, f"{type(self).__name__} exception was never retrieved": Task,
# Future, _GatheringFuture.
_NEVER_RETRIEVED = re.compile(r"\w+" + re.escape(library_text.declare(
    " exception was never retrieved", module="asyncio.futures", package="python",
    version="3.11",
    why="asyncio logs it at ERROR through the loop's exception handler, the same way as "
        "any other failed task's; a level on the 'asyncio' logger would hide those too")))


class _DropFailedCheckpointReads(logging.Filter):
    """Drops asyncio's "Task/Future exception was never retrieved" for TensorStore reads.

    When one array of a damaged checkpoint cannot be read, Orbax's gather raises that
    read's error (the command's one line) and leaves the other reads' tasks and futures,
    which fail the same way, to be collected later: asyncio then logs each as an ERROR
    with its traceback (a task or a bare future, depending on which of Orbax's reads
    failed first). They repeat the line; any other never-retrieved one is still logged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _NEVER_RETRIEVED.match(record.getMessage()):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        text = f"{type(exc).__module__} {exc}" if exc is not None else record.getMessage()
        # TensorStore's words (compiled: no source to test; test_checkpoint_checksums' damaged
        # checkpoints raise them).
        return not any(k in text for k in ("tensorstore", "OCDBT", '"zarr" driver'))


def _quiet_failed_checkpoint_reads() -> None:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _DropFailedCheckpointReads) for f in asyncio_log.filters):
        asyncio_log.addFilter(_DropFailedCheckpointReads())


# gin's ValueErrors for a required binding left unset: gin raises ValueError for every
# configuration mistake, and only these words tell this one from a bug.
_GIN_REQUIRED = tuple(library_text.declare(
    t, module="gin.config", package="gin-config", version="0.5.0",
    why="gin raises a plain ValueError for it; the words are what sets it apart")
    for t in ("gin.REQUIRED", "Required bindings"))


class UsageError(UserError):
    """A command-line flag is missing, unknown or has a value of the wrong type."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose mistakes are user errors: one line, no usage block.

    ``error`` is argparse's documented hook for them; the line ``run_command`` prints
    names the program, as for every other user error, and points to ``--help``.
    """

    def error(self, message: str):
        raise UsageError(f"{message} (see --help)")


def positive_int(value: str) -> int:
    """argparse ``type=`` of a count flag (``--seeds=N``): an integer > 0."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"needs a positive integer, got {value!r}")
    return int(value)


def own_flags_parser(prog: str) -> ArgumentParser:
    """The parser of a gin command's own flags (argparse, like every tool's): its
    ``parse_known_args`` returns the rest (gin's flags, the multi-host ones) in order."""
    return ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)


def add_debug_flag(parser) -> None:
    """Lists ``--debug`` in an argparse command's ``--help`` (run_command consumes it)."""
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help=f"show the traceback of an error (also {DEBUG_ENV}=1)")


def debug_requested(argv: Sequence[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


# Set while several processes run one job (cli/peers.py): ends this process on a failure,
# and the others with it, instead of returning (see run_command).
_failure_hook: Callable[[int, str, str], None] | None = None


def on_failure(hook: Callable[[int, str, str], None] | None) -> None:
    """Has ``run_command`` call ``hook(status, line, summary)`` on a failure instead of
    printing ``line`` and returning ``status`` (2: a user error; 1: a bug, called while it
    is handled, so that the hook can print its traceback). ``summary`` names the error
    without the program. Not for a Ctrl-C stop, which every process of a run agrees on and
    ends by itself."""
    global _failure_hook
    _failure_hook = hook


def run_command(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None,
                *, prog: str) -> int:
    """Runs ``main(argv)``; user errors become one line on stderr and an exit status.

    Args:
      main: the command's ``main`` (takes the arguments without ``--debug``).
      argv: arguments (default: ``sys.argv[1:]``).
      prog: the command's name, printed before the message.

    Returns:
      The exit status: 0, ``EXIT_USER_ERROR``, ``EXIT_INTERRUPTED`` or main's int result.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != DEBUG_FLAG]
    if not debug:
        sys.unraisablehook = _drop_closed_loop_callbacks
        _quiet_failed_checkpoint_reads()
    platforms.prefer_cpu_without_tpu()
    try:
        result = main(argv)
    except KeyboardInterrupt as e:
        if debug:
            raise
        # A bare KeyboardInterrupt has no message (and an exception is always truthy).
        print(f"{prog}: {str(e) or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - classified below; bugs are re-raised
        message = _user_message(e)
        if message is None or debug:
            if _failure_hook is not None:
                summary = f"{type(e).__name__}: {first_line(e)}"
                _failure_hook(1, f"{prog}: {summary}", summary)
            raise
        # Concurrent reads that failed alongside the reported one (TensorStore's, in
        # Orbax's asyncio gather) are collected at exit as "Exception ignored" dumps:
        # they repeat what the line says.
        sys.unraisablehook = _drop_unraisable
        if isinstance(e, Interrupted):
            print(f"{prog}: {message}", file=sys.stderr)
            return EXIT_INTERRUPTED
        if _failure_hook is not None:
            _failure_hook(EXIT_USER_ERROR, f"{prog}: error: {message}", message)
        print(f"{prog}: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    return result if isinstance(result, int) else 0


def exit_with(main: Callable[[list[str]], Any], *, prog: str) -> None:
    """``sys.exit(run_command(main, prog=prog))``: the body of a ``__main__`` block."""
    sys.exit(run_command(main, prog=prog))
