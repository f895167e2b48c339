"""Compiling the train step for a Cloud TPU slice on a machine without one.

libtpu (the ``aot`` extra) compiles for *abstract* TPU devices of a named topology
(:func:`jax.experimental.topologies.get_topology_desc`); the train step of
:func:`xlmeta_jax.pretrain.step.make_step_functions` is lowered on a mesh of them with abstract
state and batch, so nothing is allocated. The compiled program's memory analysis is the
memory one device needs; XLA refuses (RESOURCE_EXHAUSTED) what does not fit its HBM.
The changes the search tries, in order, are here too; the command line: :mod:`.aot`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import math
import os
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental.compilation_cache import compilation_cache

from xlmeta_jax import errors
from xlmeta_jax.model import mlm, network, partitioning
from xlmeta_jax.pretrain import step
from xlmeta_jax.pretrain.hardware import TpuSlice

# Rematerialisation policies from least to most recomputation (and least activation
# memory): 'dots' keeps every matmul output, 'dots_no_batch' drops the attention
# score/context matmuls (batched dots), 'save_named' keeps only the QKV, attention and
# MLP outputs, 'full' keeps only each layer's input.
REMAT_BY_COST = ("none", "dots", "dots_no_batch", "save_named", "full")

# libtpu probes the TPU VM's metadata and worker list when it loads, and logs errors
# when they are absent (as on any machine that only compiles). These values describe
# a single compile-only host; they are set only while libtpu loads.
_LIBTPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
    # libtpu takes /tmp/libtpu_lockfile for the process that owns the local TPU; a
    # compile-only process owns none, so two of them (or one next to a training job on
    # a TPU VM) may load it side by side.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


class LibtpuMissingError(errors.UserError, RuntimeError):
    """libtpu is not installed (``pip install -e '.[aot]'``)."""


def libtpu_available() -> bool:
    """Whether the libtpu package (TPU compiler) is importable."""

    return importlib.util.find_spec("libtpu") is not None


@contextlib.contextmanager
def _env(values: dict):
    """``values`` in os.environ (where unset) while the block runs; restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if k not in os.environ})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def topology_devices(tpu: TpuSlice) -> list:
    """The abstract (compile-only) devices of ``tpu``, in libtpu's order.

    Raises:
      LibtpuMissingError: without libtpu.
    """
    if not libtpu_available():
        raise LibtpuMissingError(
            "compiling for a TPU needs libtpu: pip install -e '.[aot]' (jax[tpu])")
    from jax.experimental import topologies  # noqa: PLC0415 - libtpu only for TPU compiles

    with _env({**_LIBTPU_ENV, "TPU_ACCELERATOR_TYPE": tpu.name}):
        topo = topologies.get_topology_desc(
            platform="tpu", topology_name=tpu.topology_name,
            chip_config_name=tpu.chip_config_name,
            chips_per_host_bounds=tpu.chips_per_host_bounds)
    devices = list(topo.devices)
    if len(devices) != tpu.num_devices:
        raise RuntimeError(f"{tpu.name}: libtpu's topology {tpu.topology_name} has "
                           f"{len(devices)} devices, expected {tpu.num_devices}")
    return devices


@contextlib.contextmanager
def _no_compilation_cache():
    """JAX's persistent cache off: a compile-only executable has no client to load into,
    so a cached entry could only be written, then fail (with a warning) to be read.

    JAX decides once per process whether the cache is used; ``reset_cache`` makes it
    decide again, with the flag off here and restored afterwards.
    """

    previous = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", previous)
        compilation_cache.reset_cache()


@dataclasses.dataclass(frozen=True)
class Variant:
    """The settings the search may change: remat policy, microbatches, mesh."""

    remat_policy: str
    microbatches: int
    mesh_shape: tuple[int, int, int]


@dataclasses.dataclass
class Compiled:
    """What compiling one train step for one device told (bytes per device)."""

    variant: Variant
    fits: bool
    compile_seconds: float
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    code_bytes: int = 0
    xla_flops: float = 0.0
    xla_bytes: float = 0.0
    # XLA's refusal (first line) and what it names: bytes needed / available, largest buffers.
    message: str = ""
    needed_bytes: float | None = None
    available_bytes: float | None = None
    largest: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Peak HBM of the step: inputs, outputs not aliased to them, temporaries, code."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.code_bytes)


def supports_microbatches() -> bool:
    """Whether this version's train step takes ``microbatches`` (gradient accumulation)."""
    return "microbatches" in inspect.signature(step.make_step_functions).parameters


