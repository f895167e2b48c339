"""t5x-style gin command-line flags shared by every entry point.

Accepted flags (repeatable)::

    --gin_file=gin/native/meta.gin     a gin file (searched in --gin_search_paths)
    --gin_bindings="NAME = VALUE"      a raw gin binding
    --gin.NAME=VALUE                   shorthand for --gin_bindings="NAME = VALUE"
    --gin_search_paths=DIR[,DIR]       where --gin_file and gin `include`s are looked up

As in t5x, string values keep their gin quoting: ``--gin.MODEL_DIR="'/tmp/run'"``.
The repository's ``gin/`` folder and the package directory are always searched.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import io
import logging
import os
import pathlib
import re
import textwrap
import tokenize
import typing
from collections.abc import Sequence

import gin

from xlmeta_jax import errors, library_text
from xlmeta_jax.errors import UserError

REPO_GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin"


class GinConfigError(UserError, ValueError):
    """A gin file or binding is wrong (unknown macro, wrong type, syntax, missing file)."""


class GinFileNotFoundError(GinConfigError, FileNotFoundError):
    """A ``--gin_file`` is in none of the search paths."""


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


GIN_FLAGS_HELP = (
    ("--gin_file=FILE", "gin file, repeatable; looked up in --gin_search_paths, the current "
     "folder and the repository's gin/"),
    ("--gin.NAME=VALUE", "bind a macro or parameter (strings keep their quotes: "
     "--gin.MODEL_DIR=\"'/runs/x'\"); an unknown macro is an error"),
    ("--gin_bindings='NAME = VALUE'", "the same as a raw gin binding, repeatable"),
    ("--gin_search_paths=DIR[,DIR]", "extra folders for --gin_file and gin includes"),
    ("--debug", "show the traceback of an error (also: XLMETA_DEBUG=1)"),
    ("-h, --help", "show this help and exit"),
)


def help_text(prog: str, summary: str, *, gin_files: Sequence[str], example: str,
              flags: Sequence[tuple[str, str]] = ()) -> str:
    """The ``--help`` of a gin-configured command.

    Args:
      prog: module run with ``python -m``.
      summary: what the command does (a paragraph).
      gin_files: glob patterns under the repository's ``gin/`` it takes.
      example: one complete command line.
      flags: the command's own (non-gin) flags as (flag, help).
    """

    rows = [*GIN_FLAGS_HELP, *flags]
    width = max(len(f) for f, _ in rows) + 2
    out = [f"usage: python -m {prog} --gin_file=FILE [--gin.NAME=VALUE ...] [flags]", ""]
    out += textwrap.wrap(" ".join(summary.split()), 88) + ["", "flags:"]
    for flag, text in rows:
        wrapped = textwrap.wrap(text, 88 - width - 2) or [""]
        out.append(f"  {flag:<{width}}{wrapped[0]}")
        out += [" " * (width + 2) + w for w in wrapped[1:]]
    out += ["", "gin files it takes (in gin/):"]
    names = listed_gin_files(gin_files)
    out += textwrap.wrap("  ".join(names) or "(none found)", 86, initial_indent="  ",
                         subsequent_indent="  ")
    out += ["", "example:", f"  {example}"]
    return "\n".join(out)


def listed_gin_files(patterns: Sequence[str]) -> list[str]:
    """The files of ``gin/`` that ``patterns`` name (a ``--help``'s list; tests parse each)."""
    return sorted({os.fspath(p.relative_to(REPO_GIN_DIR)) for pattern in patterns
                   for p in REPO_GIN_DIR.glob(pattern)})


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def parse_command_line(argv: Sequence[str], *, doc: str, example: str) -> GinFlags | None:
    """Gin flags of a command that takes nothing else; None after printing ``--help``.

    Args:
      argv: the command's arguments (program name excluded).
      doc: printed for ``-h`` / ``--help``.
      example: a gin file to name when none is given (e.g. ``gin/finetune/tydiqa.gin``).

    Raises:
      UserError: (one line) for unknown arguments or no ``--gin_file``.
    """
    if wants_help(argv):
        print(doc)
        return None
    try:
        flags = parse_gin_flags(argv)
    except ValueError as e:
        raise UserError(str(e)) from None
    if flags.remaining:
        raise UserError(
            f"unknown arguments {flags.remaining}; use --gin_file, --gin_bindings, "
            "--gin.NAME=VALUE or --gin_search_paths (see --help)"
        )
    if not flags.gin_files:
        raise UserError(f"no --gin_file given (e.g. --gin_file={example})")
    return flags


_PATH_NOT_FOUND = library_text.declare(  # gin's ERROR per include probe, on the root logger
    "Path not found", module="gin.resource_reader", package="gin-config", version="0.5.0",
    why="the root logger's level is every library's; gin has no option to probe quietly")
_MALFORMED = library_text.declare(  # gin's literal_eval of a bare word: a plain ValueError
    "malformed node", module="ast", package="python", version="3.11", why="no own type")


def _not_an_include_probe(record: logging.LogRecord) -> bool:
    """A log filter: gin's "Path not found" is one probe of an include another path finds."""
    return not str(record.msg).startswith(_PATH_NOT_FOUND)


def apply_gin(
    gin_files: Sequence[str],
    bindings: Sequence[str],
    search_paths: Sequence[str] = (),
    *,
    finalize: bool = True,
    check_macros: bool = False,
) -> None:
    """Parses gin files and bindings, searching ``search_paths`` and ``gin/``.

    Starts from an empty config: a notebook or a test may run several commands (each
    one locks its config) in one process.

    Files are parsed first; then (with ``check_macros``) each binding of a macro
    (``NAME = VALUE``) must name a macro the files define or use, and every
    literal value must have the type its configurable parameter declares.

    Args:
      gin_files: gin files, in order.
      bindings: ``NAME = VALUE`` bindings applied after the files.
      search_paths: folders searched for the files and their includes.
      finalize: lock the config afterwards.
      check_macros: refuse bindings of macros the files neither define nor use (a
        command line's misspelling); off for programs that bind a fixed set of
        macros to whichever files they load.

    Raises:
      GinConfigError: naming a gin file that is in none of the search paths, an
        unknown macro (with the known ones nearby), a value of the wrong type, or
        gin's own parse error.
    """
    search = [*search_paths, os.getcwd(), os.fspath(REPO_GIN_DIR), os.fspath(REPO_GIN_DIR.parent)]
    for path in search:
        gin.add_config_file_search_path(path)
    resolved = []
    for f in gin_files:
        candidates = [f] + [os.path.join(p, f) for p in search]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            raise GinFileNotFoundError(
                f"gin file {f!r} not found (searched: {', '.join(search)})"
            )
        resolved.append(found)
        if _T5X_RUN_FILE.search(_read_text(found)):  # gin/meta.gin, gin/xlmr.gin
            raise GinConfigError(
                f"gin file {f} is a run file of t5x's trainer: run it with python -m "
                f"t5x.train --gin_file={f} (or python -m xlmeta_jax.t5x_train); this "
                "command's run files are gin/native/*.gin and gin/demo*.gin")
        cycle = _include_cycle(found, search)
        if cycle:
            raise GinConfigError(f"gin config: gin file {found} includes itself: "
                                 f"{' -> '.join(cycle)}")
    gin.clear_config()
    probes = _not_an_include_probe
    logging.getLogger().addFilter(probes)
    try:
        # One at a time, so that an error gin reports without a place names its file.
        for path in resolved:
            _parse(f"gin file {path}", files=[path])
        if check_macros:
            check_macro_bindings(bindings)
        for binding in bindings:
            _parse(f"binding {binding!r}", bindings=[binding])
        check_types()
        if finalize:
            gin.finalize()
    except (ValueError, SyntaxError, TypeError, OSError, tokenize.TokenError) as e:
        if isinstance(e, UserError):
            raise
        raise GinConfigError(f"gin config: {_gin_message(e)}") from e
    finally:
        logging.getLogger().removeFilter(probes)


_BAD_TOKEN = re.compile(r"Failed to parse token '(.*)'")
_INCLUDE = re.compile(r"""^include\s+['"]([^'"]+)['"]""", re.MULTILINE)
# Only t5x's run files hold t5x's train script as a module or include gin/t5x/run settings.
_T5X_RUN_FILE = re.compile(r"^(import __main__ as train_script|include 'gin/t5x/\w+\.gin')",
                           re.MULTILINE)
_T5X_DYNAMIC = re.compile(r"^from __gin__ import dynamic_registration", re.MULTILINE)
_T5X_SETTINGS = re.compile(r"^include 'gin/t5x/", re.MULTILINE)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return ""  # gin's own parse reports it


def t5x_addon_text(path: str) -> str | None:
    """The text of ``path`` when it is a t5x file a run adds (gin/t5x/mesh.gin): t5x's
    dynamic registration without t5x's run settings (a run file includes them), else None."""
    text = _read_text(path)
    return text if _T5X_DYNAMIC.search(text) and not _T5X_SETTINGS.search(text) else None


def _include_cycle(path: str, search: Sequence[str], chain: tuple[str, ...] = ()
                   ) -> list[str] | None:
    """The include chain from ``path`` back to a file already on it, else None.

    gin follows includes without a check and a cycle ends in a RecursionError
    thousands of lines long; this names the files instead.
    """
    here = os.path.realpath(path)
    if here in chain:
        return [*chain[chain.index(here):], here]
    if len(chain) > 50:
        return None
    for name in _INCLUDE.findall(_read_text(path)):
        candidates = [os.path.join(os.path.dirname(path), name), name,
                      *(os.path.join(p, name) for p in search)]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found:
            cycle = _include_cycle(found, search, (*chain, here))
            if cycle:
                return cycle
    return None


def _parse(what: str, *, files: Sequence[str] = (), bindings: Sequence[str] = ()) -> None:
    """gin's parse of ``files`` or ``bindings``, its two unclear errors made clear.

    A bare word (an unquoted string) is reported by gin as Python's ``malformed node
    or string ... <ast.Name object at 0x...>``, and an unclosed bracket as tokenize's
    ``EOF in multi-line statement`` with no file; both name ``what`` (or gin's file
    and line) instead.

    Raises:
      GinConfigError: for those two errors; gin's other errors pass unchanged.
    """
    try:
        gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
    except (SyntaxError, ValueError) as e:
        # gin reads on past an unclosed bracket and reports the next binding's line.
        unclosed = files and _unclosed_bracket(files[0])
        if unclosed:
            raise GinConfigError(f"gin config: gin file {files[0]}, {unclosed}") from None
        if isinstance(e, SyntaxError):
            _bare_word(e, what)
        raise
    except tokenize.TokenError:
        raise GinConfigError(
            f"gin config: {what}: a '(', '[' or '{{' is never closed"
        ) from None


def _bare_word(e: SyntaxError, what: str) -> None:
    """Raises GinConfigError for gin's report of an unquoted string; returns otherwise."""
    token = _BAD_TOKEN.search(str(e))
    if token is None or not str(e).startswith(_MALFORMED):
        return
    where = f"gin file {e.filename}, line {e.lineno}" if e.filename else what
    raise GinConfigError(
        f"gin config: {where}: {token.group(1)!r} is not a value (quote a string: "
        f"'{token.group(1)}'; a reference is @name() or %MACRO)"
    ) from None


def _tokens(path: str):
    """Python's tokens of a gin file, up to where tokenizing fails (an open bracket at EOF)."""
    tokens = tokenize.generate_tokens(io.StringIO(_read_text(path)).readline)
    try:
        yield from tokens
    except (tokenize.TokenError, SyntaxError):
        return


def _unclosed_bracket(path: str) -> str | None:
    """Where a bracket left open runs into the next binding, e.g. "line 2: the '(' ...".

    A new binding starts at column 0; a bracket still open there was never closed.
    """
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[tuple[int, str]] = []
    last_row = 0
    for tok in _tokens(path):
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER):
            continue
        row, col = tok.start
        if stack and row > last_row and col == 0 and tok.type == tokenize.NAME:
            opened_row, char = stack[-1]
            return (f"line {opened_row}: the {char!r} opened there is not closed before "
                    f"line {row} starts a new binding")
        last_row = row
        if tok.string in "([{" and tok.type == tokenize.OP:
            stack.append((row, tok.string))
        elif tok.string in pairs and tok.type == tokenize.OP and stack:
            stack.pop()
    return None


