"""Training-step benchmark: tokens/s, step time, model TFLOP/s, MFU, memory; HF reference.

Times the real sharded train step of :func:`xlmeta_jax.pretrain.step.make_step_functions`
(masked LM head, AdamW, donated state) on a fixed synthetic MLM batch: the first
call (trace + compile + one step) is reported separately, then ``--warmup`` steps
are run and ``--steps`` steps are timed together, ending with
``jax.block_until_ready``. With torch and transformers importable it also times
Hugging Face's training step of the same family (``XLMRobertaForMaskedLM`` or
``ModernBertForMaskedLM``, :mod:`.bench_hf`) in the same process and prints the ratio
of tokens/s, ours over HF.

The model is the trainer's: a model file of ``gin/models/`` and any ``--gin.``
override of :class:`xlmeta_jax.model.network.EncoderConfig`'s fields (through
``network.get_config``). Examples::

    python -m xlmeta_jax.tools.bench --gin_file=models/small.gin \
        --gin.xlmeta_jax.model.network.get_config.dtype="'float32'" --batch=8 --length=128
    python -m xlmeta_jax.tools.bench --gin_file=models/base.gin --batch=32 --length=512 \
        --json_out=/tmp/bench_base.json
    # The ModernBERT family against transformers' ModernBertForMaskedLM (eager attention):
    python -m xlmeta_jax.tools.bench --gin_file=models/modernbert_tiny.gin --batch=8 \
        --length=256 --hf_attn=eager
    # Several variants in one process (EncoderConfig or bench fields), ratios against
    # the first:
    python -m xlmeta_jax.tools.bench --gin_file=models/small.gin --hf=off \
        --variants="default;full_head=true;scan_layers=false;remat_policy=full"

FLOPs are model FLOPs (matmuls only, forward + backward = 3x forward) from
:func:`xlmeta_jax.pretrain.hardware.mlm_flops_per_token`; the LM head is counted only at the
masked slots, since that is all our step computes. Importing this module imports
neither TensorFlow, seqio, gin nor torch: the library entry points
(:func:`run_ours`, :func:`run`) take an ``EncoderConfig``; the command line reads
gin files (gin-config, a pure-Python package).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any

import jax
import numpy as np

from xlmeta_jax import errors
from xlmeta_jax.data import feeding
from xlmeta_jax.model import mlm, partitioning
from xlmeta_jax.model.network import EncoderConfig, resolve_attention_impl
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import hardware
from xlmeta_jax.pretrain.step import RNG_IMPLS, make_step_functions
from xlmeta_jax.tools import bench_report, profiling, timing
from xlmeta_jax.tools.bench_hf import HFRun, hf_available

# EncoderConfig fields Hugging Face's model has no counterpart for: variants that differ
# from the first only in these are still compared with the HF run.
_NOT_IN_HF = ("scan_layers", "remat_policy", "attention_impl", "dropout_mask_bits",
              "param_dtype")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """How one benchmark run feeds, shards and times the step (the model is separate)."""

    # Global batch size in sequences.
    batch: int = 8
    # Tokens per sequence.
    length: int = 128
    # Mesh axis sizes; one may be -1 (all remaining devices).
    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    # Devices to use (the first N); 0 means all.
    num_devices: int = 0
    # Compute the LM head over the full vocabulary at every position (for comparison).
    full_head: bool = False
    # PRNG of the dropout masks: threefry2x32 (the trainer's default), rbg or unsafe_rbg.
    rng_impl: str = "threefry2x32"
    # Timed steps.
    steps: int = 10
    # Untimed steps after the compiling first call.
    warmup: int = 2
    # Seed of parameters, batch and dropout.
    seed: int = 0

    def __post_init__(self):
        if self.rng_impl not in RNG_IMPLS:
            raise ValueError(f"bench: unknown --rng_impl={self.rng_impl!r}; "
                             f"expected one of {RNG_IMPLS}")
        if self.num_devices < 0:
            raise ValueError(f"bench: --num_devices must be >= 0, got {self.num_devices}")
        for name in ("batch", "length", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"bench: --{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"bench: --warmup must be >= 0, got {self.warmup}")


# ---------------------------------------------------------------------------
# Measurements.
# ---------------------------------------------------------------------------

def attention_kernel(cfg, *, training: bool) -> str:
    """The attention implementation the network runs under ``cfg`` on this backend.

    Mirrors ``network.SelfAttention``: the cuDNN kernel has no dropout, so with
    attention dropout in training the portable XLA path runs instead.
    """
    impl = resolve_attention_impl(cfg.attention_impl, cfg.dtype)
    if impl == "cudnn" and training and cfg.attention_dropout_rate > 0:
        return "xla (cuDNN kernel has no attention dropout)"
    return impl


class OursRun(timing.TimedRun):
    """Our train step for one model and :class:`BenchOptions`: built, compiled and
    warmed up on construction; :meth:`time_steps` times further steps;
    :meth:`summary` reports.
    """

    def __init__(self, cfg: EncoderConfig, opts: BenchOptions):
        self.cfg, self.opts = cfg, opts
        if opts.length > cfg.max_length:
            raise ValueError(
                f"bench: --length={opts.length} exceeds the model's position table "
                f"(max {cfg.max_length} tokens)"
            )
        devices = jax.devices()
        if opts.num_devices:
            if opts.num_devices > len(devices):
                raise ValueError(
                    f"bench: --num_devices={opts.num_devices} but only {len(devices)} "
                    f"{jax.default_backend()} devices exist"
                )
            devices = devices[: opts.num_devices]
        shape = partitioning.mesh_shape_for(
            opts.data, opts.fsdp, opts.tensor, num_devices=len(devices)
        )
        if opts.batch % (shape[0] * shape[1]):
            raise ValueError(
                f"bench: --batch={opts.batch} is not divisible by data x fsdp = "
                f"{shape[0]} x {shape[1]} devices"
            )
        self.mesh_shape = shape
        self.mesh = partitioning.create_mesh(*shape, devices=devices)
        # One warm-up step of the schedule, so the learning rate is non-zero when timed;
        # clipping and the decay mask as the Hugging Face step timed beside it.
        opt_cfg = OptimizerConfig(warmup_steps=1, total_steps=10**6, max_grad_norm=1.0,
                                  decay_all_parameters=False)
        fns = make_step_functions(
            cfg, opt_cfg, self.mesh, seed=opts.seed, full_head=opts.full_head,
            rng_impl=opts.rng_impl,
        )
        host_batch = feeding.mlm_batch(
            np.random.default_rng(opts.seed), opts.batch, opts.length, cfg.vocab_size
        )
        self.slots = host_batch["mlm_positions"].shape[1]
        self.masked_fraction = float(host_batch["weights"].mean())
        features = mlm.FULL_HEAD_FEATURES if opts.full_head else mlm.STEP_FEATURES
        self.batch = {k: jax.device_put(host_batch[k], fns.batch_sharding) for k in features}

        self.state = jax.block_until_ready(fns.init(jax.random.key(opts.seed)))
        compile_before = timing.compile_clock()
        t0 = time.perf_counter()
        # Compiled ahead of time, so the profile can map the executable's ops back to
        # the model (``profile``); it is the same program ``fns.train_step`` runs.
        self.seed = fns.seed_arg()
        self.step = fns.train_step_jit.lower(self.state, self.batch, self.seed).compile()
        self._run(1)
        self.first_step_s = time.perf_counter() - t0
        self.compile_s = timing.compile_clock() - compile_before
        self._run(opts.warmup)
        self.memory = timing.peak_memory(self.mesh.devices.flat)

    def _run(self, n: int) -> None:
        for _ in range(n):
            self.state, self.metrics = self.step(self.state, self.batch, self.seed)
        jax.block_until_ready((self.state, self.metrics))

    def profile(self, trace_dir: str, steps: int = 3) -> profiling.Breakdown:
        """Profiles ``steps`` more steps; the time per model part (and the trace)."""
        return profiling.profile_step(self._run, self.step.as_text(), trace_dir, steps=steps)

    def summary(self, step_time: float) -> dict[str, Any]:
        """The run's figures at ``step_time`` seconds per step."""
        opts, cfg = self.opts, self.cfg
        loss = timing.check_finite(float(self.metrics["loss"]), str(opts))
        tokens = opts.batch * opts.length
        flops_per_token = hardware.mlm_flops_per_token(
            cfg, opts.length, self.slots, masked_head=not opts.full_head
        )
        tflops = flops_per_token * tokens / step_time / 1e12
        n_dev = self.mesh.devices.size
        first = self.mesh.devices.flat[0]
        peak = hardware.peak_flops_per_device(first)
        if peak is None:
            mfu, mfu_note = None, "unknown peak for this backend"
        elif cfg.dtype != "bfloat16":
            mfu, mfu_note = None, f"peak table is bf16 dense; no MFU for {cfg.dtype}"
        else:
            mfu = tflops * 1e12 / (peak * n_dev)
            mfu_note = "model FLOPs / (bf16 dense peak x devices)"
        return {
            "options": dataclasses.asdict(opts),
            "model_config": dataclasses.asdict(cfg),
            "backend": jax.default_backend(),
            "device": hardware.device_description(first),
            "num_devices": int(n_dev),
            "mesh": dict(zip(partitioning.MESH_AXES, self.mesh_shape)),
            "tokens_per_step": tokens,
            "mlm_slots_per_sequence": self.slots,
            "masked_fraction": self.masked_fraction,
            "attention_kernel": attention_kernel(cfg, training=True),
            "first_step_s": self.first_step_s,
            "compile_s": self.compile_s,
            "step_time_s": step_time,
            "tokens_per_s": tokens / step_time,
            "flops_per_token": flops_per_token,
            "lm_head_counted_at": "all positions" if opts.full_head else (
                f"masked slots only ({self.slots} of {opts.length} positions per sequence)"
            ),
            "model_tflops_per_s": tflops,
            # PRNG work of the dropout masks (32-bit draws per step), to read the profile's
            # "dropout masks" row against.
            "dropout_draws_per_step": hardware.dropout_mask_elements_per_token(
                cfg, opts.length) * tokens * cfg.dropout_mask_bits / 32,
            "peak_tflops_per_device": None if peak is None else peak / 1e12,
            "mfu": mfu,
            "mfu_note": mfu_note,
            "peak_memory_bytes": self.memory[0],
            "peak_memory_source": self.memory[1],
            "loss": loss,
        }


