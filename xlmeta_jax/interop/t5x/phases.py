r"""The phases of a staged run as one ``python -m t5x.train`` command each.

t5x's ``train`` runs one dataset, one optimizer and one schedule, so a run of several
phases runs one command per phase. Each phase is our trainer's ``Phase``, defined once
(:mod:`.stages` derives the t5x settings of one): meta-pretraining's two
(gin/phases/meta.gin) by ``python -m t5x.train --gin_file=gin/meta.gin --gin.PHASE=n``,
and any phase of a run file of our trainer (gin/native/*.gin) by ``python -m
xlmeta_jax.t5x_train --phase=NAME``:

* phase 1 of meta-pretraining trains on English into ``MODEL_DIR/phase1/``;
* phase 2 trains on the alpha-sampled mixture into ``MODEL_DIR/phase2/``, starting
  from the parameters of phase 1's final checkpoint (``checkpoint_<META_STEPS>``):
  only the parameters are read (:class:`PhaseInitializer`), while the optimizer
  state and the step (hence the learning-rate schedule) start fresh;
* a phase that continues another's optimizer state and schedule starts from that
  phase's whole state (``PhaseInitializer(keep_optimizer=True)``), so that one schedule
  spans the stages of a curriculum.

Each phase directory holds t5x's own layout (``checkpoint_<step>/``, ``config.gin``,
``train/`` summaries) plus ``xlmeta_model.json`` (the encoder configuration and
vocabulary, what ``loading.load_pretrained`` and the fine-tuning command read).
Rerunning a phase resumes it from its latest checkpoint. The functions here are what
the gin files reference; t5x calls nothing else of ours but the model.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import flax
import jax
import seqio
import tensorflow as tf
from absl import logging
from t5x import gin_utils as t5x_gin_utils
from t5x import utils as t5x_utils

from xlmeta_jax import errors, files, logs
from xlmeta_jax.data import seeds, tasks
from xlmeta_jax.model import network
from xlmeta_jax.pretrain import checkpoints

# Written next to t5x's checkpoints: the encoder configuration and vocabulary.
MODEL_INFO = checkpoints.T5X_MODEL_INFO
_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)$")


class PhaseError(errors.UserError, ValueError):
    """A phase cannot start (bad PHASE, or the phase before has not finished)."""


def check_phase(phase: int, names: Sequence[str]) -> int:
    """``phase`` (the ``PHASE`` macro, 1-based), checked against the run's phase names."""
    if isinstance(phase, bool) or phase not in range(1, len(names) + 1):
        raise PhaseError(
            f"gin macro PHASE={phase!r}: this run has phases 1 to {len(names)} "
            f"({', '.join(names)}; --gin.PHASE=2 for the second)"
        )
    return int(phase)


def run_dir(model_dir: str) -> str:
    """``MODEL_DIR``, checked to be set, absolute (``gs://`` kept)."""
    if not model_dir:
        raise PhaseError("MODEL_DIR is not set (bind --gin.MODEL_DIR=\"'/path'\")")
    return _absolute(model_dir)


def total_steps(steps: Sequence[int]) -> int:
    """Sum of step counts (the baseline's budget: META_STEPS + XLING_STEPS)."""
    return int(sum(steps))


def checkpoint_steps(directory: str) -> list[int]:
    """Steps of t5x's complete checkpoints (``checkpoint_<step>``) in ``directory``."""
    if not tf.io.gfile.isdir(directory):
        return []
    return sorted(
        int(m.group(1))
        for name in tf.io.gfile.listdir(directory)
        if (m := _CHECKPOINT_DIR.match(name.rstrip("/")))
    )


def source_checkpoint(directory: str, source_dir: str, step: int, starts: str,
                      run_first: str) -> str:
    """``source_dir/checkpoint_<step>``, the final checkpoint a phase in ``directory``
    starts from, checked to exist while the phase has no checkpoint of its own.

    Args:
      directory, source_dir: the phase's t5x directory and its source phase's.
      step: the source phase's last step.
      starts, run_first: the error's words: who starts from it, and what to run first.

    Raises:
      PhaseError: the checkpoint does not exist and the phase has not saved yet.
    """
    source = os.path.join(source_dir, f"checkpoint_{step}")
    if not checkpoint_steps(directory):
        steps = checkpoint_steps(source_dir)
        if step not in steps:
            raise PhaseError(f"{starts} final checkpoint {source}, which does not exist "
                             f"(checkpoints there: {steps or 'none'}); {run_first}")
    return source


