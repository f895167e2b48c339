"""A flipped byte in a checkpoint's array files is caught and the damaged array named.

Orbax's array files hold zstd-compressed chunks without a checksum: most one-byte
flips inside a chunk still decompress, into other numbers. Each flip here is judged
against an independent read of the damaged files (Orbax alone, no checksums): a read
that changed an array must be refused naming that array; a read that fails must be
refused as damaged; a flip that changed nothing must not be refused.
"""

from __future__ import annotations

import gin
import jax
import numpy as np
import ocdbt_layout
import orbax.checkpoint as ocp
import pytest
from errors_fixtures import STEPS, array_files, copy_run, digest, train_argv, write_gin

from xlmeta_jax import errors
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.pretrain import checkpoints, checksums, loading

ZSTD_MAGIC = bytes([0x28, 0xB5, 0x2F, 0xFD])

# A failed read of a damaged checkpoint closes Orbax's event loop while TensorStore's other
# reads still complete onto it ("Event loop is closed", unraisable). The commands drop
# exactly these (errors._drop_closed_loop_callbacks); here the readers are called directly.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(?s).*Event loop is closed:pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def finished(finished_run, tmp_path_factory):
    """This module's copy of the session's finished two-phase run (STEPS steps each;
    conftest.finished_run), and its gin file."""
    run_gin = write_gin(tmp_path_factory.mktemp("gin"))
    return copy_run(finished_run, tmp_path_factory.mktemp("finished") / "run"), run_gin


_AS_NUMPY: dict[str, object] = {}


def _raw(step_dir) -> dict:
    """Every array of the step's train state as Orbax alone reads it: ``{name: ndarray}``.

    Read into host arrays (a fifth of the time of sharded device arrays: the flip tests
    read the checkpoint once per flip), by the tree the step's metadata gives (read once
    per step directory: a flip in the array data leaves it as it is)."""
    checkpointer = ocp.PyTreeCheckpointer()
    as_numpy = _AS_NUMPY.get(str(step_dir))
    if as_numpy is None:
        layout = checkpointer.metadata(step_dir / "state")
        layout = getattr(getattr(layout, "item_metadata", layout), "tree", layout)
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), layout)
        _AS_NUMPY[str(step_dir)] = as_numpy
    tree = checkpointer.restore(step_dir / "state", restore_args=as_numpy)
    return {checksums.name_of(entry, path): np.asarray(x)
            for entry in tree
            for path, x in jax.tree_util.tree_leaves_with_path(tree[entry])}


def _frames(path) -> list[tuple[int, int]]:
    """(start, end) of each zstd frame in an OCDBT file (one compressed chunk or node each)."""
    data = path.read_bytes()
    starts = [i for i in range(len(data) - 3) if data[i:i + 4] == ZSTD_MAGIC]
    return list(zip(starts, [*starts[1:], len(data)]))


def test_checkpoints_record_a_checksum_per_array(finished):
    model_dir, _ = finished
    for phase in ("phase1", "phase2"):
        step_dir = model_dir / phase / str(STEPS)
        stored = checkpoints.read_meta(step_dir)[checkpoints.CHECKSUMS]
        assert stored["algorithm"] == checksums.ALGORITHM
        assert set(stored["arrays"]) == set(_raw(step_dir))


def _flip(path, at: int) -> bytes:
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[at] ^= 0x10
    path.write_bytes(bytes(flipped))
    return data