def abstract_batch(batch_size: int, length: int, slots: int, sharding,
                   packed: bool = False) -> dict:
    """ShapeDtypeStructs of the step's features (``mlm.step_features(packed)``)."""
    shapes = {"inputs": ((batch_size, length), jnp.int32),
              "mlm_positions": ((batch_size, slots), jnp.int32),
              "mlm_targets": ((batch_size, slots), jnp.int32),
              "mlm_weights": ((batch_size, slots), jnp.float32),
              "segment_ids": ((batch_size, length), jnp.int32),
              "positions": ((batch_size, length), jnp.int32)}
    features = mlm.step_features(packed)
    missing = set(features) - set(shapes)
    if missing:
        raise RuntimeError(f"abstract_batch: no shape for step features {sorted(missing)}")
    return {k: jax.ShapeDtypeStruct(*shapes[k], sharding=sharding) for k in features}


_SIZE = re.compile(r"([\d.]+)\s*([KMGT]?)i?B?\b")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes(text: str) -> float | None:
    m = _SIZE.fullmatch(text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_oom(message: str) -> tuple[float | None, float | None, tuple[str, ...]]:
    """(bytes needed, bytes available, largest allocations) named by an XLA:TPU refusal."""
    needed = available = None
    m = (re.search(r"Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) hbm", message)
         or re.search(r"\(([\d.]+[KMGT]?)\) exceeds available HBM \(([\d.]+[KMGT]?)\)", message))
    if m:
        needed, available = _bytes(m.group(1)), _bytes(m.group(2))
    largest = []
    lines = message.splitlines()
    for i, line in enumerate(lines):
        size = re.match(r"\s*\d+\.\s*Size:\s*(\S+)", line)
        if size:
            shape = next((ln.split("Shape:", 1)[1].strip() for ln in lines[i + 1:i + 6]
                          if "Shape:" in ln), "?")
            largest.append(f"{size.group(1)} {shape}")
    return needed, available, tuple(largest[:5])


def compile_step(model, optimizer, devices, variant: Variant, *, batch_size: int,
                 length: int, slots: int, rng_impl: str = "threefry2x32",
                 packed: bool = False) -> Compiled:
    """Compiles the train step for ``devices`` and returns its memory and cost analysis.

    Args:
      model: the EncoderConfig (its remat_policy is replaced by the variant's).
      optimizer: the phase's OptimizerConfig.
      devices: abstract TPU devices (:func:`topology_devices`).
      variant: remat policy, microbatches and (data, fsdp, tensor) mesh to compile.
      batch_size: global batch (sequences per step).
      length: sequence length.
      slots: prediction slots per sequence (``mlm.max_predictions``).
      rng_impl: PRNG of the dropout masks, as the trainer is configured.
      packed: rows packed from whole documents (the step reads their segment ids).

    Returns:
      A :class:`Compiled`; ``fits`` is False when XLA refused the program for lack of
      HBM (its message, and what it names, are kept).
    """
    mesh = partitioning.create_mesh(*variant.mesh_shape, devices=devices)
    kwargs = {"rng_impl": rng_impl}
    if variant.microbatches != 1:
        kwargs["microbatches"] = variant.microbatches
    # The kernel a TPU runs: 'auto' traced on this host would pick the host's.
    kernel = network.resolve_attention_impl(model.attention_impl, model.dtype, "tpu", length)
    fns = step.make_step_functions(
        model.replace(remat_policy=variant.remat_policy, attention_impl=kernel), optimizer,
        mesh, packed=packed, **kwargs)
    batch = abstract_batch(batch_size, length, slots, fns.batch_sharding, packed)
    return analysed(variant, lambda: fns.train_step_jit.lower(
        fns.abstract_state, batch, fns.seed_spec))


def analysed(variant, lower: Callable) -> Compiled:
    """Compiles ``lower()`` (a jitted step's ``Lowered``) and reads XLA's memory and cost
    analyses; XLA:TPU's refusal for lack of HBM is a :class:`Compiled` that does not fit."""
    t0 = time.time()
    try:
        with _no_compilation_cache():
            compiled = lower().compile()
    except jax.errors.JaxRuntimeError as e:
        text = str(e)
        # XLA's status code (compiled; one exception type for every status): the one
        # failure that is a fit table's answer rather than an error.
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        needed, available, largest = parse_oom(text)
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
        return Compiled(variant, False, time.time() - t0, message=first[:300],
                        needed_bytes=needed, available_bytes=available, largest=largest)
    seconds = time.time() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    return Compiled(
        variant, True, seconds,
        argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
        alias_bytes=mem.alias_size_in_bytes, temp_bytes=mem.temp_size_in_bytes,
        code_bytes=mem.generated_code_size_in_bytes,
        xla_flops=float(cost.get("flops", 0.0)), xla_bytes=float(cost.get("bytes accessed", 0.0)),
    )


def state_bytes_per_device(model, optimizer, devices, mesh_shape) -> int:
    """Bytes of one device's shard of parameters and optimizer state (no compile)."""
    mesh = partitioning.create_mesh(*mesh_shape, devices=devices)
    fns = step.make_step_functions(model, optimizer, mesh)
    total = 0
    for leaf in jax.tree.leaves(fns.abstract_state):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += int(jnp.dtype(leaf.dtype).itemsize) * math.prod(shard)
    return total


# ---------------------------------------------------------------------------
# The search for a configuration that fits.
# ---------------------------------------------------------------------------


def check_footprint(c: Compiled, limit: float) -> None:
    """Marks ``c`` as not fitting when its whole footprint exceeds ``limit`` bytes.

    XLA:TPU refuses a program whose *temporaries* exceed the usable HBM; parameters,
    optimizer state and the batch live in the same HBM, so a program XLA accepts may
    still not fit with them. Both must hold.
    """
    if c.fits and c.total_bytes > limit:
        c.fits = False
        c.message = (f"XLA accepts the program, but arguments + temporaries + outputs + "
                     f"code = {c.total_bytes / 2**30:.2f} GiB exceed the "
                     f"{limit / 2**30:.2f} GiB one device holds")
        c.needed_bytes, c.available_bytes = float(c.total_bytes), limit


def _shards(variant: Variant, n: int) -> int:
    shape = partitioning.mesh_shape_for(*variant.mesh_shape, num_devices=n)
    return shape[0] * shape[1]


def candidates(base: Variant, batch_size: int, num_devices: int,
               oom: Compiled | None = None) -> list[Variant]:
    """Changes to try, in order: remat policies (least recompute first), microbatches
    (2, 4, ... as the batch divides), FSDP meshes, then full remat with microbatches, then
    FSDP over the slice with microbatches.

    Microbatch counts below what XLA's refusal implies are skipped: temporaries shrink
    at most in proportion to the microbatch, so ``needed / available`` bounds the count.
    """
    out = []
    start = REMAT_BY_COST.index(base.remat_policy)
    out += [dataclasses.replace(base, remat_policy=p) for p in REMAT_BY_COST[start + 1:]]
    low = 2
    if oom is not None and oom.needed_bytes and oom.available_bytes:
        low = max(2, math.ceil(oom.needed_bytes / oom.available_bytes))
    counts = []
    k = 2
    if supports_microbatches():
        while batch_size % (_shards(base, num_devices) * k) == 0:
            if k >= low:
                counts.append(k)
            k *= 2
    out += [dataclasses.replace(base, microbatches=base.microbatches * k) for k in counts]
    if base.mesh_shape[1] == 1 and base.mesh_shape[2] == 1:
        # FSDP over one host's chips (8 at most), then over the whole slice.
        for f in sorted({min(8, num_devices), num_devices} - {1}):
            out.append(dataclasses.replace(base, mesh_shape=(-1, f, 1)))
    if base.remat_policy != "full":
        out += [Variant("full", base.microbatches * k, base.mesh_shape) for k in counts]
    if base.mesh_shape[1] == 1 and base.mesh_shape[2] == 1 and num_devices > 1:
        # Last: the state sharded over the whole slice as well as microbatches (when the
        # replicated parameters and AdamW moments alone crowd a device, as on a v2).
        out += [Variant(base.remat_policy, base.microbatches * k, (-1, num_devices, 1))
                for k in counts]
    return out


def change_flags(base: Variant, found: Variant) -> list[str]:
    """The ``--gin.`` flags that turn ``base`` into ``found``."""
    flags = []
    if found.remat_policy != base.remat_policy:
        flags.append(f"--gin.xlmeta_jax.model.network.get_config.remat_policy=\"'"
                     f"{found.remat_policy}'\"")
    if found.microbatches != base.microbatches:
        flags.append(f"--gin.MICROBATCHES={found.microbatches}")
    if found.mesh_shape != base.mesh_shape:
        flags.append("--gin.xlmeta_jax.pretrain.trainer.train.mesh_shape="
                     f"\"{tuple(found.mesh_shape)}\"".replace(" ", ""))
    return flags
