"""Every shipped gin file parses, and the pretraining experiments evaluate to valid runs."""

from __future__ import annotations

import pathlib

import gin
import pytest

from xlmeta_jax.cli import evaluation_runs, experiment_runs
from xlmeta_jax.cli import experiment as experiment_cli
from xlmeta_jax.cli import finetune as finetune_cli
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.evaluation import tasks as evaluation_tasks

REPO = pathlib.Path(__file__).resolve().parents[1]
GIN_DIR = REPO / "gin"
ALL_GIN = sorted(p.relative_to(GIN_DIR).as_posix() for p in GIN_DIR.rglob("*.gin"))
# Files of `python -m t5x.train` (t5x's gin convention: dynamic registration) bind t5x's own
# `train` (its __main__), directly or through an include; tests/test_t5x_gin.py parses and
# evaluates them.
T5X_GIN = [n for n in ALL_GIN
           if "from __gin__ import dynamic_registration" in (GIN_DIR / n).read_text()]

# Macros a user supplies on the command line, per file family.
_REQUIRED = [
    "MODEL_DIR = '/tmp/unused_model_dir'",
    "VOCAB_PATH = '/tmp/unused.model'",
    "INITIAL_CHECKPOINT_PATH = '/tmp/unused_ckpt'",
]


pytestmark = pytest.mark.usefixtures("clean_gin")


def test_gin_files_exist():
    for name in ("native/meta.gin", "native/xlmr.gin", "native/run.gin", "demo.gin",
                 "pretrain.gin", "schedule.gin"):
        assert name in ALL_GIN and name not in T5X_GIN
    for name in ("meta.gin", "xlmr.gin", "t5x/run.gin"):
        assert name in T5X_GIN
    for size in ("tiny", "small", "base", "large"):
        assert f"models/{size}.gin" in ALL_GIN
    assert "models/encoder.gin" in ALL_GIN


@pytest.mark.parametrize("name", [n for n in ALL_GIN if n not in T5X_GIN])
def test_gin_file_parses_with_header(name):
    text = (GIN_DIR / name).read_text()
    assert text.startswith("#"), f"{name} must start with a header comment saying what it is"
    bindings = [b for b in _REQUIRED if b.split("=")[0].strip() in text]
    gin_cli.apply_gin([name], bindings, finalize=False)
    assert gin.config_str()


def _evaluated_train_args(monkeypatch, gin_file, bindings=()):
    """Runs trainer.train up to (not including) compilation; returns its validated args."""
    from xlmeta_jax.cli import train as train_cli
    from xlmeta_jax.pretrain import trainer

    seen = {}

    class Stop(Exception):
        pass

    def fake_iterator(run, phase, seed, mesh):
        seen.setdefault("phases", []).append(phase)
        seen["model"] = run.model
        return None

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(trainer, "_make_iterator", fake_iterator)
    monkeypatch.setattr(trainer, "_train_phase", stop)
    monkeypatch.setattr(trainer, "_write_config", lambda run: None)
    # VOCAB_PATH is a placeholder here (the vocabulary check has its own tests).
    monkeypatch.setattr(trainer, "check_vocabulary", lambda *args: None)
    gin_cli.apply_gin([gin_file], [*_REQUIRED[:2], *bindings])
    with pytest.raises(Stop):
        train_cli.run_configured()
    return seen


def test_meta_gin_two_phases_with_handoff(monkeypatch, tmp_path):
    seen = _evaluated_train_args(
        monkeypatch, "native/meta.gin", [f"MODEL_DIR = '{tmp_path}'", "BATCH_SIZE = 64"]
    )
    p1, p2 = seen["phases"]
    assert (p1.name, p1.task, p2.name, p2.task) == (
        "phase1", "xlmeta_english_text", "phase2", "xlmeta_cc100")
    assert p2.init_from == "phase1" and p2.reset_optimizer and p2.reset_schedule
    assert p1.optimizer.total_steps == p1.num_steps
    assert p2.optimizer.total_steps == p2.num_steps
    assert (p1.optimizer.b1, p1.optimizer.b2, p1.optimizer.eps) == (0.9, 0.98, 1e-6)
    assert seen["model"].hidden_size == 768 and seen["model"].vocab_size == 250002


def test_xlmr_baseline_has_equal_compute(monkeypatch, tmp_path):
    meta = _evaluated_train_args(
        monkeypatch, "native/meta.gin", [f"MODEL_DIR = '{tmp_path}'", "BATCH_SIZE = 64"])
    gin.clear_config(clear_constants=True)
    xlmr = _evaluated_train_args(
        monkeypatch, "native/xlmr.gin", [f"MODEL_DIR = '{tmp_path}'", "BATCH_SIZE = 64"])
    (only,) = xlmr["phases"]
    assert only.task == "xlmeta_cc100" and only.init_from is None
    assert only.num_steps == sum(p.num_steps for p in meta["phases"])
    tokens = lambda phases: sum(p.num_steps * p.batch_size * p.sequence_length for p in phases)
    assert tokens(xlmr["phases"]) == tokens(meta["phases"])
    assert only.optimizer.total_steps == only.num_steps


