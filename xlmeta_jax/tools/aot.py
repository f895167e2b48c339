r"""Ahead-of-time compile of a run's train step for a Cloud TPU slice, on any machine.

  python -m xlmeta_jax.tools.aot --topology=v4-32 --gin_file=gin/native/meta.gin

Reads the run the gin files configure (the train command's files and ``--gin.``
overrides; an experiment file such as gin/experiments/xlmr_base.gin too), compiles each
phase's train step for the slice with libtpu (phases of equal shapes once) and prints,
per device: parameters and optimizer state, temporaries, outputs and their total
against the chip's HBM; whether it fits; XLA's FLOP and byte counts; a roofline step
time, tokens/s, MFU and the run's days. Nothing is read or written: MODEL_DIR,
VOCAB_PATH and the corpora need no value. When the run does not fit, it tries remat
policies (least recomputation first), then microbatches, then FSDP meshes, and prints
the smallest change that fits as the ``--gin.`` flags to add.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence

import jax

from xlmeta_jax import errors, logs
from xlmeta_jax.cli import evaluation_runs, experiment_runs
from xlmeta_jax.cli import experiment as experiment_cli
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.data import corpora
from xlmeta_jax.evaluation import embedding_config
from xlmeta_jax.experiment.arms import Budget, arm_phases
from xlmeta_jax.model import mlm, network, partitioning
from xlmeta_jax.pretrain import checks, hardware
from xlmeta_jax.pretrain.hardware import TpuSlice, UnknownSliceError, tpu_slice
from xlmeta_jax.tools import aot_embeddings
from xlmeta_jax.tools.aot_compile import (
    Compiled,
    Variant,
    candidates,
    change_flags,
    check_footprint,
    compile_step,
    topology_devices,
)

PROG = "xlmeta_jax.tools.aot"
GiB = 2**30


class AotError(errors.UserError, ValueError):
    """A bad slice, or a run that cannot be laid out on it."""


@dataclasses.dataclass(frozen=True)
class PhaseShape:
    name: str
    batch_size: int
    sequence_length: int
    num_steps: int
    optimizer: object
    # The phase's masking rate (its own, else the run's): it sets the batch's prediction
    # slots, hence the compiled shapes.
    mask_rate: float
    # The encoder the phase trains (the run's, with the phase's own RoPE bases); None: the run's.
    model: network.EncoderConfig | None = None

    @property
    def slots(self) -> int:
        return mlm.max_predictions(self.sequence_length, self.mask_rate)


@dataclasses.dataclass
class RunConfig:
    """What the compile needs of a configured run (no paths, no data)."""

    model: network.EncoderConfig
    phases: list[PhaseShape]
    mesh_shape: tuple[int, int, int]
    microbatches: int
    rng_impl: str
    # Steps the estimate of days covers, and what they are.
    total_steps: int
    steps_note: str
    # The trainer's Phase objects, for the trainer's own checks of the configuration.
    trainer_phases: list = dataclasses.field(default_factory=list)
    # Rows packed from whole documents (Corpora.packing='documents'): segment ids in the batch.
    packed: bool = False


def configured_run() -> RunConfig:
    """The run the parsed gin config describes: ``trainer.train`` or an experiment."""
    mask_rate = gin_cli.bound("xlmeta_jax.model.mlm.Masking.rate", mlm.Masking().rate)
    rng_impl = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.rng_impl", "threefry2x32")
    mesh_shape = tuple(gin_cli.bound("xlmeta_jax.pretrain.trainer.train.mesh_shape", (-1, 1, 1)))
    microbatches = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.microbatches", 1)
    packed = corpora.packs_documents(
        gin_cli.bound("xlmeta_jax.data.corpora.Corpora.packing", "blocks"))
    phases = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
    if phases is not None:
        model = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.model", None)
        if model is None:
            model = train_cli.configured_model()
        total = sum(p.num_steps for p in phases)
        note = " + ".join(f"{p.name} {p.num_steps:,}" for p in phases) + " steps"
    else:
        exp = gin_cli.bound("xlmeta_jax.experiment.runner.experiment.batch_size", None)
        if exp is None:
            raise AotError("the gin files configure no run: bind "
                           "xlmeta_jax.pretrain.trainer.train.phases (gin/native/*.gin) or an "
                           "experiment (gin/experiments/*.gin)")
        phases, model, total, note = _experiment_run()
    shapes = [PhaseShape(p.name, p.batch_size, p.sequence_length, p.num_steps,
                         p.optimizer_config(), p.masking_rate(mask_rate),
                         p.model(model)) for p in phases]
    return RunConfig(model=model, phases=shapes, mesh_shape=mesh_shape,
                     microbatches=microbatches, rng_impl=rng_impl, total_steps=total,
                     steps_note=note, trainer_phases=list(phases), packed=packed)


def _experiment_run():
    q = "xlmeta_jax.experiment.runner.experiment."
    budget = Budget(gin_cli.bound(q + "meta_steps", 0), gin_cli.bound(q + "xling_steps", 0),
                    gin_cli.bound(q + "batch_size", 0), gin_cli.bound(q + "sequence_length", 0))
    model = gin_cli.bound(q + "model", None)
    optimizer = gin_cli.bound(q + "optimizer", None)
    arms = list(gin_cli.bound(q + "arms", ("meta",)))
    seeds = list(gin_cli.bound(q + "seeds", (0, 1)))
    phases_of = {a: arm_phases(a, budget, english_task="english", xling_mixture="xling",
                               optimizer=optimizer, recipes=experiment_runs.recipes())
                 for a in arms}
    shown = phases_of.get("meta") or phases_of[arms[0]]
    total = sum(p.num_steps for a in arms for p in phases_of[a]) * len(seeds)
    note = (f"the experiment's {len(arms)} arms x {len(seeds)} seeds = {total:,} steps")
    return shown, model, total, note


# ---------------------------------------------------------------------------
# Estimates.
# ---------------------------------------------------------------------------


def _recompute_factor(model: network.EncoderConfig, length: int, slots: int,
                      policy: str) -> float:
    """Hardware FLOPs over model FLOPs that a remat policy adds (forward recomputed)."""
    h, f, n = model.hidden_size, model.mlp_dim, model.num_layers
    dense = 2 * (4 * h * h + 2 * h * f)
    attention = 2 * (2 * length * h)
    recomputed = {"none": 0.0, "dots": 0.0, "dots_no_batch": attention,
                  "save_named": attention, "full": dense + attention}[policy]
    total = hardware.mlm_flops_per_token(model, length, slots) / 3.0
    return 1.0 + n * recomputed / (3.0 * total)


@dataclasses.dataclass
class Estimate:
    model_flops: float  # per device and step (analytic, matmuls)
    step_seconds: float
    bound: str
    tokens_per_second: float
    mfu: float


def estimate(run: RunConfig, phase: PhaseShape, c: Compiled, tpu: TpuSlice) -> Estimate:
    """Roofline step time: max(analytic FLOPs incl. recompute / peak, XLA bytes / HBM BW)."""
    slots = phase.slots
    tokens = phase.batch_size * phase.sequence_length
    per_device = hardware.mlm_flops_per_token(run.model, phase.sequence_length, slots) * (
        tokens / tpu.num_devices)
    hw = per_device * _recompute_factor(run.model, phase.sequence_length, slots,
                                        c.variant.remat_policy)
    compute_s = hw / tpu.chip.device_peak_flops
    memory_s = c.xla_bytes / tpu.chip.device_hbm_bandwidth
    step_s = max(compute_s, memory_s)
    return Estimate(per_device, step_s, "compute" if compute_s >= memory_s else "HBM bandwidth",
                    tokens / step_s, per_device / (step_s * tpu.chip.device_peak_flops))


# ---------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------


def _gib(x: float) -> str:
    return f"{x / GiB:.2f} GiB" if x >= GiB / 10 else f"{x / 2**20:.1f} MiB"


def _flop(x: float) -> str:
    return f"{x / 1e12:.3f} TFLOP" if x >= 1e11 else f"{x / 1e9:.3f} GFLOP"


def _days(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} hours" if seconds >= 3600 else f"{seconds / 60:.1f} minutes"


def describe(c: Compiled, tpu: TpuSlice) -> list[str]:
    """Memory lines of one compiled (or refused) step, per device."""
    cap = tpu.chip.device_hbm_bytes
    if not c.fits:
        lines = [f"  does NOT fit: {c.message}"]
        if c.needed_bytes and c.available_bytes:
            lines.append(f"  needs {_gib(c.needed_bytes)} of {_gib(c.available_bytes)} "
                         "available per device")
        lines += [f"  largest buffer: {b}" for b in c.largest]
        return lines
    state = c.argument_bytes
    return [
        f"  parameters + optimizer state + batch (arguments): {_gib(state)}",
        f"  temporaries: {_gib(c.temp_bytes)}; outputs not aliased to inputs: "
        f"{_gib(c.output_bytes - c.alias_bytes)}; code {_gib(c.code_bytes)}",
        f"  total {_gib(c.total_bytes)} of {_gib(cap)} HBM per {tpu.device_word} "
        f"({100 * c.total_bytes / cap:.0f}%): fits",
    ]


def shape_groups(phases: Sequence[PhaseShape]) -> dict[tuple, list[PhaseShape]]:
    """The phases by the train step they compile: (batch, length, slots, encoder)."""
    groups: dict[tuple, list[PhaseShape]] = {}
    for p in phases:
        groups.setdefault((p.batch_size, p.sequence_length, p.slots, p.model), []).append(p)
    return groups


@dataclasses.dataclass
class PhaseResult:
    phases: list[PhaseShape]
    base: Compiled
    fitted: Compiled | None
    tried: list[Compiled]


def run_aot(run: RunConfig, tpu: TpuSlice, *, search: bool = True,
            say: Callable[[str], None] = print) -> list[PhaseResult]:
    """Compiles every distinct phase shape of ``run`` for ``tpu`` (and searches a fit).

    Raises:
      AotError: when a phase's batch cannot be split over the slice's devices.
    """
    n = tpu.num_devices
    if run.trainer_phases:
        # The trainer's checks (sequence length vs positions, schedule, mesh) for this slice.
        try:
            checks.validate("unused", run.model, run.trainer_phases, run.mesh_shape, n,
                            packed=run.packed, backend="tpu")
        except checks.ConfigError as e:
            raise AotError(f"on {tpu.name}: {errors.first_line(e)}") from None
    try:
        mesh = partitioning.mesh_shape_for(*run.mesh_shape, num_devices=n)
    except partitioning.MeshShapeError as e:
        raise AotError(f"train.mesh_shape on {tpu.name}: {e}") from None
    for p in run.phases:
        if p.batch_size % (mesh[0] * mesh[1] * run.microbatches):
            raise AotError(
                f"phase {p.name!r}: batch_size={p.batch_size} is not divisible by the "
                f"{mesh[0] * mesh[1]} data-parallel devices of {tpu.name} (mesh {mesh})"
                + (f" x {run.microbatches} microbatches" if run.microbatches > 1 else ""))
    say(f"{tpu.name}: {tpu.chips} chips, {n} devices (libtpu topology {tpu.topology_name})")
    devices = topology_devices(tpu)
    base = Variant(run.model.remat_policy, run.microbatches, tuple(run.mesh_shape))
    # What one device may hold: the datasheet's HBM until XLA names its usable share (the
    # "available HBM" of a refusal: less a reserve, e.g. 30.75 of a v4's 32 GiB).
    limit = [float(tpu.chip.device_hbm_bytes)]
    results = []
    for (batch, length, slots, model), phases in shape_groups(run.phases).items():
        names = ", ".join(p.name for p in phases)

        def compile_variant(v: Variant, phases=phases, batch=batch, length=length,
                            slots=slots, names=names, model=model or run.model) -> Compiled:
            say(f"compiling the train step of {names} ({batch} x {length}) for {tpu.name} "
                f"({n} devices): remat {v.remat_policy!r}, microbatches {v.microbatches}, "
                f"mesh {v.mesh_shape} ...")
            c = compile_step(model, phases[0].optimizer, devices, v, batch_size=batch,
                             length=length, slots=slots, rng_impl=run.rng_impl,
                             packed=run.packed)
            if c.available_bytes:
                limit[0] = c.available_bytes
            check_footprint(c, limit[0])
            say(f"  {'fits' if c.fits else 'does not fit'} ({c.compile_seconds:.0f} s)")
            return c

        first = compile_variant(base)
        fitted, tried = (first if first.fits else None), []
        if not first.fits and search:
            for v in candidates(base, batch, n, first):
                c = compile_variant(v)
                tried.append(c)
                if c.fits:
                    fitted = c
                    break
        results.append(PhaseResult(phases, first, fitted, tried))
    return results


def report(run: RunConfig, tpu: TpuSlice, results: Sequence[PhaseResult]) -> str:
    """The per-device report of :func:`run_aot`'s results."""
    chip = tpu.chip
    out = [f"{tpu.name}: {tpu.chips} x TPU {chip.generation}, {tpu.num_devices} devices "
           f"(one per {tpu.device_word}); per device {_gib(chip.device_hbm_bytes)} HBM at "
           f"{chip.device_hbm_bandwidth / 1e9:.0f} GB/s, {chip.device_peak_flops / 1e12:.1f} "
           "TFLOP/s bf16 peak (datasheet, xlmeta_jax/pretrain/hardware.py)"]
    # The run's time: each program's steps at its own step time (stages of other shapes);
    # the longest step is the table's.
    step_s, run_s = 0.0, 0.0
    for r in results:
        p = r.phases[0]
        names = ", ".join(q.name for q in r.phases)
        same = " (same shapes: compiled once)" if len(r.phases) > 1 else ""
        out += ["", f"{names}: batch {p.batch_size} x {p.sequence_length}, {p.slots} prediction "
                f"slots per sequence (masking {p.mask_rate:g}){same}; remat "
                f"{r.base.variant.remat_policy!r}, microbatches {r.base.variant.microbatches}, "
                f"mesh (data, fsdp, tensor) {r.base.variant.mesh_shape}"]
        out += describe(r.base, tpu)
        use = r.fitted
        if not r.base.fits:
            if use is None:
                out.append(f"  nothing tried fits ({len(r.tried)} variants compiled)"
                           if r.tried else "  no change searched (--no_search)")
                continue
            flags = change_flags(r.base.variant, use.variant)
            out += ["  smallest change that fits (add to the command):", "    " + " ".join(flags)]
            out += describe(use, tpu)
        est = estimate(run, p, use, tpu)
        ratio = use.xla_flops / est.model_flops if est.model_flops else float("nan")
        scanned = [w for w, on in (("layers under nn.scan", run.model.scan_layers),
                                   ("microbatches under lax.scan", use.variant.microbatches > 1))
                   if on]
        scan = (f" ({' and '.join(scanned)}: XLA counts a scan's body once, so both of its "
                "counts are low)" if scanned else "")
        out += [
            f"  XLA's cost analysis per device and step: {_flop(use.xla_flops)}, "
            f"{_gib(use.xla_bytes)} accessed{scan}",
            f"  analytic model FLOPs per device and step (tools/flops.py): "
            f"{_flop(est.model_flops)}; XLA / analytic = {ratio:.2f}",
            f"  roofline step time {est.step_seconds * 1e3:.1f} ms ({est.bound}-bound; analytic "
            f"FLOPs incl. remat recompute / peak vs XLA bytes / HBM bandwidth): "
            f"{est.tokens_per_second:,.0f} tokens/s, MFU {100 * est.mfu:.0f}% at best",
        ]
        step_s = max(step_s, est.step_seconds)
        run_s += sum(q.num_steps for q in r.phases) * est.step_seconds
    if sum(p.num_steps for p in run.phases) != run.total_steps:
        # An experiment's total counts every arm and seed; the shown arm's phases share
        # one shape, so its step time is the run's.
        run_s = run.total_steps * step_s
    if step_s and all(r.fitted for r in results):
        out += ["", f"run: {run.steps_note} ~ {_days(run_s)} at the "
                "roofline step time "
                "(a lower bound: no input pipeline, communication or host overhead)"]
    out += ["", summary_row(run, tpu, results, step_s, run_s)]
    return "\n".join(out)


