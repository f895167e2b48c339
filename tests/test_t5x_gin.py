"""The gin files of `python -m t5x.train` parse, and evaluate to the experiment: the
arguments t5x's `train` would get for both phases of gin/meta.gin and for gin/xlmr.gin
(model sizes from gin/models, equal compute, phase directories), without training."""

from __future__ import annotations

import copy
import pathlib
import sys
import types

import gin
import pytest
from t5x_toy import require_t5x

require_t5x()

import t5x.train as t5x_train  # noqa: E402
from t5x import optimizers as t5x_optimizers  # noqa: E402

from xlmeta_jax.data import seeds  # noqa: E402
from xlmeta_jax.interop.t5x import checks as t5x_checks  # noqa: E402
from xlmeta_jax.interop.t5x import checksums as t5x_checksums  # noqa: E402
from xlmeta_jax.interop.t5x import model as t5x_model  # noqa: E402
from xlmeta_jax.interop.t5x import phases as t5x_phases  # noqa: E402
from xlmeta_jax.model import network  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
GIN_DIR = REPO / "gin"
# t5x's own `train` as `python -m t5x.train` registers it: gin/*.gin bind it through
# `import __main__ as train_script`.
_TRAIN = gin.configurable(t5x_train.train)


def t5x_gin_files() -> list[str]:
    """Every shipped gin file written for python -m t5x.train (t5x's dynamic registration)."""
    return sorted(
        p.relative_to(REPO).as_posix() for p in GIN_DIR.rglob("*.gin")
        if "from __gin__ import dynamic_registration" in p.read_text()
    )


@pytest.fixture(autouse=True)
def t5x_main(monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(train=_TRAIN))
    monkeypatch.chdir(REPO)
    gin.clear_config(clear_constants=True)
    yield
    gin.clear_config(clear_constants=True)


def _train_args(gin_files, *bindings) -> dict:
    """t5x train's bound arguments, evaluated (references called, macros resolved)."""
    gin.add_config_file_search_path(str(REPO))
    gin.parse_config_files_and_bindings(
        list(gin_files), ["VOCAB_PATH = '/unused/spm.model'", *bindings])
    bound = gin.get_bindings(_TRAIN, resolve_references=False)
    return {k: v for k, v in bound.items()}


def _evaluate(value):
    return copy.deepcopy(value)


def _model():
    """t5x's model as train gets it, without the run's checks (no corpus or vocabulary here)."""
    return _evaluate(gin.query_parameter("t5x_checks.checked_model.model"))


def _task(args) -> str:
    """The task name the dataset config registers, without registering (no corpus here)."""
    return _evaluate(gin.query_parameter("xlmeta_jax.cli.configurables.registered.name"))


def test_every_t5x_gin_file_has_a_header_naming_its_command():
    files = t5x_gin_files()
    assert {"gin/meta.gin", "gin/xlmr.gin", "gin/t5x/run.gin", "gin/t5x/mesh.gin"} <= set(
        files)
    for name in files:
        header = (REPO / name).read_text().split("\n\n")[0]
        assert header.startswith("#") and "t5x.train" in header, name


@pytest.mark.parametrize("name", ["gin/meta.gin", "gin/xlmr.gin", "gin/annealed.gin"])
def test_run_files_parse_with_the_mesh_file(name, tmp_path):
    args = _train_args([name, "gin/t5x/mesh.gin"], f"MODEL_DIR = '{tmp_path}'",
                       "MESH_SHAPE = (4, 2)")
    partitioner = _evaluate(args["partitioner"])
    assert isinstance(partitioner, t5x_model.MeshPartitioner)
    assert dict(partitioner.mesh.shape) == {"data": 4, "model": 2}


def test_meta_gin_phase_1(tmp_path):
    args = _train_args(["gin/meta.gin"], f"MODEL_DIR = '{tmp_path}'")
    assert _evaluate(args["model_dir"]) == str(tmp_path / "phase1")
    assert _evaluate(args["total_steps"]) == 100000
    assert _task(args) == "xlmeta_english_text"
    # train's model passes our trainer's checks first (xlmeta_jax/interop/t5x/checks.py).
    assert args["model"].configurable.wrapped is t5x_checks.checked_model
    model = _model()
    assert isinstance(model, t5x_model.MaskedLMModel)
    assert isinstance(model.optimizer_def, t5x_optimizers.OptaxWrapper)
    # The encoder of gin/models/base.gin, exactly as our trainer's run gets it.
    assert model.config == network.get_config(
        "base", pad_token_id=0, dtype="bfloat16", scan_layers=True, attention_impl="auto",
        remat_policy="dots")
    opt = _evaluate(gin.query_parameter("t5x_model.adamw.config"))
    assert (opt.total_steps, opt.learning_rate, opt.warmup_steps) == (100000, 6e-4, 10000)
    assert (opt.b1, opt.b2, opt.eps, opt.weight_decay) == (0.9, 0.98, 1e-6, 0.01)
    lengths = _evaluate(gin.query_parameter("train/utils.DatasetConfig.task_feature_lengths"))
    assert lengths == {"inputs": 512, "targets": 512}
    assert _evaluate(gin.query_parameter("train/utils.DatasetConfig.batch_size")) == 8192
    save = _evaluate(args["checkpoint_cfg"]).save
    assert save.save_dataset
    # Every checkpoint's checksums, recorded beside it in the phase directory.
    [recorder] = save.state_transformation_fns
    assert isinstance(recorder, t5x_checksums.RecordChecksums)
    assert (recorder.model_dir, recorder.dtype) == (str(tmp_path / "phase1"), save.dtype)
    assert _evaluate(args["train_eval_dataset_cfg"]) is None
    assert _evaluate(gin.query_parameter(
        "t5x_phases.PhaseInitializer.init_params_from")) is None
    # t5x's trainer with our whole-batch normalisation of accumulated microbatches.
    assert issubclass(_evaluate(args["trainer_cls"]), t5x_model.MaskedLMTrainer)
    assert _evaluate(gin.query_parameter("t5x_model.MaskedLMTrainer.num_microbatches")) == 1
    # Each host's data seeded on its own; phase 1 initialises from SEED, as the baseline.
    assert _evaluate(args["get_dataset_fn"]).__wrapped__ is t5x_phases.get_dataset
    assert _evaluate(args["random_seed"]) == 0


