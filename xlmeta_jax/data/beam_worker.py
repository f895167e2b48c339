"""Beam's Python SDK worker, as ``--direct_running_mode=multi_processing`` starts it, quiet.

Beam's own worker (``apache_beam.runners.worker.sdk_worker_main``) prints its start-up
on its stderr before its log level applies (a BigQuery client it cannot find, "Logging
handler created", the runner's internal options it does not parse, a missing
session folder), a dozen lines per job that read like failures. This entry point runs
the same ``main`` with those lines dropped; everything else the worker logs still
reaches the runner's log at the job's ``--default_sdk_harness_log_level``, and a worker
that fails still fails the job with its traceback (for an input error, the job's one
line: :func:`xlmeta_jax.data.beam_runs.input_error`). Only the DirectRunner's local
workers run it (:func:`xlmeta_jax.data.beam_runs.run`); Dataflow, Flink and Spark
start their own.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import threading

from xlmeta_jax import logs
from xlmeta_jax.data import beam_runs

# Messages of Beam's start-up, by logger ("": the root), that say nothing about the job.
_START_UP_NOISE = {
    "": ("apitools not found",),
    "apache_beam.runners.worker.sdk_worker_main": (
        "Logging handler created", "No semi_persistent_directory found"),
    # The runner's own options (--direct_runner_use_stacked_bundle, ...) reach its workers.
    "apache_beam.options.pipeline_options": ("Discarding unparseable args",),
}


class _WithoutInputErrors(io.TextIOBase):
    """The worker's stderr, less the tracebacks of input errors (the job's one line)."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        if not beam_runs.is_input_error(text):
            self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()


def _stop(signum, frame) -> None:
    del frame
    # A moment for the driver, which has the same signal, to mark the job as stopping
    # before the workers' ends reach its threads.
    threading.Timer(_GRACE_SECONDS, os._exit, (128 + signum,)).start()


_GRACE_SECONDS = 1.0


def main() -> None:
    """Runs Beam's SDK worker with its start-up lines dropped.

    With ``--tensorflow`` (a job whose functions read TensorFlow, as the token cache's)
    the worker imports TensorFlow first, without its import-time lines.
    """
    # A Ctrl-C at the terminal reaches the whole process group: the driver says
    # "interrupted" and removes what the job wrote; a worker ends at once and quietly
    # (its threads would print their tracebacks, and the bundle it is in could take
    # minutes).
    signal.signal(signal.SIGINT, _stop)
    logs.quiet_start(import_tensorflow="--tensorflow" in sys.argv[1:])
    root = logging.getLogger()
    # A handler on the root logger keeps logging's first warning from adding one that
    # prints on stderr; the worker adds its own, which forwards to the runner.
    root.addHandler(logging.NullHandler())
    # A failed bundle's traceback is printed here and sent to the runner, which ends the
    # job with it: for an input error, that is the job's one line (beam_runs.run).
    sys.stderr = _WithoutInputErrors(sys.stderr)
    beam_runs.drop_messages(_START_UP_NOISE)
    from apache_beam.runners.worker import sdk_worker_main  # noqa: PLC0415 - after the filters

    sdk_worker_main.main(sys.argv)


if __name__ == "__main__":
    main()
