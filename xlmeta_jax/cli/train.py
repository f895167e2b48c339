r"""Command line of the pretraining trainer (the loop itself: :mod:`xlmeta_jax.pretrain.trainer`).

Meta-pretraining (phase 1 on English, phase 2 on the 100-language mixture from
phase 1's final parameters) or the single-phase XLM-R baseline, as gin config:

  python -m xlmeta_jax.train \
    --gin_file=gin/native/meta.gin \
    --gin.MODEL_DIR="'/path/run'" \
    --gin.VOCAB_PATH="'/path/spm.model'"

Rerunning the same command after an interruption resumes where it stopped.
See gin/native/meta.gin, gin/native/xlmr.gin and gin/demo.gin (t5x's own trainer runs
the same experiment from gin/meta.gin: xlmeta_jax/interop/t5x/model.py). Several hosts:
``--coordinator_address=HOST:PORT --process_count=N --process_index=I``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import jax

from xlmeta_jax import errors, hosts, logs
from xlmeta_jax.cli import configurables, peers, runs
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.model import network
from xlmeta_jax.pretrain import trainer

# The trainer's logger: its progress lines are what this command prints.
log = logging.getLogger("xlmeta_jax.train")


def initialize_distributed(argv_rest: Sequence[str], prog: str = "xlmeta_jax.train") -> list[str]:
    """Connects processes with ``jax.distributed`` (t5x-like flags); returns other args.

    Flags: ``--coordinator_address=HOST:PORT --process_count=N --process_index=I``
    (``--local_device_ids`` where one process drives several GPUs). Without them, on a
    cluster JAX detects by itself (:func:`hosts.cluster_environment`: a Cloud TPU VM
    slice, a SLURM step, an Open MPI job), ``jax.distributed.initialize()`` needs no
    flags. One line says what was found. ``prog`` names the command in the line a peer's
    failure ends this process with (:mod:`xlmeta_jax.cli.peers`).
    """
    args, rest = hosts.parse_distributed_flags(argv_rest, prog="xlmeta_jax.train")
    if args.coordinator_address:
        if args.process_count is None or args.process_index is None:
            raise trainer.ConfigError(
                "--coordinator_address needs --process_count and --process_index")
        source, count = "flags", args.process_count
        kwargs = dict(coordinator_address=args.coordinator_address,
                      num_processes=args.process_count, process_id=args.process_index)
    elif (cluster := hosts.cluster_environment()) is not None:
        source, count, kwargs = f"the {cluster.name} environment", cluster.process_count, {}
    else:
        return rest
    if count > 1 and os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", args.cpu_collectives)
    jax.distributed.initialize(local_device_ids=args.local_device_ids, **kwargs)
    peers.watch(prog)
    log.info("jax.distributed from %s: process %d of %d, %d local devices (%s)", source,
             jax.process_index(), jax.process_count(), jax.local_device_count(),
             jax.local_devices()[0].platform)
    return rest


def setup_logging() -> None:
    """Progress lines on stdout (independent of absl's root-logger setup)."""
    logs.show_progress()
    logs.quiet_save_waits()


# The run files (and the model and corpus files added after one) --help lists.
GIN_FILES = ("native/meta.gin", "native/xlmr.gin", "native/continue.gin", "demo.gin",
             "models/*.gin", "data/*.gin")

HELP_FLAGS = (
    ("--coordinator_address=HOST:PORT", "jax.distributed coordinator (multi-process runs; "
     "with --process_count and --process_index; not needed on a TPU VM slice, under srun "
     "or mpirun)"),
    ("--process_count=N", "number of processes"),
    ("--process_index=I", "this process's index"),
    ("--cpu_collectives=gloo", "collectives of multi-process CPU runs"),
    ("--local_device_ids=0,1,..", "this process's GPUs (one process per node)"),
)


def help_text() -> str:
    return gin_cli.help_text(
        "xlmeta_jax.train",
        "Pretrains the encoder: every phase of the run the gin files describe (meta-"
        "pretraining: English, then the 100-language mixture from phase 1's parameters; "
        "the XLM-R baseline: one phase). Rerunning the same command resumes where it "
        "stopped; Ctrl-C stops at a step boundary with a checkpoint.",
        gin_files=GIN_FILES,
        example="python -m xlmeta_jax.train --gin_file=gin/demo.gin "
                "--gin.MODEL_DIR=\"'runs/demo'\"",
        flags=HELP_FLAGS,
    )


def main(argv: Sequence[str]) -> dict:
    """Parses gin flags and runs :func:`xlmeta_jax.pretrain.trainer.train`; returns its summary."""
    if gin_cli.wants_help(argv):
        print(help_text())
        return {}
    setup_logging()
    try:
        flags = gin_cli.parse_gin_flags(argv)
    except ValueError as e:
        raise trainer.ConfigError(str(e)) from None
    rest = initialize_distributed(flags.remaining)
    if rest:
        raise trainer.ConfigError(f"unknown arguments: {rest} (see --help)")
    if not flags.gin_files:
        raise trainer.ConfigError("give at least one --gin_file (e.g. --gin_file=gin/demo.gin)")
    # TensorFlow (the input pipeline's tf.data) imported without its start-up lines, when
    # first needed: a refused input never pays for it.
    logs.quiet_start()
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths,
                      check_macros=True)
    return run_configured()


def run_configured() -> dict:
    """Runs the trainer as the parsed gin config binds it; returns its summary.

    The data the config prepares (the demo's corpus) is written by the trainer, once it
    holds MODEL_DIR and the checks that need no data passed (``prepare``).
    """
    try:
        return runs.train(
            model=configured_model(),
            corpora=configurables.corpora_settings(),
            feeder=configurables.make_mlm_iterator,
            config_text=gin_cli.config_text(),
            describe=configurables.binding_source,
            prepare=runs.prepare_data,
        )
    except TypeError as e:
        # gin's call of train() without a required binding (a hand-written run file).
        # CPython's own TypeError text (compiled, stable since 3.0): gin calls train()
        # itself, so a missing binding arrives as the call's TypeError.
        if "required keyword-only argument" not in str(e):
            raise
        raise trainer.ConfigError(f"{errors.first_line(e)} (bind it in the run's gin file)"
                                  ) from None


def configured_model() -> network.EncoderConfig:
    """``network.get_config()`` with the gin model file's bindings (size and numerics), or
    a released model's own configuration where the run file reads it from its folder
    (gin/native/continue.gin binds ``config_of.path``)."""
    if gin_cli.bound(f"{_RELEASED}.path", None) is not None:
        try:
            return configurables.config_of()
        except FileNotFoundError as e:
            raise trainer.ConfigError(str(e)) from None
    try:
        return configurables.get_config()
    except TypeError as e:
        raise trainer.ConfigError(
            "no model: add a model file (e.g. --gin_file=gin/models/base.gin), which binds "
            f"xlmeta_jax.model.network.get_config.size ({e})"
        ) from None


# The gin name of a released model's configuration (cli/configurables.py).
_RELEASED = "xlmeta_jax.interop.hf.weights.config_of"


def run() -> None:
    """Console entry point (``python -m xlmeta_jax.train`` / ``xlmeta-train``)."""
    errors.exit_with(main, prog="xlmeta_jax.train")


if __name__ == "__main__":
    run()
