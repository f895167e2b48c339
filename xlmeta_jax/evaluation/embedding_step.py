"""The contrastive train step: sharded state, the loss's gradients, GradCache.

The state is the masked-LM network's parameters, sharded by the same logical-axis rules
as pretraining (``data``, ``fsdp``, ``tensor``). The optimizer updates the encoder only:
the LM head travels untouched and has no optimizer state, so the checkpoint stays one
that fine-tuning, ``hf to_hf`` and continued pretraining read. A batch is one ``[B, L]`` id array
per column: ``query``, ``positive`` and any ``negative_<i>``, its rows split over the
mesh's batch axes. The embeddings of a step form one global array, so every row's
negatives are the whole global batch (see :mod:`xlmeta_jax.model.contrastive`).

With ``mini_batch_size`` the step is GradCache (Gao et al., 2021), as
sentence-transformers' ``CachedMultipleNegativesRankingLoss`` does it: every column is
embedded mini-batch by mini-batch without gradients, the loss's gradients with respect
to those embeddings are taken, and each mini-batch is embedded again with gradients and
back-propagated from its cached embedding gradients, its dropout drawn from the same key
both times. Activation memory then scales with the mini-batch, and the gradients are
those of the whole batch's loss (tests/test_contrastive.py). Mini-batch ``i`` takes rows
``i, i + k, ...`` (``step.split_microbatches``), so each keeps its share on every device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xlmeta_jax.model import contrastive, network, partitioning
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import step as pretrain_step
from xlmeta_jax.pretrain.step import TrainState

# The encoder's subtree of the masked-LM parameters: the only one trained.
ENCODER = "encoder"


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """How rows become embeddings and embeddings a loss (checked in the run's config)."""

    pooling: str = "mean"
    scale: float = 20.0
    symmetric: bool = False
    margin: float = 0.0
    # GradCache's rows per forward pass (of the global batch); None: one pass, no cache.
    mini_batch_size: int | None = None


def columns_of(batch: dict[str, Any]) -> list[str]:
    """A batch's columns in the loss's order: query, positive, negative_0, ..."""
    negatives = sorted((k for k in batch if k.startswith("negative_")),
                       key=lambda k: int(k.split("_")[1]))
    return ["query", "positive", *negatives]


def embedder(cfg: EncoderConfig, pooling: str) -> Callable:
    """``embed(encoder_params, ids, key, deterministic) -> [B, H]`` float32 embeddings."""
    encoder = network.encoder(cfg)

    def embed(params, ids, key=None, deterministic=True):
        rngs = None if deterministic else {"dropout": key}
        out = encoder.apply({"params": params}, ids, deterministic=deterministic, rngs=rngs)
        hidden = out[0] if isinstance(out, tuple) else out
        return contrastive.pool(hidden, ids, cfg.pad_token_id, pooling)

    return embed


def loss_of(settings: LossSettings) -> Callable:
    """``loss(column embeddings) -> scalar``: the query column against the others."""
    def loss(embeddings):
        return contrastive.ranking_loss(
            embeddings[0], jnp.concatenate(embeddings[1:], axis=0), scale=settings.scale,
            symmetric=settings.symmetric, margin=settings.margin)
    return loss


def _after(previous, x):
    """``x``, made to wait for ``previous``: XLA may run independent parts of a program at
    the same time, and two loops whose bodies hold collectives, started in another order on
    two devices, would wait for each other for ever (seen on CPU devices). Every loop of a
    step with collectives is chained after the one before it."""
    return jax.lax.optimization_barrier((previous, x))[1]


def loss_and_grads(embed: Callable, params, columns: list[jax.Array], key,
                   settings: LossSettings, *, deterministic: bool = False,
                   rows_sharding: NamedSharding | None = None, grads_sharding=None):
    """The batch's loss and its gradients with respect to ``params`` (the encoder's).

    Args:
      embed: :func:`embedder`'s function.
      params: the encoder's parameters.
      columns: ``[B, L_c]`` id arrays, query first (see :func:`columns_of`).
      key: the step's dropout key; column ``c`` draws from ``fold_in(key, c)``, and its
        GradCache mini-batch ``i`` from ``fold_in(fold_in(key, c), i)``, in both passes.
      settings: the loss and GradCache's mini-batch.
      deterministic: no dropout.
      rows_sharding, grads_sharding: as :func:`xlmeta_jax.pretrain.step.accumulated_grads`.
    """
    loss_fn = loss_of(settings)
    keys = [jax.random.fold_in(key, c) for c in range(len(columns))]
    rows = columns[0].shape[0]
    if settings.mini_batch_size is None:
        def total(p):
            embeddings = []
            for ids, k in zip(columns, keys):
                if embeddings:
                    ids = _after(embeddings[-1], ids)
                embeddings.append(embed(p, ids, k, deterministic))
            return loss_fn(embeddings)
        return jax.value_and_grad(total)(params)

    # The run's config refuses a batch that the mini-batch does not divide.
    chunks = max(1, rows // settings.mini_batch_size)

    def constrain(x, leading=()):
        if rows_sharding is None:
            return x
        spec = tuple(rows_sharding.spec)
        rest = [None] * (x.ndim - len(leading) - len(spec))
        return jax.lax.with_sharding_constraint(
            x, NamedSharding(rows_sharding.mesh, PartitionSpec(*leading, *spec, *rest)))

    def split(x):
        return constrain(pretrain_step.split_microbatches(x, chunks), (None,))

    def unsplit(x):  # inverse of split_microbatches: row j of chunk i is row j * k + i
        return jnp.swapaxes(x, 0, 1).reshape(rows, *x.shape[2:])

    frozen = jax.lax.stop_gradient(params)
    embeddings = []
    for ids, k in zip(columns, keys):
        def forward(xs, k=k):
            index, chunk = xs
            return embed(frozen, constrain(chunk), jax.random.fold_in(k, index), deterministic)
        if embeddings:
            ids = _after(embeddings[-1], ids)
        embeddings.append(unsplit(jax.lax.map(forward, (jnp.arange(chunks), split(ids)))))
    loss, cached = jax.value_and_grad(loss_fn)(embeddings)
    cached = _after(loss, cached)

    grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if grads_sharding is not None:
        grads = jax.lax.with_sharding_constraint(grads, grads_sharding)
    for ids, k, g in zip(columns, keys, cached):
        # Each column's loop waits for the previous one through the accumulated gradients.
        def body(acc, xs, k=k):
            index, chunk, chunk_grads = xs
            _, vjp = jax.vjp(
                lambda p: embed(p, constrain(chunk), jax.random.fold_in(k, index), deterministic),
                params)
            (step_grads,) = vjp(constrain(chunk_grads))
            return jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc, step_grads), None
        grads, _ = jax.lax.scan(body, grads, (jnp.arange(chunks), split(ids), split(g)))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return loss, grads


@dataclasses.dataclass
class EmbeddingStep:
    """Sharded state and the jitted step of one run on one mesh."""

    mesh: Mesh
    tx: optax.GradientTransformation
    state_sharding: Any
    abstract_state: Any
    # from_params(host params) -> TrainState at step 0 on the mesh.
    from_params: Callable
    # train_step(state, batch: {column: [B, L]}) -> (state, {"loss", "grad_norm", ...}).
    train_step: Callable
    # The jitted step itself, for ahead-of-time lowering: (state, batch, seed).
    train_step_jit: Callable
    batch_sharding: NamedSharding
    seed_spec: Any


def make_embedding_step(cfg: EncoderConfig, tx: optax.GradientTransformation, mesh: Mesh,
                        settings: LossSettings, *, seed: int = 0, schedule=None,
                        rules=partitioning.LOGICAL_AXIS_RULES) -> EmbeddingStep:
    """Builds the sharded state and the jitted contrastive step for ``mesh``.

    Args:
      cfg: the encoder (dropout rates included).
      tx: the optimizer of the encoder's parameters.
      mesh: a ``(data, fsdp, tensor)`` mesh.
      settings: pooling, loss and GradCache.
      seed: dropout seed (step ``s`` draws from ``fold_in(key(seed), s)``: resume is exact).
      schedule: the learning rate as a function of the step, reported in the metrics.
      rules: logical-axis rules.
    """
    partitioning.check_mesh_axes(mesh)
    model = network.masked_lm(cfg)
    embed = embedder(cfg, settings.pooling)

    def init_params(rng):
        return model.init(rng, jnp.full((1, 8), cfg.pad_token_id + 1, jnp.int32),
                          deterministic=True)["params"]

    abstract_params = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
        jax.eval_shape(lambda r: jax.tree.map(lambda x: getattr(x, "value", x), init_params(r),
                                              is_leaf=lambda x: hasattr(x, "value")),
                       jax.random.key(0)))
    param_specs = partitioning.logical_to_mesh_specs(
        pretrain_step.param_logical_specs(model), rules)
    partitioning.check_divisible(abstract_params, param_specs, mesh)

    # The optimizer's state covers the encoder alone: the LM head is carried, not trained.
    def from_params_fn(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=tx.init(params[ENCODER]))

    state_sharding, abstract = pretrain_step.state_shardings(
        tx, jax.eval_shape(from_params_fn, abstract_params), param_specs,
        param_specs[ENCODER], mesh)
    batch_sharding = NamedSharding(mesh, partitioning.batch_spec(2))
    replicated = NamedSharding(mesh, PartitionSpec())

    def train_step_fn(state: TrainState, batch, seed):
        key = jax.random.fold_in(jax.random.key(seed), state.step)
        columns = [batch[name] for name in columns_of(batch)]
        loss, encoder_grads = loss_and_grads(
            embed, state.params[ENCODER], columns, key, settings,
            rows_sharding=NamedSharding(mesh, partitioning.batch_spec(1)),
            grads_sharding=state_sharding.params[ENCODER])
        updates, opt_state = tx.update(encoder_grads, state.opt_state, state.params[ENCODER])
        params = {**state.params, ENCODER: optax.apply_updates(state.params[ENCODER], updates)}
        metrics = {"loss": loss, "grad_norm": optax.global_norm(encoder_grads)}
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    from_params = jax.jit(partitioning.with_rules(from_params_fn, mesh, rules),
                          out_shardings=state_sharding)
    train_step = jax.jit(
        partitioning.with_rules(train_step_fn, mesh, rules),
        in_shardings=(state_sharding, batch_sharding, replicated),
        out_shardings=(state_sharding, replicated), donate_argnums=(0,))
    seed_spec, seed_arg = pretrain_step.seed_argument(mesh, seed)

    def run_step(state, batch):
        placed = {k: jax.device_put(np.asarray(v), batch_sharding) for k, v in batch.items()}
        return train_step(state, placed, seed_arg())

    return EmbeddingStep(mesh=mesh, tx=tx, state_sharding=state_sharding,
                         abstract_state=abstract, from_params=from_params,
                         train_step=run_step, train_step_jit=train_step,
                         batch_sharding=batch_sharding, seed_spec=seed_spec)
