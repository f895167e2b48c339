"""The benchmark's report: one row per variant (and the Hugging Face peer), and notes."""

from __future__ import annotations

from typing import Any

from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.tools import profiling

PEAK_SOURCE = (
    "vendor datasheets, bf16 dense: NVIDIA H100/H200 SXM 989.4 TFLOP/s, A100 312; "
    "Google Cloud TPU docs: v4 275, v5e 197, v5p 459, v6e 918 (xlmeta_jax/pretrain/hardware.py)"
)


def describe(cfg: EncoderConfig) -> str:
    """The model in a few words, for the report."""
    return (f"{cfg.num_layers} layers x {cfg.hidden_size} wide, {cfg.num_heads} heads, "
            f"{cfg.mlp_dim} MLP, vocabulary {cfg.vocab_size}, {cfg.dtype}")


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
    rows = [("variant", "tokens/s", "step ms", "best ms", "compile s", "TFLOP/s", "MFU",
             "peak mem", "vs first", "ours/HF")]
    for r in report["results"]:
        rows.append((
            r["name"], f"{r['tokens_per_s']:,.0f}", f"{1e3 * r['step_time_s']:.1f}",
            f"{1e3 * r['step_time_best_s']:.1f}",
            f"{r['compile_s']:.1f}", f"{r['model_tflops_per_s']:.4g}",
            "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
            _gib(r["peak_memory_bytes"]), f"{r['ratio_vs_first']:.2f}",
            _fmt(r.get("ratio_vs_hf"), ".2f"),
        ))
    h = report.get("hf")
    if h:
        rows.append((
            f"HF {h.get('model_class', 'XLMRobertaForMaskedLM')}", f"{h['tokens_per_s']:,.0f}",
            f"{1e3 * h['step_time_s']:.1f}", f"{1e3 * h['step_time_best_s']:.1f}", "-",
            f"{h['model_tflops_per_s']:.4g}", "-",
            _gib(h["peak_memory_bytes"]), "-", "1.00",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = report["results"][0]
    o = first["options"]
    notes = [
        f"device: {first['device']} (backend {first['backend']}), mesh {first['mesh']}, "
        f"attention kernel: {first['attention_kernel']}",
        f"model {describe(EncoderConfig(**first['model_config']))}, "
        f"batch {o['batch']} x length {o['length']} = "
        f"{first['tokens_per_step']} tokens/step; {report['rounds']} round(s) of "
        f"{o['steps']} timed steps per run after {o['warmup']} warm-up steps (step ms: median "
        "over rounds, best ms: fastest round; ratios use the median); compile = trace + "
        "lowering + XLA compile of the first call",
    ]
    for r in report["results"]:
        notes.append(
            f"{r['name']}: {r['flops_per_token'] / 1e6:.2f} MFLOP/token (training, matmuls, "
            f"3x forward); LM head counted at {r['lm_head_counted_at']}; MFU: {r['mfu_note']}; "
            f"memory: {r['peak_memory_source']}; dropout masks: "
            f"{r['dropout_draws_per_step'] / 1e6:.1f}M 32-bit PRNG draws/step"
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
    for r in report["results"]:
        if "profile" in r:
            notes += ["", f"{r['name']}: " + profiling.Breakdown(**r["profile"]).format()]
    return "\n".join(lines + [""] + notes)
