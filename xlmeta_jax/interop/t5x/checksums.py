"""Checksums of the arrays of t5x's checkpoints, recorded as our trainer records them.

t5x's checkpoint manager writes the train state and nothing of ours, so the record
(:func:`xlmeta_jax.pretrain.checksums.record`) goes to a JSON file beside each step,
``<run>/xlmeta_checksums/checkpoint_<step>.json``, and every reader of ours (phase 2's
start, fine-tuning, ``hf to_hf``) compares the values it restored against it.

The hook is t5x's public ``SaveCheckpointConfig.state_transformation_fns``: t5x calls
each function with the state dict it is about to write, on every process, synchronously,
before its Orbax manager starts the (possibly background) save. That is the one moment
the values are at hand, and it makes the record safe against every interruption: it is
complete before the step's temporary folder exists, and the step counts as a checkpoint
only once Orbax renames that folder, so a checkpoint never lacks its record. (A
``checkpoint_manager_cls`` of ours would serve too, but t5x builds the restore
configuration of a resumed run with its default class and then refuses the mismatch.)
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
from absl import logging
from etils import epath
from t5x import checkpoints as t5x_checkpoints

from xlmeta_jax.pretrain import checksums

_STEP, _RECORD = re.compile(r"checkpoint_(\d+)"), re.compile(r"checkpoint_(\d+)\.json")


class RecordChecksums:
    """t5x save transformation that records the checksums of the state it saves.

    Bound in gin/t5x/run.gin as ``utils.SaveCheckpointConfig.state_transformation_fns``;
    returns the state and parameter infos unchanged.

    Args:
      model_dir: the run directory t5x saves ``checkpoint_<step>`` into (a phase
        directory of gin/meta.gin).
      dtype: ``SaveCheckpointConfig.dtype``: t5x casts the parameters (``target``) to it
        as it writes them, so their record is of the cast values.
    """

    def __init__(self, model_dir: str, dtype: str | None = "float32"):
        self.model_dir = os.fspath(model_dir)
        self.dtype = dtype

    def _as_saved(self, state_dict: dict) -> dict:
        if not self.dtype or "target" not in state_dict:
            return state_dict
        dtype = jnp.dtype(self.dtype)
        cast = jax.tree.map(
            lambda x: x.astype(dtype)
            if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype else x,
            state_dict["target"])
        return {**state_dict, "target": cast}

    def __call__(self, state_dict, parameter_infos):
        """Records ``state_dict``'s checksums for its step; returns both arguments as given."""
        step = int(t5x_checkpoints.get_local_data(state_dict["state"]["step"]))
        step_dir = epath.Path(self.model_dir) / f"checkpoint_{step}"
        # Every process takes part in the reduction over the global arrays.
        record = checksums.record(self._as_saved(dict(state_dict)))
        # An existing step is not written again (Orbax refuses it): keep its record.
        if jax.process_index() == 0 and not step_dir.exists():
            checksums.write_t5x_record(step_dir, record)
            self._prune()
        return state_dict, parameter_infos

    def _prune(self) -> None:
        """Removes the records of checkpoints t5x deleted (``SaveCheckpointConfig.keep``).

        Only below the newest finished checkpoint: the one step still being written in
        the background (if any) is newer than every finished one.
        """
        directory = epath.Path(self.model_dir)
        finished = [int(m.group(1)) for p in directory.iterdir()
                    if (m := _STEP.fullmatch(p.name))]
        if not finished:
            return
        newest = max(finished)
        for path in (directory / checksums.T5X_RECORDS).iterdir():
            m = _RECORD.fullmatch(path.name)
            if m and int(m.group(1)) < newest and int(m.group(1)) not in finished:
                logging.info("removing %s: t5x deleted its checkpoint", path)
                path.unlink(missing_ok=True)


def record_checksums(model_dir: str, dtype: str | None = "float32") -> list[RecordChecksums]:
    """t5x's ``SaveCheckpointConfig.state_transformation_fns``: the record (gin)."""
    return [RecordChecksums(model_dir, dtype)]
