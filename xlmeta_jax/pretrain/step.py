"""Train state, sharded initialisation and the jit'ed MLM train step.

Initialisation is abstract first (``jax.eval_shape``), so the shardings of every
parameter and optimizer slot are known before any memory is allocated; the real
init is then ``jit(init, out_shardings=...)`` and each device materialises only
its shard. The train step donates the state so parameters are updated in place.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xlmeta_jax.model import losses, mlm, network, partitioning
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.model.optimizer import (
    OptimizerConfig,
    global_norm,
    learning_rate_schedule,
    make_optimizer,
)

# PRNG implementations the dropout masks may use (``jax.random.key(..., impl=)``).
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


@flax.struct.dataclass
class TrainState:
    """Everything a step updates; checkpointed as one pytree."""

    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass
class StepFunctions:
    """Compiled-on-first-call functions bound to one mesh and model."""

    mesh: Mesh
    # The masked-LM network of the config's family (network.masked_lm).
    model: nn.Module
    tx: optax.GradientTransformation
    # Sharding pytree of TrainState (NamedShardings).
    state_sharding: Any
    # Abstract TrainState (ShapeDtypeStructs with shardings).
    abstract_state: Any
    # init(rng) -> TrainState (sharded).
    init: Callable
    # from_params(params) -> TrainState at step 0 with fresh optimizer state; donates
    # ``params`` (sharded as ``state_sharding.params``), so nothing is held twice.
    from_params: Callable
    # train_step(state, batch) -> (state, metrics).
    train_step: Callable
    # eval_step(state, batch) -> metrics.
    eval_step: Callable
    # Sharding of every batch array.
    batch_sharding: NamedSharding
    # The jitted train step itself (takes exactly the step's features and the dropout
    # seed; no checks), for ahead-of-time lowering:
    # ``train_step_jit.lower(state, batch, seed_spec).compile()``.
    train_step_jit: Callable = None
    # The dropout seed's abstract value (replicated int32), and seed_arg() -> the seed
    # ``train_step`` passes to ``train_step_jit``, placed on the mesh on first use.
    seed_spec: Any = None
    seed_arg: Callable = None


def _dummy_inputs(cfg: EncoderConfig):
    ids = jnp.full((1, 8), cfg.pad_token_id + 1, jnp.int32)
    return ids


def state_shardings(tx: optax.GradientTransformation, abstract: TrainState, param_specs,
                    trained_specs, mesh: Mesh) -> tuple[TrainState, TrainState]:
    """The state's shardings on ``mesh`` and its abstract value carrying them.

    Args:
      tx: the optimizer; its state follows the specs of the parameters it updates.
      abstract: the state's shapes (``jax.eval_shape``).
      param_specs: mesh specs of every parameter.
      trained_specs: those of the parameters ``tx`` updates (``param_specs`` or a subtree).
      mesh: the mesh.
    """
    opt_specs = optax.tree_map_params(
        tx, lambda _, spec: spec, abstract.opt_state, trained_specs,
        transform_non_params=lambda _: PartitionSpec(),
        is_leaf=lambda x: isinstance(x, PartitionSpec))
    sharding = partitioning.named_shardings(
        mesh, TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs))
    return sharding, jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sharding)


def seed_argument(mesh: Mesh, seed: int) -> tuple[jax.ShapeDtypeStruct, Callable]:
    """The dropout seed's abstract value and ``seed_arg()``, the seed on ``mesh``.

    The seed is an argument, not a constant of the program: the phases and runs that
    differ only in their seed (each phase has its own) share one compiled step. It is
    placed on first use: an ahead-of-time compile's mesh has no device memory.
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    @functools.cache
    def seed_arg():
        return jax.device_put(np.int32(seed), replicated)

    return jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated), seed_arg


def param_logical_specs(model: nn.Module):
    """Logical PartitionSpecs of every parameter, from the abstract init."""
    cfg = model.config
    abstract = jax.eval_shape(
        lambda r: model.init(r, _dummy_inputs(cfg), deterministic=True), jax.random.key(0)
    )
    return nn.get_partition_spec(abstract)["params"]


