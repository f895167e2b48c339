"""Which process of a multi-host run this is: the distributed flags and the TPU VM's.

Every command that can run on a pod takes the same flags as ``python -m xlmeta_jax.train``
(``--coordinator_address=HOST:PORT --process_count=N --process_index=I``); on Cloud TPU
VMs with several hosts ``TPU_WORKER_HOSTNAMES`` lists them and no flags are needed. The
evaluation commands (fine-tuning, retrieval) run on one host only: they feed host-local
batches to the devices of one process and write MODEL_DIR from it, so started on every
host of a pod they refuse with one line (:func:`require_one_host`) before reading or
writing anything. No jax import here: the check runs before jax starts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from xlmeta_jax import errors


class MultiHostError(errors.UserError, ValueError):
    """A single-host command was started as one of several processes (one line)."""


def parse_distributed_flags(argv: Sequence[str],
                            prog: str) -> tuple[argparse.Namespace, list[str]]:
    """The distributed flags out of ``argv``; returns them and the other arguments."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False)
    parser.add_argument("--coordinator_address", default=None)
    parser.add_argument("--process_count", type=int, default=None)
    parser.add_argument("--process_index", type=int, default=None)
    parser.add_argument("--cpu_collectives", default="gloo",
                        help="collectives implementation for multi-process CPU runs")
    return parser.parse_known_args(list(argv))


def tpu_pod_hosts() -> list[str]:
    """The hosts of this Cloud TPU VM's slice when it has several, else []."""
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return hosts.split(",") if "," in hosts else []


def one_host_message(command: str, index, count: int) -> str:
    """The line a single-host command prints when it is process ``index`` of ``count``."""
    return (f"{command} runs on one host: this is process {index} of {count}; run it on "
            "one host (one VM) with the pretrained checkpoint")


def require_one_host(argv: Sequence[str], command: str) -> list[str]:
    """Refuses to run ``command`` as one of several processes; returns the other arguments.

    Several processes are what ``--process_count`` > 1 or a multi-host TPU VM slice
    (``TPU_WORKER_HOSTNAMES``, the case where ``python -m xlmeta_jax.train`` calls
    ``jax.distributed.initialize()`` without flags) describe. Nothing is initialised: every
    process refuses on its own, without waiting for the others.

    Raises:
      MultiHostError: when this is one of several processes, or the flags are incomplete.
    """
    args, rest = parse_distributed_flags(argv, prog=command)
    if args.coordinator_address and (args.process_count is None or args.process_index is None):
        raise MultiHostError("--coordinator_address needs --process_count and --process_index")
    count, index = args.process_count, args.process_index
    if count is None and tpu_pod_hosts():
        count, index = len(tpu_pod_hosts()), os.environ.get("TPU_WORKER_ID", "?")
    if count is not None and count > 1:
        raise MultiHostError(one_host_message(command, "?" if index is None else index, count))
    return rest
