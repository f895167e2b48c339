"""The notebooks in notebooks/: stored without outputs, each with its Colab badge and its
runtimes; executed headless at tiny size on CPU from a fresh folder (the pretraining
notebook, then the transfer notebook on its run), each with its set-up cell run twice (as
on a fresh Colab runtime), where any failing cell fails the test."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import shutil

import pytest

import xlmeta_jax

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
META = NOTEBOOKS / "meta_pretraining.ipynb"
TRANSFER = NOTEBOOKS / "zero_shot_transfer.ipynb"
# Time limit of one cell (the trainer and fine-tuning cells are the long ones: about two
# minutes each on 2 CPU cores, mostly compilation).
CELL_TIMEOUT_S = 900


def _repo_url() -> str:
    return xlmeta_jax.REPOSITORY


def _code(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_notebooks_are_stored_stripped_with_badge_and_runtimes():
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert [p.name for p in paths] == [META.name, TRANSFER.name]
    repo = _repo_url().removeprefix("https://github.com/")
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in _code(nb):
            assert cell.outputs == [] and cell.execution_count is None, (path.name, cell.id)
            # Colab-only branches do not run in CI: at least they must compile.
            compile(cell.source, f"{path.name}:{cell.id}", "exec")
        assert "widgets" not in nb.metadata, path.name
        intro = nb.cells[0].source
        badge = f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{path.name}"
        assert badge in intro, path.name
        runtime = intro[intro.index("**Runtime.**"):]
        assert "TPU" in runtime and "CPU" in runtime and "minutes" in runtime, path.name
        # One parameter cell (papermill's tag) that CI's environment variable sets.
        params = [c for c in _code(nb) if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and "XLMETA_NOTEBOOK_SIZE" in params[0].source, path.name
        # Runs kept on Google Drive on request (Colab only).
        assert "USE_DRIVE = False" in params[0].source, path.name
        assert any("drive.mount(" in c.source for c in _code(nb)), path.name
        # The set-up cell installs the runtime's jax build: extras setup.py has.
        extras = set(re.findall(r'"\[(\w+)\]"', _code(nb)[0].source))
        assert extras == {"tpu", "cuda"} and extras <= set(
            importlib.metadata.metadata("xlmeta_jax").get_all("Provides-Extra")), path.name
        # The same repository everywhere it is named.
        for url in re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", "".join(
                c.source for c in nb.cells)):
            assert url == _repo_url(), (path.name, url)


def _execute(path: pathlib.Path, env: dict[str, str], workdir: pathlib.Path):
    """Runs the notebook with its kernel started in ``workdir`` and the set-up cell run twice
    (as a user reruns it): any failing cell raises."""
    nb = nbformat.read(path, as_version=4)
    setup = _code(nb)[0]
    assert '"pip", "install"' in setup.source
    again = nbformat.v4.new_code_cell(setup.source, id="setup-again")
    nb.cells.insert(nb.cells.index(setup) + 1, again)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    # Raises CellExecutionError at the first failing cell, CellTimeoutError past the limit.
    client.execute(env=env)
    return nb


def _outputs(cell, kind: str) -> list:
    out = []
    for o in cell.outputs:
        if kind == "stream" and o.output_type == "stream":
            out.append(o.text)
        elif kind in o.get("data", {}):
            out.append(o["data"][kind])
    return out


def _fresh(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, str]]:
    """A working folder of the notebook's own (no other notebook's runs) and its kernel's
    environment. Started there, the set-up cell finds the clone through the installed
    package, as Colab's kernel starts in /content and finds the clone it made."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = dict(os.environ)
    env.pop("XLMETA_NOTEBOOK_CHECKPOINT", None)
    env.update(
        XLMETA_NOTEBOOK_SIZE="tiny",
        XLMETA_NOTEBOOK_RUN_DIR=str(workdir / "runs"),
        JAX_PLATFORMS="cpu",
        # One CPU device, as on a laptop (the test session fakes eight).
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    return workdir, env


def _stdout(cells) -> str:
    return "".join(t for c in cells for t in _outputs(c, "stream"))


def _assert_pretrained(text: str, model_dir: pathlib.Path):
    """Both phases of gin/notebooks/tiny.gin ran into ``model_dir``."""
    assert "[phase1] step 40/40" in text and "[phase2] step 40/40" in text
    assert (model_dir / "summary.json").is_file()


@pytest.mark.slow
def test_notebooks_run_from_a_fresh_folder(demo_data, tmp_path, request):
    """meta_pretraining.ipynb trains both phases in a fresh folder (loss curves, hand-off);
    then zero_shot_transfer.ipynb evaluates that run. Its own pretraining branch (no
    finished run there: train or resume one) is taken on the run with its summary.json
    removed, as a run stopped after its last checkpoint leaves it: the branch resumes it
    (both phases complete, nothing trained twice; the training itself is the meta
    notebook's, the same command)."""
    # The evaluation data (a skip naming the folder when absent; CI requires it).
    shared_data = request.getfixturevalue("shared_data")
    workdir, env = _fresh(tmp_path)
    run_dir = workdir / "runs"
    # The demo corpus and vocabulary the run's first start writes (gin/demo.gin's, built once
    # per session: most of a demo's time on 2 cores), which the run reuses.
    shutil.copytree(demo_data, run_dir / "meta" / "demo_data")
    meta = _code(_execute(META, env, workdir))
    text = _stdout(meta)
    assert text.count("runtime cpu: not Colab") == 2  # The set-up cell, run twice.
    _assert_pretrained(text, run_dir / "meta")
    assert "phase 2 started from" in text and "phase1/40: phase 1's final checkpoint" in text
    plots = [c for c in meta if _outputs(c, "image/png")]
    assert len(plots) == 1 and "scalar_series" in plots[0].source

    (run_dir / "meta" / "summary.json").unlink()
    transfer = _code(_execute(TRANSFER, dict(env, XLMETA_SHARED_DATA=str(shared_data)),
                              workdir))
    text = _stdout(transfer)
    assert text.count("runtime cpu: not Colab") == 2
    assert f"no checkpoint at {run_dir / 'meta'}: training meta_pretraining.ipynb's tiny" in text
    assert "[phase1] already complete" in text and "[phase2] already complete" in text
    assert "step 1/40" not in text
    xnli_table, fill_table = [m for c in transfer for m in _outputs(c, "text/markdown")]
    for lang in ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur",
                 "vi", "zh"):
        assert f"| {lang} |" in xnli_table
    assert fill_table.count("\n| ") == 6  # One row per language.
    # The XNLI table is shown once: rendered, not also printed by the command.
    (xnli_cell,) = [c for c in transfer if "xnli.gin" in c.source]
    assert "| en |" not in "".join(_outputs(xnli_cell, "stream"))
    assert len([c for c in transfer if _outputs(c, "image/png")]) == 2
    assert (run_dir / "xnli" / "results.json").is_file()
    assert (run_dir / "tatoeba" / "results.json").is_file()
    assert (run_dir / "hf_export" / "tokenizer.json").is_file()