def _value_frames(step_dir):
    """(file, offset) of one byte in the middle of each compressed chunk of array data."""
    for path in array_files(step_dir):
        for start, end in _frames(path):
            at = start + max(4, (end - start) // 2)  # past the frame's magic number
            if at < end:
                yield path, at


@pytest.mark.slow
def test_each_flipped_byte_is_caught_naming_the_array(finished, tmp_path):
    """Every chunk of phase 2's final checkpoint gets one flipped byte, in turn."""
    model_dir = copy_run(finished[0], tmp_path / "run")
    step_dir = model_dir / "phase2" / str(STEPS)
    stored = checkpoints.read_meta(step_dir)[checkpoints.CHECKSUMS]
    original = _raw(step_dir)
    named, failed_reads = set(), 0
    for path, at in _value_frames(step_dir):
        data = _flip(path, at)
        try:
            raw = _raw(step_dir)
        except Exception:  # noqa: BLE001 - TensorStore refused the chunk itself
            failed_reads += 1
            continue
        finally:
            path.write_bytes(data)
        changed = sorted(n for n, x in original.items()
                         if not np.array_equal(raw[n], x, equal_nan=True))
        # Exactly the arrays that changed are named: no miss, no false alarm.
        assert checksums.damaged(stored, ocdbt_layout.nested(raw)) == changed, (path.name, at)
        named.update(changed)
    # The flips reached parameters and both AdamW moments. (One flip per compressed chunk
    # does not reach every array: a chunk holds several, and small arrays sit inline in
    # OCDBT's b-tree nodes, which carry a CRC-32C of their own, so a flip there fails the
    # read and is refused as damaged, see test_a_flip_in_each_array_is_named_or_refused.)
    for kind in ("params.", "opt_state.1.0.mu.", "opt_state.1.0.nu."):
        assert any(n.startswith(kind) for n in named), (kind, sorted(named))


def test_a_flip_in_each_array_is_named_or_refused(finished, tmp_path):
    """One flipped byte in each array in turn (parameters, both AdamW moments, the step
    counters), located through the OCDBT b-tree: a full restore names the array by its
    checksum or, where the chunk or the b-tree node holding it no longer decodes, refuses
    the checkpoint as damaged; in one line naming the checkpoint, never silently."""
    model_dir = copy_run(finished[0], tmp_path / "run")
    step_dir = model_dir / "phase2" / str(STEPS)
    targets = ocdbt_layout.restore_targets(step_dir)
    outcomes = ocdbt_layout.flip_each_array(
        step_dir, lambda: checkpoints.restore_items(step_dir, targets))
    assert set(outcomes) == set(_raw(step_dir))
    ocdbt_layout.assert_each_flip_refused(step_dir, outcomes, (
        "params.", "opt_state.1.0.mu.", "opt_state.1.0.nu.", "opt_state.1.0.count",
        "opt_state.1.2.count", "step"))


def test_damaged_checkpoint_is_refused_before_data_is_prepared(finished, tmp_path, capsys,
                                                               monkeypatch):
    """The stored run is checked before the trainer prepares data or builds a pipeline."""
    from xlmeta_jax.cli import runs

    prepared = []
    monkeypatch.setattr(runs, "prepare_data", lambda: prepared.append("prepare"))
    model_dir = copy_run(finished[0], tmp_path / "run")
    name = _flip_a_parameter(model_dir / "phase1" / str(STEPS))
    code, captured = _rerun(finished, model_dir, capsys)
    assert code == errors.EXIT_USER_ERROR, captured.err
    _one_line(captured.err, "xlmeta_jax.train", "phase1/4 is damaged", f"array {name}")
    assert prepared == [] and "building the input pipeline" not in captured.out


def _flip_a_parameter(step_dir, kind: str = "params.") -> str:
    """Flips one byte of a chunk that silently changes one matrix named ``kind...``; its name."""
    original = _raw(step_dir)
    for path, at in _value_frames(step_dir):
        data = _flip(path, at)
        try:
            raw = _raw(step_dir)
        except Exception:  # noqa: BLE001 - not a silent change: try the next chunk
            raw = None
        changed = [] if raw is None else [
            n for n, x in original.items() if not np.array_equal(raw[n], x, equal_nan=True)]
        if len(changed) == 1 and changed[0].startswith(kind) and original[changed[0]].ndim > 1:
            return changed[0]
        path.write_bytes(data)
    raise AssertionError(f"no chunk of a {kind}* matrix found")


def test_complete_phase_checks_its_optimizer_state(finished, tmp_path, capsys):
    """A rerun calls phase 1 complete only if its final checkpoint is whole, AdamW moments
    included: nothing later reads them (phase 2 resets the optimizer), but the checkpoint
    is the run's product, kept and copied."""
    model_dir = copy_run(finished[0], tmp_path / "run")
    name = _flip_a_parameter(model_dir / "phase1" / str(STEPS), kind="opt_state.")
    before = digest(model_dir)
    code, captured = _rerun(finished, model_dir, capsys)
    assert code == errors.EXIT_USER_ERROR, captured.err
    _one_line(captured.err, "xlmeta_jax.train", "phase1/4 is damaged", f"array {name}")
    assert "already complete" not in captured.out + captured.err
    assert digest(model_dir) == before


def _rerun(finished, model_dir, capsys):
    """Reruns the finished run's training command on ``model_dir``: (exit code, output)."""
    gin.clear_config()
    capsys.readouterr()
    code = errors.run_command(train_cli.main, train_argv(finished[1], model_dir),
                              prog="xlmeta_jax.train")
    gin.clear_config()
    return code, capsys.readouterr()


def _one_line(err: str, prog: str, *parts: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), err
    for part in parts:
        assert part in lines[0], (part, err)


def test_flip_refused_by_every_reader(finished, tmp_path, capsys):
    """The completeness check, export, fine-tuning's loader and a restore name the array."""
    from xlmeta_jax.cli import hf

    model_dir = copy_run(finished[0], tmp_path / "run")
    step_dir = model_dir / "phase2" / str(STEPS)
    name = _flip_a_parameter(step_dir)
    before = digest(model_dir)
    parts = ("phase2/4 is damaged", f"array {name}")

    code, captured = _rerun(finished, model_dir, capsys)
    err = captured.err
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, "xlmeta_jax.train", *parts)
    assert "already complete" not in err

    code = errors.run_command(hf.main, ["to_hf", f"--checkpoint={model_dir}",
                                        f"--output={tmp_path / 'out'}"], prog="xlmeta_jax.hf")
    assert code == errors.EXIT_USER_ERROR
    _one_line(capsys.readouterr().err, "xlmeta_jax.hf", *parts)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

    with pytest.raises(checkpoints.CheckpointError, match=f"array {name}"):
        loading.load_pretrained(model_dir)
    with pytest.raises(checkpoints.CheckpointError, match=f"array {name}"):
        checkpoints.restore_items(step_dir, ocdbt_layout.restore_targets(step_dir))
    assert digest(model_dir) == before