def test_t5x_demo_sizes_the_model_to_its_vocabulary(tmp_path):
    args = _train_args(["gin/t5x/demo.gin"], f"MODEL_DIR = '{tmp_path}'")
    # The demo's 2000-piece vocabulary (tiny.gin alone has 1024 ids).
    assert _model().config.vocab_size == 2000
    assert _evaluate(args["total_steps"]) == 40


def test_large_and_phase2_learning_rate(tmp_path):
    _train_args(["gin/meta.gin", "gin/models/large.gin"], f"MODEL_DIR = '{tmp_path}'",
                "PHASE = 2", "PHASE2_LEARNING_RATE = 3e-4", "PHASE2_WARMUP_STEPS = 500")
    model = _model()
    assert (model.config.num_layers, model.config.hidden_size) == (24, 1024)
    opt = _evaluate(gin.query_parameter("t5x_model.adamw.config"))
    assert (opt.total_steps, opt.learning_rate, opt.warmup_steps) == (400000, 3e-4, 500)


def test_meta_gin_phase_2_starts_from_phase_1(tmp_path):
    args = _train_args(["gin/meta.gin"], f"MODEL_DIR = '{tmp_path}'", "PHASE = 2")
    # Phase 2's dropout is not a replay of phase 1's: the seed our trainer gives the
    # mixture's phase (and the mixture-only arm).
    assert _evaluate(args["random_seed"]) == seeds.phase_seeds(["xlmeta_cc100"], 0)[0] != 0
    assert _evaluate(args["model_dir"]) == str(tmp_path / "phase2")
    assert _evaluate(args["total_steps"]) == 400000
    assert _task(args) == "xlmeta_cc100"
    with pytest.raises(t5x_phases.PhaseError, match="phase1/checkpoint_100000"):
        _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.init_params_from"))
    (tmp_path / "phase1" / "checkpoint_100000").mkdir(parents=True)
    assert _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.init_params_from")) == (
        str(tmp_path / "phase1" / "checkpoint_100000"))


def test_xlmr_gin_is_the_equal_compute_baseline(tmp_path):
    args = _train_args(["gin/xlmr.gin"], f"MODEL_DIR = '{tmp_path}'")
    assert _evaluate(args["model_dir"]) == str(tmp_path)
    assert _evaluate(args["checkpoint_cfg"]).save.state_transformation_fns[0].model_dir == (
        str(tmp_path))
    assert _evaluate(args["total_steps"]) == 100000 + 400000
    assert _task(args) == "xlmeta_cc100"
    assert _model().config.hidden_size == 768
    opt = _evaluate(gin.query_parameter("t5x_model.adamw.config"))
    assert opt.total_steps == 500000


def test_annealed_gin_stage_2_continues_stage_1(tmp_path):
    """Stage 2 of gin/annealed.gin: its own directory, data and seed; stage 1's whole final
    state (checkpoint_350000) as its start; one WSD schedule over the three stages."""
    args = _train_args(["gin/annealed.gin"], f"MODEL_DIR = '{tmp_path}'", "PHASE = 2")
    assert _evaluate(args["model_dir"]) == str(tmp_path / "stage2")
    assert _evaluate(args["total_steps"]) == 350000 + 100000
    # The stage's own registration (xlmeta_cc100.stage2), whose name seeds its data and dropout.
    assert _evaluate(gin.query_parameter("xlmeta_jax.cli.configurables.registered.view")) == (
        ".stage2")
    assert _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.keep_optimizer"))
    with pytest.raises(t5x_phases.PhaseError, match="stage1/checkpoint_350000"):
        _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.init_params_from"))
    opt = _evaluate(gin.query_parameter("t5x_model.adamw.config"))
    assert (opt.total_steps, opt.schedule, opt.decay_steps, opt.decay_shape) == (
        500000, "wsd", 50000, "1-sqrt")
    model = _model()
    assert model.masking.rate == 0.15
