"""t5x's checkpoints carry per-array checksums, and every reader of ours names a damaged array.

The checkpoints are written in process by t5x's own Orbax checkpoint manager with the
save transformation gin/t5x/run.gin binds (xlmeta_jax/interop/t5x/checksums.py), from a
tiny model sharded on a (data=4, model=2) mesh; they are read back on one device, as
phase 2's start, fine-tuning and ``hf to_hf`` read them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import ocdbt_layout
import orbax.checkpoint as ocp
import pytest
from t5x_toy import corpus_flags, require_t5x, write_corpus

require_t5x()

pytestmark = pytest.mark.extras

from t5x import checkpoints as t5x_checkpoints  # noqa: E402

from xlmeta_jax import errors  # noqa: E402
from xlmeta_jax.interop.t5x import checksums as t5x_checksums  # noqa: E402
from xlmeta_jax.interop.t5x import model as t5x_model  # noqa: E402
from xlmeta_jax.interop.t5x import phases as t5x_phases  # noqa: E402
from xlmeta_jax.model import network  # noqa: E402
from xlmeta_jax.model.optimizer import OptimizerConfig  # noqa: E402
from xlmeta_jax.pretrain import checkpoints, checksums, loading  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
LENGTH, BATCH = 16, 8
SHAPES = {"inputs": (BATCH, LENGTH), "mlm_positions": (BATCH, 4),
          "mlm_targets": (BATCH, 4), "mlm_weights": (BATCH, 4)}
TYPES = {"inputs": np.int32, "mlm_positions": np.int32, "mlm_targets": np.int32,
         "mlm_weights": np.float32}


def _initializer(cfg, mesh_shape, init_params_from=None):
    opt = OptimizerConfig(learning_rate=1e-3, warmup_steps=1, total_steps=4)
    model = t5x_model.MaskedLMModel(cfg, t5x_model.adamw(opt))
    partitioner = t5x_model.MeshPartitioner(mesh_shape=mesh_shape)
    init = t5x_phases.PhaseInitializer(
        model.optimizer_def, model.get_initial_variables, SHAPES, partitioner, TYPES,
        init_params_from=init_params_from)
    return init, partitioner


def write_t5x_run(run_dir, cfg, steps=(0, 2), keep=None) -> pathlib.Path:
    """A t5x run directory as ``python -m t5x.train`` leaves it, saved at ``steps``."""
    os.makedirs(run_dir)  # as t5x's train makes it (its manager would take the parent)
    init, partitioner = _initializer(cfg, (4, 2))
    state = init.from_scratch(jax.random.PRNGKey(0))
    manager = t5x_checkpoints.OrbaxCheckpointManagerInterface(
        directory=os.fspath(run_dir), train_state=init.global_train_state_shape,
        partitioner=partitioner, keep=keep, period=1)
    fns = t5x_checksums.record_checksums(os.fspath(run_dir))
    for step in steps:
        # Other values at every step (the AdamW moments too), as training makes them.
        values = jax.tree.map(lambda x, s=step: x + s if np.issubdtype(x.dtype, np.floating)
                              else x, state.state_dict())
        values["state"]["step"] = np.int32(step)
        state = state.restore_state(values)
        manager.save(state, fns)
    manager.wait_until_finished()
    manager.close()
    (pathlib.Path(run_dir) / t5x_phases.MODEL_INFO).write_text(json.dumps({
        "model_config": dataclasses.asdict(cfg), "vocab_path": None, "task": None,
        "phase": None, "phases": None, "train_steps": steps[-1]}))
    return pathlib.Path(run_dir)


@pytest.fixture(scope="module")
def t5x_run(tmp_path_factory):
    cfg = network.get_config("tiny")
    return write_t5x_run(tmp_path_factory.mktemp("t5x") / "run", cfg), cfg


def raw_state(step_dir) -> dict:
    """Every array of a checkpoint as Orbax alone reads it: ``{name: ndarray}``."""
    tree = ocp.PyTreeCheckpointer().restore(pathlib.Path(step_dir, "state"))
    return {checksums.name_of(entry, path): np.asarray(x)
            for entry in tree for path, x in jax.tree_util.tree_leaves_with_path(tree[entry])}


def test_every_array_of_a_t5x_checkpoint_is_recorded_beside_it(t5x_run):
    run, _ = t5x_run
    assert sorted(p.name for p in (run / checksums.T5X_RECORDS).iterdir()) == [
        "checkpoint_0.json", "checkpoint_2.json"]
    for step in (0, 2):
        step_dir = run / f"checkpoint_{step}"
        stored = checksums.read_t5x_record(step_dir)
        assert stored["algorithm"] == checksums.ALGORITHM
        raw = raw_state(step_dir)
        names = set(raw)
        assert {n.split(".")[0] for n in names} == {"target", "state"}
        assert any(".mu." in n for n in names) and any(".nu." in n for n in names)
        assert set(stored["arrays"]) == names
        # Recorded on a (4, 2) mesh, matched by the single-device read.
        assert checksums.damaged(stored, ocdbt_layout.nested(raw)) == []


def test_records_of_deleted_checkpoints_go_with_them(tmp_path):
    run = write_t5x_run(tmp_path / "run", network.get_config("tiny"),
                        steps=(0, 1, 2, 3, 4, 5), keep=2)
    assert t5x_phases.checkpoint_steps(run) == [4, 5]
    # A record goes at a later save, once a newer checkpoint is finished (t5x deletes in
    # the background); those of the kept checkpoints stay.
    records = {p.name for p in (run / checksums.T5X_RECORDS).iterdir()}
    assert {"checkpoint_4.json", "checkpoint_5.json"} <= records
    assert not {"checkpoint_0.json", "checkpoint_1.json"} & records


def flip_a_parameter(step_dir) -> str:
    """Flips one byte of a parameter matrix's chunk (ocdbt_layout) that still decompresses.

    Returns:
      The name of the parameter, the one array an independent read finds changed.
    """
    original = raw_state(step_dir)
    spans = ocdbt_layout.array_spans(pathlib.Path(step_dir, "state"))
    matrices = sorted((span.length, name) for name, [span, *_] in spans.items()
                      if name.startswith("target.") and not span.inline)
    for _, name in reversed(matrices):
        for at in (0.5, 0.6, 0.7, 0.8, 0.9):
            data = ocdbt_layout.flip(spans[name][0], at)
            try:
                raw = raw_state(step_dir)
            except Exception:  # noqa: BLE001 - zstd refused the chunk: not silent, try on
                raw = original
            changed = [n for n, x in original.items()
                       if not np.array_equal(raw[n], x, equal_nan=True)]
            if changed == [name]:
                return name
            spans[name][0].path.write_bytes(data)
    raise AssertionError(f"no flip in {step_dir} silently changes one parameter matrix")


def test_a_flip_in_each_array_of_a_t5x_checkpoint_is_named_or_refused(t5x_run, tmp_path):
    """One flipped byte in each array in turn (parameters, both AdamW moments, the step
    counters), located through the OCDBT b-tree: reading the whole state names the array
    by its recorded checksum or refuses the checkpoint as damaged, never silently."""
    run = tmp_path / "run"
    shutil.copytree(t5x_run[0], run)
    step_dir = run / "checkpoint_2"
    targets = ocdbt_layout.restore_targets(step_dir)
    outcomes = ocdbt_layout.flip_each_array(
        step_dir, lambda: checkpoints.restore_items(step_dir, targets))
    assert set(outcomes) == set(raw_state(step_dir))
    ocdbt_layout.assert_each_flip_refused(step_dir, outcomes, (
        "target.", "state.param_states.1.0.mu.", "state.param_states.1.0.nu.",
        "state.param_states.1.0.count", "state.step"))


def _one_line(err: str, prog: str, *parts: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), err
    for part in parts:
        assert part in lines[0], (part, err)


def test_flipped_byte_is_named_by_every_reader(t5x_run, tmp_path, capsys):
    """Phase 2's start, fine-tuning's loader and ``hf to_hf`` name the damaged array."""
    from xlmeta_jax.cli import hf

    run = pathlib.Path(t5x_run[0])
    cfg = t5x_run[1]
    damaged_run = tmp_path / "run"
    shutil.copytree(run, damaged_run)
    step_dir = damaged_run / "checkpoint_2"
    name = flip_a_parameter(step_dir)
    parts = ("checkpoint_2 is damaged", f"array {name}")

    with pytest.raises(errors.CheckpointError, match=f"array {name}"):
        loading.load_pretrained(damaged_run)
    with pytest.raises(errors.CheckpointError, match=f"array {name}"):
        checkpoints.restore_params(step_dir)
    init, _ = _initializer(cfg, (4, 2), init_params_from=os.fspath(step_dir))
    with pytest.raises(errors.CheckpointError, match=f"array {name}"):
        init.from_scratch(jax.random.PRNGKey(1))

    capsys.readouterr()
    code = errors.run_command(hf.main, ["to_hf", f"--checkpoint={damaged_run}",
                                        f"--output={tmp_path / 'out'}"], prog="xlmeta_jax.hf")
    assert code == errors.EXIT_USER_ERROR
    _one_line(capsys.readouterr().err, "xlmeta_jax.hf", *parts)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

    # The undamaged copy reads; a corrupted record is refused, naming the record.
    loading.load_pretrained(run)
    record = checksums.t5x_record_path(step_dir)
    record.write_text("{not json")
    with pytest.raises(errors.CheckpointError, match=f"checksums {record} are corrupted"):
        checkpoints.restore_params(step_dir)


@pytest.mark.slow
def test_t5x_phase2_from_a_damaged_phase1_is_one_line(shared_data, tmp_path):
    """``python -m t5x.train``: phase 1 records its checksums, phase 2 refuses a flip."""
    corpus = write_corpus(shared_data, str(tmp_path / "corpus"))
    model_dir = tmp_path / "run"

    def t5x_train(*extra):
        cmd = [sys.executable, "-m", "t5x.train", "--gin_file=gin/meta.gin",
               "--gin_file=gin/models/tiny.gin", f"--gin.MODEL_DIR='{model_dir}'",
               *corpus_flags(corpus), "--gin.META_STEPS=2", "--gin.XLING_STEPS=2",
               "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.WARMUP_STEPS=1",
               "--gin.CHECKPOINT_EVERY=2", *extra]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
        env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"
        env.pop(errors.DEBUG_ENV, None)
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900)

    out = t5x_train()
    assert out.returncode == 0, out.stderr[-4000:]
    step_dir = model_dir / "phase1" / "checkpoint_2"
    stored = checksums.read_t5x_record(step_dir)
    assert set(stored["arrays"]) == set(raw_state(step_dir))
    name = flip_a_parameter(step_dir)

    out = t5x_train("--gin.PHASE=2")
    assert out.returncode == errors.EXIT_USER_ERROR, out.stderr[-4000:]
    assert "Traceback" not in out.stderr, out.stderr[-4000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("t5x.train: error: "), last
    assert f"checkpoint {step_dir} is damaged: array {name}" in last, last
    assert not t5x_phases.checkpoint_steps(model_dir / "phase2")
