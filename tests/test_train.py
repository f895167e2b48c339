"""End-to-end tests of the trainer: two phases, Ctrl-C and kill -9 then resume, NaN stop,
bad config, multi-process equality. All on the tiny model with the synthetic MLM stream
(the data pipeline has its own tests), 8 fake CPU devices."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import multihost
import numpy as np
import pytest
from errors_fixtures import foreign_lines, user_env

from xlmeta_jax import errors
from xlmeta_jax.cli import train
from xlmeta_jax.data import feeding
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.model import mlm, network
from xlmeta_jax.pretrain import checkpoints, loading, run_dir, trainer
from xlmeta_jax.pretrain import checks as validation

REPO = pathlib.Path(__file__).resolve().parents[1]

STEPS = 20  # per phase: long enough that a kill lands mid-run

RUN_GIN = """
import xlmeta_jax.pretrain.trainer
MODEL_DIR = %gin.REQUIRED
xlmeta_jax.pretrain.trainer.train.model_dir = %MODEL_DIR
xlmeta_jax.pretrain.trainer.train.mesh_shape = (2, 2, 2)
xlmeta_jax.pretrain.trainer.train.checkpoint_every = 5
xlmeta_jax.pretrain.trainer.train.keep_checkpoints = 2
xlmeta_jax.pretrain.trainer.train.log_every = 10
# Gradient accumulation on: the kill-and-resume tests then cover the accumulated step.
xlmeta_jax.pretrain.trainer.train.microbatches = 2
# Two branches from phase 1 (phase2, and a short one with its own masking), merged with TIES:
# the kill-and-resume tests then cover a branch and the merge step.
xlmeta_jax.pretrain.trainer.train.phases = [
    @phase1/xlmeta_jax.pretrain.trainer.Phase(), @phase2/xlmeta_jax.pretrain.trainer.Phase(),
    @branch/xlmeta_jax.pretrain.trainer.Phase()]
