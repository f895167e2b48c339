"""Two processes of one jax.distributed run on this machine (the pod case, on CPU).

Each process gets ``--coordinator_address=localhost:PORT --process_count=2
--process_index=I`` after the command and 4 fake CPU devices; gloo does the collectives.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import threading

REPO = pathlib.Path(__file__).resolve().parents[1]


def env(devices: int = 8) -> dict:
    """The tests' environment with ``devices`` fake CPU devices and this checkout first."""
    e = dict(os.environ)
    e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    e["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + e.get("PYTHONPATH", "")
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
    for p in procs:
        p.wait(timeout=600)
    for t in threads:
        t.join(timeout=60)
    return [p.returncode for p in procs], ["".join(o) for o in outs]
