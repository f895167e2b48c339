"""Third-party notices the commands turn into their own lines or drop (xlmeta_jax.logs)."""

import contextlib
import glob
import importlib.util
import io
import logging
import os
import subprocess
import sys

import pytest
from absl import logging as absl_logging

from xlmeta_jax import logs


def _capture(logger_name):
    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = _Keep()
    logging.getLogger(logger_name).addHandler(handler)
    return records, handler


def test_a_short_save_wait_is_dropped_and_a_long_one_is_a_progress_line():
    logs.quiet_save_waits()
    logs.quiet_save_waits()  # idempotent
    absl_records, absl_handler = _capture("absl")
    ours, our_handler = _capture("xlmeta_jax.train")
    level = logs.progress.level
    logs.progress.setLevel(logging.INFO)
    try:
        # Orbax's own call (orbax/checkpoint/checkpoint_manager.py).
        absl_logging.warning("Waiting for previous save to complete took %f seconds. If this"
                             " number is high, consider checkpointing less frequently.", 3.1)
        assert absl_records == [] and ours == []
        absl_logging.warning("Waiting for previous save to complete took %f seconds. If this"
                             " number is high, consider checkpointing less frequently.",
                             logs.SLOW_SAVE_SECONDS + 1)
        assert absl_records == []
        assert len(ours) == 1 and "checkpoint saves are slow: waited 61 s" in ours[0]
        absl_logging.warning("something else")
        assert absl_records == ["something else"]
    finally:
        logs.progress.setLevel(level)
        logging.getLogger("absl").removeHandler(absl_handler)
        logging.getLogger("xlmeta_jax.train").removeHandler(our_handler)


def test_an_installed_libtpu_without_tpu_chips_logs_nothing(tmp_path):
    # With libtpu installed (the aot extra) and no TPU, JAX would try the TPU backend
    # first and print a TPU VM's set-up errors; the commands' start-up picks the CPU.
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install -e '.[aot]')")
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or os.path.exists(
            "/dev/nvidia0"):
        pytest.skip("this host has accelerators: JAX's own choice applies")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    code = ("from xlmeta_jax import logs; logs.quiet_start(); import jax; "
            "print(jax.default_backend())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cpu"
    assert "INVALID_ARGUMENT" not in out.stderr and "TPU" not in out.stderr, out.stderr


def test_every_command_picks_the_cpu_where_libtpu_finds_no_tpu(tmp_path):
    # hf, merge and the other tools never call quiet_start: the choice is made where
    # every command starts (errors.run_command). A stand-in libtpu package is enough,
    # since only its presence is looked at.
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or os.path.exists(
            "/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        pytest.skip("this host has accelerators: JAX's own choice applies")
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    code = ("import sys, jax; from xlmeta_jax import errors; "
            "sys.exit(errors.run_command(lambda argv: print(jax.config.jax_platforms),"
            " [], prog='x'))")
    picked = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert picked.returncode == 0, picked.stderr
    assert picked.stdout.strip() == "cpu"
    # The user's own JAX_PLATFORMS stays.
    env["JAX_PLATFORMS"] = "cpu,tpu"
    kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == "cpu,tpu"
    # Without libtpu (where the aot extra is not installed) nothing is chosen for JAX.
    (tmp_path / "libtpu" / "__init__.py").unlink()
    (tmp_path / "libtpu").rmdir()
    if importlib.util.find_spec("libtpu") is None:
        del env["JAX_PLATFORMS"]
        untouched = subprocess.run([sys.executable, "-c", code], env=env,
                                   capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert untouched.returncode == 0, untouched.stderr
        assert untouched.stdout.strip() in ("", "None")


def test_what_a_library_logs_while_ctrl_c_unwinds_is_dropped():
    # seqio logs "Failed to load task ..." from its `except:` and re-raises: on a Ctrl-C
    # while the pipelines are built that is no failure, and the command says "interrupted".
    logs.quiet_save_waits()
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("absl").addHandler(handler)
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            absl_logging.error("Failed to load task 'a' as part of mixture 'b'")
        try:
            raise ValueError("bad file")
        except ValueError:
            absl_logging.error("Failed to load task 'c' as part of mixture 'b'")
    finally:
        logging.getLogger("absl").removeHandler(handler)
    assert records == ["Failed to load task 'c' as part of mixture 'b'"]


def test_progress_lines_go_to_the_current_stdout(monkeypatch):
    """The progress handler is installed once per process; a command run later under
    another stdout (a notebook's or test's capture, redirect_stdout) prints there, not
    into the stream of the first command, which may be closed by then."""
    monkeypatch.setattr(logs.progress, "handlers", [])
    first = io.StringIO()
    with contextlib.redirect_stdout(first):
        logs.show_progress()
    first.close()
    later = io.StringIO()
    with contextlib.redirect_stdout(later):
        logs.progress.info("step 1/2")
    assert later.getvalue().endswith("step 1/2\n"), later.getvalue()