def make_step_functions(
    model_cfg: EncoderConfig,
    opt_cfg: OptimizerConfig,
    mesh: Mesh,
    *,
    seed: int = 0,
    rules=partitioning.LOGICAL_AXIS_RULES,
    full_head: bool = False,
    rng_impl: str = "threefry2x32",
    microbatches: int = 1,
    packed: bool = False,
) -> StepFunctions:
    """Builds the sharded init / train / eval functions for one mesh.

    Args:
      model_cfg: encoder sizes and numerics.
      opt_cfg: optimizer and schedule.
      mesh: a ``(data, fsdp, tensor)`` mesh from :func:`partitioning.create_mesh`.
      seed: seed of dropout randomness (the key for step ``s`` is ``fold_in(seed, s)``,
        so a resumed run draws the same dropout masks as an uninterrupted one).
      rules: logical-axis rules.
      full_head: apply the LM head at every position (batches then need
        ``mlm.FULL_HEAD_FEATURES``); only to measure what the gathered head saves.
      rng_impl: PRNG of the dropout masks: ``"threefry2x32"`` (JAX's default; the
        same masks on every backend and mesh) or ``"rbg"`` / ``"unsafe_rbg"`` (XLA's
        RngBitGenerator: cheaper masks, but a different stream, which may differ
        between backends). Any choice is deterministic, so resume stays exact.
      microbatches: gradient accumulation: the step splits its batch into this many
        microbatches and runs them one after another (``lax.scan``, inside the one
        jitted step), so activation memory scales with the microbatch. The loss and
        gradients are normalised over the masked tokens of the whole batch, exactly as
        with one microbatch; microbatch ``i`` takes rows ``i, i + k, ...`` (every device
        keeps its share of each) and draws dropout from ``fold_in(step key, i)``.
      packed: batches of rows packed from whole documents (``Corpora.packing``): the
        step also reads their ``mlm.PACKED_FEATURES``.

    Returns:
      A :class:`StepFunctions`. ``init``, ``train_step`` and ``eval_step`` are jitted
      (traced and compiled on first call); the train step donates its input state.
      Activation sharding constraints (the network's logical names) are bound to
      ``mesh`` while tracing.

    Raises:
      partitioning.MeshShapeError: when the mesh lacks the ``data``/``fsdp``/``tensor``
        axes or a parameter cannot be split on it (every such parameter is named).
    """
    partitioning.check_mesh_axes(mesh)
    # rng_impl and microbatches are checked where a run's config is built
    # (pretrain/checks.py, the trainer); here they are used as given.
    microbatches = int(microbatches)
    model = network.masked_lm(model_cfg)
    tx = make_optimizer(opt_cfg)
    schedule = learning_rate_schedule(opt_cfg)

    def from_params_fn(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    def init_fn(rng):
        variables = model.init(rng, _dummy_inputs(model_cfg), deterministic=True)
        return from_params_fn(nn.unbox(variables["params"]))

    logical = param_logical_specs(model)
    param_specs = partitioning.logical_to_mesh_specs(logical, rules)
    abstract = jax.eval_shape(init_fn, jax.random.key(0))
    partitioning.check_divisible(abstract.params, param_specs, mesh)
    state_sharding, abstract = state_shardings(tx, abstract, param_specs, param_specs, mesh)
    batch_sharding = NamedSharding(mesh, partitioning.batch_spec(2))
    replicated = NamedSharding(mesh, PartitionSpec())

    def _with_rules(fn):
        return partitioning.with_rules(fn, mesh, rules)

    init = jax.jit(_with_rules(init_fn), out_shardings=state_sharding)
    from_params = jax.jit(from_params_fn, in_shardings=(state_sharding.params,),
                          out_shardings=state_sharding, donate_argnums=(0,))
    seed_spec, seed_arg = seed_argument(mesh, seed)

    def sums_fn(params, batch, key):
        return losses.mlm_sums(model, params, batch, rngs={"dropout": key},
                               deterministic=False, full_head=full_head)

    def train_step_fn(state: TrainState, batch, seed):
        dropout_key = jax.random.fold_in(jax.random.key(seed, impl=rng_impl), state.step)
        grads, sums = accumulated_grads(
            sums_fn, state.params, batch, dropout_key, microbatches=microbatches,
            rows_sharding=NamedSharding(mesh, partitioning.batch_spec(1)),
            grads_sharding=state_sharding.params,
        )
        _, metrics = losses.loss_from_sums(*sums)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = global_norm(grads)
        metrics["param_norm"] = global_norm(params)
        metrics["learning_rate"] = schedule(state.step)
        if packed:  # the share of the rows that is text, not end-of-row padding
            metrics["text_share"] = jnp.mean(batch["segment_ids"] > 0, dtype=jnp.float32)
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    def eval_step_fn(state: TrainState, batch):
        _, metrics = losses.mlm_loss_and_metrics(
            model, state.params, batch, deterministic=True, full_head=full_head
        )
        return metrics

    features = mlm.FULL_HEAD_FEATURES if full_head else mlm.step_features(packed)
    batch_shardings = {k: batch_sharding for k in features}
    train_step = jax.jit(
        _with_rules(train_step_fn),
        in_shardings=(state_sharding, batch_shardings, replicated),
        out_shardings=(state_sharding, replicated),
        donate_argnums=(0,),
    )
    eval_step = jax.jit(
        _with_rules(eval_step_fn),
        in_shardings=(state_sharding, batch_shardings),
        out_shardings=replicated,
    )
    return StepFunctions(
        mesh=mesh,
        model=model,
        tx=tx,
        state_sharding=state_sharding,
        abstract_state=abstract,
        init=init,
        from_params=from_params,
        train_step=lambda s, b: train_step(s, _select(b, features), seed_arg()),
        eval_step=lambda s, b: eval_step(s, _select(b, features)),
        batch_sharding=batch_sharding,
        train_step_jit=train_step,
        seed_spec=seed_spec,
        seed_arg=seed_arg,
    )


def _select(batch, features=mlm.STEP_FEATURES):
    """The step's features of ``batch`` (the batch's shape is the run's, checked once
    where its config is built: pretrain/checks.py)."""
    missing = [k for k in features if k not in batch]
    if missing:
        raise KeyError(f"MLM batch is missing features {missing}; has {sorted(batch)}")
    return {k: batch[k] for k in features}


def check_microbatches(microbatches) -> int:
    """``microbatches`` as an int; ValueError unless it is a positive integer."""
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive integer, got {microbatches!r}")
    return int(microbatches)


def split_microbatches(batch, microbatches: int):
    """``[B, ...]`` arrays as ``[microbatches, B / microbatches, ...]``.

    Row ``j`` of microbatch ``i`` is row ``j * microbatches + i`` of the batch: strided
    rather than contiguous, so a batch sharded over devices in contiguous blocks keeps
    every microbatch spread over all of them (a contiguous split would put microbatch 0
    on the first devices only).
    """

    def split(x):
        rows = x.shape[0] // microbatches
        return jnp.swapaxes(x.reshape(rows, microbatches, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def accumulated_grads(sums_fn, params, batch, dropout_key, *, microbatches: int = 1,
                      rows_sharding: NamedSharding | None = None, grads_sharding=None):
    """Gradients of the batch's MLM loss, optionally accumulated over microbatches.

    The loss is the summed cross-entropy over the masked tokens of the whole batch
    divided by their count (``losses.loss_from_sums``), whatever ``microbatches``
    is: each microbatch contributes the gradient of its *sum*, and the total is
    divided once by the whole batch's count (a mean of microbatch means would
    weight a microbatch with few masked tokens like one with many).

    Args:
      sums_fn: ``sums_fn(params, batch, key) -> (loss_sum, weight_sum, correct_sum)``,
        e.g. ``losses.mlm_sums`` with dropout from ``key``.
      params: the parameters to differentiate.
      batch: dict of ``[B, ...]`` arrays.
      dropout_key: the step's key; microbatch ``i`` draws from ``fold_in(key, i)``
        (with one microbatch, the key itself).
      microbatches: k; ``B`` must be divisible by it (see :func:`split_microbatches`).
      rows_sharding: how a batch's rows are split over the mesh (a ``NamedSharding``
        whose spec names the row dimension only): every microbatch is split the same way.
      grads_sharding: sharding of the gradient accumulator (the parameters').

    Returns:
      ``(grads, (loss_sum, weight_sum, correct_sum))`` of the whole batch.
    """
    if microbatches == 1:
        def loss_fn(p):
            sums = sums_fn(p, batch, dropout_key)
            loss, _ = losses.loss_from_sums(*sums)
            return loss, sums

        (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return grads, sums

    def constrain(x, leading=()):
        if rows_sharding is None:
            return x
        spec = tuple(rows_sharding.spec)
        rest = [None] * (x.ndim - len(leading) - len(spec))
        return jax.lax.with_sharding_constraint(
            x, NamedSharding(rows_sharding.mesh, PartitionSpec(*leading, *spec, *rest)))

    def sum_and_sums(p, mbatch, key):
        sums = sums_fn(p, mbatch, key)
        return sums[0], sums

    def body(carry, xs):
        grads_acc, sums_acc = carry
        index, mbatch = xs
        mbatch = jax.tree.map(constrain, mbatch)
        (_, sums), grads = jax.value_and_grad(sum_and_sums, has_aux=True)(
            params, mbatch, jax.random.fold_in(dropout_key, index))
        grads_acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), grads_acc, grads)
        return (grads_acc, tuple(a + b for a, b in zip(sums_acc, sums))), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if grads_sharding is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, grads_sharding)
    zero = jnp.zeros((), jnp.float32)
    # [k, B / k, ...]: the rows of each microbatch stay split over the batch axes.
    split = jax.tree.map(lambda x: constrain(x, (None,)),
                         split_microbatches(batch, microbatches))
    (grads, sums), _ = jax.lax.scan(
        body, (zeros, (zero, zero, zero)), (jnp.arange(microbatches), split))
    denom = jnp.maximum(sums[1], 1.0)
    grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, params)
    return grads, sums
