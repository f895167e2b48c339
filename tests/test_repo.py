"""README's two set-up commands and CI agree."""

import json
import pathlib
import re

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


def test_ci_installs_t5x_before_the_tests():
    """The t5x tests run in CI: the wheels go into the venv README's command then uses."""
    _, tests = _readme_commands()
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    install = next(i for i, line in enumerate(lines) if "--no-deps" in line and ".whl" in line)
    assert "'.[t5x]'" in lines[install]
    assert install < lines.index(tests.strip())


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
