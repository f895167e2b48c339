"""Clocks and memory figures shared by the benchmark's runs (ours and Hugging Face's)."""

from __future__ import annotations

import math
import resource
import sys
import time

import jax

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


def compile_clock() -> float:
    """Cumulative trace + lowering + XLA compile seconds of this process."""
    if not _listener_registered[0]:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listener_registered[0] = True
    return _compile_seconds[0]


def max_rss_bytes() -> int:
    """The process's peak resident memory in bytes."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(rss if sys.platform == "darwin" else rss * 1024)


def peak_memory(devices) -> tuple[int, str]:
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
    return max_rss_bytes(), "process max RSS (host; includes everything run before)"


def check_finite(loss: float, what: str) -> float:
    """``loss``, or FloatingPointError naming ``what`` when it is not finite."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"bench: non-finite loss {loss} in {what}")
    return loss


class TimedRun:
    """A training step that ``_run(n)`` runs ``n`` times, waiting for the last."""

    def _run(self, n: int) -> None:
        raise NotImplementedError

    def time_steps(self, n: int) -> float:
        """Mean seconds per step over ``n`` steps dispatched back to back."""
        t0 = time.perf_counter()
        self._run(n)
        return (time.perf_counter() - t0) / n