xlmeta_jax.pretrain.trainer.train.merge = @xlmeta_jax.pretrain.trainer.Merge()
xlmeta_jax.pretrain.trainer.Merge.branches = ['phase2', 'branch']
xlmeta_jax.pretrain.trainer.Merge.base = 'phase1'
xlmeta_jax.pretrain.trainer.Merge.density = 0.5
xlmeta_jax.pretrain.trainer.Phase.task = 'synthetic'
xlmeta_jax.pretrain.trainer.Phase.num_steps = {steps}
xlmeta_jax.pretrain.trainer.Phase.batch_size = 8
xlmeta_jax.pretrain.trainer.Phase.sequence_length = 32
phase1/xlmeta_jax.pretrain.trainer.Phase.name = 'phase1'
phase2/xlmeta_jax.pretrain.trainer.Phase.name = 'phase2'
phase2/xlmeta_jax.pretrain.trainer.Phase.init_from = 'phase1'
branch/xlmeta_jax.pretrain.trainer.Phase.name = 'branch'
branch/xlmeta_jax.pretrain.trainer.Phase.init_from = 'phase1'
branch/xlmeta_jax.pretrain.trainer.Phase.num_steps = 10
branch/xlmeta_jax.pretrain.trainer.Phase.mask_rate = 0.3
"""


_env = multihost.env


def _cmd(gin_path, model_dir, *extra):
    return [
        sys.executable, "-m", "xlmeta_jax.train",
        "--gin_file=models/tiny.gin", f"--gin_file={gin_path}",
        f"--gin.MODEL_DIR='{model_dir}'", *extra,
    ]


def _final_params(model_dir, phase="phase2"):
    step_dir = loading.find_step_dir(os.path.join(model_dir, phase))
    return checkpoints.restore_params(step_dir), checkpoints.read_meta(step_dir)


def _assert_same_params(a, b):
    flat_a = jax.tree_util.tree_leaves_with_path(a)
    flat_b = jax.tree.leaves(b)
    assert len(flat_a) == len(flat_b)
    for (path, x), y in zip(flat_a, flat_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                      err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def run_gin(tmp_path_factory):
    path = tmp_path_factory.mktemp("gin") / "run.gin"
    path.write_text(RUN_GIN.format(steps=STEPS))
    return path


@pytest.fixture(scope="module")
def reference_run(run_gin, tmp_path_factory):
    """One uninterrupted two-phase run through the command line."""
    model_dir = tmp_path_factory.mktemp("reference")
    out = subprocess.run(_cmd(run_gin, model_dir), env=_env(), cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return model_dir, out.stdout


@pytest.mark.slow
def test_two_phases_log_and_handoff(reference_run):
    model_dir, stdout = reference_run
    # Progress lines name phase, step/total, tokens seen (a phase's init_from chain's
    # included), loss, accuracy, lr, grad norm, tokens/s, ETA.
    assert f"[phase1] step 10/{STEPS} | 2.56k tokens | loss" in stdout
    assert f"[phase2] step {STEPS}/{STEPS} | 10.24k tokens | loss" in stdout
    assert "[branch] step 10/10 | 7.68k tokens | loss" in stdout
    for field in ("| acc ", "| lr ", "| gnorm ", "tok/s", "| MFU ", "| ETA "):
        assert field in stdout
    assert (model_dir / "config.gin").is_file()
    assert "phase2/Phase.init_from = 'phase1'" in (
        model_dir / "config.gin").read_text()
    # Phase 2 records the phase-1 checkpoint it started from.
    _, meta = _final_params(model_dir)
    assert meta["initialized_from"] == os.fspath(model_dir / "phase1" / str(STEPS))
    assert meta["phase_step"] == STEPS and meta["step_offset"] == 0
    # keep-N: only the last two checkpoints of each phase remain.
    for phase in ("phase1", "phase2"):
        steps = sorted(int(p.name) for p in (model_dir / phase).iterdir() if p.name.isdigit())
        assert steps == [STEPS - 5, STEPS]
    assert list((model_dir / "phase1" / "train").glob("events.out.tfevents.*"))
    # The merge step ends the run: MODEL_DIR resolves to it (fine-tuning, export).
    assert "[merged] merging phase2, branch (ties against phase1)" in stdout
    assert loading.find_step_dir(model_dir) == model_dir / "merged" / "0"
    assert "of " + os.fspath(model_dir / "phase2" / str(STEPS)) in checkpoints.read_meta(
        model_dir / "merged" / "0")["initialized_from"]


def _wait_for(path, proc, timeout=300):
    t0 = time.time()
    while not os.path.exists(path):
        assert proc.poll() is None, "run ended before it could be interrupted"
        assert time.time() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.slow
def test_ctrl_c_then_kill_resume_to_the_uninterrupted_run(reference_run, run_gin, tmp_path):
    """One run stopped twice, each time resumed by the same command: Ctrl-C in phase 1 (a
    checkpoint of that step, one line, exit 130), then kill -9 in phase 2 (resumed from its
    last checkpoint, never re-initialised from phase 1). It ends with the uninterrupted
    run's parameters, metrics and merge, bit for bit. (kill -9 in phase 1: the random kills
    of tests/test_soak.py, and the experiment's in tests/test_experiment_e2e.py.)"""
    ref_dir, _ = reference_run
    model_dir = tmp_path / "run"

    # 1. Ctrl-C once phase 1 has a checkpoint: it stops at a step boundary, saving that step.
    proc = subprocess.Popen(_cmd(run_gin, model_dir), env=user_env(_env()), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(model_dir / "phase1" / "5" / "commit_success.txt", proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == errors.EXIT_INTERRUPTED, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "[phase1] stopped at step" in lines[0], stderr
    assert "rerunning the same command resumes from" in lines[0]
    stopped_at = pathlib.Path(lines[0].rsplit(" ", 1)[-1])
    assert stopped_at.parent == model_dir / "phase1", stopped_at
    assert (stopped_at / "commit_success.txt").exists()
    assert not [p for p in (model_dir / "phase1").iterdir() if "tmp" in p.name]
    assert (model_dir / run_dir.LOCK_NAME).read_text() == ""  # released, holder cleared

    # 2. The same command resumes there; kill -9 once phase 2 has a checkpoint.
    log = tmp_path / "resumed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_cmd(run_gin, model_dir), env=user_env(_env()), cwd=REPO,
                                stdout=out, stderr=out)
        try:
            _wait_for(model_dir / "phase2" / "5" / "commit_success.txt", proc)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert f"[phase1] resuming from {stopped_at}" in log.read_text(), log.read_text()[-3000:]
    assert not (model_dir / "phase2" / str(STEPS)).exists()

    # 3. Again: phase 2 resumes from its own checkpoint, and the run finishes quietly.
    out = subprocess.run(_cmd(run_gin, model_dir), env=user_env(_env()), cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[phase1] already complete" in out.stdout
    assert "[phase2] resuming from" in out.stdout
    assert "[phase2] initialised from" not in out.stdout
    # No absl, Orbax or TensorFlow notices on a resume: only the command's own lines.
    assert not foreign_lines(out.stderr), out.stderr
    for phase in ("phase1", "phase2"):
        ref_params, ref_meta = _final_params(ref_dir, phase)
        params, meta = _final_params(model_dir, phase)
        _assert_same_params(ref_params, params)
        assert meta["metrics"] == ref_meta["metrics"]
    # The run's product, the merge of its branches (MODEL_DIR resolves to it), too.
    _assert_same_params(checkpoints.restore_params(loading.find_step_dir(ref_dir)),
                        checkpoints.restore_params(loading.find_step_dir(model_dir)))


def _tiny(**kw):
    return network.get_config("tiny", pad_token_id=0, **kw)


def test_nan_loss_stops_naming_step_and_never_checkpoints_nan(tmp_path):
    from xlmeta_jax.model.optimizer import OptimizerConfig

    # An absurd learning rate makes the parameters overflow after the first update.
    opt = OptimizerConfig(learning_rate=1e38, warmup_steps=0, total_steps=10, max_grad_norm=0)
    phases = [trainer.Phase("phase1", "synthetic", 6, 8, 32, optimizer=opt)]
    with pytest.raises(FloatingPointError, match=r"non-finite loss .* at step 2"):
        trainer.train(model_dir=os.fspath(tmp_path), model=_tiny(), phases=phases,
                      mesh_shape=(8, 1, 1), checkpoint_every=1, log_every=1,
                      async_checkpointing=False)
    saved = sorted(int(p.name) for p in (tmp_path / "phase1").iterdir() if p.name.isdigit())
    assert saved == [1]
    params = checkpoints.restore_params(tmp_path / "phase1" / "1")
    assert checkpoints.all_finite(params)


def test_steps_that_predict_nothing_stop_the_run(tmp_path, monkeypatch):
    # Blocks without a masked position (here: every weight zeroed) train nothing: the run
    # stops at the first progress line, as for a non-finite loss, not with exit 0.
    class Unmasked(feeding.SyntheticMLMIterator):
        def _global_numpy(self, index):
            batch = dict(super()._global_numpy(index))
            batch["mlm_weights"] = np.zeros_like(batch["mlm_weights"])
            return batch

    monkeypatch.setattr(feeding, "SyntheticMLMIterator", Unmasked)
    phases = [trainer.Phase("phase1", "synthetic", 6, 8, 32)]
    with pytest.raises(errors.NothingTrainedError,
                       match=r"\[phase1\] steps 1 to 2 predicted no token"):
        trainer.train(model_dir=os.fspath(tmp_path), model=_tiny(), phases=phases,
                      mesh_shape=(8, 1, 1), checkpoint_every=1, log_every=2,
                      async_checkpointing=False)


def test_checkpoint_refuses_non_finite_params(tmp_path):
    from xlmeta_jax.pretrain import step as step_lib

    ckpt = checkpoints.PhaseCheckpoints(os.fspath(tmp_path), save_interval_steps=1,
                                        max_to_keep=None, async_save=False)
    state = step_lib.TrainState(step=np.int32(1), params={"w": np.array([1.0, np.nan])},
                                opt_state=())
    with pytest.raises(FloatingPointError, match="not finite"):
        ckpt.save(1, state, None, {}, force=True)
    ckpt.close()
    assert not [p for p in tmp_path.iterdir() if p.name.isdigit()]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mesh_shape=(3, 1, 1)), r"mesh_shape.*\(3, 1, 1\).*8 are available"),
        (dict(mesh_shape=(2, 2, 4)), r"mesh_shape.*16 devices"),
        (dict(phases=[trainer.Phase("p", "synthetic", 2, 6, 32)]),
         r"phase 'p': batch_size=6 is not divisible"),
        (dict(phases=[trainer.Phase("p", "synthetic", 2, 8, 512)]),
         r"phase 'p': sequence_length \(.*\) = 512 exceeds the model's 129 positions"),
        (dict(phases=[trainer.Phase("p", "synthetic", 2, 8, 32, init_from="q")]),
         r"init_from='q' is not an earlier phase"),
        (dict(rng_impl="philox"), r"train.rng_impl='philox' is not one of"),
        (dict(microbatches=0), r"microbatches must be a positive integer, got 0"),
        (dict(microbatches=2), r"batch_size=8 does not split into 2 microbatches"),
        # A masking rate that leaves most blocks without a prediction trains nothing.
        (dict(phases=[trainer.Phase("p", "synthetic", 2, 8, 32, mask_rate=0.01)]),
         r"phase 'p': masking rate 0.01 .* selects 0.30 of a block's 30 maskable tokens "
         r"\(sequence_length 32"),
        (dict(corpora=Corpora(masking=mlm.Masking(rate=0.001))),
         r"masking rate 0.001 .*raise it to at least 0.0167"),
        # A merge over branches the merged model could not be both of.
        (dict(phases=[trainer.Phase("a", "synthetic", 2, 8, 32),
                      trainer.Phase("b", "synthetic", 2, 8, 64, init_from="a"),
                      trainer.Phase("c", "synthetic", 2, 8, 32, init_from="a")],
              merge=trainer.Merge(branches=["b", "c"], base="a")),
         r"merge: branches 'b' \(sequence_length=64\) and 'c' \(sequence_length=32\) are of "
         r"different shapes"),
        (dict(phases=[trainer.Phase("a", "synthetic", 2, 8, 32)],
              merge=trainer.Merge(branches=["a", "b"], base="a")),
         r"Merge.branches names 'b', which is not a phase of the run \(\['a'\]\)"),
    ],
)
def test_invalid_config_fails_before_compiling(tmp_path, monkeypatch, kwargs, match):
    from xlmeta_jax.pretrain import step as step_lib

    def no_compile(*a, **k):
        raise AssertionError("compiled before validating")

    monkeypatch.setattr(step_lib, "make_step_functions", no_compile)
    args = dict(model_dir=os.fspath(tmp_path), model=_tiny(),
                phases=[trainer.Phase("p", "synthetic", 2, 8, 32)], mesh_shape=(8, 1, 1))
    args.update(kwargs)
    with pytest.raises(trainer.ConfigError, match=match):
        trainer.train(**args)


