r"""Kill soak: random ``kill -9`` during training and checkpoint writes, then resume.

Trains a reference run without interruption, then the same run again while
killing it (SIGKILL) at random moments, restarting it after each kill: every
attempt first finalises a checkpoint of its own (so the run moves on
through both phases), then half of the kills hit the moment it starts writing
its next checkpoint (an Orbax temporary directory exists), the rest a random
0-3 s later in training. After the last
kill the run finishes; its final parameters and metrics of every phase must be
bit-identical to the reference's.

  python -m xlmeta_jax.tools.soak --work_dir=/tmp/soak --kills=20

The default run is the tiny two-phase synthetic one (8 fake CPU devices, async
checkpoints every 3 steps). Any training command line can be soaked instead by
giving its gin flags after ``--`` (MODEL_DIR is set by the soak):

  python -m xlmeta_jax.tools.soak --work_dir=/tmp/soak_demo --kills=5 -- \
      --gin_file=gin/demo.gin

Prints one line per kill and the verdict; exits 1 when the runs differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import random
import subprocess
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

from xlmeta_jax import errors
from xlmeta_jax.pretrain import checkpoints, loading

SOAK_GIN = """
import xlmeta_jax.pretrain.trainer
include 'models/tiny.gin'
MODEL_DIR = %gin.REQUIRED
xlmeta_jax.pretrain.trainer.train.model_dir = %MODEL_DIR
xlmeta_jax.pretrain.trainer.train.mesh_shape = (2, 2, 2)
xlmeta_jax.pretrain.trainer.train.checkpoint_every = 3
xlmeta_jax.pretrain.trainer.train.keep_checkpoints = 2
xlmeta_jax.pretrain.trainer.train.async_checkpointing = True
xlmeta_jax.pretrain.trainer.train.log_every = 5
xlmeta_jax.pretrain.trainer.train.phases = [
    @phase1/xlmeta_jax.pretrain.trainer.Phase(), @phase2/xlmeta_jax.pretrain.trainer.Phase()]
xlmeta_jax.pretrain.trainer.Phase.task = 'synthetic'
xlmeta_jax.pretrain.trainer.Phase.batch_size = 8
xlmeta_jax.pretrain.trainer.Phase.sequence_length = 32
phase1/xlmeta_jax.pretrain.trainer.Phase.name = 'phase1'
phase1/xlmeta_jax.pretrain.trainer.Phase.num_steps = {steps}
phase2/xlmeta_jax.pretrain.trainer.Phase.name = 'phase2'
phase2/xlmeta_jax.pretrain.trainer.Phase.num_steps = {steps}
phase2/xlmeta_jax.pretrain.trainer.Phase.init_from = 'phase1'
"""


@dataclasses.dataclass
class Kill:
    """One kill: when, and what the run was doing."""

    attempt: int
    mode: str
    seconds: float
    during_checkpoint_write: bool


def _env(cache_dir: pathlib.Path | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env.setdefault("JAX_PLATFORMS", "cpu")
    if cache_dir is not None:
        # Every restart compiles the same step: reuse the executable (same code, same
        # results) so that the attempts spend their time training, not compiling.
        env.setdefault("JAX_COMPILATION_CACHE_DIR", os.fspath(cache_dir))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    repo = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _command(train_args: Sequence[str], model_dir: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", "xlmeta_jax.train", *train_args,
            f"--gin.MODEL_DIR='{model_dir}'"]


def _new_checkpoints(model_dir: pathlib.Path, since: float) -> int:
    """Checkpoints finalised after ``since`` (this attempt's progress)."""
    count = 0
    for p in model_dir.glob("*/*/commit_success.txt"):
        if not p.parent.name.isdigit():  # inside a temporary directory: not final yet
            continue
        try:
            if p.stat().st_mtime >= since:
                count += 1
        except FileNotFoundError:  # removed by keep-N meanwhile
            continue
    return count


def _writing_checkpoint(model_dir: pathlib.Path, since: float = 0.0) -> bool:
    """A temporary (unfinished) checkpoint directory, created after ``since``."""
    for p in model_dir.glob("*/*"):
        if ".orbax-checkpoint-tmp" in p.name:
            try:
                if p.stat().st_ctime >= since:
                    return True
            except FileNotFoundError:  # finalised (renamed) meanwhile
                continue
    return False


def _kill_once(cmd, env: dict, model_dir: pathlib.Path, rng: random.Random, attempt: int,
               log_path: pathlib.Path, max_wait: float) -> Kill | None:
    """Starts the run, lets it make progress, SIGKILLs it; None if it finished first.

    Each attempt first finalises a checkpoint of its own (so the soak moves through
    both phases), then ``training``: is killed after a random 0-3 s more;
    ``checkpoint_write``: is killed as soon as it starts writing its next checkpoint.
    """
    mode = rng.choice(["checkpoint_write", "training"])
    delay = rng.uniform(0.0, 3.0)
    with open(log_path, "a") as log:
        log.write(f"=== attempt {attempt} ({mode})\n")
        log.flush()
        t0 = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        progressed_at = None
        try:
            while proc.poll() is None and time.time() - t0 < max_wait:
                now = time.time()
                if progressed_at is None and _new_checkpoints(model_dir, t0) >= 1:
                    progressed_at = now
                if progressed_at is not None:
                    if mode == "checkpoint_write" and _writing_checkpoint(model_dir,
                                                                          progressed_at):
                        time.sleep(rng.uniform(0.0, 0.05))
                        break
                    if mode == "training" and now - progressed_at >= delay:
                        break
                time.sleep(0.005)
            if proc.poll() is not None:
                return None
            writing = _writing_checkpoint(model_dir)
            proc.kill()
            proc.wait()
            return Kill(attempt, mode, time.time() - t0, writing)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _final_state(model_dir: pathlib.Path):
    out = {}
    for phase_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and
                            p.name.startswith("phase")):
        step_dir = loading.find_step_dir(phase_dir)
        out[phase_dir.name] = (step_dir.name, checkpoints.restore_params(step_dir),
                               checkpoints.read_meta(step_dir).get("metrics"))
    return out


