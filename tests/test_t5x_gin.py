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

pytestmark = pytest.mark.extras

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


def _stage():
    """The phase a t5x run file trains (``STAGE``), as gin/t5x/phase.gin reads it."""
    return _evaluate(gin.query_parameter("STAGE/macro.value"))


def test_every_t5x_gin_file_has_a_header_naming_its_command():
    files = t5x_gin_files()
    assert {"gin/meta.gin", "gin/xlmr.gin", "gin/t5x/run.gin", "gin/t5x/mesh.gin"} <= set(
        files)
    for name in files:
        header = (REPO / name).read_text().split("\n\n")[0]
        assert header.startswith("#") and "t5x.train" in header, name


@pytest.mark.parametrize("name", ["gin/meta.gin", "gin/xlmr.gin"])
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
    assert _stage().phase.source() == "xlmeta_english_text"
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
    assert _stage().phase.source() == "xlmeta_cc100"
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


def _stage_args(run_file, phase, tmp_path, *bindings) -> dict:
    """t5x train's arguments for one phase of our trainer's run file, as ``python -m
    xlmeta_jax.t5x_train --gin_file=RUN --phase=PHASE`` derives them (gin/t5x/stage.gin)."""
    from xlmeta_jax.cli import flags as gin_flags
    from xlmeta_jax.cli import t5x_stage
    from xlmeta_jax.interop.t5x import stages

    gin_flags.apply_gin([run_file], [f"MODEL_DIR = '{tmp_path}'",
                                     "VOCAB_PATH = '/unused/spm.model'", *bindings])
    stage = t5x_stage.configured_stage(phase)
    gin.clear_config(clear_constants=True)
    stages.set_current(stage)
    return _train_args(["gin/t5x/stage.gin"])


# run file, phase, its settings: (directory, TRAIN_STEPS, start step, length, batch,
# whole state kept, source checkpoint, schedule (total, shape), masking rate, RoPE global).
STAGE_CASES = [
    ("gin/native/annealed.gin", "stage2", [], (
        "stage2", 450000, 350000, 512, 8192, True, "stage1/checkpoint_350000",
        (500000, "wsd"), 0.15, None)),
    ("gin/native/annealed.gin", "1", [], (
        "stage1", 350000, 0, 512, 8192, False, None, (500000, "wsd"), 0.3, None)),
    ("gin/native/meta.gin", "phase2", ["ENGLISH_FILES = ['/unused/*.txt']"], (
        "phase2", 400000, 0, 512, 8192, False, "phase1/checkpoint_100000",
        (400000, "linear"), 0.15, None)),
    # mmBERT's context extension: its own length and RoPE bases, the base stage's schedule
    # continued (t5x reads blocks, not rows packed from documents).
    ("gin/native/mmbert.gin", "ext", ["xlmeta_jax.data.corpora.Corpora.packing = 'blocks'"], (
        "ext", None, None, 8192, 4608, True, "base/checkpoint_", (None, "wsd"), 0.15,
        160000.0)),
]


@pytest.mark.parametrize("run_file, phase, bindings, want", STAGE_CASES,
                         ids=[f"{c[0].split('/')[-1]}:{c[1]}" for c in STAGE_CASES])