def run_ours(cfg: EncoderConfig, opts: BenchOptions) -> dict[str, Any]:
    """Times our train step for ``cfg`` under ``opts`` (``opts.steps`` steps); the summary."""
    r = OursRun(cfg, opts)
    return r.summary(r.time_steps(opts.steps))


# ---------------------------------------------------------------------------
# Variants, report, command line.
# ---------------------------------------------------------------------------

# A named benchmark configuration: (name, model, options).
Variant = tuple[str, EncoderConfig, BenchOptions]


def _parse_value(field: dataclasses.Field, text: str):
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    if kind == "bool":
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"bench: variant value {field.name}={text!r} is not a boolean")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def parse_variants(spec: str, cfg: EncoderConfig, opts: BenchOptions) -> list[Variant]:
    """``"name;key=v,key=v;..."`` -> variants; each part overrides ``cfg`` and ``opts``.

    Keys are :class:`EncoderConfig` fields (``dropout_mask_bits=8``,
    ``scan_layers=false``) or :class:`BenchOptions` fields (``full_head=true``). A
    part without ``=`` (e.g. ``default``) is just a name for the base.
    """
    model_fields = {f.name: f for f in dataclasses.fields(EncoderConfig)}
    run_fields = {f.name: f for f in dataclasses.fields(BenchOptions)}
    out = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        model_over, run_over = {}, {}
        for item in part.split(","):
            if "=" not in item:
                continue
            key, value = (s.strip() for s in item.split("=", 1))
            if key in model_fields:
                model_over[key] = _parse_value(model_fields[key], value)
            elif key in run_fields:
                run_over[key] = _parse_value(run_fields[key], value)
            else:
                raise ValueError(
                    f"bench: unknown option {key!r} in variant {part!r}; expected an "
                    f"EncoderConfig field {sorted(model_fields)} or one of {sorted(run_fields)}"
                )
        out.append((part, cfg.replace(**model_over), dataclasses.replace(opts, **run_over)))
    if not out:
        raise ValueError(f"bench: --variants={spec!r} names no variant")
    return out