def test_a_stored_phase_is_resumed_only_with_its_rope_bases_and_length():
    from xlmeta_jax.pretrain import run_dir

    model = network.get_config("modernbert_tiny", local_window=16)
    ext = trainer.Phase("ext", "synthetic", 4, 8, 64, global_rope_theta=160000.0)
    meta = {"model_config": dataclasses.asdict(ext.model(model)), "sequence_length": 64,
            "phase_step": 2}
    run_dir.check_stored_config("ext/2", meta, model, ext)
    for changed, match in [
            (dict(global_rope_theta=10000.0), r"global_rope_theta=160000.0, the config asks "
             r"for 10000.0"),
            (dict(local_rope_theta=20000.0), r"local_rope_theta=10000.0, the config asks for "
             r"20000.0"),
            (dict(sequence_length=32), r"sequence_length=64, the config asks for 32")]:
        with pytest.raises(run_dir.RunConfigMismatch, match=match):
            run_dir.check_stored_config("ext/2", meta, model, dataclasses.replace(ext, **changed))


def test_a_run_that_fails_on_its_inputs_leaves_no_model_dir(tmp_path):
    model_dir = tmp_path / "new_run"
    with pytest.raises(errors.UserError, match="no vocabulary configured"):
        trainer.train(model_dir=os.fspath(model_dir), model=_tiny(), mesh_shape=(8, 1, 1),
                      phases=[trainer.Phase("p", "xlmeta_cc100", 2, 8, 32)])
    assert not model_dir.exists()


