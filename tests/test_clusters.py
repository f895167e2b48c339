"""Cluster environments (SLURM, Open MPI, Cloud TPU) as ``jax.distributed`` reads them, the
precedence of explicit flags, the single-host refusal, and ``slurm/run.sbatch``'s srun line.

The two-process SLURM training run (resumed exactly as the two tasks of a job step) is
``test_host_streams.py::test_two_process_run_on_the_mixture_resumes_exactly``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import jax
import multihost
import pytest

from xlmeta_jax import errors, hosts
from xlmeta_jax.cli import train

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[001-004]", "SLURM_NTASKS": "32",
         "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}


@pytest.mark.parametrize("environ, expected", [
    (SLURM, hosts.ClusterEnvironment("SLURM", 32, 9)),
    ({**SLURM, "SLURM_NTASKS": "1"}, None),  # a one-task step: one process
    ({k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}, None),  # not a step
    ({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"},
     hosts.ClusterEnvironment("Open MPI", 4, 3)),
    ({"TPU_WORKER_HOSTNAMES": "a,b", "TPU_WORKER_ID": "1"},
     hosts.ClusterEnvironment("Cloud TPU", 2, "1")),
    ({"TPU_WORKER_HOSTNAMES": "a"}, None),
])
def test_cluster_environment_is_what_jax_detects(environ, expected):
    assert hosts.cluster_environment(environ) == expected


def test_a_mangled_slurm_variable_is_named():
    with pytest.raises(hosts.MultiHostError, match="SLURM_NTASKS='2x' in the environment"):
        hosts.cluster_environment({**SLURM, "SLURM_NTASKS": "2x"})


@pytest.fixture
def captured(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    return calls


def test_slurm_step_initialises_without_flags(captured):
    assert train.initialize_distributed(["--gin.X=1"]) == ["--gin.X=1"]
    assert captured == [{"local_device_ids": None}]  # JAX reads the coordinator, n and i


def test_explicit_flags_win_over_the_environment(captured):
    train.initialize_distributed(["--coordinator_address=h:1", "--process_count=2",
                                  "--process_index=1", "--local_device_ids=0,1"])
    assert captured == [{"coordinator_address": "h:1", "num_processes": 2, "process_id": 1,
                         "local_device_ids": [0, 1]}]


def test_no_cluster_no_initialisation(captured, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID")
    train.initialize_distributed([])
    assert captured == []


@pytest.mark.slow
def test_finetune_as_a_slurm_task_stops(tmp_path):
    env = multihost.slurm_env(1, job_id=4242)
    out = subprocess.run([sys.executable, "-m", "xlmeta_jax.finetune",
                          "--gin_file=finetune/pawsx.gin", f"--gin.MODEL_DIR='{tmp_path / 'r'}'"],
                         env=env, cwd=multihost.REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == errors.EXIT_USER_ERROR, out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "error:" in line]
    assert lines == ["xlmeta_jax.finetune: error: finetune runs on one host: this is process 1 "
                     "of 2; run it on one host (one VM) with the pretrained checkpoint"]
    assert not (tmp_path / "r").exists()


def _sbatch(env, *args):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "XLA_", "NCCL_"))}
    return subprocess.run(["bash", "slurm/run.sbatch", *args], env={**clean, **env},
                          cwd=multihost.REPO, capture_output=True, text=True, timeout=60)


def test_sbatch_script_parses_and_prints_its_srun_line():
    assert subprocess.run(["bash", "-n", "slurm/run.sbatch"], cwd=multihost.REPO).returncode == 0
    args = ("gin/native/meta.gin", "/runs/m", "--gin.CC100_DIR='/d'")
    out = _sbatch({"DRY_RUN": "1", "SLURM_JOB_NUM_NODES": "4", "SLURM_GPUS_ON_NODE": "8"}, *args)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    assert "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true" in words
    srun = words[words.index("srun"):]
    assert srun == ["srun", "--nodes=4", "--ntasks=32", "--ntasks-per-node=8",
                    "--kill-on-bad-exit=1",
                    ".venv/bin/python", "-m", "xlmeta_jax.train",
                    "--gin_file=gin/native/meta.gin", "--gin.MODEL_DIR='/runs/m'",
                    "--gin.CC100_DIR='/d'"]
    node = shlex.split(_sbatch({"DRY_RUN": "1", "TASKS": "node", "GPUS_PER_NODE": "4"},
                               *args).stdout)
    assert "--ntasks-per-node=1" in node and "--local_device_ids=0,1,2,3" in node
    # A job submitted with --ntasks-per-node=8: srun still starts one task per node.
    node = shlex.split(_sbatch({"DRY_RUN": "1", "TASKS": "node", "SLURM_GPUS_ON_NODE": "8",
                                "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "16",
                                "SLURM_NTASKS_PER_NODE": "8"}, *args).stdout)
    assert "--ntasks=2" in node and "--ntasks-per-node=1" in node
    # CPU nodes (no GPUs asked of sbatch): one process per node, no device ids.
    cpu = shlex.split(_sbatch({"DRY_RUN": "1", "SLURM_JOB_NUM_NODES": "2"}, *args).stdout)
    assert "--ntasks=2" in cpu and "--ntasks-per-node=1" in cpu
    assert not [w for w in cpu if w.startswith("--local_device_ids")]
    quoted = shlex.split(_sbatch({"DRY_RUN": "1"}, args[0], "/runs/it's", *args[2:]).stdout)
    assert '--gin.MODEL_DIR="/runs/it\'s"' in quoted
    t5x = shlex.split(_sbatch({"DRY_RUN": "1", "ENTRY": "t5x"}, *args).stdout)
    assert t5x[t5x.index("-m"):t5x.index("-m") + 3] == ["-m", "t5x.train", "--multiprocess_gpu"]
    refused = _sbatch({"DRY_RUN": "1", "ENTRY": "t5x", "TASKS": "node"}, *args)
    assert refused.returncode == 2 and "use TASKS=gpu with ENTRY=t5x" in refused.stderr


@pytest.mark.parametrize("env, args, part", [
    ({"GPUS_PER_NODE": "abc"}, (), "GPUS_PER_NODE=abc"),
    ({"GPUS_PER_NODE": "-1"}, (), "GPUS_PER_NODE=-1"),
    ({"TASKS": "rack"}, (), "TASKS=rack"),
    ({"ENTRY": "torch"}, (), "ENTRY=torch"),
    ({}, ("gin/native/nope.gin", "/runs/m"), "GIN_FILE gin/native/nope.gin"),
    ({}, ("gin/native/meta.gin", """/runs/a'b"c"""), "MODEL_DIR /runs/a'b\"c"),
])
def test_sbatch_refuses_a_bad_setting_in_one_line_before_srun(env, args, part):
    """DRY_RUN=1 too: a bad setting never prints an srun line."""
    out = _sbatch({"DRY_RUN": "1", **env}, *(args or ("gin/native/meta.gin", "/runs/m")))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and part in lines[0], out.stderr
    assert lines[0].startswith("slurm/run.sbatch: error: ") and not out.stdout
