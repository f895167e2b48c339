"""The package's layout rules (docs/architecture.md), checked on the source.

* Imports go down the layers (cli, tools → experiment → interop converters →
  evaluation → pretrain → data → Hugging Face formats → model → core), never up, and
  no two modules import each other, directly or around a circle.
* No import inside a function, except of an optional heavy dependency (torch,
  transformers, t5x, TensorFlow/seqio, ...) with a comment on that line saying why.
* gin is imported only under ``xlmeta_jax/cli/``: the library takes plain arguments.
* Every error class a user can meet derives from ``errors.UserError`` (one line).
* No module over 600 lines (a guide: modules are split by job, not by size).
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "xlmeta_jax"

# (module prefix, layer): the longest matching prefix gives a module's layer. A module
# may import modules of lower layers and of its own package.
LAYERS = (
    ("xlmeta_jax", 0),  # the package's (empty) __init__
    ("xlmeta_jax.errors", 0), ("xlmeta_jax.files", 0), ("xlmeta_jax.logs", 0),
    ("xlmeta_jax.hosts", 0), ("xlmeta_jax.platforms", 0), ("xlmeta_jax.library_text", 0),
    ("xlmeta_jax.model", 1),
    # Hugging Face's file formats: parameter layout, tokenizer files, weights, model card.
    ("xlmeta_jax.interop.hf.layout", 2), ("xlmeta_jax.interop.hf.tokenizer", 2),
    ("xlmeta_jax.interop.hf.weights", 2), ("xlmeta_jax.interop.hf.hf_config", 2),
    ("xlmeta_jax.interop.hf.card", 2), ("xlmeta_jax.interop.hf.modernbert_layout", 2),
    ("xlmeta_jax.interop.hf.parity", 2), ("xlmeta_jax.interop.hf.xlmr_layout", 2),
    ("xlmeta_jax.interop.hf.families", 2),
    ("xlmeta_jax.data", 3),
    ("xlmeta_jax.pretrain", 4),
    ("xlmeta_jax.evaluation", 5),
    # Our checkpoints to and from other trainers' formats.
    ("xlmeta_jax.interop", 6),
    ("xlmeta_jax.experiment", 7),
    ("xlmeta_jax.cli", 8),
    ("xlmeta_jax.tools", 9),
    # `python -m xlmeta_jax.train` etc.: thin aliases of cli/ (README's commands).
    ("xlmeta_jax.train", 10), ("xlmeta_jax.finetune", 10), ("xlmeta_jax.hf", 10),
    ("xlmeta_jax.t5x_train", 10),
    ("xlmeta_jax.experiment.__main__", 10),
)

# Optional or heavy dependencies a function may import when it needs them.
HEAVY = frozenset({
    "torch", "transformers", "t5x", "libtpu", "tensorflow", "tensorflow_datasets", "seqio",
    "safetensors", "tokenizers", "matplotlib", "clu", "gflanguages", "pydoc_data", "gin",
    "sentencepiece", "jax.experimental", "orbax.checkpoint.checkpoint_managers", "scipy",
    # The beam extra (data preparation and the token cache jobs).
    "apache_beam",
    # Our modules that import seqio and TensorFlow at their top.
    "xlmeta_jax.data.tasks", "xlmeta_jax.data.providers", "xlmeta_jax.data.preprocessors",
    "xlmeta_jax.data.seqio_vocabularies", "xlmeta_jax.evaluation.pair_task",
    # gin flag parsing, absent on accelerator hosts that only benchmark.
    "xlmeta_jax.cli.flags",
    # Our trainer's gin names beside t5x's, only for t5x_train --phase (t5x's own run files
    # must not see them: their `train` would be ambiguous).
    "xlmeta_jax.cli.t5x_stage",
})

MAX_LINES = 600


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or (
        module.startswith(p + ".") and p != "xlmeta_jax")), key=len, default=None)
    assert best is not None, f"{module} is in no layer of tests/test_layout.py"
    return dict(LAYERS)[best]


def _package(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The modules an import statement names (``from a import b`` names a.b if a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = _package(module).split(".")
        base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports(module: str):
    """(target, line, inside a function, the source line) of every import of ``module``."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module, child):
                    out.append((target, child.lineno, in_function, lines[child.lineno - 1]))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            else:
                visit(child, in_function)

    visit(ast.parse(source), False)
    return out