def test_unwritable_model_dir(tmp_path, monkeypatch):
    from xlmeta_jax.pretrain import step as step_lib

    monkeypatch.setattr(step_lib, "make_step_functions", None)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(trainer.ConfigError,
                       match=r"MODEL_DIR .*file/run: .*/file is a file, not a directory"):
        trainer.train(model_dir=os.fspath(blocker / "run"), model=_tiny(),
                      phases=[trainer.Phase("p", "synthetic", 2, 8, 32)], mesh_shape=(8, 1, 1))


def test_model_dir_check_is_safe_for_concurrent_hosts(tmp_path):
    # Every host of a pod checks the same shared MODEL_DIR at the same time; one
    # host's probe must never be another's.
    import concurrent.futures

    def check(_):
        for _ in range(200):
            validation.check_model_dir(os.fspath(tmp_path))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(check, range(8)))
    assert list(tmp_path.iterdir()) == []


def test_missing_macro_names_it(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=models/tiny.gin",
         "--gin_bindings=MODEL_DIR = %gin.REQUIRED",
         "--gin_bindings=xlmeta_jax.pretrain.trainer.train.model_dir = %MODEL_DIR"],
        env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert "MODEL_DIR" in out.stderr
    assert not any(tmp_path.iterdir())


def test_unknown_gin_file_is_named():
    with pytest.raises(FileNotFoundError, match="no_such.gin"):
        train.main(["--gin_file=no_such.gin"])


