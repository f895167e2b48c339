"""The input iterator as an Orbax checkpoint item: one file set per process.

Each process saves the state of its own input iterator (its shard of the data and its
position in it) under ``<step>/data/process_<i>-of-<n>``, so a restore on the same
process count continues every host's stream where it stopped. On another count the
streams cannot continue: the trainer refuses, or with ``train.new_process_count='reseed'``
restores the rest and restarts the streams (:func:`stored_process_count` tells which).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from xlmeta_jax.errors import CheckpointError


def stored_process_count(step_dir) -> int | None:
    """How many processes wrote a checkpoint's input-iterator states (None: no states)."""
    found = sorted(epath.Path(step_dir).glob("data/process_0-of-*"))
    for path in found:
        count = path.name.split("-of-")[1].split(".")[0]
        if count.isdigit():
            return int(count)
    return None


def _process_file(directory: epath.Path) -> str:
    return os.fspath(directory / f"process_{jax.process_index()}-of-{jax.process_count()}")


class DataIteratorHandler(ocp.CheckpointHandler):
    """Saves/restores any iterator with ``save(filename)`` / ``restore(filename)``.

    Runs synchronously inside the (possibly async) manager's save: the iterator
    keeps moving after ``save`` returns, so its state must be captured now.
    """

    def save(self, directory: epath.Path, args: DataIteratorSave):
        directory = epath.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        args.iterator.save(_process_file(directory))

    def restore(self, directory: epath.Path, args: DataIteratorRestore):
        directory = epath.Path(directory)
        name = _process_file(directory)
        if not list(directory.glob(os.path.basename(name) + "*")):
            raise CheckpointError(
                f"no input-iterator state {name}*: the checkpoint was written by a run with "
                "another process count, or is incomplete"
            )
        args.iterator.restore(name)
        return args.iterator

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    iterator: Any