def summary_row(run: RunConfig, tpu: TpuSlice, results: Sequence[PhaseResult],
                step_s: float, run_s: float) -> str:
    """One markdown table row: slice, memory per device, fit, change, longest step time,
    the run's days (each stage's steps at its own step time)."""
    worst = max(results, key=lambda r: (r.fitted or r.base).total_bytes)
    use = worst.fitted or worst.base
    cap = tpu.chip.device_hbm_bytes
    if all(r.base.fits for r in results):
        fit, change = "yes", "-"
    elif all(r.fitted for r in results):
        flags = {f for r in results if not r.base.fits
                 for f in change_flags(r.base.variant, r.fitted.variant)}
        fit, change = "with change", " ".join(f"`{f}`" for f in sorted(flags))
    else:
        fit, change = "no", "nothing tried fits"
    memory = (f"{use.total_bytes / GiB:.2f} of {cap / GiB:.0f}" if use.fits
              else f"needs {(use.needed_bytes or 0) / GiB:.1f} of {cap / GiB:.0f}")
    timing = (f"{step_s * 1e3:.0f} ms | {run_s / 86400:.1f}"
              if step_s and fit != "no" else "- | -")
    return f"| {tpu.name} | {memory} | {fit} | {change} | {timing} |"


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------

HELP_FLAGS = (
    ("--topology=SLICE", "Cloud TPU slice to compile for: v2-8 (Colab), v3-8, v4-8 ... "
     "v4-4096, v5p-8 ..., v5e-1 ... v5e-256, v6e-1 ... v6e-256 (v2/v3/v4/v5p count "
     "TensorCores, v5e/v6e chips); repeatable or comma-separated"),
    ("--no_search", "only compile the configured run; do not look for a change that fits"),
)