MULTIHOST = textwrap.dedent("""
    import sys
    import jax
    from xlmeta_jax.model import network
    from xlmeta_jax.cli import train
    from xlmeta_jax.pretrain import trainer
    train.setup_logging()
    rest = train.initialize_distributed(sys.argv[2:])
    assert jax.device_count() == 8, jax.device_count()
    trainer.train(model_dir=sys.argv[1], model=network.get_config("tiny", pad_token_id=0),
                  phases=[trainer.Phase("phase1", "synthetic", 4, 8, 32)], mesh_shape=(2, 2, 2),
                  checkpoint_every=4, log_every=2)
""")


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    script = tmp_path / "mh.py"
    script.write_text(MULTIHOST)
    one = subprocess.run([sys.executable, script, tmp_path / "one"], env=_env(8), cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = tmp_path / "two"
    codes, outs = multihost.run_two([sys.executable, script, two], 0, fresh=two)
    assert codes == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    for i in range(2):
        assert f"jax.distributed from flags: process {i} of 2, 4 local devices" in outs[i]
    # (Two processes started as SLURM's tasks: tests/test_host_streams.py's resumed run.)
    a, meta_a = _final_params(tmp_path / "one", "phase1")
    b, meta_b = _final_params(two, "phase1")
    # Not bit-identical: gradients are all-reduced across processes (gloo) in another
    # summation order than within one process. 1e-7 is ~1000x below one AdamW update
    # (lr 6e-4 x O(1)), so a wrong shard or a missing process's data would show.
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))
    assert meta_a["metrics"]["loss"] == pytest.approx(meta_b["metrics"]["loss"], rel=1e-6)
    print(f"final loss: one process {meta_a['metrics']['loss']}, two by flags "
          f"{meta_b['metrics']['loss']}")


