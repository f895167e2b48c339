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

    beam_args = list(beam_args)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # The workers' per-bundle INFO lines would drown the job's own.
        beam_args.append("--default_sdk_harness_log_level=WARNING")
    options = PipelineOptions(beam_args)
    runner = options.view_as(StandardOptions).runner
    if runner in (None, "DirectRunner", "direct"):
        # As Beam's DirectRunner builds it, with the options the workers read.
        from apache_beam.portability.api import beam_provision_api_pb2  # noqa: PLC0415
        from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: PLC0415
        from apache_beam.runners.portability.portable_runner import (  # noqa: PLC0415
            JobServiceHandle,
        )

        encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
        runner = fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))
    try:
        with beam.Pipeline(runner=runner, options=options) as pipeline:
            build(pipeline)
    except Exception as e:  # noqa: BLE001 - every runner wraps a worker's error its own way
        found = re.search(re.escape(_MARK) + "(.*?)" + re.escape(_END), str(e), re.S)
        if found:
            raise text_files.CorpusError(found.group(1).strip()) from None
        raise
