"""A phase's starting state: from an earlier phase's checkpoint, or initial parameters.

The trainer's init/resume precedence (its comment in :func:`trainer._initial_state`) picks
one of these when a phase has no checkpoint of its own yet.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from xlmeta_jax.interop.hf import weights as hf
from xlmeta_jax.model import network
from xlmeta_jax.pretrain import checkpoints, loading, step
from xlmeta_jax.pretrain.checks import ConfigError


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


def initial_params(path: str, model: network.EncoderConfig):
    """Params from INITIAL_CHECKPOINT_PATH: an xlmeta_jax checkpoint or an HF directory."""
    if os.path.isfile(os.path.join(path, "config.json")):
        cfg, params = hf.load_hf(path)
    else:
        cfg, params, _ = loading.load_pretrained(path)
    shape_of = lambda c: (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.mlp_dim)
    if cfg.family != model.family:
        raise ConfigError(
            f"INITIAL_CHECKPOINT_PATH {path}: its encoder is of the {cfg.family!r} family, the "
            f"configured model of the {model.family!r} family (the gin model file: "
            "gin/models/*.gin)")
    if shape_of(cfg) != shape_of(model):
        raise ConfigError(
            f"INITIAL_CHECKPOINT_PATH {path}: its encoder {shape_of(cfg)} (vocab, hidden, layers, "
            f"heads, mlp) does not match the configured model {shape_of(model)}"
        )
    return params
