"""Two processes of one jax.distributed run on this machine (the pod case, on CPU).

Each process gets ``--coordinator_address=localhost:PORT --process_count=2
--process_index=I`` after the command and 4 fake CPU devices; gloo does the collectives.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import threading

REPO = pathlib.Path(__file__).resolve().parents[1]
# How long a two-process run may take before the tests call it a hang (runs take minutes).
WAIT_SECONDS = int(os.environ.get("XLMETA_TEST_WAIT_SECONDS", "600"))


def env(devices: int = 8) -> dict:
    """The tests' environment with ``devices`` fake CPU devices and this checkout first."""
    e = dict(os.environ)
    e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    e["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    # A process the tests end for running too long prints every thread's stack (SIGABRT).
    e["PYTHONFAULTHANDLER"] = "1"
    e["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"
    return e


def port(salt: int) -> int:
    """A coordinator port for this test process (``salt`` tells tests and attempts apart)."""
    return 20000 + (os.getpid() * 7 + salt) % 20000


def gloo_timed_out(outs) -> bool:
    """True when a run may have failed on gloo's fixed rendezvous timeout.

    On a loaded machine it can expire while one process is still compiling: the tests
    retry that (and only that) once.
    """
    return "gloo" in "".join(outs).lower()


def slurm_env(index: int, job_id: int, tasks: int = 2, devices: int = 4) -> dict:
    """What ``srun --ntasks=2`` on this machine sets for task ``index`` (JAX reads these)."""
    return {**env(devices), "SLURM_JOB_ID": str(job_id), "SLURM_NTASKS": str(tasks),
            "SLURM_PROCID": str(index), "SLURM_LOCALID": str(index),
            "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost",
            "SLURM_STEP_NUM_NODES": "1"}


def two_processes(cmd, port_: int | None, on_line=None, devices: int = 4, slurm_job=None):
    """Runs ``cmd`` as processes 0 and 1; returns their exit codes and outputs.

    Args:
      cmd: the command (a list), before the distributed flags.
      port_: the coordinator's port (None: no distributed flags).
      on_line: ``on_line(index, line, procs)`` sees every output line as it comes.
      devices: fake CPU devices per process.
      slurm_job: start them as SLURM tasks of this job id (:func:`slurm_env`).
    """
    def flags(i):
        return [] if port_ is None else [f"--coordinator_address=localhost:{port_}",
                                         "--process_count=2", f"--process_index={i}"]

    procs = [
        subprocess.Popen(
            [*map(os.fspath, cmd), *flags(i)],
            env=env(devices) if slurm_job is None else slurm_env(i, slurm_job, devices=devices),
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    outs = [[], []]

    def read(i):
        for line in procs[i].stdout:
            outs[i].append(line)
            if on_line is not None:
                on_line(i, line, procs)

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for p in procs:
            p.wait(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        # Far beyond any run's time: a hang. Each process left shows where it waits.
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGABRT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in threads:
            t.join(timeout=60)
        raise AssertionError(
            f"still running after {WAIT_SECONDS} s; outputs (the stacks last):\n"
            + "\n".join(f"--- process {i} ---\n{''.join(o)[-20000:]}"
                         for i, o in enumerate(outs))) from None
    for t in threads:
        t.join(timeout=60)
    return [p.returncode for p in procs], ["".join(o) for o in outs]


def run_two(cmd, salt: int, *, expected=(0, 0), on_line=None, fresh=None, slurm=False):
    """:func:`two_processes` of ``cmd`` on ``port(salt)``, retried once (on
    ``port(salt + 1)``) when the exit codes are not ``expected`` and gloo's rendezvous
    may have timed out (:func:`gloo_timed_out`).

    Args:
      cmd: the command (a list), before the distributed flags.
      salt: tells this call's ports apart from other tests' (and its retry's).
      expected: the exit codes the test wants (a retry is for an unexpected outcome).
      on_line: makes each attempt's line watcher (its own state): ``on_line()`` is
        :func:`two_processes`'s ``on_line``.
      fresh: the run's folder, emptied before the retry, so it repeats the run from its
        start rather than resuming the failed attempt.
      slurm: started as the two tasks of a SLURM job step (no flags: SLURM's variables
        say which process is which).
    """
    for attempt in range(2):
        if attempt and fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        where = port(salt + attempt)
        codes, outs = two_processes(cmd, None if slurm else where, on_line and on_line(),
                                    slurm_job=where if slurm else None)
        if tuple(codes) == tuple(expected) or attempt or not gloo_timed_out(outs):
            break
    return codes, outs
