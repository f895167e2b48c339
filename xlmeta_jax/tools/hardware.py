"""Peak throughput of known accelerators, for MFU in logs and benchmarks."""

from __future__ import annotations

import jax

# Dense bf16 peak FLOP/s per device, from vendor datasheets (no sparsity).
# NVIDIA: H100/H200 SXM 989.4 TFLOP/s, A100 312 TFLOP/s. Google Cloud TPU docs:
# v4 275, v5e 197, v5p 459, v6e (Trillium) 918 TFLOP/s per chip.
_PEAK_BF16_FLOPS = (
    ("h200", 989.4e12),
    ("h100", 989.4e12),
    ("a100", 312e12),
    ("tpu v6", 918e12),
    ("tpu v5p", 459e12),
    ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12),
    ("tpu v4", 275e12),
)


def peak_flops_per_device(device=None) -> float | None:
    """bf16 dense peak FLOP/s of ``device`` (default: the first device), or None."""
    device = jax.devices()[0] if device is None else device
    kind = getattr(device, "device_kind", "").lower()
    for key, flops in _PEAK_BF16_FLOPS:
        if key in kind:
            return flops
    return None


def device_description(device=None) -> str:
    device = jax.devices()[0] if device is None else device
    return f"{jax.device_count()} x {getattr(device, 'device_kind', device.platform)}"