def test_a_phase_of_our_run_file_derives_its_t5x_settings(run_file, phase, bindings, want,
                                                          tmp_path):
    (name, steps, start, length, batch, keeps, source, (total, schedule), rate,
     rope) = want
    from xlmeta_jax.interop.t5x import stages

    args = _stage_args(run_file, phase, tmp_path, *bindings)
    stage = stages.current()
    assert _evaluate(args["model_dir"]) == str(tmp_path / name)
    # Steps and their start: the phase's own, or (continuing a schedule) after its source's.
    assert _evaluate(args["total_steps"]) == (steps or stage.end_step())
    assert _evaluate(gin.query_parameter("t5x_progress.ProgressAction.start_step")) == (
        start if start is not None else stage.start_step())
    assert stage.end_step() - stage.start_step() == stage.phase.num_steps
    lengths = _evaluate(gin.query_parameter("train/utils.DatasetConfig.task_feature_lengths"))
    assert lengths == {"inputs": length, "targets": length}
    assert _evaluate(gin.query_parameter("train/utils.DatasetConfig.batch_size")) == batch
    assert _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.keep_optimizer")) is keeps
    if source is None:
        assert _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.init_params_from")
                         ) is None
    else:  # the source phase has not run here: its final checkpoint is named
        with pytest.raises(t5x_phases.PhaseError, match=source):
            _evaluate(gin.query_parameter("t5x_phases.PhaseInitializer.init_params_from"))
    opt = _evaluate(gin.query_parameter("t5x_model.adamw.config"))
    assert opt == _evaluate(gin.query_parameter("t5x_model.learning_rate.config"))
    assert opt == stage.phase.optimizer_config() and opt.schedule == schedule
    if total is not None:
        assert opt.total_steps == total
    model = _model()
    assert model.masking.rate == rate
    assert model.config == stage.phase.model(stage.model)
    if rope is not None:
        assert model.config.global_rope_theta == model.config.local_rope_theta == rope
        assert stage.model.local_rope_theta != rope  # the run's own, not the phase's
    # Each phase's data and dropout seeds, as our trainer derives them (later phases).
    sources = [p.source() for p in stage.phases]
    assert _evaluate(gin.query_parameter("t5x_phases.get_dataset.stream_seed")) == (
        seeds.phase_seeds(sources, 0)[stage.index])


def test_a_phase_takes_t5x_mesh_file(tmp_path):
    # python -m xlmeta_jax.t5x_train --gin_file=gin/native/annealed.gin --phase=stage2
    #   --gin_file=gin/t5x/mesh.gin --gin.MESH_SHAPE="(4, 2)": t5x's add-on and its macro go
    # to t5x, after gin/t5x/stage.gin; the run file to our trainer's parse.
    from xlmeta_jax.cli import t5x_stage

    argv = t5x_stage.stage_argv("stage2", [
        "--gin_file=gin/native/annealed.gin", "--gin_file=gin/t5x/mesh.gin",
        "--gin.MESH_SHAPE=(4, 2)", f"--gin.MODEL_DIR='{tmp_path}'",
        "--gin.VOCAB_PATH='/unused/spm.model'", "--alsologtostderr"], "gin/t5x/stage.gin")
    assert argv == ["--gin_file=gin/t5x/stage.gin", "--gin_file=gin/t5x/mesh.gin",
                    "--gin_bindings=MESH_SHAPE = (4, 2)", "--alsologtostderr"]
    args = _train_args(["gin/t5x/stage.gin", "gin/t5x/mesh.gin"], "MESH_SHAPE = (4, 2)")
    partitioner = _evaluate(args["partitioner"])
    assert isinstance(partitioner, t5x_model.MeshPartitioner)
    assert dict(partitioner.mesh.shape) == {"data": 4, "model": 2}
    assert _evaluate(args["model_dir"]) == str(tmp_path / "stage2")


@pytest.mark.parametrize("run_file, phase, bindings, words", [
    ("gin/native/annealed.gin", "stage4", [], ["--phase=stage4", "stage1, stage2, stage3"]),
    ("gin/native/annealed.gin", "0", [], ["--phase=0", "1 to 3"]),
    ("gin/native/mmbert.gin", "ext", [], ["Corpora.packing", "'blocks'"]),
    ("gin/native/annealed.gin", "stage2",
     ["xlmeta_jax.pretrain.recipes.annealed.overrides = {'stage2': {'reset_schedule': True}}"],
     ["'stage2'", "resets its schedule but not its optimizer"]),
])
def test_a_phase_t5x_cannot_run_is_one_line(run_file, phase, bindings, words, tmp_path):
    from xlmeta_jax import errors
    from xlmeta_jax.cli import flags as gin_flags
    from xlmeta_jax.cli import t5x_stage

    gin_flags.apply_gin([run_file], [f"MODEL_DIR = '{tmp_path}'",
                                     "VOCAB_PATH = '/unused/spm.model'", *bindings])
    with pytest.raises(errors.UserError) as e:
        t5x_stage.configured_stage(phase)
    line = errors.user_message(e.value)
    assert "\n" not in line and all(w in line for w in words), line


def test_stage_gin_alone_names_the_command():
    from xlmeta_jax.interop.t5x import stages

    stages._current.clear()
    args = _train_args(["gin/t5x/stage.gin"])
    with pytest.raises(stages.StageError, match="--phase=NAME"):
        _evaluate(args["model_dir"])
