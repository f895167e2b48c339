"""Ctrl-C during training (xlmeta_jax.pretrain.signals): a second signal ends the run at
once with one line, also while the main thread is inside a long C call (XLA compiling)."""

from __future__ import annotations

import os
import subprocess
import sys

from xlmeta_jax import errors

# The main thread blocks SIGINT and sleeps in libc: signals go to another thread and no
# Python handler runs until the call returns (as in a compile of minutes on a TPU host).
_STUCK = """
import ctypes, os, signal, time
from xlmeta_jax.pretrain import signals
with signals.StopSignals() as stop:
    stop.defer()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    os.kill(os.getpid(), signal.SIGINT)
    while stop._arrived < 1:  # standard signals do not queue: one at a time
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)
    ctypes.CDLL(None).sleep({seconds})
print("still running")
"""

# The main thread runs Python: its handler takes the first signal (a stop request, the
# loop goes on) and ends the process on the second.
_RUNNING = """
import os, signal, time
from xlmeta_jax.pretrain import signals
with signals.StopSignals() as stop:
    stop.defer()
    os.kill(os.getpid(), signal.SIGINT)
    while not stop.requested(sync_point=True):
        time.sleep(0.01)
    print("stop requested", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(120)
print("still running")
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=100)


def test_a_second_signal_ends_a_main_thread_stuck_in_c():
    out = _run(_STUCK.format(seconds=90))
    assert out.returncode == errors.EXIT_INTERRUPTED, out.stdout + out.stderr
    assert "still running" not in out.stdout
    assert out.stderr.strip().splitlines() == [
        "xlmeta_jax.train: interrupted: stopped at once on the second SIGINT, without a "
        "checkpoint of this step; rerunning the same command resumes from the last one "
        "saved"], out.stderr


def test_first_signal_asks_and_second_stops_at_once():
    out = _run(_RUNNING)
    assert out.returncode == errors.EXIT_INTERRUPTED, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["stop requested"], out.stdout
    assert out.stderr.strip().endswith("stopped at once on the second SIGTERM, without a "
                                       "checkpoint of this step; rerunning the same command "
                                       "resumes from the last one saved"), out.stderr
    assert "Traceback" not in out.stderr
