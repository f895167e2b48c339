"""One failing process of a multi-process run ends the others within seconds, one line each.

Without this, an error on one process (a file only it reads, a bad setting it alone
checks) leaves the others waiting in a collective until gloo's or the coordination
service's time-outs end them, minutes later, with pages of coordination-service errors;
and the failing process itself waits in JAX's shutdown barrier for peers that never
come. Here the failing process prints its line, publishes it in ``jax.distributed``'s
key-value store, and ends at once; every process watches that key from a daemon thread
and, when it appears (after a grace of five seconds, in which a process failing the same
way ends with its own line), ends itself at once, as ``kill`` would, with ``process I
failed: <line>`` and the same exit status (2: a user error, 1: a bug); MODEL_DIR's lock of
such a process is taken over by the next start. Process 0 hosts the store: before it ends, it waits
(seconds at most) until each peer has read the line, and two seconds more for the peers to
exit. A Ctrl-C stop is not a failure:
every process agrees on its step and ends by itself (pretrain/signals.py).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback

import jax

# JAX has no public key-value API; its own compiler cache and Orbax's multihost utilities
# read the distributed client the same way.
from jax._src import distributed as jax_distributed

from xlmeta_jax import errors

_FAILED = "xlmeta/failed"
_DONE = "xlmeta/done"
# The watcher asks in short waits, so that it is never inside the client's C++ call when
# the interpreter finalises (a thread there aborts the process on its way out).
_POLL_MS = 1_000
# How long a process that reads a peer's failure leaves its own main thread to fail first.
_GRACE_SECONDS = 5.0
# How long process 0 keeps the store up for its peers to read a failure.
_WAIT_FOR_PEERS_SECONDS = 15.0
# And then for its peers' exits: a peer marks itself done just before its os._exit, and a
# service that ends in between makes the peer's client abort the peer (SIGABRT, not its
# status), as a peer descheduled for a moment on a loaded host saw.
_AFTER_PEERS_SECONDS = 2.0

_ending = threading.Lock()  # held by whichever path ends this process
_finished = threading.Event()  # the command returned: the watcher stands down


def watch(prog: str) -> None:
    """Ends this process when another fails, and the others when this one fails.

    Call once ``jax.distributed.initialize`` has connected more than one process.
    """
    client = jax_distributed.global_state.client
    if client is None or jax.process_count() < 2:
        return
    index, count = jax.process_index(), jax.process_count()

    def end(status: int, line: str | None) -> None:
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        sys.stdout.flush()
        # The line is said. Whatever the coordination service's threads log from here (a peer
        # ending first closes its socket: "PollForError ... Socket closed") is noise after it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        try:
            client.key_value_set(f"{_DONE}/{index}", "1")
        except Exception:  # noqa: BLE001, S110 - the store is gone: nobody waits for us
            pass
        if index == 0:
            deadline = time.monotonic() + _WAIT_FOR_PEERS_SECONDS
            for peer in range(1, count):
                left = int(1000 * (deadline - time.monotonic()))
                if left <= 0:
                    break
                try:
                    client.blocking_key_value_get(f"{_DONE}/{peer}", left)
                except Exception:  # noqa: BLE001, S112 - a peer that ended without a word
                    continue
            time.sleep(_AFTER_PEERS_SECONDS)
        os._exit(status)

    def failed(status: int, line: str, summary: str) -> None:
        if not _ending.acquire(blocking=False):
            time.sleep(3600)  # the watcher is ending the process with a peer's line
        try:
            # A peer that failed first broke this process's collectives (gloo: "connection
            # closed by peer"): its line is the cause.
            first = client.key_value_try_get(_FAILED)
        except Exception:  # noqa: BLE001 - no failure recorded yet
            first = None
        if first is not None and int(first.split("\t", 1)[0]) != index:
            failer, peer_status, peer_summary = first.split("\t", 2)
            end(int(peer_status), f"{prog}: error: process {failer} failed: {peer_summary}")
        if status == 1:
            traceback.print_exc()
        try:
            client.key_value_set(_FAILED, f"{index}\t{status}\t{summary}")
        except Exception:  # noqa: BLE001, S110 - another process failed first
            pass
        end(status, line)

    def read() -> None:
        while not _finished.is_set():
            try:
                value = client.blocking_key_value_get(_FAILED, _POLL_MS)
            except Exception as e:  # noqa: BLE001 - a time-out, or the store is gone
                # The coordination service's status code (compiled; the client raises
                # one exception type for every failure): a poll that timed out.
                if "DEADLINE_EXCEEDED" in str(e):
                    continue
                return
            failer, status, summary = value.split("\t", 2)
            if int(failer) == index or _finished.is_set():
                return
            # A process failing the same way (a check every process makes) ends with its
            # own line and its own clean-up, if it gets there within the grace period.
            time.sleep(_GRACE_SECONDS)
            if not _ending.acquire(blocking=False):
                return  # this process is ending with its own line
            end(int(status), f"{prog}: error: process {failer} failed: {summary}")

    errors.on_failure(failed)
    watcher = threading.Thread(target=read, name="xlmeta-peers", daemon=True)

    def stand_down() -> None:
        _finished.set()
        watcher.join(timeout=2 * _POLL_MS / 1000)

    # atexit runs last-in first-out: this stands down before JAX's shutdown barrier.
    atexit.register(stand_down)
    watcher.start()