def run(
    variants: list[Variant],
    *,
    hf: str = "auto",
    hf_compile: bool = False,
    hf_attn: str = "sdpa",
    rounds: int = 1,
    profile_dir: str = "",
    profile_steps: int = 3,
) -> dict[str, Any]:
    """Times every variant (and HF for the first one's model and batch) in this process.

    All runs are built, compiled and warmed up first; then ``rounds`` rounds each
    time ``steps`` steps of every run in turn, so that ratios between runs see the
    same machine conditions. Step times are the median over rounds.

    Args:
      variants: (name, model, options) triples; ratios are against the first.
      hf: "on" (fail without torch/transformers), "off", or "auto".
      hf_compile: wrap the HF model in ``torch.compile``.
      hf_attn: HF ``attn_implementation`` ("sdpa" or "eager").
      rounds: timing rounds (interleaved over runs).
      profile_dir: when set, each variant then runs ``profile_steps`` more steps under
        ``jax.profiler`` (trace written under ``profile_dir/<variant index>``) and its
        result gets a ``profile``: op time per model part (:mod:`.profiling`).
      profile_steps: steps inside each profile.

    Returns:
      The report: ``results`` (one dict per variant), ``hf`` (or ``hf_skipped``), host.
    """
    if hf not in ("auto", "on", "off"):
        raise ValueError(f"bench: --hf must be auto, on or off, got {hf!r}")
    if rounds < 1:
        raise ValueError(f"bench: --rounds must be >= 1, got {rounds}")
    if hf == "on" and not hf_available():
        raise ImportError("bench: --hf=on needs torch and transformers")
    if profile_dir and profile_steps < 1:
        raise ValueError(f"bench: --profile_steps must be >= 1, got {profile_steps}")
    runs: list[tuple[str | None, Any, int]] = [
        (name, OursRun(cfg, o), o.steps) for name, cfg, o in variants]
    report: dict[str, Any] = {
        "host": {"platform": platform.platform(), "python": platform.python_version(),
                 "jax": jax.__version__, "cpu_count": os.cpu_count()},
        "rounds": rounds,
    }
    _, first_cfg, first = variants[0]
    if hf == "off":
        report["hf_skipped"] = "--hf=off"
    elif not hf_available():
        report["hf_skipped"] = "torch/transformers not importable"
    else:
        hf_run = HFRun(first_cfg, batch=first.batch, length=first.length, warmup=first.warmup,
                       seed=first.seed, compile=hf_compile, attn_implementation=hf_attn)
        runs.append((None, hf_run, first.steps))
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, (_, r, steps) in enumerate(runs):
            times[i].append(r.time_steps(steps))
    summaries = []
    for (name, r, _), t in zip(runs, times):
        s = r.summary(float(np.median(t)))
        s["step_time_rounds_s"] = t
        # The least disturbed round: on a shared machine the better estimate of speed.
        s["step_time_best_s"] = min(t)
        s["tokens_per_s_best"] = s["tokens_per_s"] * s["step_time_s"] / min(t)
        if name is not None:
            s["name"] = name
        summaries.append(s)
    if profile_dir:
        # After the timed rounds, so tracing never disturbs a timing.
        for i, (s, (_, r, _)) in enumerate(zip(summaries, runs)):
            if isinstance(r, OursRun):
                sub = os.path.join(profile_dir, str(i))
                s["profile"] = r.profile(sub, profile_steps).as_dict()
    if "hf_skipped" not in report:
        report["hf"] = summaries.pop()
    results = report["results"] = summaries
    for r in results:
        r["ratio_vs_first"] = r["tokens_per_s"] / results[0]["tokens_per_s"]
        r["ratio_vs_first_best"] = r["tokens_per_s_best"] / results[0]["tokens_per_s_best"]
    if "hf" in report:
        h = report["hf"]

        def seen_by_hf(cfg, o):
            fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_IN_HF}
            return fields, o.batch, o.length

        for r, (_, cfg, o) in zip(results, variants):
            same = seen_by_hf(cfg, o) == seen_by_hf(first_cfg, first)
            r["ratio_vs_hf"] = r["tokens_per_s"] / h["tokens_per_s"] if same else None
            r["ratio_vs_hf_best"] = (
                r["tokens_per_s_best"] / h["tokens_per_s_best"] if same else None
            )
    return report


