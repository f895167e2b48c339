"""README's two set-up commands, CI, the notebooks and the pinned versions agree."""

import ast
import json
import pathlib
import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import xlmeta_jax

REPO = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    demo, tests = _readme_commands()
    assert "xlmeta_jax.train --gin_file=gin/demo.gin" in demo
    assert "pytest" in tests
    for cmd in (demo, tests):
        assert "\n" not in cmd.strip(), "each set-up command is one line"
        assert cmd.startswith("python3 -m venv .venv && "), "each starts from a fresh venv"


def test_ci_runs_readme_test_command():
    _, tests = _readme_commands()
    ci = (REPO / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines()


def test_ruff_clean():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_ci_runs_the_extras_after_readme_command():
    """README's command runs first as a new user's (no t5x: those tests skip); then the t5x
    wheels and libtpu go into the same venv and the tests marked ``extras`` run again."""
    _, tests = _readme_commands()
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    readme = lines.index(tests.strip())
    install = next(i for i, line in enumerate(lines) if "--no-deps" in line and ".whl" in line)
    assert "'.[t5x,aot]'" in lines[install] and readme < install
    assert not any("t5x" in line and "pip install" in line for line in lines[:readme])
    assert ".venv/bin/python -m pytest" in lines[install + 1]
    assert "-m extras" in lines[install + 1] and "XLMETA_EXPECT_EXTRAS=1" in lines[install + 1]


def test_every_mention_of_the_repository_is_the_one_constant():
    owner_name = xlmeta_jax.REPOSITORY.removeprefix("https://github.com/")
    texts = {"README.md": (REPO / "README.md").read_text(),
             "setup.py": (REPO / "setup.py").read_text()}
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[nb.name] = "".join("".join(c["source"]) for c in cells)
        # The Colab badge opens this very notebook of this repository.
        badge = f"colab.research.google.com/github/{owner_name}/blob/main/notebooks/{nb.name}"
        assert badge in texts[nb.name], nb.name
    mentions = {(name, m) for name, text in texts.items()
                for m in re.findall(r"github(?:\.com)?/([\w.-]+/xlmeta_jax)\b", text)}
    assert mentions and {m for _, m in mentions} == {owner_name}, mentions
    assert "url=_REPOSITORY" in texts["setup.py"]


def _setup_requirements():
    """Every requirement string setup.py names: install_requires and all extras."""
    tree = ast.parse((REPO / "setup.py").read_text())
    lists = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.List)}
    call = next(node.value for node in tree.body if isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call))
    kwargs = {k.arg: k.value for k in call.keywords}
    found = [lists[kwargs["install_requires"].id]]
    for value in kwargs["extras_require"].values:
        found.append(lists[value.id] if isinstance(value, ast.Name) else value)
    return [Requirement(ast.literal_eval(e)) for lst in found for e in lst.elts]


def _constraints():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_what_setup_py_allows():
    pins = _constraints()
    requirements = _setup_requirements()
    assert {canonicalize_name(r.name) for r in requirements} <= set(pins), "a requirement unpinned"
    for req in requirements:
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[canonicalize_name(req.name)]}, "
            f"setup.py asks for {req}")
    # Installed from wheels or git with --no-deps, not from the index: pinning them would fail.
    assert not {"t5x", "airio", "jestimator"} & set(pins)


def test_every_install_uses_the_constraints():
    demo, tests = _readme_commands()
    for cmd in (demo, tests):
        assert "pip install -q -c constraints.txt -e " in cmd
    for path in (".ci/run", "README.md", "tpu/run_pod.sh"):
        for line in (REPO / path).read_text().splitlines():
            if re.search(r"pip install .*-e ", line):
                assert "-c constraints.txt" in line, (path, line)
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        install = [src for src in ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
                   if '"pip", "install"' in src]
        assert install, f"{nb.name}: no set-up cell installs the package"
        for src in install:
            assert '"-c", "constraints.txt"' in src, nb.name
