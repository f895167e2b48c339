"""Running the project's Apache Beam jobs: the runner, and a worker's input errors.

Beam's own pipeline options choose the runner (``--runner=DataflowRunner``, ``FlinkRunner``,
``SparkRunner``, ...). Without one, a job runs on the engine Beam's DirectRunner runs batch
jobs on (the FnApiRunner, which ``--direct_num_workers`` and ``--direct_running_mode``
set), without the DirectRunner's first try at downloading its Prism runner's binary.

With ``--direct_running_mode=multi_processing`` the local workers are Beam's own worker
started through :mod:`xlmeta_jax.data.beam_worker`, which drops its start-up lines; the
driver drops two of Beam's warnings that are not about the job (:func:`quiet`).

An input error found on a worker (a damaged ``.xz``) is raised as a ``CorpusError``
through every runner's own wrapping of worker failures: :func:`input_error` marks its
message, :func:`run` finds the mark and raises the one line again in the driver.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from xlmeta_jax import errors, library_text
from xlmeta_jax.data import text_files

_MARK, _END = "<<xlmeta-input-error:", ":xlmeta-input-error>>"

# Beam's warnings in the driver that are not about the job, by logger.
_NOISE = {
    # Importing Beam without its BigQuery client (not needed here) warns on the root logger.
    "": (library_text.declare(
        "apitools not found", module="apache_beam.io.gcp.internal.clients.bigquery",
        package="apache-beam", version="2.77.0",
        why="logged at import on the root logger (every library's level); no option"),),
    # A source-text heuristic that flags seqio's PreprocessTask function for the
    # ``return`` of a function nested in it, not a bug.
    "apache_beam.transforms.core": (library_text.declare(
        "Using yield and return in the process method", module="apache_beam.transforms.core",
        package="apache-beam", version="2.77.0",
        why="a level on apache_beam.transforms.core would hide its other warnings (type "
            "hints, deprecations); the check has no option"),),
    # run() starts the local workers itself (below): in Beam's terms that is "in_memory".
    "apache_beam.runners.portability.fn_api_runner.fn_runner": (library_text.declare(
        "If direct_num_workers is not equal to 1",
        module="apache_beam.runners.portability.fn_api_runner.fn_runner",
        package="apache-beam", version="2.77.0",
        why="run() passes in_memory with several workers on purpose (it starts them); the "
            "runner's logger also reports failed stages, so its level stays"),),
}


class _Drop(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def drop_messages(noise: dict[str, tuple[str, ...]]) -> None:
    """Drops the records that loggers (by name; "" the root) log with these beginnings."""
    for name, prefixes in noise.items():
        logging.getLogger(name).addFilter(_Drop(prefixes))


class _DropInputErrors(logging.Filter):
    """Drops a local worker's log records of an input error or a Ctrl-C: run() says the
    one, the command the other, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        interrupted = (message.startswith("KeyboardInterrupt")
                       or bool(record.exc_info and record.exc_info[0]
                               and issubclass(record.exc_info[0], KeyboardInterrupt)))
        return not (interrupted or is_input_error(message))


# Set by a Ctrl-C during run(): the job is being torn down, and what Beam's threads in
# the driver say about the workers that ended is not news (the command says "interrupted").
_STOPPING = threading.Event()


_BEAM_LEVEL = [logging.NOTSET]


def _on_ctrl_c(signum, frame):
    del signum, frame
    _STOPPING.set()
    beam_logger = logging.getLogger("apache_beam")
    _BEAM_LEVEL[0] = beam_logger.level
    beam_logger.setLevel(logging.CRITICAL + 1)
    raise KeyboardInterrupt


def _quiet_threads_when_stopping(previous):
    def hook(args):
        if not _STOPPING.is_set():
            previous(args)
    hook.xlmeta = True
    return hook


