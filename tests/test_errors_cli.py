"""The commands as a user runs them: one stderr line per bad input, exit status, run
untouched, clean logs, ``--help`` everywhere. Representative cases of the table in
test_errors.py, each in a subprocess with the commands' own log settings. (Ctrl-C, its one
line and the resume: tests/test_train.py's interrupted run.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from errors_fixtures import (
    REPO,
    STEPS,
    array_files,
    copy_run,
    digest,
    foreign_lines,
    train_cmd,
    user_env,
    write_gin,
)

from xlmeta_jax import errors
from xlmeta_jax.pretrain import run_dir

# Every test here starts the real commands in subprocesses (TensorFlow and JAX start-up
# each time): end-to-end runs, left out of the `-m "not slow"` loop; test_errors.py holds
# the same cases in-process.
pytestmark = pytest.mark.slow

def _run(cmd, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=user_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def run_gin(tmp_path_factory):
    return write_gin(tmp_path_factory.mktemp("gin"))


@pytest.fixture(scope="module")
def finished(finished_run, tmp_path_factory):
    """This module's copy of the session's finished run (conftest.finished_run)."""
    return copy_run(finished_run, tmp_path_factory.mktemp("finished") / "run")


def _assert_one_line(out, *parts, code=errors.EXIT_USER_ERROR):
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def test_rerun_of_finished_run_is_quiet_and_changes_nothing(finished, run_gin):
    before = digest(finished)
    out = _run(train_cmd(run_gin, finished))
    assert out.returncode == 0, out.stderr
    assert not foreign_lines(out.stderr), out.stderr  # no TensorFlow/absl/gin noise
    assert "[phase2] already complete" in out.stdout
    assert digest(finished) == before


@pytest.mark.parametrize("extra, parts", [
    (["--gin.BATCH_SIZ=8"], ["unknown gin macro 'BATCH_SIZ'", "did you mean BATCH_SIZE"]),
    (["--gin.META_STEPS=2.5"], ["META_STEPS = 2.5", "expected an integer"]),
    # Changed model size with more steps: the differing field, not Orbax's dump.
    (["--gin.xlmeta_jax.model.network.get_config.hidden_size=32", "--gin.XLING_STEPS=8"],
     ["EncoderConfig.hidden_size=64", "asks for 32"]),
])
def test_bad_input_on_the_command_line(finished, run_gin, extra, parts):
    before = digest(finished)
    out = _run(train_cmd(run_gin, finished, *extra))
    _assert_one_line(out, "xlmeta_jax.train: error:", *parts)
    assert "strict" not in out.stderr
    assert digest(finished) == before


def test_truncated_final_checkpoint_is_not_complete(finished, run_gin, tmp_path):
    model_dir = copy_run(finished, tmp_path / "run")
    for f in array_files(model_dir / "phase2" / str(STEPS)):
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    before = digest(model_dir)
    out = _run(train_cmd(run_gin, model_dir))
    _assert_one_line(out, "phase2/4 is damaged")
    assert "already complete" not in out.stdout.split("[phase1]")[-1].replace(
        "[phase1] already complete", "")
    assert digest(model_dir) == before


def test_second_writer_is_refused_naming_the_holder(finished, run_gin):
    with run_dir.RunLock(finished):
        out = _run(train_cmd(run_gin, finished))
    _assert_one_line(out, f"is in use by pid {os.getpid()}")


def test_hf_export_of_a_deleted_array_file(finished, tmp_path):
    model_dir = copy_run(finished, tmp_path / "run")
    array_files(model_dir / "phase2" / str(STEPS))[0].unlink()
    out = _run([sys.executable, "-m", "xlmeta_jax.hf", "to_hf",
                f"--checkpoint={model_dir / 'phase2'}", f"--output={tmp_path / 'hf'}"])
    # One line: not the TensorStore spec of every array that failed to read.
    _assert_one_line(out, "xlmeta_jax.hf: error: checkpoint", "phase2/4 is damaged",
                     "cannot be read")
    assert not (tmp_path / "hf").exists()


def test_hf_export_of_corrupted_metadata(finished, tmp_path):
    model_dir = copy_run(finished, tmp_path / "run")
    (model_dir / "phase2" / str(STEPS) / "meta" / "metadata").write_bytes(b"\xff\xfe\x00garbage")
    out = _run([sys.executable, "-m", "xlmeta_jax.hf", "to_hf", f"--checkpoint={model_dir}",
                f"--output={tmp_path / 'hf'}"])
    _assert_one_line(out, "xlmeta_jax.hf: error: checkpoint metadata", "is corrupted")


@pytest.mark.parametrize("module, parts", [
    ("xlmeta_jax.train", ["--gin_file", "--gin.NAME=VALUE", "--coordinator_address",
                          "native/meta.gin", "models/tiny.gin", "example:"]),
    ("xlmeta_jax.finetune", ["--gin_file", "finetune/xnli.gin", "finetune/tatoeba.gin",
                             "--seeds", "example:"]),
    ("xlmeta_jax.experiment", ["experiments/cpu.gin", "--dry_run", "example:"]),
    ("xlmeta_jax.hf", ["to_flax", "--hf_path", "to_hf", "--checkpoint", "examples:"]),
    ("xlmeta_jax.data.vocabulary", ["--files", "--num_threads", "this machine's cores",
                                    "No gin files", "Example", "(default: 2000000)"]),
    ("xlmeta_jax.tools.report", ["--output", "example:", "no gin files"]),
    ("xlmeta_jax.tools.bench", ["--batch", "models/small.gin", "example:"]),
    ("xlmeta_jax.tools.aot", ["--topology", "--gin_file", "native/meta.gin", "example:"]),
    ("xlmeta_jax.tools.soak", ["--kills", "(default:"]),
    ("xlmeta_jax.tools.throughput", ["python -m xlmeta_jax.tools.throughput", "--seconds"]),
    ("xlmeta_jax.tools.caching", ["python -m xlmeta_jax.tools.caching", "--task"]),
    ("benchmarks.checksum_cost", ["--repeats", "models/small.gin"]),
    ("xlmeta_jax.data.prepare", ["--input", "--shard_bytes", "--vocab_sample_lines", "--tokenize",
                                 "--runner", "--overwrite"]),
    ("benchmarks.prepare_bench", ["--mb", "--startup_mb"]),
    ("benchmarks.beam_log_options", ["--workers", "log options"]),
    ("xlmeta_jax.data.vocabulary", ["--prepared", "--vocab_sample_lines"]),
])
def test_every_command_has_a_help(module, parts):
    out = _run([sys.executable, "-m", module, "--help"], timeout=120)
    assert out.returncode == 0, out.stderr
    # Every command takes --debug (errors.run_command), and its help says so.
    for part in [*parts, "--debug"]:
        assert part in out.stdout, (part, out.stdout)
    # Only the t5x trainer's files are t5x's: our commands' help does not list them.
    assert "  meta.gin" not in out.stdout and "pretrain.gin" not in out.stdout


@pytest.mark.extras
def test_t5x_command_help_says_what_it_adds_and_exits_0():
    # absl's --help exits 1; ours says what the command adds (--debug), then t5x's flags.
    pytest.importorskip("t5x", reason="t5x is not on the package index (README: the t5x "
                        "entry point); its command's own test without it is below")
    out = _run([sys.executable, "-m", "xlmeta_jax.t5x_train", "--help"], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for part in ["--debug", "XLMETA_DEBUG=1", "gin/t5x/demo.gin", "--gin_file", "--gin_bindings"]:
        assert part in out.stdout, (part, out.stdout)


def test_t5x_command_without_t5x_says_how_to_install_it(tmp_path):
    # A user's clone with the README's test command only: no t5x. The command starts
    # with t5x hidden: a sitecustomize marks the module absent (import raises
    # ModuleNotFoundError and importlib.util.find_spec answers None, as without it).
    hide = tmp_path / "sitecustomize.py"
    hide.write_text("import sys\nsys.modules['t5x'] = None\n")
    e = user_env()
    e["PYTHONPATH"] = os.pathsep.join([str(tmp_path), e.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "xlmeta_jax.t5x_train", "--help"], env=e,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    _assert_one_line(out, "python -m xlmeta_jax.t5x_train: error: t5x is not installed",
                     "'.[t5x]'")


def test_tensorflow_stays_quiet_when_the_user_sets_its_log_level(tmp_path):
    # TF_CPP_MIN_LOG_LEVEL=3 asks for less: TensorFlow's import-time lines stay away too.
    e = dict(user_env(), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-m", "xlmeta_jax.tools.caching",
                          "--task=xlmeta_cc100", f"--cache_dir={tmp_path}",
                          "--gin_file=gin/data/cc100.gin", f"--gin.CC100_DIR='{tmp_path}'",
                          "--gin.VOCAB_PATH='/nonexistent.model'"],
                         env=e, cwd=REPO, capture_output=True, text=True, timeout=300)
    _assert_one_line(out, "vocabulary file /nonexistent.model does not exist")