def _parser() -> argparse.ArgumentParser:
    d = BenchOptions()
    p = errors.ArgumentParser(
        prog="python -m xlmeta_jax.tools.bench",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Time the MLM training step (and Hugging Face's, for reference). The "
                    "model: --gin_file=models/<size>.gin and --gin.NAME=VALUE overrides, "
                    "e.g. --gin.xlmeta_jax.model.network.get_config.dtype=\"'float32'\".",
        epilog="gin files it takes: models/tiny.gin, models/small.gin, models/base.gin, "
               "models/large.gin.  example: python -m xlmeta_jax.tools.bench "
               "--gin_file=models/small.gin --batch=8 --length=128 --hf=off",
    )
    p.add_argument("--batch", type=int, default=d.batch, help="global batch (sequences)")
    p.add_argument("--length", type=int, default=d.length, help="tokens per sequence")
    p.add_argument("--data", type=int, default=d.data, help="mesh 'data' axis size (-1: rest)")
    p.add_argument("--fsdp", type=int, default=d.fsdp, help="mesh 'fsdp' axis size")
    p.add_argument("--tensor", type=int, default=d.tensor, help="mesh 'tensor' axis size")
    p.add_argument("--num_devices", type=int, default=d.num_devices,
                   help="use the first N devices (0: all)")
    p.add_argument("--full_head", action="store_true",
                   help="LM head over the full vocabulary at every position (comparison)")
    p.add_argument("--rng_impl", default=d.rng_impl, choices=RNG_IMPLS,
                   help="PRNG of the dropout masks")
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed steps after compile")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--rounds", type=int, default=1,
                   help="timing rounds, interleaved over variants and HF (median reported)")
    p.add_argument("--variants", default="",
                   help="';'-separated variants of comma-separated key=value overrides of "
                        "EncoderConfig or bench fields, timed in one process "
                        "(e.g. 'default;full_head=true;scan_layers=false')")
    p.add_argument("--hf", default="auto", choices=("auto", "on", "off"),
                   help="also time HF's model of the same family (auto: when importable)")
    p.add_argument("--hf_compile", action="store_true", help="torch.compile the HF model")
    p.add_argument("--hf_attn", default="sdpa", choices=("sdpa", "eager"))
    p.add_argument("--profile_dir", default="",
                   help="after timing, profile each variant: trace written here, op time "
                        "per model part printed (TensorBoard/Perfetto open the trace)")
    p.add_argument("--profile_steps", type=int, default=3, help="steps inside each profile")
    p.add_argument("--json_out", default="", help="also write the report as JSON here")
    errors.add_debug_flag(p)
    return p


