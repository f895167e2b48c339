"""Guards of a run directory: one writer at a time, and the same run on every rerun.

* :class:`RunLock` — a lock file ``MODEL_DIR/.lock`` held (``flock``) for as long as
  a command writes into the directory, recording who holds it (host, pid, since
  when). The kernel drops the lock when its process dies (kill -9 included), so a
  stale lock of a dead process is taken over, with a log line saying whose it was.
  On a pod only the primary host takes it (every host writes its own part of the
  same checkpoints).
* :func:`check_stored_config` — a rerun must ask for the run that is stored: the
  model and the phase's data/batch/length must match what the checkpoint recorded,
  or the error names the field that differs (:func:`check_same_source`: and the
  input stream's source, text or token cache).
* :func:`use_compilation_cache` — JAX's persistent compilation cache, by default in
  ``MODEL_DIR/compilation_cache``: a resume or the next stage reuses compiled steps.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys

import jax
from jax.experimental.compilation_cache import compilation_cache

from xlmeta_jax import files
from xlmeta_jax.errors import UserError

log = logging.getLogger("xlmeta_jax.train")

LOCK_NAME = ".lock"
# JAX's persistent compilation cache of a run (train.compilation_cache_dir's default).
COMPILATION_CACHE = "compilation_cache"

# EncoderConfig fields that only choose how the same computation runs; a resume
# may change them (e.g. a GPU resume of a CPU run picks cuDNN attention).
EXECUTION_ONLY_FIELDS = frozenset({"attention_impl", "remat_policy"})
# Phase settings a resume must keep (more steps is allowed: the phase continues).
PHASE_FIELDS = ("task", "batch_size", "sequence_length", "languages", "alpha", "mask_rate")


class RunLockedError(UserError):
    """Another live process holds the run directory."""


class CompilationCacheError(UserError):
    """The compilation cache's folder cannot be one (a file is in the way)."""


class RunConfigMismatch(UserError):
    """The requested run differs from the one stored in the run directory."""


