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
"""

from __future__ import annotations

import dataclasses
import math

import jax
import optax

from xlmeta_jax import errors


class OptimizerConfigError(errors.UserError, ValueError):
    """An optimizer setting is out of range (one line naming it, as every user error).

    Attributes:
      field: the OptimizerConfig field at fault (``learning_rate``), so that a command
        line can name the setting the user gave (``LEARNING_RATE``) next to it.
      value: that field's value.
    """

    def __init__(self, message: str, field: str | None = None, value=None):
        super().__init__(message)
        self.field, self.value = field, value


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

    def __post_init__(self):
        def bad(field: str, rule: str):
            value = getattr(self, field)
            raise OptimizerConfigError(
                f"OptimizerConfig.{field} must be {rule}, got {value}", field, value)

        if self.total_steps <= 0:
            bad("total_steps", "> 0")
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
            learning_rate=linear_warmup_linear_decay(cfg),
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
