"""Orbax checkpoints of a training phase: state, data-iterator state, metadata.

Layout (t5x-like, one CheckpointManager per phase)::

    MODEL_DIR/
      config.gin                 operative gin config of the run
      phase1/
        <step>/state/            TrainState (params, optimizer state, step) — Orbax
        <step>/data/             each process's input-iterator state
        <step>/meta/             JSON: encoder config, vocabulary, phase, provenance
        train/                   TensorBoard summaries
      phase2/ ...

Orbax writes each step into a temporary directory and renames it when complete,
so an interrupted save never looks like a checkpoint. A failed save (disk full,
Ctrl-C twice) removes its temporary directory; the next run's manager removes
any left by a kill -9. Damaged checkpoints (unreadable metadata, missing or
truncated array files) raise :class:`CheckpointError` naming the directory, and an
array that differs from its checksum recorded at save time (:mod:`xlmeta_jax.pretrain.checksums`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

from xlmeta_jax import errors, library_text
from xlmeta_jax.data import feeding
from xlmeta_jax.errors import CheckpointError, NoSpaceError, first_line, no_space
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import checksums

STATE, DATA, META = "state", "data", "meta"
STEP_METADATA = "_CHECKPOINT_METADATA"  # Orbax's per-step file (commit time, item names)
CHECKSUMS = "checksums"  # key of the metadata item: checksums.record() of the saved state
# `python -m t5x.train` (gin/meta.gin, gin/xlmr.gin) writes <run>/checkpoint_<step>/state with the
# parameters under "target", and our encoder configuration as <run>/xlmeta_model.json.
T5X_PARAMS, T5X_MODEL_INFO = "target", "xlmeta_model.json"


def absolute(path) -> str:
    """``path`` made absolute (Orbax refuses relative paths); URLs (gs://...) as given."""
    path = os.fspath(path)
    return path if "://" in path else os.path.abspath(path)


class _OrbaxLogFilter(logging.Filter):
    """Drops Orbax log records that say nothing to a user of this module.

    * notices that hold for every read of one item of a composite checkpoint
      (its step-level metadata lives one folder up), or that precede an error
      this module raises itself;
    * background-thread tracebacks of a full disk (or quota, or file-size limit): the
      same error is raised again by ``save``/``wait`` and reported there as one line.
    """

    NOTICES = (
        library_text.declare(
            "Metadata file does not exist", module="orbax.checkpoint._src.metadata.checkpoint",
            package="orbax-checkpoint", version="0.12.8",
            why="logged at WARNING on the absl logger, which also carries Orbax's real "
                "warnings and every other absl user's; no option"),
        library_text.declare(
            "Failed to get item metadata", module="orbax.checkpoint._src.checkpointers."
            "checkpointer", package="orbax-checkpoint", version="0.12.8",
            why="the same logger; said for every item of a composite checkpoint read"),
    )
    REPORTED = errors.NO_SPACE_TEXTS

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if any(message.startswith(n) for n in self.NOTICES):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        text = message + (str(exc) if exc is not None else "")
        return not any(r in text for r in self.REPORTED)


_ORBAX_LOG_FILTER = _OrbaxLogFilter()
_READING_ARRAY = library_text.declare(
    "reading array", module="orbax.checkpoint._src.serialization.serialization",
    package="orbax-checkpoint", version="0.12.8",
    why="Orbax re-raises TensorStore's read errors as plain exceptions with these words")


def _filter_orbax_logs() -> None:
    # Idempotent: logging keeps one copy of a given filter object.
    logging.getLogger("absl").addFilter(_ORBAX_LOG_FILTER)


def _damaged(step_dir, e: BaseException, what: str | None = None) -> CheckpointError:
    text = first_line(e)
    if what is not None:
        text = f"{what}: {type(e).__name__}: {text}"
    # "TensorStore" and "OCDBT" are TensorStore's words (compiled: no source to test; the
    # damaged-checkpoint tests raise them); "reading array" is Orbax's wrapping of them.
    elif "TensorStore" in text or _READING_ARRAY in text or "OCDBT" in text:
        # TensorStore's own text is a multi-kilobyte spec dump; say what it means.
        text = "its array data cannot be read: an array file is missing, truncated or corrupted"
    return CheckpointError(f"checkpoint {step_dir} is damaged or incomplete ({text[:300]})")


def discard_partial(directory) -> list[str]:
    """Removes Orbax's temporary (unfinished) step directories under ``directory``."""
    directory = epath.Path(absolute(directory))
    removed = []
    if not directory.exists():
        return removed
    for p in directory.iterdir():
        if ocp.path.step.TMP_DIR_SUFFIX in p.name:
            shutil.rmtree(os.fspath(p), ignore_errors=True)
            removed.append(os.fspath(p))
    return removed


# ---------------------------------------------------------------------------
# One phase's checkpoints.
# ---------------------------------------------------------------------------


def all_finite(tree) -> bool:
    """True when every floating-point leaf of ``tree`` is finite (one device reduction)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    if not leaves:
        return True
    ok = jax.jit(lambda xs: jnp.all(jnp.stack([jnp.isfinite(x).all() for x in xs])))(leaves)
    return bool(ok)


class PhaseCheckpoints:
    """A CheckpointManager for one phase directory (periodic, async, keep-N, final)."""

    def __init__(
        self,
        directory: str,
        *,
        save_interval_steps: int,
        max_to_keep: int | None,
        async_save: bool = True,
        read_only: bool = False,
    ):
        self.directory = epath.Path(absolute(directory))
        _filter_orbax_logs()

        options = ocp.CheckpointManagerOptions(
            # Every `save_interval_steps` and on preemption; unlike Orbax's default,
            # no extra checkpoint of the very first step.
            save_decision_policy=policies.AnySavePolicy([
                policies.FixedIntervalPolicy(save_interval_steps),
                policies.PreemptionCheckpointingPolicy(),
            ]),
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            create=not read_only,
            # Not Orbax's read_only option: it warns on every open. This object
            # never saves when read_only (see save()).
            # Unfinished saves of a killed run are removed below, synchronously:
            # Orbax's own cleanup runs in a thread that close() does not wait for,
            # so a short-lived manager (a phase found complete) could exit under it.
            cleanup_tmp_directories=False,
        )
        self.read_only = read_only
        if not read_only and jax.process_index() == 0:
            discard_partial(self.directory)
        # Before Orbax lists the steps: it would log two ERROR lines per damaged file.
        if self.directory.exists():
            for step_dir in self.directory.iterdir():
                if step_dir.name.isdigit():
                    check_step_metadata(step_dir)
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                STATE: ocp.StandardCheckpointHandler(),
                DATA: feeding.DataIteratorHandler(),
                META: ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def step_dir(self, step: int) -> epath.Path:
        return self.directory / str(step)

    def save(self, step: int, state, iterator, meta: dict, *, force: bool = False) -> bool:
        """Saves when the interval says so (or ``force``); refuses non-finite state."""
        if self.read_only:
            raise RuntimeError(f"{self.directory} was opened read-only")
        if not force and not self.manager.should_save(step):
            return False
        if not all_finite(state.params):
            raise errors.NonFiniteError(
                f"refusing to write checkpoint {self.step_dir(step)}: parameters are not finite"
            )
        meta = {**meta, CHECKSUMS: checksums.record(state)}
        items = {
            STATE: ocp.args.StandardSave(state),
            META: ocp.args.JsonSave(meta),
        }
        if iterator is not None:
            items[DATA] = feeding.DataIteratorSave(iterator)
        try:
            return self.manager.save(step, args=ocp.args.Composite(**items), force=force)
        except Exception as e:
            self._raise_write_error(e, step)
            raise

    def _raise_write_error(self, e: BaseException, step: int | None) -> None:
        """Turns a full disk into one error, after removing the partial step."""
        what = no_space(e)
        if what is None:
            return
        removed = discard_partial(self.directory)
        # A background save fails at the next save or wait: name the step it was writing.
        steps = sorted(int(os.path.basename(p).split(".")[0]) for p in removed
                       if os.path.basename(p).split(".")[0].isdigit())
        if steps:
            step = steps[0]
        where = self.step_dir(step) if step is not None else self.directory
        latest = self.latest_step()
        resume = "the phase's start" if latest is None else f"step {latest}"
        raise NoSpaceError(
            f"{what} while writing checkpoint {where} (the partial "
            f"checkpoint was removed; the run resumes from {resume})"
        ) from e

    def restore(self, step: int, abstract_state, iterator=None):
        """Restores state (onto ``abstract_state``'s shardings) and the iterator.

        Raises:
          CheckpointError: the step's files are damaged or do not fit ``abstract_state``.
        """
        self.read_meta(step)  # a readable-metadata check with a clear message first
        items = {STATE: ocp.args.StandardRestore(abstract_state), META: ocp.args.JsonRestore()}
        if iterator is not None:
            items[DATA] = feeding.DataIteratorRestore(iterator)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many kinds
            raise _damaged(self.step_dir(step), e) from e
        checksums.verify(self.step_dir(step), restored[META].get(CHECKSUMS), restored[STATE])
        return restored[STATE], restored[META]

    def read_meta(self, step: int) -> dict:
        return read_meta(self.step_dir(step))

    def wait(self):
        """Waits for a background save; a full disk becomes a NoSpaceError."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            self._raise_write_error(e, None)
            raise

    def close(self):
        self.manager.close()


def save_params(phase_dir, cfg: EncoderConfig, params, *, step: int = 0,
                vocab_path: str | None = None, initialized_from: str | None = None,
                extra_meta: dict | None = None) -> epath.Path:
    """Writes parameters alone as step ``step`` of a phase directory, as the trainer does.

    ``<step>/state`` holds only ``params`` and ``<step>/meta`` the encoder config,
    vocabulary and provenance, so :func:`load_pretrained`, ``INITIAL_CHECKPOINT_PATH``
    and fine-tuning read it like a pretraining checkpoint (e.g. ``hf to_flax``).

    Raises:
      CheckpointError: the step already exists.
      FloatingPointError: the parameters are not finite.
    """
    if not all_finite(params):
        raise errors.NonFiniteError(f"refusing to write {phase_dir}: parameters are not finite")
    ckpt = PhaseCheckpoints(os.fspath(phase_dir), save_interval_steps=1, max_to_keep=None,
                            async_save=False)
    try:
        if ckpt.latest_step() is not None:
            raise CheckpointError(f"{ckpt.directory} already holds checkpoints")
        meta = {"phase": ckpt.directory.name, "phase_step": step,
                "model_config": dataclasses.asdict(cfg), "vocab_path": vocab_path,
                "initialized_from": initialized_from, "metrics": {},
                CHECKSUMS: checksums.record({"params": params}), **(extra_meta or {})}
        ckpt.manager.save(step, args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave({"params": params}),
            META: ocp.args.JsonSave(meta),
        }), force=True)
        ckpt.wait()
    finally:
        ckpt.close()
    return ckpt.step_dir(step)