def help_text() -> str:
    return gin_cli.help_text(
        PROG,
        "Compiles the configured run's train step (each phase; equal shapes once) for a "
        "Cloud TPU slice on this machine (CPU is enough; needs libtpu: pip install -e "
        "'.[aot]') and prints per device: parameters and optimizer state, temporaries and "
        "total against the chip's HBM, whether it fits, XLA's FLOP and byte counts, a "
        "roofline step time, tokens/s, MFU and the run's days. When it does not fit it "
        "tries remat policies, microbatches and FSDP meshes and prints the smallest "
        "change that fits as --gin. flags. Takes the train command's gin files and "
        "overrides; MODEL_DIR, VOCAB_PATH and the corpora need no value.",
        gin_files=(*train_cli.GIN_FILES[:3], *experiment_cli.GIN_FILES, "models/*.gin",
                   "finetune/embeddings.gin"),
        example=f"python -m {PROG} --topology=v4-32 --gin_file=gin/native/meta.gin",
        flags=HELP_FLAGS,
    )


def parse_args(argv: Sequence[str]):
    """(slices, search, gin flags) from the command line; user errors before any work."""
    try:
        flags = gin_cli.parse_gin_flags(argv)
    except ValueError as e:
        raise AotError(str(e)) from None
    own = errors.own_flags_parser(f"python -m {PROG}")
    own.add_argument("--topology", action="append", default=[])
    own.add_argument("--no_search", action="store_true")
    try:
        own, rest = own.parse_known_args(flags.remaining)
    except errors.UsageError as e:
        raise AotError(str(e)) from None
    names = [s for arg in own.topology for s in arg.split(",") if s]
    search = not own.no_search
    if rest:
        raise AotError(f"unknown arguments {rest} (see --help)")
    if not names:
        raise AotError("no --topology given (e.g. --topology=v4-8)")
    if not flags.gin_files:
        raise AotError("no --gin_file given (e.g. --gin_file=gin/native/meta.gin)")
    try:
        slices = [tpu_slice(s) for s in names]
    except UnknownSliceError as e:
        raise AotError(str(e)) from None
    return slices, search, flags


