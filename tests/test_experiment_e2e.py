"""The experiment command end to end on real shared text (gin/experiments/tiny.gin, two arms,
one seed): killed during pretraining, killed again during evaluation, then finished; nothing
finished is redone and results.json + the report hold every run."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _cmd(model_dir, shared_data):
    return [
        sys.executable, "-m", "xlmeta_jax.experiment",
        "--gin_file=gin/experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.SHARED_DATA_DIR='{shared_data}'",
        "--gin.xlmeta_jax.experiment.runner.experiment.arms=['meta', 'joint']",
        "--gin.SEEDS=[0]",
    ]


def _env():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = os.fspath(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # Compiling dominates at this size.
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"
    return env


def _run_until(path, cmd, log, timeout=600):
    """Starts the command, SIGKILLs it once ``path`` exists; returns what it printed."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=_env(), cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            t0 = time.time()
            while not os.path.exists(path):
                assert proc.poll() is None, pathlib.Path(log).read_text()[-3000:]
                assert time.time() - t0 < timeout, f"{path} never appeared"
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return pathlib.Path(log).read_text()


@pytest.mark.slow
def test_experiment_resumes_after_kills_and_writes_the_report(tmp_path, shared_data):
    exp_dir = tmp_path / "exp"
    cmd = _cmd(exp_dir, shared_data)

    # 1. Killed once phase 1 of meta has its first checkpoint (step 3 of 4).
    _run_until(exp_dir / "pretrain/meta/seed0/phase1/3/commit_success.txt", cmd,
               tmp_path / "run1.log")
    assert not (exp_dir / "pretrain/meta/seed0/summary.json").exists()

    # 2. Resumes phase 1 from that checkpoint; killed during the first evaluation, which
    # starts as soon as meta's checkpoint exists (before the joint arm pretrains).
    first_eval = exp_dir / "eval/meta/seed0/pawsx"
    out2 = _run_until(first_eval / "config.gin", cmd, tmp_path / "run2.log")
    assert "corpus and vocabulary prepared earlier" in out2
    assert "[phase1] resuming from" in out2 and "phase1/3 (step 3/4)" in out2
    assert "[joint seed 0] pretraining" not in out2
    assert not (first_eval / "results.json").exists()
    # The evaluation's config.gin: the task's config with this run's values appended.
    config = (first_eval / "config.gin").read_text()
    assert f"MODEL_DIR = {str(first_eval)!r}" in config and "finetune.seed = 0" in config

    # 3. Finishes: meta is not pretrained again, its interrupted evaluation is redone,
    # then the joint arm pretrains and is evaluated.
    out3 = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert out3.returncode == 0, out3.stdout[-3000:] + out3.stderr[-3000:]
    log3 = out3.stdout + out3.stderr
    assert "[meta seed 0] pretraining finished earlier" in log3
    assert "[phase1] step" not in log3 and "[phase2] step" not in log3  # meta: no step ran
    assert "[joint seed 0] pretraining: xlmeta_joint" in log3
    assert "[meta seed 0] pawsx (as python -m xlmeta_jax.finetune" in log3

    results = json.loads((exp_dir / "results.json").read_text())
    assert sorted(results["runs"]) == ["joint/seed0", "meta/seed0"]
    assert results["experiment"]["tokens"]["meta"] == results["experiment"]["tokens"]["joint"]
    for run in results["runs"].values():
        assert sorted(run["evaluations"]) == ["pawsx", "tatoeba"]
        pawsx = run["evaluations"]["pawsx"]
        assert set(pawsx["languages"]) == {"de", "en", "es", "fr", "ja", "ko", "zh"}
        assert pawsx["transfer_gap"] == pytest.approx(pawsx["english"] - pawsx["average_target"])
        assert len(run["evaluations"]["tatoeba"]["layer_sweep"]) == 3  # embeddings + 2 layers
        curve = run["pretraining"]["loss_curve"]
        assert curve["tokens"] == sorted(set(curve["tokens"]))  # resumed steps counted once
        assert curve["tokens"][-1] == run["pretraining"]["tokens"]
    meta_phases = [p["task"] for p in results["runs"]["meta/seed0"]["pretraining"]["phases"]]
    assert meta_phases == ["xlmeta_english_text", "xlmeta_cc100"]
    report = (exp_dir / "report.md").read_text()
    assert "## pawsx (accuracy)" in report and "| joint |" in report
    for name in ("english_vs_target.png", "pawsx_languages.png", "retrieval_layers.png",
                 "pretraining_loss.png"):
        assert (exp_dir / name).stat().st_size > 1000, name
    manifest = json.loads((exp_dir / "corpus/manifest.json").read_text())
    assert manifest["evaluation_sets_excluded"] == ["tatoeba", "flores200", "xnli", "pawsx"]
