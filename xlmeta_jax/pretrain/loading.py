"""Finding a run's checkpoint and loading its parameters (our trainer's layout and t5x's).

:func:`find_step_dir` resolves what a user names — a run's MODEL_DIR, a phase
directory or a step directory — to one finished step, and :func:`load_pretrained`
reads its encoder configuration, parameters and vocabulary for fine-tuning,
evaluation and export. A phase's starting state comes from here too, when the phase
has no checkpoint of its own yet (the trainer's init/resume precedence, its comment in
:func:`trainer._initial_state`, picks one): an earlier phase's checkpoint
(:func:`handoff_state`) or initial parameters (:func:`initial_params`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from xlmeta_jax.errors import CheckpointError, first_line
from xlmeta_jax.interop.hf import weights as hf
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import checkpoints, step
from xlmeta_jax.pretrain.checkpoints import (
    META,
    STATE,
    T5X_MODEL_INFO,
    read_meta,
    restore_params,
)

_T5X_STEP = re.compile(r"checkpoint_(\d+)")


def recorded_phases(model_dir) -> list[str] | None:
    """Phase names of our trainer's run in ``model_dir``, in training order.

    Every checkpoint records its run's phases (``run_phases`` in its metadata), so any
    phase's latest checkpoint names them all, the unstarted ones included. None when no
    checkpoint records them (a run directory without checkpoints, or one written before
    the record existed).
    """
    model_dir = epath.Path(model_dir)
    for phase_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
        steps = sorted((int(q.name) for q in phase_dir.iterdir()
                        if q.name.isdigit() and (q / checkpoints.META).exists()), reverse=True)
        for number in steps[:1]:
            phases = checkpoints.read_meta(phase_dir / str(number)).get("run_phases")
            if phases:
                return list(phases)
    return None


def _final_step_dir(phase_dir: epath.Path) -> epath.Path:
    steps = sorted(
        int(p.name) for p in phase_dir.iterdir() if p.name.isdigit() and (p / STATE).exists()
    )
    if not steps:
        raise CheckpointError(f"phase directory {phase_dir} holds no checkpoint yet")
    step_dir = phase_dir / str(steps[-1])
    meta = read_meta(step_dir)
    done, total = meta.get("phase_step"), meta.get("num_steps")
    if done is not None and total is not None and done != total:
        raise CheckpointError(
            f"phase {phase_dir.name!r} is not finished (latest checkpoint: step {done} of "
            f"{total}); to use it anyway, name the step directory: {step_dir}"
        )
    return step_dir


def _t5x_phases(model_dir: epath.Path) -> list[str] | None:
    """Phases of a t5x run (gin/meta.gin), as its phase directories' model info names them."""
    for info in sorted(model_dir.glob(f"*/{T5X_MODEL_INFO}")):
        phases = json.loads(info.read_text()).get("phases")
        if phases:
            return list(phases)
    return None


def _t5x_final_step_dir(run_dir: epath.Path) -> epath.Path:
    """The last ``checkpoint_<step>`` of a t5x run directory; refused if the run is unfinished."""
    steps = sorted(
        int(m.group(1)) for p in run_dir.iterdir()
        if (m := _T5X_STEP.fullmatch(p.name)) and (p / STATE).exists()
    )
    if not steps:
        raise CheckpointError(f"t5x run directory {run_dir} holds no checkpoint yet")
    step_dir = run_dir / f"checkpoint_{steps[-1]}"
    total = json.loads((run_dir / T5X_MODEL_INFO).read_text()).get("train_steps")
    if total is not None and steps[-1] != total:
        raise CheckpointError(
            f"{run_dir.name!r} is not finished (latest checkpoint: step {steps[-1]} of "
            f"{total}); to use it anyway, name the step directory: {step_dir}"
        )
    return step_dir


def find_step_dir(path) -> epath.Path:
    """Resolves a checkpoint path to a step directory.

    * ``MODEL_DIR/phaseN/<step>``: that step, finished or not (named explicitly);
    * a phase directory: its final checkpoint; an unfinished phase is refused;
    * a run's MODEL_DIR: the final checkpoint of the run's *last* phase (as its
      checkpoints record the run's phases: ``phase2`` of meta-pretraining, ``xlmr`` of
      the baseline); refused while that phase is unfinished, even when an earlier one is
      complete. When no checkpoint records the phases, a directory holding exactly one
      phase resolves to it;
    * the same for ``python -m t5x.train``'s layout: ``<run>/checkpoint_<step>``, a run
      (or phase) directory, and gin/meta.gin's MODEL_DIR (``phase2`` is the last phase).
    """
    path = epath.Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is a file, not a checkpoint directory")
    if (path / STATE).exists():
        return path
    if any(p.name.isdigit() for p in path.iterdir()):
        return _final_step_dir(path)
    if (path / T5X_MODEL_INFO).exists():
        return _t5x_final_step_dir(path)
    phases = recorded_phases(path) or _t5x_phases(path)
    if phases is None:
        # No checkpoint names the run's phases: only an unambiguous single phase resolves.
        present = sorted(p.name for p in path.iterdir() if p.is_dir() and any(
            q.name.isdigit() and (q / STATE).exists() for q in p.iterdir()))
        if len(present) != 1:
            found = f"phases {present}" if present else "no phase checkpoints"
            raise CheckpointError(
                f"{path} has no checkpoint naming its run's phases and holds {found}: pass "
                "MODEL_DIR/<phase> or MODEL_DIR/<phase>/<step>"
            )
        phases = present
    last = path / phases[-1]
    if not last.exists():
        raise CheckpointError(
            f"the last configured phase {phases[-1]!r} of {path} has not started; name an "
            "earlier phase's directory or step to use it"
        )
    if (last / T5X_MODEL_INFO).exists():
        return _t5x_final_step_dir(last)
    return _final_step_dir(last)


