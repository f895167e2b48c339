"""The fine-tuning loop's parts: parameters, optimizer schedule, jit'ed train / predict.

Training is data-parallel: parameters are replicated and every batch is split over all
devices along the mesh's ``data`` axis. The optimizer is the one of XTREME's scripts
(Hugging Face ``AdamW`` with ``get_linear_schedule_with_warmup``, biases and LayerNorm
without weight decay, global-norm clipping); see :func:`make_finetune_optimizer`.
"""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from xlmeta_jax.evaluation.models import HEADS, FineTuneModel, head_loss
from xlmeta_jax.model import partitioning
from xlmeta_jax.model.optimizer import decay_mask


def hf_linear_schedule(
    learning_rate: float, warmup_steps: int, total_steps: int, offset: int = 0
) -> optax.Schedule:
    """``get_linear_schedule_with_warmup`` as a function of the update count.

    Unlike :func:`xlmeta_jax.model.optimizer.linear_warmup_linear_decay`, a warm-up longer
    than training is allowed (XTREME's QA recipe warms up over 500 steps whatever the
    training length; the rate then never reaches its peak). ``offset`` = 1 reproduces
    ``run_tag.py``, which steps the scheduler before the optimizer.
    """

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + offset
        warm = step / max(1, warmup_steps)
        decay = jnp.maximum(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
        return learning_rate * jnp.where(step < warmup_steps, warm, decay)

    return schedule


def make_finetune_optimizer(
    *, learning_rate: float, warmup_steps: int, total_steps: int, weight_decay: float,
    b1: float, b2: float, eps: float, max_grad_norm: float, schedule_offset: int = 0,
) -> optax.GradientTransformation:
    """Clipping by global norm, then AdamW on :func:`hf_linear_schedule`."""
    parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    parts.append(optax.adamw(
        hf_linear_schedule(learning_rate, warmup_steps, total_steps, schedule_offset),
        b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask,
    ))
    return optax.chain(*parts)


class Runner:
    """Jit'ed train / predict functions of one model on a data-parallel mesh."""

    def __init__(self, model: FineTuneModel, params, tx, mesh, seed: int):
        self.model, self.tx, self.mesh = model, tx, mesh
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.params = jax.device_put(params, self.replicated)
        self.opt_state = jax.device_put(tx.init(params), self.replicated)
        self.step = 0
        # An argument, not a constant of the program: the runs of other seeds share its
        # compiled step.
        self.seed = jnp.int32(seed)

        def train_step(params, opt_state, step, batch, seed):
            def loss_fn(p):
                out = model.apply(
                    {"params": p},
                    batch["input_ids"],
                    deterministic=False,
                    rngs={"dropout": jax.random.fold_in(jax.random.key(seed), step)},
                )
                return head_loss(model, out, batch)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        def predict(params, input_ids):
            return model.apply({"params": params}, input_ids, deterministic=True)

        # Traced on first call, inside _context() (mesh + logical-axis rules).
        self._train = jax.jit(train_step, donate_argnums=(0, 1))
        self._predict = jax.jit(predict)

    def _context(self):
        # An abstract mesh, or Flax's logical activation constraints are no-ops.
        stack = contextlib.ExitStack()
        stack.enter_context(partitioning.mesh_context(self.mesh))
        stack.enter_context(partitioning.axis_rules_context())
        return stack

    def _put(self, arrays: dict[str, np.ndarray]):
        return {
            k: jax.device_put(v, NamedSharding(self.mesh, partitioning.batch_spec(v.ndim)))
            for k, v in arrays.items()
        }

    def train_step(self, batch: dict[str, np.ndarray]) -> float:
        with self._context():
            self.params, self.opt_state, loss = self._train(
                self.params, self.opt_state, jnp.int32(self.step), self._put(batch), self.seed
            )
        self.step += 1
        return loss

    def host_params(self):
        """A host copy of the current parameters (a model-selection snapshot)."""
        return jax.device_get(self.params)

    def load_params(self, params) -> None:
        """Replaces the parameters (e.g. by the selected snapshot)."""
        self.params = jax.device_put(params, self.replicated)

    def predict(self, input_ids: np.ndarray, batch_size: int):
        """Outputs for every row, in batches padded to ``batch_size`` rows."""
        n = len(input_ids)
        outs = []
        pad = self.model.config.pad_token_id
        for i in range(0, n, batch_size):
            chunk = input_ids[i : i + batch_size]
            rows = len(chunk)
            if rows < batch_size:
                filler = np.full((batch_size - rows, chunk.shape[1]), pad, chunk.dtype)
                chunk = np.concatenate([chunk, filler])
            with self._context():
                out = self._predict(self.params, self._put({"x": chunk})["x"])
            outs.append(jax.tree.map(lambda a, r=rows: np.asarray(a)[:r], out))
        return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def init_params(model: FineTuneModel, encoder_params, max_seq_length: int, seed: int):
    """Head params from a fresh init; encoder params from the checkpoint (shape-checked),
    or freshly initialised too when there is no checkpoint (``init:<size>``)."""
    cfg = model.config
    dummy = jnp.full((1, max_seq_length), cfg.pad_token_id + 1, jnp.int32)
    key = jax.random.key(seed)
    with partitioning.axis_rules_context():
        if encoder_params is None:
            init = jax.jit(lambda r: nn.unbox(model.init(r, dummy, deterministic=True)["params"]))
            return jax.device_get(init(key))
        # Only the head is initialised: a pretrained encoder's init would be thrown away.
        shapes = jax.eval_shape(
            lambda r: nn.unbox(model.init(r, dummy, deterministic=True)["params"]), key
        )
        head = HEADS[model.kind](cfg, model.num_labels)
        hidden = jnp.zeros((1, max_seq_length, cfg.hidden_size), jnp.dtype(cfg.dtype))
        head_params = jax.device_get(
            jax.jit(lambda r: nn.unbox(head.init(r, hidden, True)["params"]))(key)
        )
    expected = jax.tree_util.tree_structure(shapes["encoder"])
    got = jax.tree_util.tree_structure(encoder_params)
    if expected != got:
        raise ValueError(
            "checkpoint encoder parameters do not match the encoder config: "
            f"expected tree {expected}, got {got}"
        )
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(shapes["encoder"])[0],
        jax.tree.leaves(encoder_params),
    ):
        if a.shape != np.shape(b):
            raise ValueError(
                f"checkpoint parameter encoder{jax.tree_util.keystr(path)} has shape "
                f"{np.shape(b)}, the config expects {a.shape}"
            )
    encoder = jax.tree.map(
        lambda a, b: np.asarray(b, dtype=a.dtype), shapes["encoder"], encoder_params
    )
    return {"encoder": encoder, "head": head_params}


def batches(n: int, batch_size: int, steps: int, seed: int):
    """Row indices of ``steps`` batches: seeded permutations of ``n`` rows, one after another."""
    rng = np.random.default_rng(seed)
    order = np.zeros((0,), np.int64)
    for _ in range(steps):
        while len(order) < batch_size:
            order = np.concatenate([order, rng.permutation(n)])
        yield order[:batch_size]
        order = order[batch_size:]