def _gin_message(e: BaseException) -> str:
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # gin appends "In file ..., line N" / the offending text on following lines.
    where = next((ln for ln in lines[1:] if ln.startswith("In ")), "")
    return f"{lines[0]} ({where})" if where and lines else (lines[0] if lines else repr(e))


# ---------------------------------------------------------------------------
# Checks of the parsed config (public gin API: config_str, query_parameter).
# ---------------------------------------------------------------------------

_MACRO_LINE = re.compile(r"^([A-Za-z_][\w.]*) = ")
_BINDING_LINE = re.compile(r"^((?:[\w.]+/)*[\w.]+\.\w+) = ")
_MACRO_USE = re.compile(r"%([A-Za-z_][\w.]*)")


def used_macros() -> set[str]:
    """Macros some binding of the parsed config reads (``%NAME``)."""
    return set(_MACRO_USE.findall(gin.config_str())) - {"gin.REQUIRED"}


def known_macros() -> set[str]:
    """Macros the parsed config defines or uses (``NAME = ...`` / ``%NAME``)."""
    text = gin.config_str()
    names = set(_MACRO_USE.findall(text))
    for line in text.splitlines():
        m = _MACRO_LINE.match(line)
        if m and "." not in m.group(1):
            names.add(m.group(1))
    names.discard("gin.REQUIRED")
    return names