def load_pretrained(path) -> tuple[EncoderConfig, Any, str | None]:
    """Loads a pretraining checkpoint for fine-tuning or evaluation.

    Args:
      path: MODEL_DIR, a phase directory or a step directory, of our trainer or of
        ``python -m t5x.train`` (``checkpoint_<step>`` directories).

    Returns:
      (encoder config, params as host arrays, vocabulary path or None).
    """
    step_dir = find_step_dir(path)
    meta = _step_meta(step_dir)
    try:
        cfg = EncoderConfig(**meta["model_config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint metadata of {step_dir} has no valid model_config ({first_line(e)})"
        ) from None
    params = restore_params(step_dir)
    params = jax.tree.map(np.asarray, params)
    return cfg, params, meta.get("vocab_path")


def _step_meta(step_dir: epath.Path) -> dict:
    """A step's metadata: ours (``<step>/meta``), or a t5x run's model info beside its
    ``checkpoint_<step>`` directories."""
    t5x_info = step_dir.parent / T5X_MODEL_INFO
    if not (step_dir / META).exists() and t5x_info.exists():
        return json.loads(t5x_info.read_text())
    return read_meta(step_dir)


def recorded_vocabulary(path) -> tuple[str | None, dict | None]:
    """(the vocabulary path, its record: ``hf_tokenizer.make_record``) the checkpoint
    ``path`` resolves to was trained with; the record is None for a checkpoint written
    before checkpoints kept it (and for t5x's, which do not)."""
    meta = _step_meta(find_step_dir(path))
    return meta.get("vocab_path"), meta.get("tokenizer")


def recorded_tokenizer(path) -> dict | None:
    """The tokenizer record of :func:`recorded_vocabulary`."""
    return recorded_vocabulary(path)[1]


def is_count(path) -> bool:
    """Whether an optimizer-state leaf is a step counter (optax's ``count``)."""
    return any(getattr(k, "name", None) == "count" for k in path)


def handoff_state(fns: step.StepFunctions, step_dir, *, reset_optimizer: bool,
                  reset_schedule: bool) -> step.TrainState:
    """The initial state of a phase that starts from an earlier phase's checkpoint.

    Parameters always come from ``step_dir``. With ``reset_optimizer`` only they (and,
    without ``reset_schedule``, the step) are read, through Orbax's partial restore:
    the earlier phase's AdamW moments never reach memory, and fresh ones are built
    around the restored parameters in place. Without ``reset_optimizer`` the whole
    state is restored, once, and its moments are kept.

    Args:
      fns: the new phase's step functions (mesh, shardings, optimizer).
      step_dir: the earlier phase's final step directory.
      reset_optimizer: start from fresh AdamW moments.
      reset_schedule: restart the step and the learning-rate schedule at 0.
    """
    if reset_optimizer:
        wanted = {"params": fns.abstract_state.params}
        if not reset_schedule:
            wanted["step"] = fns.abstract_state.step
        restored = checkpoints.restore_items(step_dir, wanted)
        state = fns.from_params(restored["params"])
        if reset_schedule:
            return state
        # optax's counters advance with the step (both start at 0 in every phase and
        # move together), so the earlier step is also their value.
        previous = restored["step"]
        return state.replace(step=previous, opt_state=_counts_at(state.opt_state, previous))
    prev = checkpoints.PhaseCheckpoints(os.path.dirname(os.fspath(step_dir)),
                                        save_interval_steps=1, max_to_keep=None, read_only=True)
    try:
        previous, _ = prev.restore(int(os.path.basename(os.fspath(step_dir))),
                                   fns.abstract_state)
    finally:
        prev.close()
    if not reset_schedule:
        return previous
    # A fresh schedule: the step and optax's counters restart at 0, as fns.init sets them.
    zero = jax.device_put(jnp.zeros_like(previous.step), previous.step.sharding)
    return previous.replace(step=zero, opt_state=_counts_at(previous.opt_state, zero))


def _counts_at(opt_state, value: jax.Array):
    """``opt_state`` with optax's step counters set to ``value`` (on their shardings)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.device_put(value.astype(x.dtype), x.sharding)
        if is_count(path) else x,
        opt_state,
    )


def initial_params(path: str, model: EncoderConfig):
    """Params from INITIAL_CHECKPOINT_PATH: an xlmeta_jax checkpoint or an HF directory."""
    if os.path.isfile(os.path.join(path, "config.json")):
        cfg, params = hf.load_hf(path)
    else:
        cfg, params, _ = load_pretrained(path)
    shape_of = lambda c: (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.mlp_dim)
    if cfg.family != model.family:
        raise CheckpointError(
            f"INITIAL_CHECKPOINT_PATH {path}: its encoder is of the {cfg.family!r} family, the "
            f"configured model of the {model.family!r} family (the gin model file: "
            "gin/models/*.gin)")
    if shape_of(cfg) != shape_of(model):
        raise CheckpointError(
            f"INITIAL_CHECKPOINT_PATH {path}: its encoder {shape_of(cfg)} (vocab, hidden, layers, "
            f"heads, mlp) does not match the configured model {shape_of(model)}"
        )
    return params
