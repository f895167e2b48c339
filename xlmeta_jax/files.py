"""Files written whole: a reader (or a rerun after a crash) sees the old content or the
new, never a half-written file. Results, reports, configs and the "done" markers of runs
and experiments are written this way."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable


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
