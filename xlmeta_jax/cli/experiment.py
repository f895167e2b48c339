"""``python -m xlmeta_jax.experiment``: runs the experiment, or prints its plan.

The logic lives in :mod:`xlmeta_jax.experiment.runner`; see the package docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

from xlmeta_jax import errors, logs
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.experiment import runner

FLAGS = (
    ("--dry_run", "print the plan (every run and evaluation, what is done) and its "
     "estimated time from measured step rates; run nothing"),
    *train_cli.HELP_FLAGS,
)


def help_text() -> str:
    return gin_cli.help_text(
        "xlmeta_jax.experiment",
        "Meta-pretraining against single-phase baselines at equal compute: pretrains every "
        "arm (meta, xlmr, joint, xling_only) x seed, fine-tunes and evaluates each final "
        "checkpoint on the configured tasks, writes results.json, report.md and plots "
        "into MODEL_DIR. Rerunning the same command resumes; nothing finished is redone.",
        gin_files=("experiments/*.gin",),
        example="python -m xlmeta_jax.experiment --gin_file=gin/experiments/cpu.gin "
                "--gin.MODEL_DIR=\"'runs/cpu_experiment'\" --dry_run",
        flags=FLAGS,
    )


def main(argv: Sequence[str]) -> dict | None:
    """Parses the command line, then runs the experiment or prints its plan."""
    argv = list(argv)
    if gin_cli.wants_help(argv):
        print(help_text())
        return None
    train_cli.setup_logging()
    try:
        flags = gin_cli.parse_gin_flags(argv)
    except ValueError as e:
        raise runner.ExperimentError(str(e)) from None
    dry_run = "--dry_run" in flags.remaining
    rest = train_cli.initialize_distributed([a for a in flags.remaining if a != "--dry_run"])
    if rest:
        raise runner.ExperimentError(f"unknown arguments {rest} (see --help)")
    if not flags.gin_files:
        raise runner.ExperimentError(
            "no --gin_file given (e.g. --gin_file=gin/experiments/cpu.gin)")
    logs.quiet_start(import_tensorflow=True)
    # The evaluations' gin configurables (read by the plan) exist before the config locks.
    import xlmeta_jax.cli.configurables  # noqa: F401

    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths, check_macros=True,
                      positive=train_cli.POSITIVE_PARAMETERS)
    exp = runner.experiment()
    if not dry_run:
        # Before the corpus is prepared or anything pretrains: no pod time is spent.
        runner.check_hosts(exp)
    if dry_run:
        from xlmeta_jax.experiment.plan import plan

        print(plan(exp))
        return None
    return runner.run(exp, "python -m xlmeta_jax.experiment " + " ".join(argv))


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.experiment")
