"""Training-step benchmark: tokens/s, step time, model TFLOP/s, MFU, memory; HF reference.

Times the real sharded train step of :func:`xlmeta_jax.step.make_step_functions`
(masked LM head, AdamW, donated state) on a fixed synthetic MLM batch: the first
call (trace + compile + one step) is reported separately, then ``--warmup`` steps
are run and ``--steps`` steps are timed together, ending with
``jax.block_until_ready``. With torch and transformers importable it also times
Hugging Face's ``XLMRobertaForMaskedLM`` training step (AdamW, same sizes, same
masked positions as labels, LM head over every position as HF computes it) in the
same process and prints the ratio of tokens/s, ours over HF.

Examples::

    python -m xlmeta_jax.bench --size=small --batch=8 --length=128 --dtype=fp32
    python -m xlmeta_jax.bench --size=base --batch=32 --length=512 --dtype=bf16 \\
        --json_out=/tmp/bench_base.json
    # Several variants in one process, ratios against the first:
    python -m xlmeta_jax.bench --size=small --dtype=fp32 --hf=off \\
        --variants="masked;full_head=true;scan=false;remat=full"

FLOPs are model FLOPs (matmuls only, forward + backward = 3x forward) from
:func:`xlmeta_jax.losses.mlm_flops_per_token`; the LM head is counted only at the
masked slots, since that is all our step computes. Imports neither TensorFlow nor
seqio; torch and transformers only when the HF comparison runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import resource
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from xlmeta_jax import hardware, losses, partitioning
from xlmeta_jax.network import SIZES, get_config
from xlmeta_jax.optimizer import OptimizerConfig, linear_warmup_linear_decay
from xlmeta_jax.step import TrainState, make_step_functions

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
_REMAT = ("none", "full", "dots", "dots_no_batch", "save_named")
PEAK_SOURCE = (
    "vendor datasheets, bf16 dense: NVIDIA H100/H200 SXM 989.4 TFLOP/s, A100 312; "
    "Google Cloud TPU docs: v4 275, v5e 197, v5p 459, v6e 918 (xlmeta_jax/hardware.py)"
)


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """One benchmark configuration."""

    # Named model size: tiny, small, base or large.
    size: str = "small"
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
    # Compute dtype (parameters and optimizer state stay fp32): bf16 or fp32.
    dtype: str = "bf16"
    # Stack layers with nn.scan.
    scan: bool = True
    # Rematerialisation policy of each layer.
    remat: str = "none"
    # Attention kernel: xla, cudnn or auto (cudnn on GPU).
    attention: str = "auto"
    # Dropout as configured for the size (False: all dropout rates 0; compiles faster on CPU).
    dropout: bool = True
    # Compute the LM head over the full vocabulary at every position (for comparison).
    full_head: bool = False
    # Timed steps.
    steps: int = 10
    # Untimed steps after the compiling first call.
    warmup: int = 2
    # Seed of parameters, batch and dropout.
    seed: int = 0

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"bench: unknown --size={self.size!r}; expected one of {SIZES}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"bench: unknown --dtype={self.dtype!r}; expected bf16 or fp32")
        if self.remat not in _REMAT:
            raise ValueError(f"bench: unknown --remat={self.remat!r}; expected one of {_REMAT}")
        if self.attention not in ("xla", "cudnn", "auto"):
            raise ValueError(f"bench: unknown --attention={self.attention!r}")
        if self.num_devices < 0:
            raise ValueError(f"bench: --num_devices must be >= 0, got {self.num_devices}")
        for name in ("batch", "length", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"bench: --{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"bench: --warmup must be >= 0, got {self.warmup}")

    def model_config(self):
        no_dropout = {} if self.dropout else dict(dropout_rate=0.0, attention_dropout_rate=0.0)
        return get_config(
            self.size,
            **no_dropout,
            dtype=_DTYPES[self.dtype],
            param_dtype="float32",
            scan_layers=self.scan,
            remat_policy=self.remat,
            attention_impl=self.attention,
        )


# ---------------------------------------------------------------------------
# Measurements.
# ---------------------------------------------------------------------------

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_compile_seconds = [0.0]
_listener_registered = [False]


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event in _COMPILE_EVENTS:
        _compile_seconds[0] += duration


def _compile_clock() -> float:
    """Cumulative trace + lowering + XLA compile seconds of this process."""
    if not _listener_registered[0]:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listener_registered[0] = True
    return _compile_seconds[0]


def _max_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _peak_memory(devices) -> tuple[int, str]:
    """Peak bytes in use on the busiest device, or the process max RSS on CPU."""
    peaks = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # noqa: BLE001 - backends without the query
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(stats["peak_bytes_in_use"])
    if peaks:
        return int(max(peaks)), "device peak_bytes_in_use (max over devices)"
    return _max_rss_bytes(), "process max RSS (host; includes everything run before)"


def _mesh_context(mesh):
    # jax >= 0.7 spells it set_mesh; older releases use the Mesh context manager.
    set_mesh = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
    return set_mesh(mesh) if set_mesh else mesh


def _full_head_step(fns, opt_cfg: OptimizerConfig, seed: int):
    """The train step of ``fns`` with the LM head over every position.

    Same model, optimizer, shardings, donation and metrics as ``xlmeta_jax.step``;
    only the loss differs (full-vocabulary logits at all ``length`` positions, loss
    on the masked ones through the full-length ``targets``/``weights``).
    """
    model, tx, mesh = fns.model, fns.tx, fns.mesh
    schedule = linear_warmup_linear_decay(opt_cfg)
    base_key = jax.random.key(seed)
    features = ("inputs", "targets", "weights")

    def step_fn(state, batch):
        dropout_key = jax.random.fold_in(base_key, state.step)

        def loss_fn(params):
            logits = model.apply(
                {"params": params}, batch["inputs"], deterministic=False,
                rngs={"dropout": dropout_key},
            )
            loss_sum, weight_sum, correct = losses.weighted_cross_entropy(
                logits, batch["targets"], batch["weights"]
            )
            denom = jnp.maximum(weight_sum, 1.0)
            return loss_sum / denom, {"loss": loss_sum / denom, "accuracy": correct / denom}

        with partitioning.axis_rules_context():
            (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["param_norm"] = optax.global_norm(params)
        metrics["learning_rate"] = schedule(state.step)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    jitted = jax.jit(
        step_fn,
        in_shardings=(fns.state_sharding, {k: fns.batch_sharding for k in features}),
        out_shardings=(fns.state_sharding, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=(0,),
    )

    def run(state, batch):
        with _mesh_context(mesh):
            return jitted(state, {k: batch[k] for k in features})

    return run


def run_ours(opts: BenchOptions) -> dict[str, Any]:
    """Times our train step under ``opts``; returns the measurements."""
    cfg = opts.model_config()
    if opts.length > cfg.max_length:
        raise ValueError(
            f"bench: --length={opts.length} exceeds the {opts.size} position table "
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
    mesh = partitioning.create_mesh(*shape, devices=devices)
    # Warm-up long enough that the learning rate is non-zero during timing.
    opt_cfg = OptimizerConfig(warmup_steps=1, total_steps=10**6)
    fns = make_step_functions(cfg, opt_cfg, mesh, seed=opts.seed)
    slots = losses.max_predictions_for_length(opts.length)
    host_batch = losses.synthetic_mlm_batch(
        np.random.default_rng(opts.seed), opts.batch, opts.length, cfg.vocab_size, slots=slots
    )
    batch = {k: jax.device_put(v, fns.batch_sharding) for k, v in host_batch.items()}
    step = _full_head_step(fns, opt_cfg, opts.seed) if opts.full_head else fns.train_step

    state = jax.block_until_ready(fns.init(jax.random.key(opts.seed)))
    compile_before = _compile_clock()
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    first_step_s = time.perf_counter() - t0
    compile_s = _compile_clock() - compile_before
    for _ in range(opts.warmup):
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    t0 = time.perf_counter()
    for _ in range(opts.steps):
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    step_time = (time.perf_counter() - t0) / opts.steps
    loss = float(metrics["loss"])
    if not math.isfinite(loss):
        raise FloatingPointError(f"bench: non-finite loss {loss} under {opts}")

    tokens = opts.batch * opts.length
    flops_per_token = losses.mlm_flops_per_token(
        cfg, opts.length, slots, masked_head=not opts.full_head
    )
    tflops = flops_per_token * tokens / step_time / 1e12
    n_dev = mesh.devices.size
    peak = hardware.peak_flops_per_device(mesh.devices.flat[0])
    if peak is None:
        mfu, mfu_note = None, "unknown peak for this backend"
    elif opts.dtype != "bf16":
        mfu, mfu_note = None, "peak table is bf16 dense; no MFU for fp32"
    else:
        mfu, mfu_note = tflops * 1e12 / (peak * n_dev), "model FLOPs / (bf16 dense peak x devices)"
    mem, mem_source = _peak_memory(mesh.devices.flat)
    return {
        "options": dataclasses.asdict(opts),
        "backend": jax.default_backend(),
        "device": hardware.device_description(mesh.devices.flat[0]),
        "num_devices": int(n_dev),
        "mesh": dict(zip(partitioning.MESH_AXES, shape)),
        "tokens_per_step": tokens,
        "mlm_slots_per_sequence": slots,
        "masked_fraction": float(host_batch["weights"].mean()),
        "first_step_s": first_step_s,
        "compile_s": compile_s,
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time,
        "flops_per_token": flops_per_token,
        "lm_head_counted_at": "all positions" if opts.full_head else (
            f"masked slots only ({slots} of {opts.length} positions per sequence)"
        ),
        "model_tflops_per_s": tflops,
        "peak_tflops_per_device": None if peak is None else peak / 1e12,
        "mfu": mfu,
        "mfu_note": mfu_note,
        "peak_memory_bytes": mem,
        "peak_memory_source": mem_source,
        "loss": loss,
    }


def hf_available() -> bool:
    """True when torch and transformers import."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def run_hf(opts: BenchOptions, *, compile: bool = False,
           attn_implementation: str = "sdpa") -> dict[str, Any]:
    """Times Hugging Face's XLMRobertaForMaskedLM training step under ``opts``.

    Same sizes, batch and masked positions (labels -100 elsewhere); AdamW with
    RoBERTa's betas/eps/decay without decay on biases and LayerNorms, gradient
    clipping at 1.0, dropout on; bf16 through autocast (fp32 weights), as HF's
    Trainer does. HF computes the LM head at every position.
    """
    import torch
    import transformers

    from xlmeta_jax import hf

    cfg = opts.model_config()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(opts.seed)
    hf_cfg = transformers.XLMRobertaConfig(**hf.hf_config_from_config(cfg))
    model = transformers.XLMRobertaForMaskedLM._from_config(
        hf_cfg, attn_implementation=attn_implementation
    ).to(device).train()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name
         else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.98), eps=1e-6,
    )
    slots = losses.max_predictions_for_length(opts.length)
    host = losses.synthetic_mlm_batch(
        np.random.default_rng(opts.seed), opts.batch, opts.length, cfg.vocab_size, slots=slots
    )
    ids = torch.from_numpy(host["inputs"].astype(np.int64)).to(device)
    labels = torch.from_numpy(
        np.where(host["weights"] > 0, host["targets"], -100).astype(np.int64)
    ).to(device)
    mask = torch.ones_like(ids)
    forward = torch.compile(model) if compile else model
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16,
                              enabled=opts.dtype == "bf16")

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def step():
        with autocast:
            loss = forward(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step()
    sync()
    first_step_s = time.perf_counter() - t0
    for _ in range(opts.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(opts.steps):
        loss = step()
    sync()
    step_time = (time.perf_counter() - t0) / opts.steps
    loss = float(loss.detach())
    tokens = opts.batch * opts.length
    # HF's own computation: LM head at every position.
    flops_per_token = losses.mlm_flops_per_token(cfg, opts.length, slots, masked_head=False)
    if device == "cuda":
        mem, mem_source = torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    else:
        mem, mem_source = _max_rss_bytes(), "process max RSS (host; includes the JAX run)"
    return {
        "framework": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "device": device,
        "compile": compile,
        "attn_implementation": attn_implementation,
        "torch_threads": torch.get_num_threads(),
        "first_step_s": first_step_s,
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time,
        "flops_per_token": flops_per_token,
        "lm_head_counted_at": "all positions",
        "model_tflops_per_s": flops_per_token * tokens / step_time / 1e12,
        "peak_memory_bytes": int(mem),
        "peak_memory_source": mem_source,
        "loss": loss,
    }


# ---------------------------------------------------------------------------
# Variants, report, command line.
# ---------------------------------------------------------------------------


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
    return text


def parse_variants(spec: str, base: BenchOptions) -> list[tuple[str, BenchOptions]]:
    """``"name;key=v,key=v;..."`` -> named options; each part overrides ``base``.

    A part without ``=`` (e.g. ``masked``) is just a name for ``base``.
    """
    fields = {f.name: f for f in dataclasses.fields(BenchOptions)}
    out = []
    for part in (p.strip() for p in spec.split(";")):
        if not part:
            continue
        overrides = {}
        for item in part.split(","):
            if "=" not in item:
                continue
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in fields:
                raise ValueError(
                    f"bench: unknown option {key!r} in variant {part!r}; expected one of "
                    f"{sorted(fields)}"
                )
            overrides[key] = _parse_value(fields[key], value)
        out.append((part, dataclasses.replace(base, **overrides)))
    if not out:
        raise ValueError(f"bench: --variants={spec!r} names no variant")
    return out


def _fmt(x, spec=".3g"):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _gib(n):
    return f"{n / 2**30:.2f} GiB"


def format_report(report: dict[str, Any]) -> str:
    """The results as a text table plus notes."""
    rows = [("variant", "tokens/s", "step ms", "compile s", "TFLOP/s", "MFU",
             "peak mem", "vs first", "ours/HF")]
    for r in report["results"]:
        rows.append((
            r["name"], f"{r['tokens_per_s']:,.0f}", f"{1e3 * r['step_time_s']:.1f}",
            f"{r['compile_s']:.1f}", f"{r['model_tflops_per_s']:.4g}",
            "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
            _gib(r["peak_memory_bytes"]), f"{r['ratio_vs_first']:.2f}",
            _fmt(r.get("ratio_vs_hf"), ".2f"),
        ))
    h = report.get("hf")
    if h:
        rows.append((
            "HF XLMRobertaForMaskedLM", f"{h['tokens_per_s']:,.0f}",
            f"{1e3 * h['step_time_s']:.1f}", "-", f"{h['model_tflops_per_s']:.4g}", "-",
            _gib(h["peak_memory_bytes"]), "-", "1.00",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = report["results"][0]
    o = first["options"]
    notes = [
        f"device: {first['device']} (backend {first['backend']}), mesh {first['mesh']}",
        f"model {o['size']}, batch {o['batch']} x length {o['length']} = "
        f"{first['tokens_per_step']} tokens/step, {o['steps']} timed steps after "
        f"{o['warmup']} warm-up steps; compile = trace + lowering + XLA compile of the "
        "first call",
    ]
    for r in report["results"]:
        notes.append(
            f"{r['name']}: {r['flops_per_token'] / 1e6:.2f} MFLOP/token (training, matmuls, "
            f"3x forward); LM head counted at {r['lm_head_counted_at']}; MFU: {r['mfu_note']}; "
            f"memory: {r['peak_memory_source']}"
        )
    notes.append(f"peak FLOP/s source: {PEAK_SOURCE}")
    if h:
        notes.append(
            f"HF: {h['framework']} on {h['device']} ({h['attn_implementation']} attention, "
            f"compile={h['compile']}), LM head at all positions "
            f"({h['flops_per_token'] / 1e6:.2f} MFLOP/token), labels -100 except the same "
            f"masked positions; ours/HF = ratio of tokens/s"
        )
    elif report.get("hf_skipped"):
        notes.append(f"HF comparison skipped: {report['hf_skipped']}")
    return "\n".join(lines + [""] + notes)


def run(
    variants: list[tuple[str, BenchOptions]],
    *,
    hf: str = "auto",
    hf_compile: bool = False,
    hf_attn: str = "sdpa",
) -> dict[str, Any]:
    """Runs every variant (ours), then HF for the first one; returns the report.

    Args:
      variants: (name, options) pairs; ratios are against the first.
      hf: "on" (fail without torch/transformers), "off", or "auto".
      hf_compile: wrap the HF model in ``torch.compile``.
      hf_attn: HF ``attn_implementation`` ("sdpa" or "eager").
    """
    if hf not in ("auto", "on", "off"):
        raise ValueError(f"bench: --hf must be auto, on or off, got {hf!r}")
    if hf == "on" and not hf_available():
        raise ImportError("bench: --hf=on needs torch and transformers")
    results = []
    for name, opts in variants:
        r = run_ours(opts)
        r["name"] = name
        results.append(r)
    base = results[0]["tokens_per_s"]
    for r in results:
        r["ratio_vs_first"] = r["tokens_per_s"] / base
    report: dict[str, Any] = {
        "results": results,
        "host": {"platform": platform.platform(), "python": platform.python_version(),
                 "jax": jax.__version__},
    }
    if hf == "off":
        report["hf_skipped"] = "--hf=off"
    elif not hf_available():
        report["hf_skipped"] = "torch/transformers not importable"
    else:
        first = variants[0][1]
        h = run_hf(first, compile=hf_compile, attn_implementation=hf_attn)
        report["hf"] = h
        comparable = ("size", "batch", "length", "dtype")
        for r, (_, opts) in zip(results, variants):
            same = all(getattr(opts, k) == getattr(first, k) for k in comparable)
            r["ratio_vs_hf"] = r["tokens_per_s"] / h["tokens_per_s"] if same else None
    return report


def _parser() -> argparse.ArgumentParser:
    d = BenchOptions()
    p = argparse.ArgumentParser(
        prog="python -m xlmeta_jax.bench",
        description="Time the MLM training step (and Hugging Face's, for reference).",
    )
    p.add_argument("--size", default=d.size, choices=SIZES)
    p.add_argument("--batch", type=int, default=d.batch, help="global batch (sequences)")
    p.add_argument("--length", type=int, default=d.length, help="tokens per sequence")
    p.add_argument("--data", type=int, default=d.data, help="mesh 'data' axis size (-1: rest)")
    p.add_argument("--fsdp", type=int, default=d.fsdp, help="mesh 'fsdp' axis size")
    p.add_argument("--tensor", type=int, default=d.tensor, help="mesh 'tensor' axis size")
    p.add_argument("--num_devices", type=int, default=d.num_devices,
                   help="use the first N devices (0: all)")
    p.add_argument("--dtype", default=d.dtype, choices=tuple(_DTYPES),
                   help="compute dtype; parameters stay fp32")
    p.add_argument("--scan", default=d.scan, action=argparse.BooleanOptionalAction,
                   help="stack layers with nn.scan")
    p.add_argument("--remat", default=d.remat, choices=_REMAT, help="per-layer remat policy")
    p.add_argument("--attention", default=d.attention, choices=("xla", "cudnn", "auto"))
    p.add_argument("--dropout", default=d.dropout, action=argparse.BooleanOptionalAction,
                   help="dropout as in pretraining (--no-dropout: rates 0, for quick CPU runs)")
    p.add_argument("--full_head", action="store_true",
                   help="LM head over the full vocabulary at every position (comparison)")
    p.add_argument("--steps", type=int, default=d.steps, help="timed steps")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed steps after compile")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--variants", default="",
                   help="';'-separated variants of comma-separated key=value overrides, "
                        "timed in one process (e.g. 'masked;full_head=true;scan=false')")
    p.add_argument("--hf", default="auto", choices=("auto", "on", "off"),
                   help="also time HF XLMRobertaForMaskedLM (auto: when importable)")
    p.add_argument("--hf_compile", action="store_true", help="torch.compile the HF model")
    p.add_argument("--hf_attn", default="sdpa", choices=("sdpa", "eager"))
    p.add_argument("--json_out", default="", help="also write the report as JSON here")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m xlmeta_jax.bench``; returns the report dict."""
    args = _parser().parse_args(argv)
    fields = {f.name for f in dataclasses.fields(BenchOptions)}
    base = BenchOptions(**{k: v for k, v in vars(args).items() if k in fields})
    variants = parse_variants(args.variants, base) if args.variants else [("ours", base)]
    report = run(variants, hf=args.hf, hf_compile=args.hf_compile, hf_attn=args.hf_attn)
    report["command"] = "python -m xlmeta_jax.bench " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    print(format_report(report))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json_out}")
    return report


if __name__ == "__main__":
    main()