@pytest.fixture(scope="module")
def phase1_run(tmp_path_factory):
    """One short phase in this process: its final step directory."""
    model_dir = tmp_path_factory.mktemp("phase1_only")
    trainer.train(model_dir=os.fspath(model_dir), model=_tiny(),
                  phases=[trainer.Phase("phase1", "synthetic", 3, 8, 32)], mesh_shape=(8, 1, 1),
                  checkpoint_every=3, log_every=3, async_checkpointing=False)
    return model_dir / "phase1" / "3"


def _handoff(step_dir, monkeypatch, **flags):
    from xlmeta_jax.model import partitioning
    from xlmeta_jax.model.optimizer import OptimizerConfig
    from xlmeta_jax.pretrain import step as step_lib

    fns = step_lib.make_step_functions(
        _tiny(), OptimizerConfig(total_steps=10, warmup_steps=1),
        partitioning.create_mesh(8, 1, 1))
    if flags["reset_optimizer"]:
        # Parameters only: the whole earlier state (with its AdamW moments) is never read.
        def whole_state(*a, **k):
            raise AssertionError("restored the earlier phase's whole state")

        monkeypatch.setattr(checkpoints.PhaseCheckpoints, "restore", whole_state)
    else:
        # The earlier state whole, restored once: no fresh state beside it.
        def fresh_state(*a, **k):
            raise AssertionError("built a fresh state beside the restored one")

        fns = dataclasses.replace(fns, init=fresh_state, from_params=fresh_state)
    return fns, loading.handoff_state(fns, step_dir, **flags)


def _counts(opt_state):
    return [int(x) for path, x in jax.tree_util.tree_leaves_with_path(opt_state)
            if loading.is_count(path)]


def _moments(opt_state):
    return [np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(opt_state)
            if not loading.is_count(path)]


@pytest.mark.parametrize("reset_schedule", [True, False])
def test_handoff_with_fresh_optimizer_restores_params_only(phase1_run, monkeypatch,
                                                           reset_schedule):
    _, state = _handoff(phase1_run, monkeypatch, reset_optimizer=True,
                        reset_schedule=reset_schedule)
    _assert_same_params(checkpoints.restore_params(phase1_run), state.params)
    assert all(not m.any() for m in _moments(state.opt_state))
    expected = 0 if reset_schedule else 3
    assert int(state.step) == expected
    assert set(_counts(state.opt_state)) == {expected}


@pytest.mark.parametrize("reset_schedule", [True, False])
def test_handoff_keeping_optimizer_carries_moments(phase1_run, monkeypatch, reset_schedule):
    fns, state = _handoff(phase1_run, monkeypatch, reset_optimizer=False,
                          reset_schedule=reset_schedule)
    ckpt = checkpoints.PhaseCheckpoints(os.fspath(phase1_run.parent), save_interval_steps=1,
                                        max_to_keep=None, read_only=True)
    saved, _ = ckpt.restore(3, fns.abstract_state)
    ckpt.close()
    _assert_same_params(saved.params, state.params)
    for a, b in zip(_moments(saved.opt_state), _moments(state.opt_state), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(m.any() for m in _moments(state.opt_state))
    # A fresh schedule: step and optax's counters restart at 0; else they go on.
    expected = 0 if reset_schedule else 3
    assert int(state.step) == expected and set(_counts(state.opt_state)) == {expected}
