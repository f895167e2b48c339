"""Evaluation on a pod: fine-tuning and the experiment's evaluations run on one host.

Started as one of several processes, ``python -m xlmeta_jax.finetune`` stops with one
line before reading a checkpoint or data or creating MODEL_DIR; the experiment stops
before it prepares a corpus or pretrains when it has evaluations to run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import multihost
import pytest
from errors_fixtures import digest

from xlmeta_jax import errors, hosts
from xlmeta_jax.evaluation.finetune import FineTuneConfig, finetune
from xlmeta_jax.experiment import runner
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.model.optimizer import OptimizerConfig

FINETUNE = [sys.executable, "-m", "xlmeta_jax.finetune", "--gin_file=finetune/pawsx.gin",
            "--gin_file=finetune/demo.gin", "--gin.INITIAL_CHECKPOINT_PATH='init:tiny'"]


def _error_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.strip()]


pytestmark = pytest.mark.usefixtures("clean_gin")


def test_one_host_check_reads_the_flags_and_the_tpu_slice(monkeypatch):
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    assert hosts.require_one_host(["--gin_file=x.gin"], "finetune") == ["--gin_file=x.gin"]
    assert hosts.require_one_host(
        ["--coordinator_address=h:1", "--process_count=1", "--process_index=0", "a"],
        "finetune") == ["a"]
    with pytest.raises(hosts.MultiHostError, match=r"^finetune runs on one host: this is "
                       r"process 1 of 4; run it on one host \(one VM\)"):
        hosts.require_one_host(["--process_count=4", "--process_index=1"], "finetune")
    # A Cloud TPU VM of a multi-host slice: no flags, the environment says it.
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3")
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    with pytest.raises(hosts.MultiHostError, match="this is process 1 of 2"):
        hosts.require_one_host([], "finetune")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2")
    assert hosts.require_one_host([], "finetune") == []
    with pytest.raises(hosts.MultiHostError, match="needs --process_count and --process_index"):
        hosts.require_one_host(["--coordinator_address=h:1"], "finetune")


def test_finetune_in_a_multiprocess_run_refuses_before_reading(tmp_path, monkeypatch):
    # The gin entry point too (the experiment and scripts call it in-process).
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with pytest.raises(hosts.MultiHostError, match="this is process 1 of 2"):
        finetune(FineTuneConfig(task="pawsx", initial_checkpoint_path="/no/such/checkpoint",
                                model_dir=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_experiment_with_evaluations_refuses_on_several_processes(tmp_path, monkeypatch):
    exp = runner.experiment(
        name="t", model_dir=str(tmp_path / "exp"), seeds=(0,), meta_steps=4, xling_steps=4,
        batch_size=8, sequence_length=32,
        model=EncoderConfig(vocab_size=100, num_layers=1, hidden_size=16, num_heads=2,
                            mlp_dim=32, max_position_embeddings=34),
        optimizer=OptimizerConfig(warmup_steps=2), english_task="en", xling_mixture="xx",
        tasks=("pawsx",))
    runner.check_hosts(exp)  # one process: fine
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(runner.ExperimentError, match="tasks=\\[\\] and rerun"):
        runner.run(exp)
    assert not (tmp_path / "exp").exists()
    runner.check_hosts(runner.experiment(**{**_fields(exp), "tasks": ()}))


def _fields(exp) -> dict:
    return dict(name=exp.name, model_dir=exp.model_dir, seeds=exp.seeds,
                meta_steps=exp.budget.meta_steps, xling_steps=exp.budget.xling_steps,
                batch_size=exp.budget.batch_size, sequence_length=exp.budget.sequence_length,
                model=exp.model, optimizer=exp.optimizer, english_task=exp.english_task,
                xling_mixture=exp.xling_mixture)


@pytest.mark.slow
def test_finetune_on_two_processes_stops_at_once_touching_nothing(tmp_path):
    new_dir = tmp_path / "new"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "results.json").write_text(json.dumps({"task": "pawsx", "average": 55.0}))
    before = digest(earlier)
    for model_dir in (new_dir, earlier):
        codes, outs = multihost.two_processes([*FINETUNE, f"--gin.MODEL_DIR='{model_dir}'"],
                                              multihost.port(200))
        assert codes == [errors.EXIT_USER_ERROR] * 2, outs
        for i, out in enumerate(outs):
            assert _error_lines(out) == [
                f"xlmeta_jax.finetune: error: finetune runs on one host: this is process {i} "
                "of 2; run it on one host (one VM) with the pretrained checkpoint"], out
    assert not new_dir.exists()
    assert digest(earlier) == before


@pytest.mark.slow
def test_finetune_on_a_tpu_vm_of_a_multi_host_slice_stops(tmp_path):
    env = {**multihost.env(), "TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3", "TPU_WORKER_ID": "1"}
    out = subprocess.run([*FINETUNE, f"--gin.MODEL_DIR='{tmp_path / 'run'}'"], env=env,
                         cwd=multihost.REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == errors.EXIT_USER_ERROR, out.stderr
    assert _error_lines(out.stdout + out.stderr) == [
        "xlmeta_jax.finetune: error: finetune runs on one host: this is process 1 of 2; run "
        "it on one host (one VM) with the pretrained checkpoint"]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_experiment_on_two_processes_stops_before_pretraining(tmp_path):
    model_dir = tmp_path / "exp"
    cmd = [sys.executable, "-m", "xlmeta_jax.experiment", "--gin_file=experiments/cpu.gin",
           f"--gin.MODEL_DIR='{model_dir}'"]
    codes, outs = multihost.run_two(cmd, 300, expected=(2, 2))
    assert codes == [errors.EXIT_USER_ERROR] * 2, outs
    def refusal(i):
        return (f"the experiment's evaluations run on one host: this is process {i} of 2; "
                "pretrain on the pod with --gin.xlmeta_jax.experiment.runner.experiment.tasks=[] "
                "and rerun the command without it on one host (one VM) to evaluate")

    for i, out in enumerate(outs):
        assert "Traceback" not in out, out
        # Its own refusal, or, where the other process refused first (cli/peers.py), the
        # other's: every process makes the same check.
        assert (f"xlmeta_jax.experiment: error: {refusal(i)}" in out
                or f"xlmeta_jax.experiment: error: process {1 - i} failed: {refusal(1 - i)}"
                in out), out
    assert not model_dir.exists()