def get_dataset(cfg: t5x_utils.DatasetConfig, shard_id: int, num_shards: int,
                feature_converter_cls, num_epochs: int | None = None,
                continue_from_last_checkpoint: bool = False,
                stream_seed: int | None = None):
    """t5x's ``utils.get_dataset`` with a data seed per source and per input shard.

    t5x seeds every host's input pipeline with ``DatasetConfig.seed`` itself (and
    asserts that it is the same everywhere), so every host would draw the same mixture
    sequence and masks, and phase 2 would replay phase 1's seeds. Here the stream of
    shard ``shard_id`` is seeded ``seeds.host_seed(seeds.phase_seed(seed, task),
    shard_id)`` as in our trainer: hosts draw independently, while which documents a
    shard reads depends on the shard alone. Bound as ``train.get_dataset_fn``
    (gin/t5x/run.gin); without a seed it is t5x's own function. ``stream_seed``: the
    phase's data seed itself (gin/t5x/stage.gin: the one our trainer derives, which
    also counts earlier phases reading the same task) in place of the one derived here.
    """
    if cfg.seed is None or not isinstance(cfg.mixture_or_task_name, str):
        return t5x_utils.get_dataset(cfg, shard_id, num_shards, feature_converter_cls,
                                     num_epochs, continue_from_last_checkpoint)
    if continue_from_last_checkpoint:
        raise ValueError("continue_from_last_checkpoint is not supported by this dataset fn")
    if cfg.module:
        importlib.import_module(cfg.module)
    if cfg.batch_size % num_shards:
        raise ValueError(f"Batch size ({cfg.batch_size}) must be divisible by number of "
                         f"shards ({num_shards}).")
    if stream_seed is None:
        stream_seed = seeds.phase_seed(cfg.seed, cfg.mixture_or_task_name)
    seed = seeds.host_seed(stream_seed, shard_id)
    logging.info("dataset %s: shard %d of %d, %d examples per batch, seed %d",
                 cfg.mixture_or_task_name, shard_id, num_shards,
                 cfg.batch_size // num_shards, seed)
    if cfg.use_cached:
        tasks.check_cache(cfg.mixture_or_task_name, cfg.split)
    return seqio.get_dataset(
        mixture_or_task_name=cfg.mixture_or_task_name,
        task_feature_lengths=cfg.task_feature_lengths,
        dataset_split=cfg.split,
        shuffle=cfg.shuffle,
        num_epochs=num_epochs,
        feature_converter=feature_converter_cls(
            pack=cfg.pack, use_custom_packing_ops=cfg.use_custom_packing_ops),
        shard_info=seqio.ShardInfo(index=shard_id, num_shards=num_shards),
        use_cached=cfg.use_cached,
        seed=seed,
        trim_output_features=cfg.trim_output_features,
        batch_size=cfg.batch_size // num_shards,
    )


class PhaseInitializer(t5x_utils.TrainStateInitializer):
    """t5x's train-state initializer; the fresh state may start from another checkpoint.

    t5x builds a fresh state only when the run directory has no checkpoint; with
    ``init_params_from`` that state gets the parameters of the given t5x checkpoint
    while the optimizer state and step stay freshly initialised (phase 2 of
    meta-pretraining), or with ``keep_optimizer`` its whole state: parameters, optimizer
    moments and step (the stages of a curriculum, one schedule across them). t5x's
    ``RestoreCheckpointConfig`` with an ``assignment_map`` would do the same, but its
    Orbax checkpoint manager then also restores the other run's input-pipeline state,
    which fails for a different dataset (phase 1's English into phase 2's mixture).
    """

    def __init__(self, *args, init_params_from: str | None = None,
                 keep_optimizer: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.init_params_from = init_params_from
        self.keep_optimizer = keep_optimizer

    def from_scratch(self, init_rng):
        state = super().from_scratch(init_rng)
        if not self.init_params_from:
            return state
        if self.keep_optimizer:
            # The fresh state's tree, shapes and shardings say what to read and where to.
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                state.state_dict())
            restored = checkpoints.restore_items(self.init_params_from, abstract)
            logs.progress.info("state from %s: parameters, optimizer state and step %d",
                               self.init_params_from, int(restored["state"]["step"]))
            return state.restore_state(restored)
        logs.progress.info("parameters from %s; fresh optimizer state and step",
                           self.init_params_from)
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state.params
        )
        params = checkpoints.restore_params(self.init_params_from, abstract)
        if isinstance(state.params, flax.core.FrozenDict):
            params = flax.core.freeze(params)
        return state.replace_params(params)


def summarize_config(
    model_dir: str,
    summary_writer,
    step: int,
    *,
    model: Any = None,
    vocab_path: str | None = None,
    task: str | None = None,
    phase: int | None = None,
    train_steps: int | None = None,
    names: Sequence[str] | None = None,
) -> None:
    """t5x's ``summarize_gin_config``, plus ``MODEL_DIR/xlmeta_model.json``.

    The JSON records what a checkpoint alone does not: the encoder configuration
    (sizes, pad id, numerics), the vocabulary, the run's last step and, for
    meta-pretraining, its phases — so that fine-tuning and the Hugging Face export
    load a t5x-written checkpoint (``loading.load_pretrained``) and refuse an
    unfinished one.
    """
    t5x_gin_utils.summarize_gin_config(model_dir, summary_writer, step)
    config = getattr(model, "config", None)
    if jax.process_index() != 0 or not isinstance(config, network.EncoderConfig):
        return
    info = {
        "model_config": dataclasses.asdict(config),
        "vocab_path": _absolute(vocab_path) if vocab_path else None,
        "task": task,
        "phase": phase,
        "phases": list(names) if phase is not None and names else None,
        "train_steps": train_steps,
    }
    with tf.io.gfile.GFile(os.path.join(model_dir, MODEL_INFO), "w") as f:
        f.write(json.dumps(info, indent=2))


def _absolute(path: str) -> str:
    path = files.user_path(path, "MODEL_DIR")
    return path if "://" in path else os.path.abspath(path)