def _gin_cli():
    try:
        from xlmeta_jax.cli import flags as gin_cli  # noqa: PLC0415 - gin is absent on hosts that only benchmark
    except ImportError as e:
        raise ImportError("bench: the command line reads gin/models/*.gin and needs "
                          "gin-config (pip install gin-config)") from e
    return gin_cli


def model_from_gin(gin_files, bindings, search_paths=()) -> EncoderConfig:
    """The trainer's model configuration from gin files and bindings.

    Raises:
      ValueError: when no model file names a size (``network.get_config.size``).
    """
    gin_cli = _gin_cli()
    gin = gin_cli.gin
    gin.clear_config()
    gin_cli.apply_gin(gin_files, bindings, search_paths, finalize=False)
    try:
        gin.query_parameter("xlmeta_jax.model.network.get_config.size")
    except ValueError:
        raise ValueError("bench: no model size; give a model file, e.g. "
                         "--gin_file=models/small.gin") from None
    return gin.get_configurable("xlmeta_jax.model.network.get_config")()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m xlmeta_jax.tools.bench``; returns the report dict."""
    argv = sys.argv[1:] if argv is None else list(argv)
    flags = _gin_cli().parse_gin_flags(argv)
    args = _parser().parse_args(flags.remaining)
    cfg = model_from_gin(flags.gin_files, flags.bindings, flags.search_paths)
    fields = {f.name for f in dataclasses.fields(BenchOptions)}
    base = BenchOptions(**{k: v for k, v in vars(args).items() if k in fields})
    variants = (parse_variants(args.variants, cfg, base) if args.variants
                else [("default", cfg, base)])
    report = run(variants, hf=args.hf, hf_compile=args.hf_compile, hf_attn=args.hf_attn,
                 rounds=args.rounds, profile_dir=args.profile_dir,
                 profile_steps=args.profile_steps)
    report["command"] = "python -m xlmeta_jax.tools.bench " + " ".join(argv)
    print(bench_report.format_report(report), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json_out}")
    return report


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.bench")
