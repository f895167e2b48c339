"""t5x-style gin command-line flags shared by every entry point.

Accepted flags (repeatable)::

    --gin_file=gin/meta.gin            a gin file (searched in --gin_search_paths)
    --gin_bindings="NAME = VALUE"      a raw gin binding
    --gin.NAME=VALUE                   shorthand for --gin_bindings="NAME = VALUE"
    --gin_search_paths=DIR[,DIR]       where --gin_file and gin `include`s are looked up

As in t5x, string values keep their gin quoting: ``--gin.MODEL_DIR="'/tmp/run'"``.
The repository's ``gin/`` folder and the package directory are always searched.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Sequence

import gin

REPO_GIN_DIR = pathlib.Path(__file__).resolve().parents[1] / "gin"


@dataclasses.dataclass
class GinFlags:
    """Gin flags parsed from argv, plus the arguments gin did not claim."""

    gin_files: list[str]
    bindings: list[str]
    search_paths: list[str]
    remaining: list[str]


def parse_gin_flags(argv: Sequence[str]) -> GinFlags:
    """Splits gin flags out of ``argv`` (program name excluded).

    Args:
      argv: command-line arguments, e.g. ``sys.argv[1:]``.

    Returns:
      The gin files, bindings (``--gin.X=Y`` expanded to ``X = Y``), search paths,
      and every other argument untouched.

    Raises:
      ValueError: for a gin flag without a value.
    """
    files, bindings, paths, rest = [], [], [], []
    it = iter(argv)
    for arg in it:
        name, eq, value = arg.partition("=")
        is_gin = name in ("--gin_file", "--gin_bindings", "--gin_search_paths") or (
            name.startswith("--gin.")
        )
        if not is_gin:
            rest.append(arg)
            continue
        if not eq:
            value = next(it, None)
            if value is None:
                raise ValueError(f"flag {name} needs a value")
        if name == "--gin_file":
            files.append(value)
        elif name == "--gin_bindings":
            bindings.append(value)
        elif name == "--gin_search_paths":
            paths.extend(p for p in value.split(",") if p)
        else:
            target = name[len("--gin.") :]
            if not target:
                raise ValueError(f"malformed flag {arg!r}: expected --gin.NAME=VALUE")
            bindings.append(f"{target} = {value}")
    return GinFlags(files, bindings, paths, rest)


def parse_command_line(argv: Sequence[str], *, doc: str, example: str) -> GinFlags | None:
    """Gin flags of a command that takes nothing else; None after printing ``--help``.

    Args:
      argv: the command's arguments (program name excluded).
      doc: printed for ``-h`` / ``--help``.
      example: a gin file to name when none is given (e.g. ``gin/finetune/tydiqa.gin``).

    Raises:
      SystemExit: for unknown arguments or no ``--gin_file``.
    """
    if any(a in ("-h", "--help") for a in argv):
        print(doc)
        return None
    flags = parse_gin_flags(argv)
    if flags.remaining:
        raise SystemExit(
            f"unknown arguments {flags.remaining}; use --gin_file, --gin_bindings, "
            "--gin.NAME=VALUE or --gin_search_paths"
        )
    if not flags.gin_files:
        raise SystemExit(f"no --gin_file given (e.g. --gin_file={example})")
    return flags


def apply_gin(
    gin_files: Sequence[str],
    bindings: Sequence[str],
    search_paths: Sequence[str] = (),
    *,
    finalize: bool = True,
) -> None:
    """Parses gin files and bindings, searching ``search_paths`` and ``gin/``.

    Starts from an empty config: a notebook or a test may run several commands (each
    one locks its config) in one process.

    Raises:
      FileNotFoundError: naming a gin file that is in none of the search paths.
    """
    search = [*search_paths, os.getcwd(), os.fspath(REPO_GIN_DIR), os.fspath(REPO_GIN_DIR.parent)]
    for path in search:
        gin.add_config_file_search_path(path)
    resolved = []
    for f in gin_files:
        candidates = [f] + [os.path.join(p, f) for p in search]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            raise FileNotFoundError(
                f"gin file {f!r} not found (searched: {', '.join(search)})"
            )
        resolved.append(found)
    gin.clear_config()
    gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=finalize)


def write_config(model_dir: str, filename: str = "config.gin") -> str:
    """Writes the full parsed config (before anything ran) to MODEL_DIR."""
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, filename)
    with open(path, "w") as f:
        f.write(gin.config_str())
    return path
