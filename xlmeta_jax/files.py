"""Files and folders written whole: a reader (or a rerun after a crash) sees the old
content or the new, never a half-written one. Results, reports, configs and the "done"
markers of runs and experiments are written this way (:func:`write_atomic`), and so are
the folders prepared once for a run, such as the demo's corpus (:func:`built_whole`).
The paths a user types are read here too, as a shell reads them (:func:`user_path`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator

from xlmeta_jax import errors


def write_atomic(path: str | os.PathLike, content: str | bytes | None = None, *,
                 write: Callable[[str], None] | None = None) -> None:
    """Writes ``path`` through a temporary sibling renamed over it (``os.replace``).

    Args:
      path: the file to (re)write; its folder must exist.
      content: the text (UTF-8) or bytes to write; or
      write: ``write(temporary_path)`` writes the file itself (e.g. safetensors).

    The temporary file is removed when writing fails, so nothing half-written is left.
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        if write is not None:
            write(tmp)
        elif isinstance(content, bytes):
            with open(tmp, "wb") as f:
                f.write(content)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(content)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def _beside(folder: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """Yields ``(folder, tmp)``: the folder a link points to, and a new temporary sibling
    of it, removed at the end unless it was renamed away.

    Beside the folder a link points to, so that the link stays and the renames stay on
    the folder's file system.
    """
    folder = os.path.realpath(os.fspath(folder))
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.", dir=parent)
    try:
        yield folder, tmp
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)


@contextlib.contextmanager
def built_whole(folder: str) -> Iterator[str]:
    """Yields a temporary sibling of ``folder`` to build in, renamed to ``folder`` at the end.

    An interrupted or failed build removes the temporary folder and leaves ``folder`` as
    it was, so a rerun never mistakes half-written files for a prepared folder; a
    successful one replaces ``folder`` whole. An old ``folder`` is renamed aside, the new
    one renamed into its place and only then the old one removed: ``folder`` is missing
    only between two renames on one file system (an exception there puts the old one
    back), never while a large old folder is deleted.

    Args:
      folder: the folder to create, e.g. ``MODEL_DIR/corpus``.
    """
    with _beside(folder) as (folder, tmp):
        yield tmp
        if not os.path.exists(folder):
            os.rename(tmp, folder)
            return
        old = f"{tmp}.old"  # tmp's name is this build's own: so is this one
        os.rename(folder, old)
        try:
            os.rename(tmp, folder)
        except BaseException:
            os.rename(old, folder)
            raise
        shutil.rmtree(old)


@contextlib.contextmanager
def staged_into(folder: str | os.PathLike, *, last: str) -> Iterator[str]:
    """Yields a temporary sibling of ``folder`` to write files into, moved into ``folder``
    at the end, ``last`` last.

    Unlike :func:`built_whole` the folder may hold other files, which stay (an export into
    a folder prepared with its tokenizer). A failed or interrupted write removes the
    temporary folder and leaves ``folder`` as it was; the moves are renames on one file
    system, and ``last`` (e.g. ``config.json``) arriving last marks the files complete.
    """
    with _beside(folder) as (folder, tmp):
        yield tmp
        os.makedirs(folder, exist_ok=True)
        for name in sorted(os.listdir(tmp), key=lambda n: (n == last, n)):
            _move_into(os.path.join(tmp, name), os.path.join(folder, name))


def _move_into(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst``; a folder onto an existing folder merges into it."""
    if os.path.isdir(src) and os.path.isdir(dst):
        for name in sorted(os.listdir(src)):
            _move_into(os.path.join(src, name), os.path.join(dst, name))
        return
    os.replace(src, dst)


def not_a_folder(path: str | os.PathLike, what: str) -> str | None:
    """Why ``path`` cannot be (or become) a folder, as one line naming it; None if it can.

    A file at ``path`` or at one of its parents is in the way of ``os.makedirs``, whose
    own text is a bare ``[Errno 17] File exists`` or ``[Errno 20] Not a directory``.
    URLs (``gs://...``) are not checked.
    """
    path = os.path.abspath(os.fspath(path)) if "://" not in os.fspath(path) else None
    if path is None:
        return None
    for parent in (path, *_parents(path)):
        if os.path.exists(parent):
            if os.path.isdir(parent):
                return None
            if parent == path:
                return f"{what} {path} is a file, not a directory"
            return f"{what} {path}: {parent} is a file, not a directory"
    return None


def _parents(path: str) -> Iterator[str]:
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        yield path


# $NAME or ${NAME}, as a shell expands them (os.path.expandvars leaves unset ones as typed).
_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def user_path(path, setting: str):
    """A path a user typed, read as a shell would: ``~`` and ``$NAME`` expanded.

    Every path setting of the commands (gin bindings and flags) goes through here once,
    where the config is built, so ``~/runs/x`` is never a folder named ``~``. URLs
    (``gs://...``) and None are returned as given.

    Args:
      path: the value as given (a str or os.PathLike; None).
      setting: how errors name it (``MODEL_DIR``, ``--output``).

    Raises:
      errors.UserError: the path names an environment variable that is not set.
    """
    if path is None:
        return None
    path = os.fspath(path)
    if "://" in path:
        return path
    expanded = os.path.expandvars(os.path.expanduser(path))
    unset = _VARIABLE.search(expanded)
    if unset:
        raise errors.UserError(
            f"{setting}={path!r}: the environment variable {unset.group(1).strip('{}')} "
            f"is not set"
        )
    return expanded


def user_paths(paths, setting: str):
    """:func:`user_path` of a path or of each in a (nested) list or tuple of them."""
    if isinstance(paths, list | tuple):
        return type(paths)(user_paths(p, setting) for p in paths)
    return user_path(paths, setting)


def path_flag(flag: str) -> Callable[[str], str]:
    """An argparse ``type=`` reading a path flag with :func:`user_path` (``--output=~/x``:
    the shell leaves that ``~`` as typed)."""
    return lambda value: user_path(value, flag)