def _read_json_object(path: epath.Path) -> dict:
    """A checkpoint's JSON file that must hold an object; CheckpointError naming it if not."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, OSError) as e:
        raise CheckpointError(
            f"checkpoint metadata {path} is corrupted ({type(e).__name__}); "
            "the checkpoint cannot be used"
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint metadata {path} is corrupted (not a JSON object)")
    return data


def check_step_metadata(step_dir) -> None:
    """Refuses a step whose Orbax step metadata (``_CHECKPOINT_METADATA``) is unreadable.

    Orbax itself only logs such a file as an ERROR and goes on using the step, so a
    damaged final step would pass for a finished phase.

    Raises:
      CheckpointError: naming the file.
    """
    path = epath.Path(step_dir) / STEP_METADATA
    if path.exists():  # older Orbax versions write none
        _read_json_object(path)


def read_meta(step_dir) -> dict:
    """The JSON metadata item of a step directory (Orbax's JsonCheckpointHandler file).

    Raises:
      CheckpointError: this file or the step's Orbax step metadata is missing or corrupted.
    """
    path = epath.Path(step_dir) / META / "metadata"
    if not path.exists():
        raise CheckpointError(f"{step_dir} has no {META}/metadata: not an xlmeta_jax checkpoint")
    check_step_metadata(step_dir)
    return _read_json_object(path)


def verify_readable(step_dir, abstract_params=None, *, all_arrays: bool = False) -> dict:
    """Checks that a checkpoint can be used: metadata, array metadata and parameters.

    The parameters are read in full: a truncated or deleted array file shows only when
    its bytes are read, and the parameters are what a later phase, a fine-tune or an
    export needs. A phase's final checkpoint, which a rerun calls complete, is the
    run's product: ``all_arrays`` checks its optimizer state too, one entry at a time
    so that no more than one entry is in memory at once.

    Args:
      step_dir: ``.../phaseN/<step>``.
      abstract_params: expected parameter shapes/dtypes (ShapeDtypeStructs), if known.
      all_arrays: also read and check every other entry of the train state.

    Returns:
      The checkpoint's metadata.

    Raises:
      CheckpointError: naming the step directory and what is wrong.
    """
    meta = read_meta(step_dir)
    restore_params(step_dir, abstract_params)  # read in full; the values are not kept
    if all_arrays:
        tree = _stored_tree(step_dir, _state_dir(step_dir))
        for entry in sorted(set(tree) - {"params"}):
            if jax.tree.leaves(tree[entry], is_leaf=_is_array):
                restore_items(step_dir, {entry: _on_first_device(tree[entry])})
    return meta


def restore_items(step_dir, abstract: dict) -> dict:
    """Reads only some top-level entries of a checkpoint's train state.

    Orbax's partial restore: entries not named in ``abstract`` (e.g. the AdamW
    moments when only ``params`` are asked for) are never read into memory.

    Args:
      step_dir: ``.../phaseN/<step>``.
      abstract: ``{entry: pytree of ShapeDtypeStructs with shardings}``, entries of
        :class:`xlmeta_jax.pretrain.step.TrainState` (``params``, ``step``, ``opt_state``).

    Returns:
      ``{entry: restored pytree}`` placed on the given shardings.

    Raises:
      CheckpointError: the step's files are damaged, or its parameters have other
        shapes than ``abstract["params"]`` (naming the first that differs).
    """
    state_dir = _state_dir(step_dir)
    if "params" in abstract:
        _check_shapes(step_dir, _stored_tree(step_dir, state_dir).get("params", {}),
                      abstract["params"])
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
    try:
        restored = ocp.PyTreeCheckpointer().restore(
            state_dir,
            args=ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args,
                                        partial_restore=True),
        )
    except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many kinds
        raise _damaged(step_dir, e) from e
    if (epath.Path(step_dir) / META).exists():
        stored = read_meta(step_dir).get(CHECKSUMS)
    else:  # t5x's checkpoint: its record lies beside it
        stored = checksums.read_t5x_record(step_dir)
    checksums.verify(step_dir, stored, restored)
    return restored


def _state_dir(step_dir) -> epath.Path:
    state_dir = epath.Path(absolute(step_dir)) / STATE
    if not state_dir.exists():
        raise CheckpointError(f"{step_dir} has no {STATE}/ item: not an xlmeta_jax checkpoint")
    _filter_orbax_logs()
    return state_dir


def _stored_tree(step_dir, state_dir) -> dict:
    """The train state's tree of array metadata (shapes, dtypes), read without data."""
    try:
        meta = ocp.PyTreeCheckpointer().metadata(state_dir)
        tree = getattr(meta, "item_metadata", meta)
        tree = getattr(tree, "tree", tree)
    except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many kinds
        raise _damaged(step_dir, e, "its array metadata cannot be read") from e
    if tree is None:  # Orbax logs a failed read (e.g. a b-tree node's CRC) and returns None
        raise CheckpointError(f"checkpoint {step_dir} is damaged or incomplete (its array "
                              "metadata cannot be read: an array file is corrupted or missing)")
    return dict(tree)


