"""AdamW and learning-rate schedules as RoBERTa / XLM-R train them (optax).

The defaults are fairseq's, as RoBERTa's pretraining README runs it (``--optimizer adam
--adam-betas '(0.9,0.98)' --adam-eps 1e-6 --clip-norm 0.0 --weight-decay 0.01
--lr-scheduler polynomial_decay``):

- the learning rate of update ``t`` (0-based) is ``lr * t / warmup`` during warm-up, so the
  first update has rate 0: fairseq's trainer calls ``step_update(0)`` right after
  building the scheduler, which overrides the ``lr / warmup`` its constructor set;
- no gradient clipping (``max_grad_norm = 0``);
- weight decay on every parameter (fairseq's Adam decays all of them; HF's fine-tuning
  scripts, and so :mod:`xlmeta_jax.evaluation`, exempt biases and LayerNorm).

Besides that linear decay (``schedule='linear'``), the staged curricula use
warm-up-stable-decay (``'wsd'``: MiniCPM, Hu et al. 2024; with a linear, cosine or
1-sqrt cool-down, Hagele et al. 2024, as mmBERT's decay stage runs it) and fairseq's
inverse square root (``'inverse_sqrt'``). Every schedule is a function of optax's update
count, so a phase that continues the previous phase's schedule (``Phase.reset_schedule
=False``) continues the same curve.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from xlmeta_jax import errors

# OptimizerConfig.schedule: the learning-rate schedules after the linear warm-up.
SCHEDULES = ("linear", "wsd", "inverse_sqrt")
# OptimizerConfig.decay_shape: how a 'wsd' schedule cools down over its decay_steps.
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


class OptimizerConfigError(errors.SettingError):
    """An optimizer setting out of range, refused where the config is built.

    A :class:`errors.SettingError`: the line names ``OptimizerConfig.<field>``, or in a
    command that parsed gin the binding or macro the user set (``LEARNING_RATE``).
    """

    def __init__(self, field: str, value, message: str):
        super().__init__(CONFIGURABLE, field, value, message)


# The name gin files bind OptimizerConfig by (a bad value's line names its binding).
CONFIGURABLE = "xlmeta_jax.model.optimizer.OptimizerConfig"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer hyper-parameters (defaults: RoBERTa/XLM-R pretraining)."""

    # Peak learning rate reached at the end of warm-up.
    learning_rate: float = 6e-4
    # Steps of linear warm-up from 0 to `learning_rate`.
    warmup_steps: int = 10000
    # Total steps of the schedule; the rate decays linearly to `end_learning_rate` here.
    total_steps: int = 500000
    # Learning rate at `total_steps` (linear decay end point).
    end_learning_rate: float = 0.0
    # Adam first-moment decay.
    b1: float = 0.9
    # Adam second-moment decay (RoBERTa: 0.98 for stability with large batches).
    b2: float = 0.98
    # Adam epsilon (RoBERTa: 1e-6).
    eps: float = 1e-6
    # Decoupled weight decay (AdamW), multiplied by the learning rate as fairseq's Adam does.
    weight_decay: float = 0.01
    # Which parameters decay: True every one (fairseq, hence RoBERTa/XLM-R); False all but
    # biases and LayerNorm parameters (HF's `no_decay` list, BERT's recipe).
    decay_all_parameters: bool = True
    # Clip gradients to this global norm; 0 disables clipping (RoBERTa: --clip-norm 0.0).
    max_grad_norm: float = 0.0
    # After the warm-up: 'linear' decay to total_steps (RoBERTa), 'wsd' (stable at the peak,
    # then decay_steps of cool-down ending at total_steps), or 'inverse_sqrt' (fairseq's:
    # peak * sqrt(warmup_steps / step); needs warmup_steps >= 1; no end point).
    schedule: str = "linear"
    # 'wsd': steps of the final cool-down, in (0, total_steps - warmup_steps].
    decay_steps: int = 0
    # 'wsd': the cool-down's shape, 'linear', 'cosine' or '1-sqrt'.
    decay_shape: str = "linear"

    def __post_init__(self):
        def bad(field: str, rule: str):
            value = getattr(self, field)
            raise OptimizerConfigError(field, value, f"must be {rule}, got {value}")

        if not errors.is_count(self.total_steps):
            bad("total_steps", "an integer > 0")
        if not 0 <= self.warmup_steps <= self.total_steps:
            bad("warmup_steps", f"in [0, total_steps={self.total_steps}]")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            bad("learning_rate", "a finite number > 0")
        if not (self.end_learning_rate >= 0 and math.isfinite(self.end_learning_rate)):
            bad("end_learning_rate", "a finite number >= 0")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                bad(name, "in [0, 1)")
        if not self.eps > 0:
            bad("eps", "> 0")
        if not self.weight_decay >= 0:
            bad("weight_decay", ">= 0")
        if not self.max_grad_norm >= 0:
            bad("max_grad_norm", ">= 0 (0 disables clipping)")
        if self.schedule not in SCHEDULES:
            bad("schedule", f"one of {SCHEDULES}")
        if self.decay_shape not in DECAY_SHAPES:
            bad("decay_shape", f"one of {DECAY_SHAPES}")
        if self.schedule == "wsd":
            if not 0 < self.decay_steps <= self.total_steps - self.warmup_steps:
                bad("decay_steps", f"in (0, total_steps - warmup_steps = "
                    f"{self.total_steps - self.warmup_steps}] for schedule='wsd'")
        elif self.decay_steps:
            bad("decay_steps", f"0 for schedule={self.schedule!r} (it sets 'wsd''s cool-down)")
        if self.schedule == "inverse_sqrt" and self.warmup_steps < 1:
            bad("warmup_steps", ">= 1 for schedule='inverse_sqrt' (its decay is "
                "peak * sqrt(warmup_steps / step))")


