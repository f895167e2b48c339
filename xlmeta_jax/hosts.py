"""Which process of a multi-host run this is: the distributed flags or the cluster's.

Every command that can run on a pod takes the same flags as ``python -m xlmeta_jax.train``
(``--coordinator_address=HOST:PORT --process_count=N --process_index=I``). Without them
the cluster says it (:func:`cluster_environment`), as ``jax.distributed.initialize()``
reads it with no arguments: a Cloud TPU VM slice of several hosts
(``TPU_WORKER_HOSTNAMES``), a SLURM step of several tasks (``srun``: ``SLURM_NTASKS``,
``SLURM_PROCID`` ...), an Open MPI job (``mpirun``). Explicit flags win. The
evaluation commands (fine-tuning, retrieval) run on one host only: they feed host-local
batches to the devices of one process and write MODEL_DIR from it, so started on every
host of a pod they refuse with one line (:func:`require_one_host`) before reading or
writing anything. No jax import here: the check runs before jax starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence

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
    parser.add_argument("--local_device_ids", default=None, type=_device_ids,
                        help="comma-separated GPUs of this process (one process per node: all "
                        "of the node's; default: JAX's, one GPU per process under SLURM)")
    return parser.parse_known_args(list(argv))


def _device_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected device ids >= 0, got {text!r}")
    return ids


@dataclasses.dataclass(frozen=True)
class ClusterEnvironment:
    """A multi-process environment that ``jax.distributed.initialize()`` detects by itself."""

    name: str
    process_count: int
    process_index: int | str  # "?" where the environment does not say


# What JAX's cluster detection (jax._src.clusters) requires of each environment it reads;
# mirrored here, without importing jax, so that a single-host command can refuse at once.
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                   "SLURM_LOCALID")
OPEN_MPI_VARIABLE = "OMPI_MCA_orte_hnp_uri"


def cluster_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment | None:
    """The cluster this process is one of several processes of, else None.

    Args:
      environ: the environment to read (default ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    hosts = environ.get("TPU_WORKER_HOSTNAMES", "")
    if "," in hosts:
        return ClusterEnvironment("Cloud TPU", len(hosts.split(",")),
                                  environ.get("TPU_WORKER_ID", "?"))
    if all(name in environ for name in SLURM_VARIABLES):
        count, index = _integer(environ, "SLURM_NTASKS"), _integer(environ, "SLURM_PROCID")
        if count > 1:
            return ClusterEnvironment("SLURM", count, index)
    if OPEN_MPI_VARIABLE in environ:
        count = _integer(environ, "OMPI_COMM_WORLD_SIZE")
        if count > 1:
            rank = "OMPI_COMM_WORLD_RANK"
            return ClusterEnvironment(
                "Open MPI", count, _integer(environ, rank) if rank in environ else "?")
    return None


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ.get(name, "1"))
    except ValueError:
        raise MultiHostError(f"{name}={environ[name]!r} in the environment: expected an "
                             "integer (is this process started by srun / mpirun?)") from None


def one_host_message(command: str, index, count: int) -> str:
    """The line a single-host command prints when it is process ``index`` of ``count``."""
    return (f"{command} runs on one host: this is process {index} of {count}; run it on "
            "one host (one VM) with the pretrained checkpoint")


def require_one_host(argv: Sequence[str], command: str) -> list[str]:
    """Refuses to run ``command`` as one of several processes; returns the other arguments.

    Several processes are what ``--process_count`` > 1 or, without the flags, a
    cluster environment (:func:`cluster_environment`: where ``python -m xlmeta_jax.train``
    calls ``jax.distributed.initialize()`` without flags) describe. Nothing is initialised: every
    process refuses on its own, without waiting for the others.

    Raises:
      MultiHostError: when this is one of several processes, or the flags are incomplete.
    """
    args, rest = parse_distributed_flags(argv, prog=command)
    if args.coordinator_address and (args.process_count is None or args.process_index is None):
        raise MultiHostError("--coordinator_address needs --process_count and --process_index")
    count, index = args.process_count, args.process_index
    if count is None and (cluster := cluster_environment()) is not None:
        count, index = cluster.process_count, cluster.process_index
    if count is not None and count > 1:
        raise MultiHostError(one_host_message(command, "?" if index is None else index, count))
    return rest
