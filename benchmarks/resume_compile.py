"""Resume to first step, with and without the persistent compilation cache.

    python -m benchmarks.resume_compile --gin_file=models/small.gin --length=128 --repeats=2

Starts a run of the synthetic MLM stream and stops it after its first step (as Ctrl-C
does: a checkpoint; the process filled the run's cache, ``MODEL_DIR/compilation_cache``),
then ``--repeats`` times resumes it in a fresh process for one more step and stops it
again, alternately with the cache (the default) and with ``compilation_cache_dir=''``
(the same configuration otherwise: the same compiled programs), and times each from the
command's start to its first step's progress line, and from its "resuming from" line to
it. Prints the medians and their ratios; every resume is a new process, so nothing is
reused from memory.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

RUN_GIN = """
import xlmeta_jax.pretrain.trainer
MODEL_DIR = %gin.REQUIRED
xlmeta_jax.pretrain.trainer.train.model_dir = %MODEL_DIR
xlmeta_jax.pretrain.trainer.train.checkpoint_every = 1
xlmeta_jax.pretrain.trainer.train.keep_checkpoints = 1
xlmeta_jax.pretrain.trainer.train.log_every = 1
xlmeta_jax.pretrain.trainer.train.phases = [@xlmeta_jax.pretrain.trainer.Phase()]
xlmeta_jax.pretrain.trainer.Phase.name = 'phase1'
xlmeta_jax.pretrain.trainer.Phase.task = 'synthetic'
xlmeta_jax.pretrain.trainer.Phase.num_steps = 1000
xlmeta_jax.pretrain.trainer.Phase.batch_size = {batch}
xlmeta_jax.pretrain.trainer.Phase.sequence_length = {length}
xlmeta_jax.model.optimizer.OptimizerConfig.warmup_steps = 1
"""


def _first_step(cmd: list[str], env: dict, marker: str = "resuming from"
                ) -> tuple[float, float]:
    """Runs ``cmd`` until its first progress line, then stops it as Ctrl-C does (a
    checkpoint at that step). Returns the seconds from the command's start to that line
    and from its ``marker`` line to it (the restore, the compile and the first batch)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    mark = seen = None
    for line in proc.stdout:
        if mark is None and marker in line:
            mark = time.perf_counter()
        if seen is None and re.search(r"\] step \d+/", line):
            seen = time.perf_counter()
            proc.send_signal(signal.SIGINT)
    if proc.wait() not in (0, 130) or seen is None or mark is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode})")
    return seen - t0, seen - mark


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.resume_compile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", default="models/tiny.gin")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="resume_compile_")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    try:
        gin_path = os.path.join(work, "run.gin")
        with open(gin_path, "w") as f:
            f.write(RUN_GIN.format(batch=args.batch, length=args.length))
        model_dir = os.path.join(work, "run")

        def cmd(*extra: str) -> list[str]:
            return [sys.executable, "-m", "xlmeta_jax.train", f"--gin_file={args.gin_file}",
                    f"--gin_file={gin_path}", f"--gin.MODEL_DIR='{model_dir}'", *extra]

        _first_step(cmd(), env, marker="compiling the train step")
        cached = os.path.join(model_dir, "compilation_cache")
        print(f"trained and stopped; the run's cache holds {len(os.listdir(cached))} "
              "compiled programs", flush=True)
        times = {"with the cache": [], "without": []}
        for _ in range(args.repeats):
            for name, extra in (("with the cache", ()), ("without", (
                    "--gin.xlmeta_jax.pretrain.trainer.train.compilation_cache_dir=''",))):
                times[name].append(_first_step(cmd(*extra), env))
        for name, t in times.items():
            print(f"{name}: resume -> first step median "
                  f"{statistics.median(a for a, _ in t):.1f} s, of which restore + "
                  f"compile + first batch {statistics.median(b for _, b in t):.1f} s ("
                  + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in t) + ")")
        (w_all, w_step), (n_all, n_step) = (
            (statistics.median(a for a, _ in t), statistics.median(b for _, b in t))
            for t in times.values())
        print(f"ratio without / with the cache: resume -> first step {n_all / w_all:.2f}, "
              f"restore + compile + first batch {n_step / w_step:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
