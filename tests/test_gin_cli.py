"""t5x-style gin flags, and every gin/finetune file parses against the real configurables."""

import os
import pathlib

import gin
import pytest

import xlmeta_jax.cli.configurables  # noqa: F401 (registers finetune / evaluate_retrieval)
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.evaluation import settings, tasks

FINETUNE_GIN = sorted((gin_cli.REPO_GIN_DIR / "finetune").glob("*.gin"))


pytestmark = pytest.mark.usefixtures("clean_gin")


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


# embeddings.gin: the contrastive run (evaluation/embedding_run.py), not an XTREME task.
TASK_GIN = [p for p in FINETUNE_GIN if p.stem not in ("base", "demo", "embeddings")]
_MACROS = ["INITIAL_CHECKPOINT_PATH = 'init:tiny'", "MODEL_DIR = '/tmp/x'"]


def test_finetune_gin_files_are_base_tasks_and_one_demo_override():
    assert {p.stem for p in FINETUNE_GIN} == {*tasks.names(), "base", "demo", "embeddings"}
    base = (gin_cli.REPO_GIN_DIR / "finetune" / "base.gin").read_text()
    assert all(f"{m} = %gin.REQUIRED" in base for m in ("INITIAL_CHECKPOINT_PATH", "MODEL_DIR"))


@pytest.mark.parametrize("path", TASK_GIN, ids=lambda p: p.name)
def test_every_finetune_gin_file_parses_alone_and_with_the_demo(path: pathlib.Path):
    text = path.read_text()
    # Header comment with the command that runs it; the shared part is included.
    assert text.startswith("#") and "python -m xlmeta_jax.finetune" in text
    assert "include 'finetune/base.gin'" in text
    assert len([x for x in text.splitlines() if x and not x.startswith("#")]) <= 12
    gin_cli.apply_gin([f"finetune/{path.name}"], _MACROS, finalize=False)
    assert gin.query_parameter("finetune.task") == path.stem
    full_length = gin.query_parameter("finetune.max_seq_length")
    gin.clear_config()
    gin_cli.apply_gin([f"finetune/{path.name}", "finetune/demo.gin"], _MACROS, finalize=False)
    assert gin.query_parameter("finetune.task") == path.stem
    assert gin.query_parameter("finetune.train_steps") == 200
    assert full_length >= gin.query_parameter("finetune.max_seq_length") == 128


# XTREME's scripts/train_<task>.sh for a base encoder (and third_party/run_*.py defaults):
# epochs, learning rate, warm-up steps, weight decay, --save_steps (English-dev selection)
# and seed. The batch is 8 per GPU x 4 accumulation steps everywhere.
XTREME_RECIPE = {
    "xnli": (5.0, 2e-5, 0, 0.0, 100, 42),
    "pawsx": (5.0, 2e-5, 0, 0.0, 200, 42),
    "panx": (10.0, 2e-5, 0, 0.0, 1000, 1),
    "udpos": (10.0, 2e-5, 0, 0.0, 500, 1),
    "tydiqa": (3.0, 3e-5, 500, 0.0001, None, 42),
    "xquad": (3.0, 3e-5, 500, 0.0001, None, 42),
    "mlqa": (3.0, 3e-5, 500, 0.0001, None, 42),
}


@pytest.mark.parametrize("task", sorted(XTREME_RECIPE))
def test_finetune_recipe_is_xtremes(task):
    gin_cli.apply_gin([f"finetune/{task}.gin"], _MACROS, finalize=False)
    q = gin.query_parameter
    try:
        eval_every = q("finetune.eval_every")
    except ValueError:  # unbound: the default, no selection
        eval_every = settings.FineTuneSettings.eval_every
    got = (q("finetune.num_epochs"), q("finetune.learning_rate"), q("finetune.warmup_steps"),
           q("finetune.weight_decay"), eval_every, q("finetune.seed"))
    assert got == XTREME_RECIPE[task]
    assert (q("finetune.batch_size"), q("finetune.adam_b2"), q("finetune.adam_eps"),
            q("finetune.max_grad_norm")) == (32, 0.999, 1e-8, 1.0)
    assert q("finetune.max_seq_length") == (384 if task in ("tydiqa", "xquad", "mlqa") else 128)


def test_required_macro_left_unset_is_an_error():
    with pytest.raises(ValueError, match="MODEL_DIR.*gin.REQUIRED"):
        gin_cli.apply_gin(
            ["finetune/tydiqa.gin"], ["INITIAL_CHECKPOINT_PATH = 'init:tiny'"]
        )


def test_a_bad_value_is_traced_to_the_setting_the_user_gave():
    """LEARNING_RATE reaches phase 1's OptimizerConfig directly and phase 2's through
    PHASE2_LEARNING_RATE (gin/native/meta.gin's chain): a bad value is named by the macro
    that holds it, else by its binding, else by the parameter itself."""
    import xlmeta_jax.model.optimizer  # noqa: F401 - registers OptimizerConfig

    gin.clear_config()
    try:
        gin.parse_config("""
LEARNING_RATE = 1e-3
PHASE2_LEARNING_RATE = -1.0
xlmeta_jax.model.optimizer.OptimizerConfig.learning_rate = %LEARNING_RATE
phase2/xlmeta_jax.model.optimizer.OptimizerConfig.learning_rate = %PHASE2_LEARNING_RATE
phase1/xlmeta_jax.model.optimizer.OptimizerConfig.warmup_steps = 20
""")
        lr = "OptimizerConfig.learning_rate"
        assert gin_cli.source_of_value(lr, 1e-3) == "LEARNING_RATE"
        assert gin_cli.source_of_value(lr, -1.0) == "PHASE2_LEARNING_RATE"
        # gin's own (shortest unique) name of the binding.
        assert gin_cli.source_of_value("OptimizerConfig.warmup_steps", 20) == (
            "phase1/OptimizerConfig.warmup_steps")
        # An integer 1 is not the float 1.0 of another binding; an unbound value: the name.
        assert gin_cli.source_of_value(lr, 5.0) == lr
        assert gin_cli.source_of_value("OptimizerConfig.warmup_steps", 20.0) == (
            "OptimizerConfig.warmup_steps")
    finally:
        gin.clear_config()


@pytest.mark.parametrize("files, match", [
    ({"self.gin": "include 'self.gin'\nX = 1\n"},
     r"self.gin includes itself: .*self.gin -> .*self.gin$"),
    ({"a.gin": "include 'b.gin'\n", "b.gin": "include 'a.gin'\n"},
     r"a.gin includes itself: .*a.gin -> .*b.gin -> .*a.gin$"),
    ({"a.gin": "X = 1\nY = (1,\nMETA_STEPS = 3\n"},
     r"a.gin, line 2: the '\(' opened there is not closed before line 3 starts a new binding"),
    ({"a.gin": "X = [1,\n  2]\nY = foo\n"}, r"a.gin, line 3: 'foo' is not a value"),
])
def test_gin_file_mistakes_are_named_where_they_are(tmp_path, files, match):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    first = next(iter(files))
    with pytest.raises(gin_cli.GinConfigError, match=match):
        gin_cli.apply_gin([os.fspath(tmp_path / first)], [], [os.fspath(tmp_path)])


@pytest.mark.parametrize("name", ["meta.gin", "xlmr.gin"])
def test_t5x_run_files_given_to_our_commands_name_t5x_command(name):
    with pytest.raises(gin_cli.GinConfigError,
                       match=rf"gin/{name} is a run file of t5x's trainer: run it with "
                       rf"python -m t5x.train --gin_file=gin/{name}"):
        gin_cli.apply_gin([f"gin/{name}"], [])