def test_meta_gin_base_is_xlmr_exact_and_sizes_come_from_network(monkeypatch, tmp_path):
    from xlmeta_jax.model import network

    seen = _evaluated_train_args(
        monkeypatch, "native/meta.gin", [f"MODEL_DIR = '{tmp_path}'", "BATCH_SIZE = 64"])
    model = seen["model"]
    # XLM-R's dropout exactly (flax's 32-bit masks), the shape from network's one table.
    assert model.dropout_mask_bits == 32 and model.dropout_rate == 0.1
    # Remat 'dots': what fits XLM-R's batch on a v4-256 (python -m xlmeta_jax.tools.aot).
    assert model == network.get_config(
        "base", pad_token_id=0, dtype="bfloat16", scan_layers=True, attention_impl="auto",
        remat_policy="dots")


def test_large_after_meta_and_phase2_learning_rate(monkeypatch, tmp_path):
    from xlmeta_jax.model import network

    seen = _evaluated_train_args(
        monkeypatch, "native/meta.gin",
        [f"MODEL_DIR = '{tmp_path}'", "BATCH_SIZE = 64", "include 'models/large.gin'",
         "PHASE2_LEARNING_RATE = 3e-4", "PHASE2_WARMUP_STEPS = 500"])
    model = seen["model"]
    assert (model.num_layers, model.hidden_size) == (24, 1024)
    assert model.remat_policy == "save_named"
    assert model.dropout_mask_bits == 32
    assert model == network.get_config(
        "large", pad_token_id=0, dtype="bfloat16", scan_layers=True, attention_impl="auto",
        remat_policy="save_named")
    p1, p2 = seen["phases"]
    assert (p1.optimizer.learning_rate, p1.optimizer.warmup_steps) == (6e-4, 10000)
    assert (p2.optimizer.learning_rate, p2.optimizer.warmup_steps) == (3e-4, 500)


def test_phase2_learning_rate_follows_phase1_by_default(monkeypatch, tmp_path):
    seen = _evaluated_train_args(
        monkeypatch, "native/meta.gin",
        [f"MODEL_DIR = '{tmp_path}'", "BATCH_SIZE = 64", "LEARNING_RATE = 1e-4"])
    p1, p2 = seen["phases"]
    assert p1.optimizer.learning_rate == p2.optimizer.learning_rate == 1e-4
    assert p1.optimizer.warmup_steps == p2.optimizer.warmup_steps == 10000


# ---------------------------------------------------------------------------
# What each command's --help lists works with that command.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", gin_cli.listed_gin_files(train_cli.GIN_FILES))
def test_every_gin_file_of_train_help_configures_a_run(name):
    # Run files alone; the model and corpus files after a run file, as the help says.
    files = [name] if "/" not in name or name.startswith("native/") else ["native/meta.gin",
                                                                           name]
    gin_cli.apply_gin(files, _REQUIRED[:2], finalize=False)
    phases = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
    assert phases and all(p.num_steps > 0 and p.batch_size > 0 for p in phases), name


@pytest.mark.parametrize("name", gin_cli.listed_gin_files(experiment_cli.GIN_FILES))
def test_every_gin_file_of_experiment_help_configures_an_experiment(name, tmp_path):
    gin_cli.apply_gin([name], [f"MODEL_DIR = '{tmp_path}'"], finalize=False)
    exp = experiment_runs.experiment()
    assert exp.arms and exp.tasks and exp.budget.meta_steps > 0


@pytest.mark.parametrize("name", gin_cli.listed_gin_files(finetune_cli.GIN_FILES))
def test_every_gin_file_of_finetune_help_configures_an_evaluation(name):
    # The CPU-size file goes after a task file, as its header says.
    files = ["finetune/pawsx.gin", name] if name == "finetune/demo.gin" else [name]
    # TRAIN_FILES: the contrastive runs' data (other files have no such macro).
    train_files = ["TRAIN_FILES = ['/tmp/unused.jsonl']"] if "embeddings" in name else []
    gin_cli.apply_gin(files, [_REQUIRED[0], _REQUIRED[2], *train_files], finalize=False)
    if evaluation_runs.bound_task() == "embeddings":
        config = evaluation_runs.embeddings_config()
        assert config.steps > 0 and config.evaluate
        assert config.train_files or config.bitext_languages
        return
    config = evaluation_runs.finetune_config()
    assert config.task in evaluation_tasks.names()
    assert f"finetune/{config.task}.gin" in files


@pytest.mark.parametrize("size, layers, width, dtype, batch, length, steps", [
    ("tiny", 2, 64, "float32", 16, 64, 40),
    ("colab", 4, 256, "bfloat16", 128, 128, 2000),
])
def test_notebook_sizes_are_the_demo_at_their_scale(size, layers, width, dtype, batch, length,
                                                    steps, tmp_path):
    """gin/notebooks/SIZE.gin: what both notebooks train (and the AOT table was compiled for)."""
    gin_cli.apply_gin([f"notebooks/{size}.gin"], [f"MODEL_DIR = '{tmp_path}'"], finalize=False)
    model = train_cli.configured_model()
    assert (model.num_layers, model.hidden_size, model.dtype) == (layers, width, dtype)
    assert model.vocab_size == 2000  # The demo's vocabulary.
    p1, p2 = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
    assert p2.init_from == "phase1"
    for p in (p1, p2):
        assert (p.batch_size, p.sequence_length, p.num_steps) == (batch, length, steps)
