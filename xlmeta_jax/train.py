r"""Command line of the pretraining trainer (the loop itself: :mod:`xlmeta_jax.trainer`).

Meta-pretraining (phase 1 on English, phase 2 on the 100-language mixture from
phase 1's final parameters) or the single-phase XLM-R baseline, as gin config:

  python -m xlmeta_jax.train \
    --gin_file=gin/meta.gin \
    --gin.MODEL_DIR="'/path/run'" \
    --gin.VOCAB_PATH="'/path/spm.model'"

Rerunning the same command after an interruption resumes where it stopped.
See gin/meta.gin, gin/xlmr.gin and gin/demo.gin. Several hosts:
``--coordinator_address=HOST:PORT --process_count=N --process_index=I``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import jax

from xlmeta_jax import gin_cli, trainer

# The trainer's logger: its progress lines are what this command prints.
log = logging.getLogger("xlmeta_jax.train")


def initialize_distributed(argv_rest: Sequence[str]) -> list[str]:
    """Connects processes with ``jax.distributed`` (t5x-like flags); returns other args.

    Flags: ``--coordinator_address=HOST:PORT --process_count=N --process_index=I``.
    On Cloud TPU VMs with several hosts, ``jax.distributed.initialize()`` needs no flags.
    """
    parser = argparse.ArgumentParser(prog="xlmeta_jax.train", add_help=False)
    parser.add_argument("--coordinator_address", default=None)
    parser.add_argument("--process_count", type=int, default=None)
    parser.add_argument("--process_index", type=int, default=None)
    parser.add_argument("--cpu_collectives", default="gloo",
                        help="collectives implementation for multi-process CPU runs")
    args, rest = parser.parse_known_args(list(argv_rest))
    if args.coordinator_address:
        if args.process_count is None or args.process_index is None:
            raise trainer.ConfigError(
                "--coordinator_address needs --process_count and --process_index")
        if args.process_count > 1 and os.environ.get("JAX_PLATFORMS", "") == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", args.cpu_collectives)
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address,
            num_processes=args.process_count,
            process_id=args.process_index,
        )
    elif "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
        jax.distributed.initialize()
    return rest


def setup_logging() -> None:
    """Progress lines on stdout (independent of absl's root-logger setup)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str]) -> dict:
    """Parses gin flags and runs :func:`xlmeta_jax.trainer.train`; returns its summary."""
    setup_logging()
    flags = gin_cli.parse_gin_flags(argv)
    rest = initialize_distributed(flags.remaining)
    if rest:
        raise trainer.ConfigError(f"unknown arguments: {rest}")
    if not flags.gin_files:
        raise trainer.ConfigError("give at least one --gin_file (e.g. --gin_file=gin/demo.gin)")
    # The input pipeline's gin configurables (xlmeta_jax.corpus) come with the trainer and
    # need no TensorFlow; hosts without it can still train on the synthetic stream.
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths)
    return trainer.train()


def run() -> None:
    """Console entry point (``python -m xlmeta_jax.train`` / ``xlmeta-train``)."""
    main(sys.argv[1:])


if __name__ == "__main__":
    run()
