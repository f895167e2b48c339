"""Running the project's Apache Beam jobs: the runner, and a worker's input errors.

Beam's own pipeline options choose the runner (``--runner=DataflowRunner``, ``FlinkRunner``,
``SparkRunner``, ...). Without one, a job runs on the engine Beam's DirectRunner runs batch
jobs on (the FnApiRunner, which ``--direct_num_workers`` and ``--direct_running_mode``
set), without the DirectRunner's first try at downloading its Prism runner's binary.

An input error found on a worker (a damaged ``.xz``) is raised as a ``CorpusError``
through every runner's own wrapping of worker failures: :func:`input_error` marks its
message, :func:`run` finds the mark and raises the one line again in the driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from xlmeta_jax.data import text_files

_MARK, _END = "<<xlmeta-input-error:", ":xlmeta-input-error>>"


def input_error(e: text_files.CorpusError) -> RuntimeError:
    """The error a worker raises for ``e``, found again by :func:`run` in the driver."""
    return RuntimeError(f"{_MARK}{e}{_END}")


def run(build: Callable[[object], None], beam_args: Sequence[str] = ()) -> None:
    """Builds a pipeline with ``build(pipeline)`` and runs it to the end.

    Raises:
      CorpusError: a worker's input error (:func:`input_error`), as one line.
    """
    import apache_beam as beam  # noqa: PLC0415 - the beam extra
    from apache_beam.options.pipeline_options import (  # noqa: PLC0415
        PipelineOptions,
        StandardOptions,
    )

    options = PipelineOptions(list(beam_args))
    runner = options.view_as(StandardOptions).runner
    if runner in (None, "DirectRunner", "direct"):
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner  # noqa: PLC0415

        runner = FnApiRunner()
    try:
        with beam.Pipeline(runner=runner, options=options) as pipeline:
            build(pipeline)
    except Exception as e:  # noqa: BLE001 - every runner wraps a worker's error its own way
        found = re.search(re.escape(_MARK) + "(.*?)" + re.escape(_END), str(e), re.S)
        if found:
            raise text_files.CorpusError(found.group(1).strip()) from None
        raise
