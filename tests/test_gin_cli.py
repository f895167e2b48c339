"""t5x-style gin flags, and every gin/finetune file parses against the real configurables."""

import pathlib

import gin
import pytest

from xlmeta_jax import gin_cli
from xlmeta_jax.evaluation import finetuning, readers, retrieval  # noqa: F401 (configurables)

FINETUNE_GIN = sorted((gin_cli.REPO_GIN_DIR / "finetune").glob("*.gin"))


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_parse_gin_flags_forms():
    flags = gin_cli.parse_gin_flags([
        "--gin_file=a.gin", "--gin_file", "b.gin",
        "--gin_bindings=x.y = 1", "--gin.MODEL_DIR='/tmp/r'",
        "--gin_search_paths=p1,p2", "--other", "7",
    ])
    assert flags.gin_files == ["a.gin", "b.gin"]
    assert flags.bindings == ["x.y = 1", "MODEL_DIR = '/tmp/r'"]
    assert flags.search_paths == ["p1", "p2"]
    assert flags.remaining == ["--other", "7"]
    with pytest.raises(ValueError, match="needs a value"):
        gin_cli.parse_gin_flags(["--gin_file"])
    with pytest.raises(ValueError, match="malformed flag"):
        gin_cli.parse_gin_flags(["--gin.=3"])


def test_missing_gin_file_names_search_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="gin file 'nope.gin' not found"):
        gin_cli.apply_gin(["nope.gin"], [], [str(tmp_path)])


def test_search_paths_find_files_and_includes(tmp_path):
    (tmp_path / "mine.gin").write_text(
        "include 'finetune/xnli.gin'\nfinetune.batch_size = 8\n"
    )
    gin_cli.apply_gin(
        ["mine.gin"],
        ["INITIAL_CHECKPOINT_PATH = 'init:tiny'", "MODEL_DIR = '/tmp/x'"],
        [str(tmp_path)],
        finalize=False,
    )
    assert gin.query_parameter("finetune.task") == "xnli"
    assert gin.query_parameter("finetune.batch_size") == 8


@pytest.mark.parametrize("path", FINETUNE_GIN, ids=lambda p: p.name)
def test_every_finetune_gin_file_parses(path: pathlib.Path):
    text = path.read_text()
    # Header comment with the command that runs it, and the two required macros.
    assert text.startswith("#") and "python -m xlmeta_jax." in text
    gin_cli.apply_gin(
        [f"finetune/{path.name}"],
        ["INITIAL_CHECKPOINT_PATH = 'init:tiny'", "MODEL_DIR = '/tmp/x'"],
        finalize=False,
    )
    task = gin.query_parameter("finetune.task")
    assert task in readers.TASKS
    assert path.stem.removesuffix("_demo") == task
    macros = {"INITIAL_CHECKPOINT_PATH", "MODEL_DIR"}
    full = (path.parent / f"{task}.gin").read_text()
    assert all(f"{m} = %gin.REQUIRED" in full for m in macros)


def test_required_macro_left_unset_is_an_error():
    with pytest.raises(ValueError, match="MODEL_DIR.*gin.REQUIRED"):
        gin_cli.apply_gin(
            ["finetune/tydiqa.gin"], ["INITIAL_CHECKPOINT_PATH = 'init:tiny'"]
        )