def _internal(target: str) -> str | None:
    """The module of ours an import target names (a name inside a module: that module)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_go_down_the_layers():
    wrong = []
    for module in MODULES:
        for target, line, _, _ in _imports(module):
            ours = _internal(target)
            if ours is None or ours == module:
                continue
            same_package = _package(ours).startswith(_package(module)) or _package(
                module).startswith(_package(ours))
            if _layer(ours) > _layer(module) or (
                    _layer(ours) == _layer(module) and not same_package
                    and _layer(module) != 10):
                wrong.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {ours}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = {m: {o for t, *_ in _imports(m) if (o := _internal(t)) and o != m}
             for m in MODULES}
    # A package's __init__ importing its own modules is not a cycle of behaviour.
    state: dict[str, int] = {}
    cycles = []

    def walk(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_imports_inside_functions_are_of_heavy_dependencies_and_say_why():
    wrong = []
    for module in MODULES:
        for target, line, in_function, text in _imports(module):
            if not in_function:
                continue
            heavy = any(target == h or target.startswith(h + ".") for h in HEAVY)
            if not heavy or "#" not in text:
                wrong.append(f"{MODULES[module].relative_to(REPO)}:{line}: {text.strip()}")
    assert not wrong, ("imports inside functions (only an optional heavy dependency, with a "
                       "comment saying why):\n" + "\n".join(wrong))


def test_gin_is_imported_only_by_the_command_line():
    wrong = [f"{MODULES[m].relative_to(REPO)}:{line}"
             for m in MODULES for target, line, _, _ in _imports(m)
             if (target == "gin" or target.startswith("gin.")) and not m.startswith(
                 "xlmeta_jax.cli")]
    assert not wrong, "gin imported outside xlmeta_jax/cli/:\n" + "\n".join(wrong)


def test_no_module_over_the_line_limit():
    long = [f"{p.relative_to(REPO)}: {n}" for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


# Top-level modules of the optional extras that README's test command does not install:
# `.[t5x]` with t5x's wheels (t5x, airio, jestimator, grain, fiddle) and `.[aot]`/`.[tpu]`.
OPTIONAL_EXTRAS = frozenset({"t5x", "airio", "jestimator", "grain", "fiddle", "libtpu"})


@pytest.mark.extras  # imports xlmeta_jax.interop.t5x too where t5x is installed
def test_every_error_class_is_a_user_error():
    errors = importlib.import_module("xlmeta_jax.errors")
    wrong = []
    for module in MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            # Only a missing optional extra excuses a module (t5x on a new user's machine,
            # libtpu without the aot extra); anything else is a broken import.
            if (e.name or "").partition(".")[0] in OPTIONAL_EXTRAS:
                continue
            pytest.fail(f"{module} does not import: {e}")
        for name, obj in vars(mod).items():
            if (isinstance(obj, type) and issubclass(obj, Exception)
                    and obj.__module__ == module and not issubclass(obj, errors.UserError)):
                wrong.append(f"{module}.{name}")
    assert not wrong, "error classes that are not UserErrors:\n" + "\n".join(wrong)


def test_the_trainer_command_imports_what_it_runs():
    """``python -m xlmeta_jax.train`` loads neither evaluation, the experiment nor t5x's
    interop (their gin names live in cli/evaluation_runs.py and cli/experiment_runs.py)."""
    import subprocess
    import sys

    code = ("import sys, xlmeta_jax.cli.train; print('\\n'.join(m for m in sys.modules "
            "if m.startswith('xlmeta_jax.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout.split()
    assert "xlmeta_jax.pretrain.trainer" in out
    wrong = [m for m in out if m.startswith(("xlmeta_jax.evaluation", "xlmeta_jax.experiment",
                                             "xlmeta_jax.interop.t5x"))]
    assert not wrong, wrong


# Where a family's name may be compared with a literal: the family modules themselves.
_FAMILY_PLACES = ("xlmeta_jax/model/", "xlmeta_jax/interop/hf/xlmr_layout.py",
                  "xlmeta_jax/interop/hf/modernbert_layout.py",
                  "xlmeta_jax/interop/hf/families.py")
_NAME = r"""["'](xlmr|modernbert)["']"""
_FAMILY_BRANCH = re.compile(rf"(family|model_type)\b[^\n=!]{{0,40}}[!=]=\s*{_NAME}"
                            rf"|{_NAME}\s*[!=]=[^\n]{{0,40}}family")


def test_no_family_is_named_outside_its_modules():
    """The rest of the house asks a family (network.family(config), hf.families.of(config))
    instead of comparing its name: a new family then touches its modules only."""
    found = []
    for path in sorted(REPO.joinpath("xlmeta_jax").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(_FAMILY_PLACES):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _FAMILY_BRANCH.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
