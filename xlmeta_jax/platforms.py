"""Which backend a command's JAX picks on a host without TPU chips but with libtpu.

An installed libtpu (the ``aot`` extra, the TPU compiler) is tried first as JAX's
backend, and on a host without TPU chips it logs a TPU VM's set-up errors (``E0000 …
INVALID_ARGUMENT … TPU_WORKER_HOSTNAMES``) before JAX falls back to the CPU. Every
command picks the CPU directly there; setting ``JAX_PLATFORMS`` yourself keeps JAX's
choice. This module imports no JAX, so a command can call it before its heavy imports.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys


def has_nvidia_device() -> bool:
    """Whether the host has an NVIDIA GPU (its device nodes)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def libtpu_without_tpu() -> bool:
    """libtpu is installed, but the host has no TPU chip (TPU VMs: /dev/accel*, /dev/vfio)."""
    if importlib.util.find_spec("libtpu") is None:
        return False
    return not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def prefer_cpu_without_tpu() -> None:
    """Makes JAX use the CPU where libtpu is installed on a host without TPU chips."""
    if ("JAX_PLATFORMS" in os.environ or has_nvidia_device()
            or not libtpu_without_tpu()):
        return
    if "jax" in sys.modules:
        # Takes effect as long as no backend has been initialised yet.
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"
