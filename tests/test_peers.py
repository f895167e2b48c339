"""A failing process of a two-process run ends both within seconds, with one line each
(``xlmeta_jax/cli/peers.py``), instead of leaving the other waiting in a collective."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from multihost import REPO, env, port

pytest.importorskip("apache_beam")

from xlmeta_jax import errors  # noqa: E402

PROG = "xlmeta_jax.train"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A prepared folder: English in two shards of many documents; Swahili, one document."""
    from xlmeta_jax.data import prepare, vocabulary

    root = tmp_path_factory.mktemp("peers")
    (root / "in").mkdir()
    (root / "in" / "en.txt").write_text("".join(
        f"the quick brown fox {i} jumps over {i * 7} lazy dogs\n" + ("\n" if i % 3 == 2 else "")
        for i in range(600)))
    (root / "in" / "sw.txt").write_text("habari ya asubuhi rafiki yangu\n")
    assert prepare.main([f"--input={root / 'in'}/*", f"--output={root / 'cc100'}",
                         "--shard_bytes=8000"]) == 0
    vocab = vocabulary.train_vocabulary({"en": [str(root / "in" / "en.txt")]},
                                        str(root / "spm" / "v"), 400, num_lines=600,
                                        num_threads=1, print_report=False)
    return {"cc100": root / "cc100", "vocab": vocab}


def _run(tmp_path, data, languages, cc100_of=lambda i, d: d, salt=0):
    """Both processes; returns (exit codes, stderr lines of each, seconds)."""
    procs = []
    started = time.monotonic()
    for i in range(2):
        cmd = [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=native/xlmr.gin",
               "--gin_file=models/tiny.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
               f"--gin.VOCAB_PATH='{data['vocab']}'",
               f"--gin.CC100_DIR='{cc100_of(i, data['cc100'])}'",
               f"--gin.CC100_LANGUAGES={languages!r}", "--gin.BATCH_SIZE=8",
               "--gin.SEQUENCE_LENGTH=32", "--gin.META_STEPS=2", "--gin.XLING_STEPS=2",
               "--gin.WARMUP_STEPS=1", f"--coordinator_address=localhost:{port(301 + salt)}",
               "--process_count=2", f"--process_index={i}"]
        procs.append(subprocess.Popen(cmd, env=env(4), cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300)[1] for p in procs]
    seconds = time.monotonic() - started
    lines = [[ln for ln in out.splitlines() if ln.strip()] for out in outs]
    return [p.returncode for p in procs], lines, seconds


def _ends(lines, *parts):
    """One line, the command's, naming every part."""
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), lines
    for part in parts:
        assert part in lines[0], (part, lines[0])


@pytest.mark.slow
def test_an_empty_share_is_refused_on_every_process(data, tmp_path):
    """Swahili's one document leaves process 1 nothing to read: refused from the statistics
    before any step, on both processes (where process 1's stream used to end at its first
    batch while process 0 waited in a collective for minutes)."""
    codes, lines, _ = _run(tmp_path, data, ["en", "sw"])
    assert codes == [errors.EXIT_USER_ERROR] * 2, lines
    # Each says it, or the other's line first ("process I failed: ..."): the same check.
    for out in lines:
        _ends(out, "'sw'", "1 documents", "1 lines", "2 processes")


@pytest.mark.slow
def test_one_process_failing_ends_the_other_with_its_line(data, tmp_path):
    """Only process 1 is given a CC-100 folder that does not exist: it says so, and process 0,
    which has no error of its own, ends at once with process 1's line."""
    missing = tmp_path / "no_cc100"
    codes, lines, _ = _run(tmp_path, data, ["en"], salt=1,
                                 cc100_of=lambda i, d: d if i == 0 else missing)
    assert codes == [errors.EXIT_USER_ERROR] * 2, lines
    _ends(lines[1], f"the CC-100 folder {missing} (CC100_DIR) does not exist")
    _ends(lines[0], "process 1 failed:", f"the CC-100 folder {missing} (CC100_DIR)")
    assert os.path.isdir(data["cc100"])


@pytest.mark.slow
def test_the_demo_as_two_processes_is_refused_before_building_anything(tmp_path):
    """Each process would build the demo corpus in the same folder (and a multi-process run
    counts no corpus): refused in one line on both, nothing built."""
    procs = [subprocess.Popen(
        [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=demo.gin",
         f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
         f"--coordinator_address=localhost:{port(311)}", "--process_count=2",
         f"--process_index={i}"], env=env(4), cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [errors.EXIT_USER_ERROR] * 2, outs
    for out in outs:
        _ends([ln for ln in out.splitlines() if ln.strip()], "the demo runs as one process")
    assert not (tmp_path / "run" / "demo_data").exists()