class RunLock:
    """``MODEL_DIR/.lock``: an exclusive ``flock`` plus who holds it.

    Use as a context manager, or :meth:`acquire` / :meth:`release`.
    """

    def __init__(self, model_dir: str, *, what: str = "MODEL_DIR"):
        self.model_dir = os.fspath(model_dir)
        self.path = os.path.join(self.model_dir, LOCK_NAME)
        self._what = what
        self._fd = None

    @staticmethod
    def supported(model_dir: str) -> bool:
        """Local (or mounted) paths only: object stores (gs://) have no file locks."""
        return "://" not in os.fspath(model_dir)

    def _holder(self) -> dict:
        try:
            with open(self.path) as f:
                return json.loads(f.read() or "{}")
        except (OSError, ValueError):
            return {}

    def _describe(self, holder: dict) -> str:
        if not holder:
            return "another process (no holder recorded)"
        return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since "
                f"{holder.get('since', '?')}")

    def acquire(self) -> RunLock:
        """Takes the lock or raises RunLockedError naming the holder."""
        os.makedirs(self.model_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise RunLockedError(
                    f"{self._what} {self.model_dir} is in use by {self._describe(self._holder())}"
                    f" (lock {self.path}); wait for it or stop it first"
                ) from None
            # A filesystem without flock (some network mounts): fall back to the
            # recorded pid, which is checkable on this host only.
            holder = self._holder()
            if holder.get("host") == socket.gethostname() and _alive(holder.get("pid")):
                os.close(fd)
                raise RunLockedError(
                    f"{self._what} {self.model_dir} is in use by {self._describe(holder)} "
                    f"(lock {self.path})"
                ) from None
        stale = self._holder()
        if stale:
            log.info("taking over the lock %s left by %s (that process is gone)", self.path,
                     self._describe(stale))
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Clears the holder record and drops the lock (the file itself stays: removing
        it could let two later processes lock two different files)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_stored_config(where: str, meta: dict, model, phase, data_seed: int | None = None
                        ) -> None:
    """Raises RunConfigMismatch when ``meta`` (a stored checkpoint's) differs from the
    requested ``model`` (EncoderConfig), ``phase`` (trainer Phase) or ``data_seed``.

    Args:
      where: the checkpoint directory, for the message.
      meta: the checkpoint's metadata (``model_config``, ``task``, ...).
      model: the requested encoder configuration.
      phase: the requested phase.
      data_seed: the phase's data and dropout seed (``seeds.phase_seed``), when known:
        resuming with another would continue a different stream.
    """
    stored_model = meta.get("model_config") or {}
    requested = dataclasses.asdict(phase.model(model))  # with the phase's RoPE bases
    for field, value in requested.items():
        if field in EXECUTION_ONLY_FIELDS or field not in stored_model:
            continue
        if stored_model[field] != value:
            raise RunConfigMismatch(
                f"{where} was trained with EncoderConfig.{field}={stored_model[field]!r}, "
                f"the config asks for {value!r}; use another MODEL_DIR or the stored setting"
            )
    for field in PHASE_FIELDS:
        wanted = getattr(phase, field)
        if isinstance(wanted, tuple):
            wanted = list(wanted)  # as the metadata's JSON holds it
        if field in meta and meta[field] != wanted:
            raise RunConfigMismatch(
                f"{where} was trained with {field}={meta[field]!r}, the config asks for "
                f"{getattr(phase, field)!r} (phase {phase.name!r}); use another MODEL_DIR "
                "or the stored setting"
            )
    if data_seed is not None and meta.get("data_seed", data_seed) != data_seed:
        raise RunConfigMismatch(
            f"{where} was trained with data and dropout seed {meta['data_seed']}, the config "
            f"derives {data_seed} (train.seed and the phase's task); resume with the seed the "
            "run was started with"
        )
    stored_step = meta.get("phase_step")
    if isinstance(stored_step, int) and stored_step > phase.num_steps:
        raise RunConfigMismatch(
            f"{where} is at step {stored_step}, beyond the requested num_steps="
            f"{phase.num_steps} of phase {phase.name!r}"
        )


def check_same_source(phase, step_dir: str, meta: dict, now: bool) -> None:
    """Refuses to restore an input stream's state into one reading the other source.

    ``now``: whether this run's stream reads the offline token cache.
    """
    stored = bool(meta.get("use_cached", False))
    if stored != now:
        def what(cached):
            return "the offline token cache" if cached else "the text"
        raise RunConfigMismatch(
            f"[{phase.name}] {step_dir} was trained reading {what(stored)} (use_cached="
            f"{stored}), this run reads {what(now)}: the input stream's state restores only "
            f"into the same source; rerun with use_cached={stored} (XLING_USE_CACHED, "
            f"{phase.name}/xlmeta_jax.pretrain.trainer.Phase.use_cached or "
            "make_mlm_iterator.use_cached)")


def use_compilation_cache(model_dir: str, path: str | None) -> str | None:
    """Points JAX's persistent compilation cache at ``path`` (returns it).

    Args:
      model_dir: the run directory.
      path: ``train.compilation_cache_dir``: a folder (``gs://`` too), ``''`` for no
        cache, or None: the cache JAX already has (``JAX_COMPILATION_CACHE_DIR``, shared
        between runs), else ``MODEL_DIR/compilation_cache``.

    Returns:
      The folder in use, or None when there is none.

    Raises:
      CompilationCacheError: a file where the folder should be (JAX would go on without a
        cache and say so in a warning of its own, on every compile).
    """
    current = jax.config.jax_compilation_cache_dir
    if path == "":
        jax.config.update("jax_enable_compilation_cache", False)
    else:
        path = path or current or os.path.join(model_dir, COMPILATION_CACHE)
        if problem := files.not_a_folder(path, "the compilation cache"):
            raise CompilationCacheError(
                f"{problem}: remove it, or set train.compilation_cache_dir (a folder, or '' "
                "for none)")
        if path == current:
            return path
        jax.config.update("jax_compilation_cache_dir", path)
    # JAX opens its cache once, at the first compile that looks for it.
    compilation_cache.reset_cache()
    return path or None
