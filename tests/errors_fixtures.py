"""Shared pieces of the bad-input tests: a tiny two-phase run and run-directory digests."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

STEPS = 4

# Two phases of the tiny model on the synthetic stream, with the macros a user
# binds on the command line (as gin/meta.gin has them).
RUN_GIN = """
import xlmeta_jax.pretrain.trainer
MODEL_DIR = %gin.REQUIRED
META_STEPS = 4
XLING_STEPS = 4
BATCH_SIZE = 8
SEQUENCE_LENGTH = 32
MASK_RATE = 0.15
xlmeta_jax.model.mlm.Masking.rate = %MASK_RATE
xlmeta_jax.pretrain.trainer.train.model_dir = %MODEL_DIR
xlmeta_jax.pretrain.trainer.train.mesh_shape = (8, 1, 1)
xlmeta_jax.pretrain.trainer.train.checkpoint_every = 2
xlmeta_jax.pretrain.trainer.train.keep_checkpoints = 2
xlmeta_jax.pretrain.trainer.train.log_every = 2
xlmeta_jax.pretrain.trainer.train.phases = [
    @phase1/xlmeta_jax.pretrain.trainer.Phase(), @phase2/xlmeta_jax.pretrain.trainer.Phase()]
xlmeta_jax.pretrain.trainer.Phase.task = 'synthetic'
xlmeta_jax.pretrain.trainer.Phase.batch_size = %BATCH_SIZE
xlmeta_jax.pretrain.trainer.Phase.sequence_length = %SEQUENCE_LENGTH
phase1/xlmeta_jax.pretrain.trainer.Phase.name = 'phase1'
phase1/xlmeta_jax.pretrain.trainer.Phase.num_steps = %META_STEPS
phase1/xlmeta_jax.pretrain.trainer.Phase.optimizer = \
    @phase1/xlmeta_jax.model.optimizer.OptimizerConfig()
phase1/xlmeta_jax.model.optimizer.OptimizerConfig.total_steps = %META_STEPS
phase1/xlmeta_jax.model.optimizer.OptimizerConfig.warmup_steps = 1
phase2/xlmeta_jax.pretrain.trainer.Phase.name = 'phase2'
phase2/xlmeta_jax.pretrain.trainer.Phase.num_steps = %XLING_STEPS
phase2/xlmeta_jax.pretrain.trainer.Phase.init_from = 'phase1'
"""


def write_gin(folder: pathlib.Path) -> pathlib.Path:
    path = folder / "run.gin"
    path.write_text(RUN_GIN)
    return path


def train_argv(gin_path, model_dir, *extra) -> list[str]:
    return ["--gin_file=models/tiny.gin", f"--gin_file={gin_path}",
            f"--gin.MODEL_DIR='{model_dir}'", *extra]


def train_cmd(gin_path, model_dir, *extra) -> list[str]:
    return [sys.executable, "-m", "xlmeta_jax.train", *train_argv(gin_path, model_dir, *extra)]


def env() -> dict:
    e = dict(os.environ)
    e["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    e["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("XLMETA_DEBUG", None)
    return e


def user_env(base: dict | None = None) -> dict:
    """``base`` (default: :func:`env`) as a user's shell has it: the commands' own
    TensorFlow log settings, not the tests', and no debug tracebacks."""
    e = dict(env() if base is None else base)
    e.pop("TF_CPP_MIN_LOG_LEVEL", None)
    e.pop("XLMETA_DEBUG", None)
    return e


def foreign_lines(stderr: str) -> list[str]:
    """The stderr lines that are not our command's own (third-party notices, tracebacks).

    Whether a third-party notice appears can depend on timing (Orbax's "waiting for previous
    save" on a loaded machine); tests assert that none leaks through, never on timing.
    """
    return [line for line in stderr.splitlines()
            if line.strip() and not line.startswith("xlmeta_jax.")]


def digest(folder) -> dict[str, str]:
    """Content hash of every file under ``folder`` (what "no checkpoint changed" compares)."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha1(f.read()).hexdigest()
    return out


def copy_run(src, dst) -> pathlib.Path:
    shutil.copytree(src, dst)
    return pathlib.Path(dst)


def array_files(step_dir) -> list[pathlib.Path]:
    """The OCDBT data files holding a checkpoint's arrays."""
    return sorted(p for p in pathlib.Path(step_dir, "state").rglob("*")
                  if p.is_file() and p.parent.name == "d")