def main(argv: Sequence[str]) -> int:
    """Parses the command line, compiles for each slice and prints the reports."""
    if gin_cli.wants_help(argv):
        print(help_text())
        return 0
    slices, search, flags = parse_args(argv)
    # The host backend only traces and holds abstract arrays: the CPU one. Left to JAX, an
    # installed libtpu would be tried as the host's backend first, and log the errors of a
    # TPU VM it cannot find (TPU_WORKER_HOSTNAMES, accelerator type) before the compile.
    if "JAX_PLATFORMS" not in os.environ:
        jax.config.update("jax_platforms", "cpu")
    # Experiment files import the evaluation code, which starts TensorFlow: started now,
    # without its start-up lines (as the train command does).
    logs.quiet_start(import_tensorflow=True)

    # Not finalized: gin's finalize refuses unset required macros (MODEL_DIR, VOCAB_PATH,
    # the corpora), which the compile never reads.
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths, finalize=False,
                      check_macros=True)
    if evaluation_runs.bound_task() == embedding_config.TASK:
        # gin/finetune/embeddings.gin: the contrastive step, GradCache's mini-batch searched.
        shape = aot_embeddings.configured()
        for tpu in slices:
            results = aot_embeddings.run(shape, tpu, search=search,
                                         say=lambda s: print(s, file=sys.stderr, flush=True))
            print(aot_embeddings.report(shape, tpu, results), flush=True)
        return 0
    try:
        run = configured_run()
    except ValueError as e:
        if isinstance(e, errors.UserError):
            raise
        raise AotError(f"gin config: {errors.first_line(e)}") from None
    for tpu in slices:
        results = run_aot(run, tpu, search=search,
                          say=lambda s: print(s, file=sys.stderr, flush=True))
        print(report(run, tpu, results), flush=True)
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog=PROG)