def linear_warmup_linear_decay(cfg: OptimizerConfig) -> optax.Schedule:
    """0 -> peak over ``warmup_steps``, then peak -> end at ``total_steps``.

    The rate of update ``t`` (0-based) is fairseq's ``polynomial_decay`` (power 1) after
    ``t`` updates: ``lr * t / warmup_steps`` while ``t <= warmup_steps``, then linear to
    ``end_learning_rate`` at ``total_steps``; the first update's rate is 0 in both.
    """
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    decay = optax.linear_schedule(
        cfg.learning_rate,
        cfg.end_learning_rate,
        max(cfg.total_steps - cfg.warmup_steps, 1),
    )
    if cfg.warmup_steps == 0:
        return decay
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def warmup_stable_decay(cfg: OptimizerConfig) -> optax.Schedule:
    """Linear warm-up, the peak until ``total_steps - decay_steps``, then a cool-down.

    The rate of update ``t`` is ``lr * t / warmup_steps`` during warm-up (the first is 0,
    as in :func:`linear_warmup_linear_decay`), ``lr`` while stable, and over the last
    ``decay_steps`` updates, with ``p = (t - (total_steps - decay_steps)) / decay_steps``,
    ``end + (lr - end) * f(p)`` where ``f`` is ``1 - p`` ('linear'), ``(1 + cos(pi p)) / 2``
    ('cosine') or ``1 - sqrt(p)`` ('1-sqrt', Hagele et al. 2024, eq. 1); ``end`` from
    ``total_steps`` on.
    """
    peak, end = cfg.learning_rate, cfg.end_learning_rate
    warmup, start, length = cfg.warmup_steps, cfg.total_steps - cfg.decay_steps, cfg.decay_steps
    shape = cfg.decay_shape

    def schedule(count):
        t = jnp.asarray(count, jnp.float32)
        p = jnp.clip((t - start) / length, 0.0, 1.0)
        if shape == "linear":
            remaining = 1.0 - p
        elif shape == "cosine":
            remaining = 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        else:
            remaining = 1.0 - jnp.sqrt(p)
        decayed = end + (peak - end) * remaining
        return jnp.where(t < warmup, peak * t / max(warmup, 1), decayed)

    return schedule


def inverse_sqrt(cfg: OptimizerConfig) -> optax.Schedule:
    """fairseq's ``inverse_sqrt`` from a warm-up start of 0: ``lr * sqrt(warmup / t)`` after it.

    fairseq/optim/lr_scheduler/inverse_square_root_schedule.py ``step_update``:
    ``warmup_init_lr + t * lr_step`` while ``t < warmup_updates``, then
    ``decay_factor * t ** -0.5`` with ``decay_factor = lr * warmup_updates ** 0.5``.
    """
    peak, warmup = cfg.learning_rate, cfg.warmup_steps

    def schedule(count):
        t = jnp.asarray(count, jnp.float32)
        return jnp.where(t < warmup, peak * t / warmup,
                         peak * math.sqrt(warmup) * jax.lax.rsqrt(jnp.maximum(t, 1.0)))

    return schedule


def learning_rate_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """The schedule ``cfg.schedule`` names (see :data:`SCHEDULES`)."""
    return {"linear": linear_warmup_linear_decay, "wsd": warmup_stable_decay,
            "inverse_sqrt": inverse_sqrt}[cfg.schedule](cfg)


def decay_mask(params):
    """True for parameters that get weight decay: every kernel and embedding table.

    Biases and LayerNorm scale/bias are excluded (HF's ``no_decay`` list). The mask
    has the container types of ``params`` (dict, or t5x's FrozenDict), as optax
    requires.
    """

    def decays(path, _):
        names = [str(getattr(k, "key", k)) for k in path]
        return not (names[-1] == "bias" or any("layer_norm" in n for n in names))

    return jax.tree_util.tree_map_with_path(decays, params)


def decay_all(params):
    """True for every parameter (fairseq's Adam decays all of them); ``decay_mask``'s form."""
    return jax.tree.map(lambda _: True, params)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW on the warm-up/decay schedule, after global-norm clipping if it is set.

    The state has one structure whatever the settings (a clipping stage, identity when
    clipping is off; a decay mask, all True when every parameter decays), so a run
    resumes, or restores onto another mesh, after either is changed.
    """
    clip = optax.clip_by_global_norm(cfg.max_grad_norm) if cfg.max_grad_norm > 0 else (
        optax.identity())
    return optax.chain(
        clip,
        optax.adamw(
            learning_rate=learning_rate_schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=decay_all if cfg.decay_all_parameters else decay_mask,
        ),
    )


def global_norm(tree) -> jax.Array:
    """L2 norm of all leaves of ``tree`` together (what clipping compares)."""
    return optax.tree.norm(tree)
