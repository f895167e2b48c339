"""What a training step costs and what the hardware offers: model FLOPs and dropout PRNG
draws per input token, the peak throughput and memory of known accelerators, and Cloud
TPU slice names.

For MFU in logs and benchmarks (FLOPs counted from the model configuration and the
batch shape only: no TensorFlow, no tracing), and for the ahead-of-time compile tool
(:mod:`xlmeta_jax.tools.aot`), which turns a slice name such as ``v4-32`` into the
topology libtpu compiles for and judges the result against the chip's datasheet.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax

from xlmeta_jax import errors
from xlmeta_jax.model import network


def mlm_flops_per_token(cfg, length: int, slots: int, *, masked_head: bool = True) -> float:
    """Training FLOPs per input token (forward + backward = 3x forward matmuls).

    Counts matmuls only: QKV/out projections, attention scores and context, MLP (GeGLU:
    three matrices), and the LM head (dense + vocabulary projection) applied at ``slots`` of every
    ``length`` positions when ``masked_head`` (else at every position). ``slots``
    is the batch's prediction slots (``batch["mlm_positions"].shape[1]``, i.e.
    ``mlm.max_predictions(length, masking rate)``).
    """
    h, f, v, n = cfg.hidden_size, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
    family = network.family(cfg)
    # Keys a query attends to: the row, or on a sliding-window layer the window's.
    keys = [family.attended_keys(cfg, i, length) for i in range(n)]
    dense = 2 * (4 * h * h + family.mlp_matrices * h * f)
    layers = sum(dense + 2 * (2 * k * h) for k in keys)
    head_frac = slots / length if masked_head else 1.0
    head = 2 * (h * h + h * v) * head_frac
    return 3.0 * (layers + head)


def dropout_mask_elements_per_token(cfg, length: int, *, attention_dropout: bool = True) -> float:
    """Dropout-mask elements one training step draws per input token.

    The embeddings' and every layer's two hidden-state dropouts draw ``hidden_size``
    elements per token; attention dropout draws ``num_heads * length`` per token and
    layer (one per attention probability). Each element costs one PRNG draw at
    ``dropout_mask_bits=32``, half or a quarter of one at 16 or 8 bits.
    """
    h, n = cfg.hidden_size, cfg.num_layers
    hidden = h * (1 + 2 * n) if cfg.dropout_rate > 0 else 0
    attn = n * cfg.num_heads * length if attention_dropout and cfg.attention_dropout_rate > 0 else 0
    return float(hidden + attn)


# Dense bf16 peak FLOP/s per device, from vendor datasheets (no sparsity).
# NVIDIA: H100/H200 SXM 989.4 TFLOP/s, A100 312 TFLOP/s. Google Cloud TPU docs:
# v4 275, v5e 197, v5p 459, v6e (Trillium) 918 TFLOP/s per chip; v2 and v3 (45 and
# 123 per chip) show one JAX device per TensorCore, i.e. half a chip. JAX names the
# v5p chip "TPU v5" and v5e "TPU v5 lite", so the longer names come first.
_PEAK_BF16_FLOPS = (
    ("h200", 989.4e12),
    ("h100", 989.4e12),
    ("a100", 312e12),
    ("tpu v6", 918e12),
    ("tpu v5p", 459e12),
    ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12),
    ("tpu v5", 459e12),
    ("tpu v4", 275e12),
    ("tpu v3", 61.5e12),
    ("tpu v2", 22.5e12),
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


# ---------------------------------------------------------------------------
# Cloud TPU chips and slices.
# ---------------------------------------------------------------------------

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class TpuChip:
    """Datasheet figures of one TPU generation, per chip."""

    generation: str
    # Name of the generation in libtpu's topology names ("v5p:2x2x1").
    topology_prefix: str
    peak_flops: float
    hbm_bytes: int
    hbm_bandwidth: float
    # TensorCores per chip, and whether JAX shows them as one device (megacore).
    cores_per_chip: int
    megacore: bool
    # Slice names count TensorCores (v2-8 is 4 chips) or chips (v5e-16 is 16).
    name_counts_cores: bool
    # Dimensions of the chip grid (2-D torus or 3-D).
    grid_dims: int
    # Chips of one host, as libtpu's chips_per_host_bounds.
    host_bounds: tuple[int, int, int]

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore else self.cores_per_chip

    @property
    def device_hbm_bytes(self) -> int:
        return self.hbm_bytes // self.devices_per_chip

    @property
    def device_peak_flops(self) -> float:
        return self.peak_flops / self.devices_per_chip

    @property
    def device_hbm_bandwidth(self) -> float:
        return self.hbm_bandwidth / self.devices_per_chip


# Sources: Google Cloud TPU documentation, system architecture of each version
# (cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e, /v5p, /v6e): v2 45 TFLOP/s, 16 GiB at
# 600 GB/s; v3 123 TFLOP/s, 32 GiB at 900 GB/s; v4 275 TFLOP/s, 32 GiB at 1200 GB/s;
# v5e 197 TFLOP/s, 16 GB at 819 GB/s; v5p 459 TFLOP/s, 95 GB at 2765 GB/s; v6e 918
# TFLOP/s, 32 GB at 1640 GB/s (bf16 dense peaks, HBM capacity and bandwidth per chip).
TPU_CHIPS = {
    "v2": TpuChip("v2", "v2", 45e12, 16 * GiB, 600e9, 2, False, True, 2, (2, 2, 1)),
    "v3": TpuChip("v3", "v3", 123e12, 32 * GiB, 900e9, 2, False, True, 2, (2, 2, 1)),
    "v4": TpuChip("v4", "v4", 275e12, 32 * GiB, 1200e9, 2, True, True, 3, (2, 2, 1)),
    "v5e": TpuChip("v5e", "v5e", 197e12, 16 * 10**9, 819e9, 1, False, False, 2, (2, 2, 1)),
    "v5p": TpuChip("v5p", "v5p", 459e12, 95 * 10**9, 2765e9, 2, True, True, 3, (2, 2, 1)),
    "v6e": TpuChip("v6e", "v6e", 918e12, 32 * 10**9, 1640e9, 1, False, False, 2, (2, 2, 1)),
}


class UnknownSliceError(errors.UserError, ValueError):
    """A slice name that is not a Cloud TPU accelerator type this table knows."""


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    """A Cloud TPU slice (``v4-32``) as libtpu compiles for it."""

    name: str
    chip: TpuChip
    chips: int
    # libtpu's topology name ("v4:2x2x4") and its keyword arguments.
    topology_name: str
    chip_config_name: str
    chips_per_host_bounds: tuple[int, int, int]

    @property
    def num_devices(self) -> int:
        return self.chips * self.chip.devices_per_chip

    @property
    def device_word(self) -> str:
        """What one JAX device is on this slice (for reports)."""
        return "chip" if self.chip.devices_per_chip == 1 else "TensorCore"


def _grid(chips: int, dims: int) -> tuple[int, ...]:
    """The chip grid of a power-of-two slice: 2x2(x1) first, then double z, y, x in turn."""
    if dims == 2:
        if chips == 1:
            return (1, 1)
        side = 2 ** (int(math.log2(chips)) // 2)
        return (side, chips // side)
    if chips == 4:
        return (2, 2, 1)
    shape = [2, 2, 2]
    axis = 2
    while math.prod(shape) < chips:
        shape[axis] *= 2
        axis = (axis - 1) % 3
    return tuple(shape)


def tpu_slice(name: str) -> TpuSlice:
    """The slice a Cloud TPU accelerator type names (``v2-8``, ``v4-32``, ``v5e-256``).

    v2, v3, v4 and v5p names count TensorCores (two per chip); v5e and v6e names count
    chips (``v5litepod-16`` is accepted for ``v5e-16``). Sizes are powers of two.

    Raises:
      UnknownSliceError: naming the slice and the accepted forms.
    """
    m = re.fullmatch(r"(v2|v3|v4|v5p|v5e|v5litepod|v6e)-(\d+)", name.strip().lower())
    known = ", ".join(f"{g}-N" for g in TPU_CHIPS)
    if not m:
        raise UnknownSliceError(f"unknown TPU slice {name!r}; expected {known} "
                                "(e.g. v2-8, v4-32, v5e-16, v6e-256)")
    generation = "v5e" if m.group(1) == "v5litepod" else m.group(1)
    chip = TPU_CHIPS[generation]
    count = int(m.group(2))
    chips = count // chip.cores_per_chip if chip.name_counts_cores else count
    smallest = 4 if chip.grid_dims == 3 or chip.name_counts_cores else 1
    if (chip.name_counts_cores and count % chip.cores_per_chip) or chips < smallest or (
            chips & (chips - 1)):
        unit = "TensorCores (2 per chip)" if chip.name_counts_cores else "chips"
        first = smallest * (chip.cores_per_chip if chip.name_counts_cores else 1)
        raise UnknownSliceError(
            f"TPU slice {name!r}: {generation} slice names count {unit}; expected a power of "
            f"two from {generation}-{first}")
    grid = _grid(chips, chip.grid_dims)
    padded = (grid + (1,))[:3]
    # One host holds 4 chips (v5e and v6e: up to 8, as 2x4); larger slices span hosts.
    single_host = chips <= (4 if chip.name_counts_cores else 8)
    bounds = padded if single_host else chip.host_bounds
    return TpuSlice(
        name=f"{generation}-{count}", chip=chip, chips=chips,
        topology_name=f"{chip.topology_prefix}:{'x'.join(map(str, grid))}",
        chip_config_name="megacore" if chip.megacore else "default",
        chips_per_host_bounds=bounds,
    )