def restore_params(step_dir, abstract_params=None):
    """Reads only the parameters of a checkpoint step directory (ours or t5x's).

    Args:
      step_dir: ``.../phaseN/<step>``, or t5x's ``.../checkpoint_<step>``.
      abstract_params: optional pytree of ShapeDtypeStructs with shardings to
        restore onto (any mesh); default: arrays on the first device.
    """
    tree = _stored_tree(step_dir, _state_dir(step_dir))
    key = T5X_PARAMS if "params" not in tree and T5X_PARAMS in tree else "params"
    if abstract_params is None:
        abstract_params = _on_first_device(tree.get(key, {}))
    return restore_items(step_dir, {key: abstract_params})[key]


def _is_array(x) -> bool:
    return hasattr(x, "shape")


def _on_first_device(stored):
    """ShapeDtypeStructs on the first device for a tree of stored array metadata."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        stored, is_leaf=_is_array)


def _check_shapes(step_dir, stored, expected) -> None:
    """Names the first parameter whose stored shape differs from the expected one."""
    leaves = jax.tree_util.tree_leaves_with_path(stored, is_leaf=lambda x: hasattr(x, "shape"))
    flat_stored = {jax.tree_util.keystr(k): v for k, v in leaves}
    for path, want in jax.tree_util.tree_leaves_with_path(expected):
        key = jax.tree_util.keystr(path)
        have = flat_stored.get(key)
        if have is None:
            raise CheckpointError(f"checkpoint {step_dir} has no parameter {key}: another model")
        if tuple(have.shape) != tuple(want.shape):
            raise CheckpointError(
                f"checkpoint {step_dir}: parameter {key} has shape {tuple(have.shape)}, the "
                f"configured model needs {tuple(want.shape)}"
            )
