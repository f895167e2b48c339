"""``python -m xlmeta_jax.experiment``: runs the experiment, or prints its plan.

The logic lives in :mod:`xlmeta_jax.experiment.runner`; see the package docstring.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import xlmeta_jax.experiment as experiment_pkg
from xlmeta_jax import gin_cli, trainer
from xlmeta_jax.experiment import runner


class _GinProbeFilter(logging.Filter):
    """Drops gin's "Path not found" records: every include is first looked up under the
    other search paths, and each miss is logged at ERROR although nothing is wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found")


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Parses the command line, then runs the experiment or prints its plan."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(experiment_pkg.__doc__)
        return None
    # Each evaluation parses its task's gin files (with includes) in this process.
    logging.getLogger().addFilter(_GinProbeFilter())
    flags = gin_cli.parse_gin_flags(argv)
    parser = argparse.ArgumentParser(prog="xlmeta_jax.experiment", add_help=False)
    parser.add_argument("--dry_run", action="store_true")
    args, rest = parser.parse_known_args(flags.remaining)
    from xlmeta_jax import train as train_cli

    train_cli.setup_logging()
    rest = train_cli.initialize_distributed(rest)
    if rest:
        raise runner.ExperimentError(
            f"unknown arguments {rest}; use --gin_file, --gin.NAME=VALUE, --gin_bindings, "
            "--gin_search_paths, --dry_run")
    if not flags.gin_files:
        raise runner.ExperimentError(
            "no --gin_file given (e.g. --gin_file=gin/experiments/cpu.gin)")
    # Registers the gin configurables of the corpora and of the evaluations (read by the
    # plan) before the config is locked.
    import xlmeta_jax.corpus  # noqa: F401
    import xlmeta_jax.evaluation.finetuning  # noqa: F401
    import xlmeta_jax.evaluation.retrieval  # noqa: F401

    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths)
    exp = runner.experiment()
    if args.dry_run:
        from xlmeta_jax.experiment.plan import plan

        print(plan(exp))
        return None
    command = "python -m xlmeta_jax.experiment " + " ".join(argv)
    return runner.run(exp, command)


if __name__ == "__main__":
    try:
        main()
    except (runner.ExperimentError, trainer.ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