def check_macro_bindings(bindings: Sequence[str], known: set[str] | None = None) -> None:
    """Raises GinConfigError for a binding of a macro the parsed files do not know.

    gin accepts any ``NAME = VALUE`` as a macro definition, so a misspelled
    ``--gin.BATCH_SIZ=8`` would silently leave ``BATCH_SIZE`` at its default.
    ``known`` defaults to :func:`known_macros`.
    """
    for binding in bindings:
        name = binding.partition("=")[0].strip()
        if not name or "." in name or "/" in name or not name.isidentifier():
            continue
        if known is None:
            known = known_macros()
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(near)}?" if near else (
                f"known macros: {', '.join(sorted(known)) or 'none'}"
            )
            raise GinConfigError(f"unknown gin macro {name!r} in binding {binding!r}; {hint}")


def binding_source(key: str) -> str:
    """The macro a parameter's value comes from (``META_STEPS``), else ``key`` itself.

    A scoped key (``phase1/...Phase.sequence_length``) falls back to the less scoped
    bindings gin would apply to it (``...Phase.sequence_length``).
    """
    scopes, _, name = key.rpartition("/")
    parts = scopes.split("/") if scopes else []
    for i in range(len(parts) + 1):
        try:
            value = gin.query_parameter("/".join([*parts[i:], name]))
        except ValueError:
            continue
        return _macro_name(value) or key
    return key


