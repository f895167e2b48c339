"""Ctrl-C and SIGTERM during training: stop at a step boundary with a checkpoint.

The first SIGINT/SIGTERM only sets a flag; the trainer checks it after each step,
writes a checkpoint of that step, waits for it, and stops with one line saying
where the run resumes. A second signal ends the process at once, as ``kill -9``
would and with one line (a checkpoint being written is discarded, the previous
one stays: the run resumes from it, as after any crash). The main thread can be
inside a long C call then (XLA compiling the step, a checkpoint write) where no
Python signal handler runs, so a watcher thread, woken by the signal itself
(``signal.set_wakeup_fd``), ends it when the handler has not within a second.
On several processes the flag is agreed collectively at the points the trainer
asks, so every host stops at the same step.

Before the trainer's first step (building the input pipelines, which takes about a
minute for the experiment's 66 languages) there is nothing to save: on one process the first
signal stops at once. Several processes keep to the flag, so that no host leaves the
others waiting in a collective.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

from xlmeta_jax import errors

log = logging.getLogger("xlmeta_jax.train")

SIGNALS = (signal.SIGINT, signal.SIGTERM)

# How long a second signal may wait for the main thread's handler before the watcher
# thread ends the process itself.
STOP_NOW_GRACE_SECONDS = 1.0


class StoppedBeforeTraining(KeyboardInterrupt):
    """A signal before the first step: the run stopped at once, with nothing to save.

    A KeyboardInterrupt, so that no ``except Exception`` on the way out catches it.
    """


class StopSignals:
    """Context manager turning the first SIGINT/SIGTERM into a stop request."""

    def __init__(self):
        self._received = 0  # signals the Python handler has seen (main thread)
        self._arrived = 0  # signals the watcher has seen (at delivery)
        self._previous = {}
        self._at_once = jax.process_count() == 1
        self._wakeup = None  # (read fd, write fd, previous wakeup fd) while watching
        self._done = threading.Event()

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
        _stop_now(signum)

    def _watch(self, read_fd: int) -> None:
        """Counts signals as they arrive; ends the process on a second one the main
        thread's handler has not taken within the grace period."""
        try:
            while not self._done.is_set():
                data = os.read(read_fd, 64)  # b"" once __exit__ closes the write end
                if not data:
                    return
                for signum in data:
                    if signum not in SIGNALS:
                        continue
                    self._arrived += 1
                    if self._arrived >= 2 and not self._at_once and not self._done.wait(
                            STOP_NOW_GRACE_SECONDS) and self._received < self._arrived:
                        _stop_now(signum)
        except OSError:
            return
        finally:
            os.close(read_fd)  # the watcher's own: never closed under a read in flight

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
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            if previous != -1:  # an event loop's (a notebook's): leave it
                signal.set_wakeup_fd(previous)
                os.close(read_fd)
                os.close(write_fd)
            else:
                self._wakeup = (read_fd, write_fd, previous)
                threading.Thread(target=self._watch, args=(read_fd,), daemon=True,
                                 name="xlmeta-stop-signals").start()
        return self

    def __exit__(self, *exc) -> None:
        self._restore()
        self._done.set()
        if self._wakeup is not None:
            _, write_fd, previous = self._wakeup
            self._wakeup = None
            signal.set_wakeup_fd(previous)
            os.close(write_fd)  # the watcher's read returns b"" and it ends

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


def _stop_now(signum: int) -> None:
    """Ends the process at once with one line, as ``kill -9`` would (nothing is saved)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    name = signal.Signals(signum).name
    os.write(2, (f"xlmeta_jax.train: interrupted: stopped at once on the second {name}, "
                 f"without a checkpoint of this step; rerunning the same command resumes "
                 f"from the last one saved\n").encode())
    os._exit(errors.EXIT_INTERRUPTED)