def test_a_record_that_lost_an_array_is_damaged(finished, tmp_path, capsys):
    # An entry renamed in the record: that array would be restored unchecked. Every reader
    # refuses the checkpoint instead, naming the array.
    import json

    model_dir = copy_run(finished[0], tmp_path / "run")
    meta_file = model_dir / "phase2" / str(STEPS) / checkpoints.META / "metadata"
    meta = json.loads(meta_file.read_text())
    arrays = meta[checkpoints.CHECKSUMS]["arrays"]
    name = next(n for n in sorted(arrays) if n.startswith("params"))
    arrays[name + "_renamed"] = arrays.pop(name)
    meta_file.write_text(json.dumps(meta))
    before = digest(model_dir)
    code, captured = _rerun(finished, model_dir, capsys)
    assert code == errors.EXIT_USER_ERROR, captured.err
    _one_line(captured.err, "xlmeta_jax.train", "phase2/4 is damaged",
              f"array {name} has no checksum in the record saved with it")
    with pytest.raises(checkpoints.CheckpointError, match=f"array {name} has no checksum"):
        loading.load_pretrained(model_dir)
    assert digest(model_dir) == before


def test_checksum_cost_command_times_a_whole_state(tmp_path, capsys):
    """The benchmark saves and reads the trainer's whole state (parameters and both AdamW
    moments) and its record verifies; figures are printed, not asserted (timing)."""
    from benchmarks import checksum_cost

    r = checksum_cost.main(["--gin_file=models/tiny.gin", "--repeats=1",
                            f"--work_dir={tmp_path}"])
    cfg = checksum_cost.bench.model_from_gin(["models/tiny.gin"], [])
    stored = _raw(tmp_path / "phase" / "1")
    assert r["values"] == sum(x.size for x in stored.values())
    assert any(n.startswith("opt_state.") and ".mu." in n for n in stored)
    out = capsys.readouterr().out
    assert "record / save" in out and "verify / read" in out and f"x {cfg.hidden_size}" in out
