"""AdamW and learning-rate schedules as RoBERTa / XLM-R train them (optax)."""

from __future__ import annotations

import dataclasses

import jax
import optax

from xlmeta_jax import errors


class OptimizerConfigError(errors.UserError, ValueError):
    """An optimizer setting is out of range (one line naming it, as every user error)."""


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
    # Decoupled weight decay, not applied to biases and LayerNorm parameters.
    weight_decay: float = 0.01
    # Clip gradients to this global norm (0 disables clipping).
    max_grad_norm: float = 1.0

    def __post_init__(self):
        if self.total_steps <= 0:
            raise OptimizerConfigError(
                f"OptimizerConfig.total_steps must be > 0, got {self.total_steps}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise OptimizerConfigError(
                f"OptimizerConfig.warmup_steps={self.warmup_steps} must be in "
                f"[0, total_steps={self.total_steps}]"
            )
        if self.learning_rate <= 0:
            raise OptimizerConfigError(
                f"OptimizerConfig.learning_rate must be > 0, got {self.learning_rate}")
        if self.end_learning_rate < 0:
            raise OptimizerConfigError(
                f"OptimizerConfig.end_learning_rate must be >= 0, got {self.end_learning_rate}"
            )
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise OptimizerConfigError(
                    f"OptimizerConfig.{name} must be in [0, 1), got {getattr(self, name)}"
                )
        if self.eps <= 0:
            raise OptimizerConfigError(f"OptimizerConfig.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise OptimizerConfigError(
                f"OptimizerConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm < 0:
            raise OptimizerConfigError(
                f"OptimizerConfig.max_grad_norm must be >= 0 (0 disables clipping), "
                f"got {self.max_grad_norm}"
            )


def linear_warmup_linear_decay(cfg: OptimizerConfig) -> optax.Schedule:
    """0 -> peak over ``warmup_steps``, then peak -> end at ``total_steps``."""
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    decay = optax.linear_schedule(
        cfg.learning_rate,
        cfg.end_learning_rate,
        max(cfg.total_steps - cfg.warmup_steps, 1),
    )
    if cfg.warmup_steps == 0:
        return decay
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


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


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping followed by AdamW on the warm-up/decay schedule."""
    parts = []
    if cfg.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.max_grad_norm))
    parts.append(
        optax.adamw(
            learning_rate=linear_warmup_linear_decay(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=decay_mask,
        )
    )
    return optax.chain(*parts)


def global_norm(tree) -> jax.Array:
    """L2 norm of all leaves of ``tree`` together (what clipping compares)."""
    return optax.tree.norm(tree)
