"""What Beam's worker log options leave on a terminal, against our quiet worker.

    python -m benchmarks.beam_log_options [--workers=2]

Writes three small ``.xz`` inputs (and a copy with one of them damaged) in a temporary
folder, then runs ``python -m xlmeta_jax.data.prepare`` on DirectRunner workers
(``--direct_running_mode=multi_processing``) four times: the good and the damaged input,
each with our worker (``xlmeta_jax/data/beam_worker.py``, what prepare starts) and with
Beam's own ``sdk_worker_main`` at its quietest log options
(``--default_sdk_harness_log_level=ERROR`` and ``--sdk_harness_log_level_overrides`` for
``apache_beam`` and the root logger). Prints each run's exit status and the lines it
printed (stdout and stderr), then the lines Beam's own worker adds. Needs the ``beam``
extra.
"""

from __future__ import annotations

import lzma
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from xlmeta_jax import errors

# Run in the prepare command's process before it starts: its local workers become Beam's own.
_STOCK_WORKER = """
import sys
from apache_beam.transforms import environments
from xlmeta_jax import errors
from xlmeta_jax.data import prepare

_from_command = environments.SubprocessSDKEnvironment.from_command_string.__func__


def _stock(cls, command, *args, **kwargs):
    command = command.replace("-m xlmeta_jax.data.beam_worker",
                              "-m apache_beam.runners.worker.sdk_worker_main")
    return _from_command(cls, command.replace(" --tensorflow", ""), *args, **kwargs)


environments.SubprocessSDKEnvironment.from_command_string = classmethod(_stock)
errors.exit_with(prepare.main, prog="xlmeta_jax.data.prepare")
"""
_QUIETEST = ["--default_sdk_harness_log_level=ERROR",
             '--sdk_harness_log_level_overrides={"apache_beam": "ERROR", "root": "ERROR"}']


def _inputs(root: str) -> tuple[str, str]:
    """Three languages of made-up text, and the same with one file damaged."""
    rng = random.Random(0)
    good, bad = os.path.join(root, "good"), os.path.join(root, "bad")
    os.makedirs(good)
    os.makedirs(bad)
    for lang in ("en", "de", "sw"):
        docs = ["\n".join(" ".join(f"{lang}{rng.randrange(500)}" for _ in range(12))
                          for _ in range(50)) for _ in range(20)]
        data = lzma.compress(("\n\n".join(docs) + "\n").encode())
        with open(os.path.join(good, f"{lang}.txt.xz"), "wb") as f:
            f.write(data)
        if lang == "de":  # one flipped byte in the middle of the compressed stream
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
        with open(os.path.join(bad, f"{lang}.txt.xz"), "wb") as f:
            f.write(bytes(data))
    return good, bad


def _run(argv: list[str], out: str) -> tuple[int, list[str]]:
    """Exit status and printed lines, with the output folder and the job's time masked."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.returncode, [re.sub(r" in [\d.]+ s", " in T s", line.replace(out, "OUT"))
                             for line in (done.stdout + done.stderr).splitlines()]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.beam_log_options`` (see the module docstring)."""
    parser = errors.ArgumentParser(prog="python -m benchmarks.beam_log_options",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=errors.positive_int, default=2,
                        help="DirectRunner workers (default: 2)")
    errors.add_debug_flag(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        good, bad = _inputs(root)
        runs = {}
        for name, folder in (("good input", good), ("damaged .xz", bad)):
            for worker, command in (("ours", ["-m", "xlmeta_jax.data.prepare"]),
                                    ("Beam's own", ["-c", _STOCK_WORKER])):
                out = os.path.join(root, f"out-{len(runs)}")
                flags = [f"--input={folder}/*", f"--output={out}",
                         f"--direct_num_workers={args.workers}",
                         "--direct_running_mode=multi_processing"]
                if worker != "ours":
                    flags += _QUIETEST
                rc, lines = _run([sys.executable, *command, *flags], out)
                runs[name, worker] = lines
                print(f"{name}, {worker} worker: exit {rc}, {len(lines)} lines "
                      f"({sum(line.startswith('Traceback') for line in lines)} tracebacks)")
        for name in ("good input", "damaged .xz"):
            extra = [line for line in runs[name, "Beam's own"]
                     if line not in runs[name, "ours"]]
            print(f"\n{name}: lines of Beam's own worker that ours does not print "
                  f"({len(extra)}), first 8:")
            for line in extra[:8]:
                print("  " + line[:160])
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="benchmarks.beam_log_options")