def setting_source(e: errors.SettingError) -> str:
    """A bad setting as the user gave it: the macro or binding its value comes from.

    For a phase's, the scoped binding (``stage1/...Phase.mask_rate``); for a value bound
    through a macro, the macro (``MASK_RATE``); else the configurable's own key. An object
    that does not know its scope (``OptimizerConfig``, which a phase's scoped binding may
    build) is named by the binding that holds the bad value (:func:`source_of_value`).
    """
    if e.scope is None:
        parameter = f"{e.configurable.rpartition('.')[2]}.{e.field}"
        found = source_of_value(parameter, e.value)
        if found != parameter:
            return found
    return binding_source(e.key())


def source_of_value(parameter: str, value) -> str:
    """Where a bad value of ``parameter`` (``Configurable.param``, any scope) was set.

    A value checked inside a configurable (``OptimizerConfig.learning_rate``) reaches it
    through a scoped binding and often a macro; the binding whose value equals the bad
    one is what the user set: ``LEARNING_RATE`` (its macro) or the binding's own key.
    Falls back to ``parameter`` when no binding holds that value.
    """
    for key in binding_keys():
        if not (key == parameter or key.endswith("." + parameter)
                or key.endswith("/" + parameter)):
            continue
        literal, macro = _resolve(gin.query_parameter(key))
        if literal is value or (type(literal) is type(value) and literal == value):
            return macro or key
    return parameter


