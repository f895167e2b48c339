"""Ctrl-C and SIGTERM during training: stop at a step boundary with a checkpoint.

The first SIGINT/SIGTERM only sets a flag; the trainer checks it after each step,
writes a checkpoint of that step, waits for it, and stops with one line saying
where the run resumes. A second signal interrupts at once (a checkpoint being
written is discarded; the previous one stays). On several processes the flag
is agreed collectively at the points the trainer asks, so every host stops at
the same step.

Before the trainer's first step (building the input pipelines, which takes about a
minute for the experiment's 66 languages) there is nothing to save: on one process the first
signal stops at once. Several processes keep to the flag, so that no host leaves the
others waiting in a collective.
"""

from __future__ import annotations

import logging
import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger("xlmeta_jax.train")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StoppedBeforeTraining(KeyboardInterrupt):
    """A signal before the first step: the run stopped at once, with nothing to save.

    A KeyboardInterrupt, so that no ``except Exception`` on the way out catches it.
    """


class StopSignals:
    """Context manager turning the first SIGINT/SIGTERM into a stop request."""

    def __init__(self):
        self._received = 0
        self._previous = {}
        self._at_once = jax.process_count() == 1

    def _handle(self, signum, frame):
        self._received += 1
        if self._at_once:
            self._restore()
            raise StoppedBeforeTraining(
                f"{signal.Signals(signum).name} before training started: nothing was trained "
                f"in this run; rerunning the same command starts where this one would have")
        if self._received == 1:
            log.info("%s received: stopping after this step with a checkpoint (send it again "
                     "to stop now without one)", signal.Signals(signum).name)
            return
        self._restore()
        raise KeyboardInterrupt

    def _restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def defer(self) -> None:
        """From now on (the first step is near) a first signal stops at a step boundary."""
        self._at_once = False

    def __enter__(self) -> StopSignals:
        # Signal handlers can only be installed from the main thread (a notebook's
        # or test's worker thread simply trains without them).
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def requested(self, *, sync_point: bool) -> bool:
        """Whether to stop now.

        Args:
          sync_point: a step where every process calls this (a collective agrees
            on the answer there); elsewhere a multi-process run answers False.
        """
        if jax.process_count() == 1:
            return self._received > 0
        if not sync_point:
            return False

        flags = multihost_utils.process_allgather(np.int32(self._received > 0))
        return bool(np.max(flags))
