"""Ahead-of-time fit of a contrastive run (gin/finetune/embeddings.gin) on a TPU slice.

``python -m xlmeta_jax.tools.aot --topology=v5p-128 --gin_file=gin/finetune/embeddings.gin
--gin_file=gin/models/mmbert_base.gin --gin.BATCH_SIZE=32768`` compiles the contrastive step
(:mod:`xlmeta_jax.evaluation.embedding_step`) of the configured model, global batch, query
and document lengths, GradCache mini-batch and mesh for the slice, and prints per device
what it holds against the chip's HBM. When it does not fit, the search halves GradCache's
mini-batch (its rows per device) until it does, and prints the ``--gin.MINI_BATCH_SIZE`` that
fits: GradCache's activations follow the mini-batch, the cached embeddings the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from xlmeta_jax import errors
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.evaluation import embedding_step, training
from xlmeta_jax.model import network, partitioning
from xlmeta_jax.pretrain.hardware import TpuSlice
from xlmeta_jax.tools import aot_compile

Q = "xlmeta_jax.cli.runs.embeddings."


class EmbeddingsAotError(errors.UserError, ValueError):
    """A contrastive run that cannot be laid out on the slice."""


@dataclasses.dataclass(frozen=True)
class EmbeddingShape:
    """What decides a contrastive step's program."""

    model: network.EncoderConfig
    batch_size: int
    mini_batch_size: int | None
    query_length: int
    document_length: int
    negatives: int
    mesh_shape: tuple[int, int, int]
    pooling: str


def configured() -> EmbeddingShape:
    """The contrastive run of the parsed gin files (its model: the gin model files')."""
    return EmbeddingShape(
        model=train_cli.configured_model(),
        batch_size=gin_cli.bound(Q + "batch_size", 64),
        mini_batch_size=gin_cli.bound(Q + "mini_batch_size", None),
        query_length=gin_cli.bound(Q + "query_length", 128),
        document_length=gin_cli.bound(Q + "document_length", 128),
        negatives=0,
        mesh_shape=tuple(gin_cli.bound(Q + "mesh_shape", (-1, 1, 1))),
        pooling=gin_cli.bound(Q + "pooling", "mean"))


def compile_embedding_step(shape: EmbeddingShape, devices, mini_batch_size: int | None
                           ) -> aot_compile.Compiled:
    """Compiles the contrastive step of ``shape`` with ``mini_batch_size`` for ``devices``."""
    mesh = partitioning.create_mesh(*shape.mesh_shape, devices=devices)
    longest = max(shape.query_length, shape.document_length)
    kernel = network.resolve_attention_impl(shape.model.attention_impl, shape.model.dtype,
                                            "tpu", longest)
    tx = training.make_finetune_optimizer(
        learning_rate=5e-5, warmup_steps=0, total_steps=1000, weight_decay=0.01, b1=0.9,
        b2=0.999, eps=1e-8, max_grad_norm=1.0)
    settings = embedding_step.LossSettings(pooling=shape.pooling,
                                           mini_batch_size=mini_batch_size)
    fns = embedding_step.make_embedding_step(shape.model.replace(attention_impl=kernel), tx,
                                             mesh, settings)
    lengths = {"query": shape.query_length, "positive": shape.document_length,
               **{f"negative_{i}": shape.document_length for i in range(shape.negatives)}}
    batch = {k: jax.ShapeDtypeStruct((shape.batch_size, n), jnp.int32,
                                     sharding=fns.batch_sharding) for k, n in lengths.items()}
    variant = aot_compile.Variant(shape.model.remat_policy, 1, shape.mesh_shape)

    def lower():
        with partitioning.axis_rules_context(), partitioning.mesh_context(mesh):
            return fns.train_step_jit.lower(fns.abstract_state, batch, fns.seed_spec)

    return aot_compile.analysed(variant, lower)


def _mini_batches(shape: EmbeddingShape, shards: int) -> list[int | None]:
    """The bound mini-batch first, then halves of the rows per device, down to one."""
    per_device = (shape.mini_batch_size or shape.batch_size) // shards
    out: list[int | None] = [shape.mini_batch_size]
    while per_device > 1:
        per_device //= 2
        out.append(per_device * shards)
    return out


def run(shape: EmbeddingShape, tpu: TpuSlice, *, search: bool = True,
        say: Callable[[str], None] = print) -> list[tuple[int | None, aot_compile.Compiled]]:
    """Compiles the bound mini-batch, then (``search``) smaller ones until one fits."""
    devices = aot_compile.topology_devices(tpu)
    sizes = partitioning.mesh_shape_for(*shape.mesh_shape, num_devices=len(devices))
    shards = sizes[0] * sizes[1]
    if shape.batch_size % shards:
        raise EmbeddingsAotError(
            f"embeddings.batch_size={shape.batch_size} is not divisible by the {shards} batch "
            f"shards of {tpu.name}'s mesh {tuple(sizes)}")
    if shape.mini_batch_size is not None and shape.mini_batch_size % shards:
        raise EmbeddingsAotError(
            f"embeddings.mini_batch_size={shape.mini_batch_size} is not divisible by the "
            f"{shards} batch shards of {tpu.name}'s mesh {tuple(sizes)}")
    results = []
    for mini in _mini_batches(shape, shards) if search else [shape.mini_batch_size]:
        say(f"compiling {tpu.name}: batch {shape.batch_size}, GradCache mini-batch "
            f"{mini or 'none'} ...")
        c = compile_embedding_step(shape, devices, mini)
        # XLA's own figure of the usable HBM when it names one (as the pretraining search).
        limit = c.available_bytes or float(tpu.chip.device_hbm_bytes)
        aot_compile.check_footprint(c, limit)
        results.append((mini, c))
        if c.fits:
            break
    return results


def report(shape: EmbeddingShape, tpu: TpuSlice,
           results: list[tuple[int | None, aot_compile.Compiled]]) -> str:
    """The fit table of :func:`run` and the flag that fits."""
    gib = 2**30
    m = shape.model
    hbm = tpu.chip.device_hbm_bytes / gib
    lines = [f"{tpu.name} ({tpu.num_devices} devices, {hbm:.1f} GiB HBM each): contrastive"
             f" step of {m.family} {m.num_layers} x {m.hidden_size} "
             f"(vocabulary {m.vocab_size:,}, {m.dtype}), {shape.batch_size:,} pairs of "
             f"{shape.query_length} + {shape.document_length} tokens, mesh {shape.mesh_shape}"]
    for mini, c in results:
        what = f"mini-batch {mini:,}" if mini else "no GradCache"
        if c.fits:
            lines.append(f"  {what}: fits — per device {c.argument_bytes / gib:.2f} GiB "
                         f"arguments, {c.temp_bytes / gib:.2f} GiB temporaries, "
                         f"{c.total_bytes / gib:.2f} GiB in all; {c.xla_flops:.3g} FLOP "
                         f"(compiled in {c.compile_seconds:.0f} s)")
        else:
            lines.append(f"  {what}: does not fit — {c.message}")
    fitting = [mini for mini, c in results if c.fits]
    if fitting and fitting[0] != shape.mini_batch_size:
        lines.append(f"  fits with --gin.MINI_BATCH_SIZE={fitting[0]}")
    elif not fitting:
        lines.append("  nothing tried fits: a smaller BATCH_SIZE, or FSDP "
                     "(embeddings.mesh_shape)")
    return "\n".join(lines)
