"""Test-wide settings: 8 fake CPU devices and the shared-data location.

XLA_FLAGS must be set before jax is imported anywhere, hence at conftest import.
"""

import contextlib
import fcntl
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow must not grab the accelerators JAX uses (and is CPU-only here anyway).
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Tiny models compile far longer than they run; let every test process (and the
# subprocesses of the end-to-end tests) reuse compiled executables.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"xlmeta_jax_test_cache_{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Most of XLA's optimisation passes off, here and in every command a test starts: on the
# tiny models compiling dominates, and the passes cost far more than they save. No test
# compares against a figure of an optimised compile but the TPU compiles of test_aot.py,
# which turn them back on.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "true")

# A suite started as a background job (`nohup pytest … &`) inherits SIGINT ignored, and
# Python then leaves it ignored. The tests that stop a run with SIGINT, in this process or
# in a command it starts, need what every other launch gives: Python's KeyboardInterrupt
# handler here (and so, through exec, the default disposition in the commands started from
# here, which then install their own). Done in every process that loads this file: xdist's
# controller (before it starts the workers) and each worker.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(
    os.environ.get("XLMETA_SHARED_DATA", REPO.parent / "shared" / "data")
)


def pytest_collection_modifyitems(items):
    """The modules holding end-to-end (``slow``) tests run first, each in its collection
    order, the others after them.

    Under ``-n`` xdist hands tests out in this order: the long runs start at once, and the
    tail of the session, where one worker may wait for the other, holds only short
    in-process tests. (In alphabetical order a module of minute-long runs could start last.)
    """
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow)


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """../shared/data, or a skip (with the reason) in a user's clone without it.

    In CI (CI=true) the data must be present: a missing folder fails instead of skipping.
    """
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI expects the shared data folder at {SHARED_DATA}")
        pytest.skip(f"shared data folder {SHARED_DATA} is absent (set XLMETA_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def own_cache_dirs():
    """seqio's cache folders are global: a test's own alone are searched, then restored."""
    seqio = pytest.importorskip("seqio")
    before = list(seqio.utils.get_global_cache_dirs())
    seqio.utils.set_global_cache_dirs([])
    yield
    seqio.utils.set_global_cache_dirs(before)


@pytest.fixture
def clean_gin():
    """gin's one global config, empty before and after the test (for tests that parse)."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


# ---------------------------------------------------------------------------
# Toy SentencePiece models and corpora, built once per test session.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def english_lines(shared_data) -> list[str]:
    """The first 8000 non-empty lines of tinyshakespeare (shared data's english_pd)."""
    path = shared_data / "english_pd" / "tinyshakespeare" / "input.txt"
    return [line for line in path.read_text().splitlines() if line.strip()][:8000]


@pytest.fixture(scope="session")
def english_spm(english_lines, tmp_path_factory) -> str:
    """A 1000-piece English SentencePiece model with our special ids (pad 0, eos 1, ...)."""
    from xlmeta_jax.data import vocabulary

    return _built_once(tmp_path_factory, "english_spm", lambda folder: (
        vocabulary.train_sentencepiece(folder / "en", 1000, sentences=english_lines)))


@pytest.fixture(scope="session")
def toy_cc100(shared_data, tmp_path_factory) -> dict:
    """The toy CC-100 folder of tests/data_toy.py and its 2000-piece vocabulary.

    Returns ``{"root", "cc_dir", "docs", "vocab"}``; read only (tests write elsewhere).
    """
    from data_toy import train_toy_vocabulary, write_cc100_dir

    def build(root):
        cc_dir = str(root / "cc100")
        docs = write_cc100_dir(shared_data, cc_dir)
        vocab = train_toy_vocabulary(cc_dir, str(root / "vocab" / "toy"))
        return {"root": str(root), "cc_dir": cc_dir, "docs": docs, "vocab": vocab}

    built = _built_once(tmp_path_factory, "toy_cc100", build)
    return {**built, "root": pathlib.Path(built["root"])}


@contextlib.contextmanager
def _session_lock(tmp_path_factory, name: str):
    """A folder shared by the whole session's processes (every xdist worker), under a lock.

    Under xdist each worker has a base folder of its own inside one run folder; the first
    to take the lock builds there, the others wait and find what it built.
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _built_once(tmp_path_factory, name: str, build):
    """``build(folder)``'s result, built once for the whole session: by the first process
    to ask (under xdist, every worker is a session of its own), then read back by the
    others. The result must be JSON (paths as strings); the folder is read only after."""
    with _session_lock(tmp_path_factory, name) as folder:
        done = folder.parent / f"{name}.json"
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # an earlier worker's failed build
            folder.mkdir(parents=True)
            done.write_text(json.dumps(build(folder)))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> pathlib.Path:
    """gin/demo.gin's corpus and vocabulary (``MODEL_DIR/demo_data``), as the demo's first
    run writes them (``demo_corpus.prepare_demo``, what its VOCAB_PATH evaluates), built
    once for the session: training the vocabulary is most of a demo's time on 2 cores.
    Read only: a test copies it into its MODEL_DIR, where the demo then reuses it as a
    second run of the demo would."""
    from xlmeta_jax.data import demo_corpus

    with _session_lock(tmp_path_factory, "demo_run") as model_dir:
        demo_corpus.prepare_demo(os.fspath(model_dir))
    return model_dir / "demo_data"


@pytest.fixture(scope="session")
def demo_run(demo_data, tmp_path_factory) -> dict:
    """README's demo (gin/demo.gin), shortened to 6 steps a phase, run once for the
    session by the command itself on the session's demo corpus: {"model_dir", "stdout",
    "stderr"}. Read only: tests/test_demo.py checks the run, and the embeddings demo
    starts from it (tests/test_embeddings_run.py)."""
    def build(folder):
        model_dir = folder / "demo"
        shutil.copytree(demo_data, model_dir / "demo_data")
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # what a user sees: the command's own settings
        cmd = [
            sys.executable, "-m", "xlmeta_jax.train", "--gin_file=gin/demo.gin",
            # Relative, as in README's command.
            f"--gin.MODEL_DIR='{os.path.relpath(model_dir, REPO)}'",
            "--gin.META_STEPS=6", "--gin.XLING_STEPS=6",
            "--gin.WARMUP_STEPS=2",
            "--gin.xlmeta_jax.pretrain.trainer.train.checkpoint_every=3",
            "--gin.xlmeta_jax.pretrain.trainer.train.log_every=3",
        ]
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=900)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        return {"model_dir": str(model_dir), "stdout": out.stdout, "stderr": out.stderr}

    return _built_once(tmp_path_factory, "demo_run_both_phases", build)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> pathlib.Path:
    """One finished tiny two-phase run (``errors_fixtures.RUN_GIN``), trained once for the
    session by the command itself and shared by both workers. Read only: a module takes
    its own copy (``errors_fixtures.copy_run``), so that reruns, locks and damage stay
    in that copy."""
    from errors_fixtures import env, train_cmd, write_gin

    def build(folder):
        model_dir = folder / "run"
        out = subprocess.run(train_cmd(write_gin(folder), model_dir), env=env(), cwd=REPO,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return str(model_dir)

    return pathlib.Path(_built_once(tmp_path_factory, "finished_run", build))