def _macro_name(value) -> str | None:
    if isinstance(value, gin.config.ConfigurableReference) and (
        value.selector == "gin.macro"
    ):
        return value.scoped_selector.rsplit("/", 1)[0]
    return None


def _resolve(value, depth: int = 0):
    """(literal value, macro it came from); references other than macros stay as they are."""
    macro = None
    while depth < 20:
        name = _macro_name(value)
        if name is None:
            break
        macro = macro or name
        try:
            value = gin.query_parameter(f"{name}/gin.macro.value")
        except ValueError:
            break
        depth += 1
    return value, macro


def binding_keys() -> list[str]:
    """Every binding key of the parsed config (``[scope/]configurable.parameter``)."""
    keys = []
    for line in gin.config_str().splitlines():
        m = _BINDING_LINE.match(line)
        if m and not m.group(1).endswith("gin.macro.value"):
            keys.append(m.group(1))
    return keys


_SIMPLE = {int: "an integer", float: "a number", str: "a string", bool: "True or False"}


def _expected(hint) -> str:
    """What a simple annotation accepts, in words ("an integer or None")."""
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType",
                                                             None)):
        words = [_SIMPLE.get(h, "None" if h is type(None) else None)
                 for h in typing.get_args(hint)]
        if all(words):
            return " or ".join(words)
    return _SIMPLE.get(hint) or str(hint).replace("typing.", "")


def _type_ok(value, hint) -> bool | None:
    """Whether ``value`` fits a simple annotation; None when the hint is not simple."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        results = [_type_ok(value, h) for h in typing.get_args(hint)]
        if any(r is None for r in results):
            return None
        return any(results)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None


def _hints(selector: str) -> dict:
    try:
        fn = gin.get_configurable(selector.rsplit("/", 1)[-1])
    except (ValueError, KeyError):
        return {}
    target = getattr(fn, "__wrapped__", fn)
    try:
        return typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    except Exception:  # noqa: BLE001 - unresolvable annotations are simply not checked
        return {}


def _describe(key: str, macro: str | None, value) -> str:
    return f"{macro} = {value!r} (used by {key})" if macro else f"{key} = {value!r}"


def check_types() -> None:
    """Raises GinConfigError for a literal whose type its parameter does not accept.

    Only the type: a value's range is checked where the configuration is built (the
    trainer's ``validate``, ``OptimizerConfig``, ...), once.
    """
    for key in binding_keys():
        selector, _, param = key.rpartition(".")
        value, macro = _resolve(gin.query_parameter(key))
        if isinstance(value, gin.config.ConfigurableReference) or value is gin.REQUIRED:
            continue
        hint = _hints(selector).get(param)
        if hint is not None and _type_ok(value, hint) is False:
            expected = _expected(hint)
            raise GinConfigError(f"{_describe(key, macro, value)}: expected {expected}")


def bound(name: str, default):
    """A gin parameter's value (references and macros evaluated), or ``default``."""
    try:
        value = gin.query_parameter(name)
    except ValueError:
        return default
    # gin evaluates @references and %macros when it deep-copies a binding (as when it
    # calls the configurable); required values stay unresolved and never reach here.
    return copy.deepcopy(value)


def config_text() -> str:
    """The full parsed config, as ``MODEL_DIR/config.gin`` records it."""
    return gin.config_str()