def compare(reference: pathlib.Path, soaked: pathlib.Path) -> list[str]:
    """Differences between two finished runs' final checkpoints (empty: bit-identical)."""

    a, b = _final_state(reference), _final_state(soaked)
    if sorted(a) != sorted(b):
        return [f"phases differ: {sorted(a)} vs {sorted(b)}"]
    diffs = []
    for phase in a:
        (step_a, params_a, metrics_a), (step_b, params_b, metrics_b) = a[phase], b[phase]
        if step_a != step_b:
            diffs.append(f"{phase}: final step {step_a} vs {step_b}")
        leaves_a = jax.tree_util.tree_leaves_with_path(params_a)
        leaves_b = jax.tree.leaves(params_b)
        for (path, x), y in zip(leaves_a, leaves_b):
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                diffs.append(f"{phase}: parameter {jax.tree_util.keystr(path)} differs")
        if metrics_a != metrics_b:
            diffs.append(f"{phase}: final metrics {metrics_a} vs {metrics_b}")
    return diffs


def soak(work_dir, kills: int, *, train_args: Sequence[str] = (), seed: int = 0,
         steps: int = 60, max_wait: float = 600.0) -> dict:
    """Runs the soak; returns {"kills": [...], "restarts": n, "differences": [...]}."""
    work = pathlib.Path(work_dir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    if not train_args:
        gin_path = work / "soak.gin"
        gin_path.write_text(SOAK_GIN.format(steps=steps))
        train_args = [f"--gin_file={gin_path}"]
    reference, soaked = work / "reference", work / "soaked"
    log_path = work / "train.log"
    env = _env(work / "jax_cache")
    print(f"reference run -> {reference}", flush=True)
    out = subprocess.run(_command(train_args, reference), env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"reference run failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rng = random.Random(seed)
    done, attempts = [], 0
    while len(done) < kills:
        attempts += 1
        kill = _kill_once(_command(train_args, soaked), env, soaked, rng, attempts, log_path,
                          max_wait)
        if kill is None:
            print(f"run {attempts}: finished before its kill ({len(done)} kills so far)",
                  flush=True)
            break
        done.append(kill)
        print(f"kill {len(done)}/{kills}: after {kill.seconds:.1f}s ({kill.mode}; "
              f"checkpoint being written: {kill.during_checkpoint_write})", flush=True)
    final = subprocess.run(_command(train_args, soaked), env=env, capture_output=True,
                           text=True)
    if final.returncode != 0:
        raise RuntimeError(f"final resume failed:\n{final.stdout[-3000:]}{final.stderr[-3000:]}")
    diffs = compare(reference, soaked)
    leftovers = [os.fspath(p) for p in soaked.glob("*/*") if ".orbax-checkpoint-tmp" in p.name]
    resumes = log_path.read_text().count("] resuming from ") + final.stdout.count(
        "] resuming from ")
    return {"kills": [dataclasses.asdict(k) for k in done], "restarts": attempts + 1,
            "resumes": resumes, "differences": diffs, "leftover_tmp_dirs": leftovers}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    parser = errors.ArgumentParser(
        prog="python -m xlmeta_jax.tools.soak",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__.split("\n\n")[1],
        epilog="example: python -m xlmeta_jax.tools.soak --work_dir=/tmp/soak --kills=20",
    )
    parser.add_argument("--work_dir", required=True,
                        help="folder for the reference run, the soaked run and train.log")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs before the final run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times and modes")
    parser.add_argument("--steps", type=int, default=60,
                        help="steps per phase of the built-in tiny run")
    parser.add_argument("--max_wait", type=float, default=600.0,
                        help="seconds one attempt may run before it is killed regardless")
    errors.add_debug_flag(parser)
    args = parser.parse_args(argv)
    result = soak(args.work_dir, args.kills, train_args=train_args, seed=args.seed,
                  steps=args.steps, max_wait=args.max_wait)
    writes = sum(k["during_checkpoint_write"] for k in result["kills"])
    print(f"{len(result['kills'])} kills ({writes} during a checkpoint write), "
          f"{result['restarts']} starts, {result['resumes']} resumes from a checkpoint")
    if result["leftover_tmp_dirs"]:
        print(f"leftover temporary checkpoint dirs: {result['leftover_tmp_dirs']}")
    if result["differences"]:
        print("NOT identical to the uninterrupted run:\n  " + "\n  ".join(result["differences"]))
        return 1
    print("final checkpoints bit-identical to the uninterrupted run")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.tools.soak")
