"""Third-party notices the commands turn into their own lines or drop (xlmeta_jax.logs)."""

import logging

from absl import logging as absl_logging

from xlmeta_jax import logs


def _capture(logger_name):
    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = _Keep()
    logging.getLogger(logger_name).addHandler(handler)
    return records, handler


def test_a_short_save_wait_is_dropped_and_a_long_one_is_a_progress_line():
    logs.quiet_save_waits()
    logs.quiet_save_waits()  # idempotent
    absl_records, absl_handler = _capture("absl")
    ours, our_handler = _capture("xlmeta_jax.train")
    level = logs.progress.level
    logs.progress.setLevel(logging.INFO)
    try:
        # Orbax's own call (orbax/checkpoint/checkpoint_manager.py).
        absl_logging.warning("Waiting for previous save to complete took %f seconds. If this"
                             " number is high, consider checkpointing less frequently.", 3.1)
        assert absl_records == [] and ours == []
        absl_logging.warning("Waiting for previous save to complete took %f seconds. If this"
                             " number is high, consider checkpointing less frequently.",
                             logs.SLOW_SAVE_SECONDS + 1)
        assert absl_records == []
        assert len(ours) == 1 and "checkpoint saves are slow: waited 61 s" in ours[0]
        absl_logging.warning("something else")
        assert absl_records == ["something else"]
    finally:
        logs.progress.setLevel(level)
        logging.getLogger("absl").removeHandler(absl_handler)
        logging.getLogger("xlmeta_jax.train").removeHandler(our_handler)