def _interrupted(e: BaseException) -> bool:
    """Whether ``e`` is a runner's wrapping of a KeyboardInterrupt (Ctrl-C in a bundle)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt) or str(e).startswith("KeyboardInterrupt"):
            return True
        e = e.__cause__ or e.__context__
    return False


def is_input_error(text: str) -> bool:
    """Whether ``text`` carries an :func:`input_error` (a traceback, a log record)."""
    return _MARK in text


_QUIET = False


def quiet() -> None:
    """Drops Beam's warnings that are not about the job (idempotent; call before
    importing Beam)."""
    global _QUIET
    if not _QUIET:
        drop_messages(_NOISE)
        # Where the DirectRunner logs what its local workers log, and where a worker in
        # this process (one worker, in_memory) logs a failed bundle: for an input error,
        # run() says it in one line.
        for name in ("apache_beam.runners.portability.local_job_service",
                     "apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker"):
            logging.getLogger(name).addFilter(_DropInputErrors())
        _QUIET = True


def input_error(e: text_files.CorpusError) -> RuntimeError:
    """The error a worker raises for ``e``, found again by :func:`run` in the driver."""
    return RuntimeError(f"{_MARK}{e}{_END}")


def check_options(beam_args: Sequence[str]) -> None:
    """Refuses, in one line, a pipeline option that no Beam options class (nor the chosen
    runner's) takes, and a local worker count below 0.

    Beam itself only warns of an unknown option and runs on without it (a mistyped
    ``--workers=0`` would be dropped silently).

    Raises:
      UsageError: naming the option (and the closest one Beam knows).
    """
    quiet()  # before Beam's import, which warns of a BigQuery client it does not need
    from apache_beam.options.pipeline_options import (  # noqa: PLC0415 - the beam extra
        DirectOptions,
        PipelineOptions,
        StandardOptions,
    )

    said = io.StringIO()
    try:
        # Beam's argparse prints its usage (a hundred lines) before it exits on a bad value.
        with contextlib.redirect_stderr(said):
            options = PipelineOptions(list(beam_args))
            runner = options.view_as(StandardOptions).runner
            if runner:
                # Importing the runner registers its options class (Flink's, Dataflow's).
                from apache_beam.runners import create_runner  # noqa: PLC0415

                try:
                    create_runner(runner)
                except ValueError as e:
                    raise errors.UsageError(f"--runner={runner}: {e}") from None
                except ImportError:
                    return  # the runner's extra is missing: Beam names it when the job starts
            # Beam warns of each unknown option ("Discarding unparseable args") and runs on;
            # here the unknown ones are refused in one line instead.
            options_log = logging.getLogger("apache_beam.options.pipeline_options")
            level = options_log.level
            options_log.setLevel(logging.ERROR)
            try:
                known = options.get_all_options()
                every = options.get_all_options(retain_unknown_options=True)
            finally:
                options_log.setLevel(level)
    except SystemExit:
        reason = [line for line in said.getvalue().splitlines() if ": error: " in line]
        raise errors.UsageError("Beam's pipeline options: " + (
            reason[-1].split(": error: ", 1)[1] if reason else f"cannot parse {list(beam_args)}")
        ) from None
    unknown = [name for name in every if name not in known]
    loose = [a for a in beam_args if not a.startswith("-")]
    if unknown or loose:
        flag = (next((a for a in beam_args if a.lstrip("-").split("=")[0] == unknown[0]),
                     f"--{unknown[0]}") if unknown else loose[0])
        close = difflib.get_close_matches(flag.split("=")[0], [f"--{k}" for k in known], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise errors.UsageError(f"{flag} is an option of neither this command nor Apache Beam"
                                f"{hint}")
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:
        raise errors.UsageError(f"--direct_num_workers must be >= 0 (0: one worker per CPU), "
                                f"got {workers}")


def run(build: Callable[[object], None], beam_args: Sequence[str] = (), *,
        tensorflow: bool = False) -> None:
    """Builds a pipeline with ``build(pipeline)`` and runs it to the end.

    Args:
      build: adds the job's transforms to a pipeline.
      beam_args: Beam's pipeline options.
      tensorflow: the job's functions use TensorFlow (local workers import it first,
        without its start-up lines).

    Raises:
      CorpusError: a worker's input error (:func:`input_error`), as one line.
    """
    import apache_beam as beam  # noqa: PLC0415 - the beam extra
    from apache_beam.options.pipeline_options import (  # noqa: PLC0415
        PipelineOptions,
        StandardOptions,
    )

    quiet()
    beam_args = list(beam_args)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # The workers' per-bundle INFO lines would drown the job's own.
        beam_args.append("--default_sdk_harness_log_level=WARNING")
    options = PipelineOptions(beam_args)
    runner = options.view_as(StandardOptions).runner
    if runner in (None, "DirectRunner", "direct"):
        # As Beam's DirectRunner builds it, with the options the workers read.
        from apache_beam.options.pipeline_options import DirectOptions  # noqa: PLC0415
        from apache_beam.portability.api import beam_provision_api_pb2  # noqa: PLC0415
        from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: PLC0415
        from apache_beam.runners.portability.portable_runner import (  # noqa: PLC0415
            JobServiceHandle,
        )
        from apache_beam.transforms import environments  # noqa: PLC0415

        environment, direct = None, options.view_as(DirectOptions)
        if direct.direct_running_mode == "multi_processing":
            # The same worker subprocesses as Beam's multi_processing, started with our
            # command: the runner replaces the environment in that mode, not in in_memory.
            environment = environments.SubprocessSDKEnvironment.from_command_string(
                f"exec {shlex.quote(sys.executable)} -m xlmeta_jax.data.beam_worker"
                + (" --tensorflow" if tensorflow else ""))
            direct.direct_running_mode = "in_memory"
        encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
        runner = fn_runner.FnApiRunner(
            default_environment=environment,
            provision_info=fn_runner.ExtendedProvisionInfo(
                beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))
    if not getattr(threading.excepthook, "xlmeta", False):
        threading.excepthook = _quiet_threads_when_stopping(threading.excepthook)
    if _STOPPING.is_set():  # an earlier job of this process was interrupted
        _STOPPING.clear()
        logging.getLogger("apache_beam").setLevel(_BEAM_LEVEL[0])
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_ctrl_c) if in_main else None
    try:
        with beam.Pipeline(runner=runner, options=options) as pipeline:
            build(pipeline)
    except Exception as e:  # noqa: BLE001 - every runner wraps a worker's error its own way
        found = re.search(re.escape(_MARK) + "(.*?)" + re.escape(_END), str(e), re.S)
        if found:
            raise text_files.CorpusError(found.group(1).strip()) from None
        if _interrupted(e):
            raise KeyboardInterrupt from None
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
