"""Bad inputs and faults: each gives one line naming the bad thing, a non-zero exit and
leaves existing runs untouched (issue #15's table; the command-line subset runs in
subprocesses in test_errors_cli.py).

The commands run in-process here through the same wrapper as their ``__main__``
(``errors.run_command``), against one tiny finished two-phase run per module.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import logging
import os
import socket
import sys

import gin
import pytest
from errors_fixtures import (
    STEPS,
    array_files,
    copy_run,
    digest,
    train_argv,
    write_gin,
)

from xlmeta_jax import errors
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.pretrain import checkpoints, loading, run_dir
from xlmeta_jax.pretrain import trainer as train

PROG = "xlmeta_jax.train"


pytestmark = pytest.mark.usefixtures("clean_gin")


def _train(argv, capsys) -> tuple[int, str]:
    gin.clear_config()
    capsys.readouterr()
    code = errors.run_command(train_cli.main, argv, prog=PROG)
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.fixture(scope="module")
def run_gin(tmp_path_factory):
    return write_gin(tmp_path_factory.mktemp("gin"))


@pytest.fixture(scope="module")
def finished(finished_run, tmp_path_factory):
    """This module's copy of the session's finished two-phase run (STEPS steps each;
    conftest.finished_run)."""
    return copy_run(finished_run, tmp_path_factory.mktemp("finished") / "run")


def _one_line(err: str, *parts: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{PROG}: "), err
    assert "Traceback" not in err
    for part in parts:
        assert part in lines[0], (part, lines[0])


# ---------------------------------------------------------------------------
# Command-line and gin mistakes against the finished run: nothing may change.
# ---------------------------------------------------------------------------

BAD_BINDINGS = [
    # (extra argv, parts of the one line)
    (["--gin.BATCH_SIZ=8"], ["unknown gin macro 'BATCH_SIZ'", "did you mean BATCH_SIZE"]),
    (["--gin.XLING_STEP=8"], ["unknown gin macro 'XLING_STEP'", "XLING_STEPS"]),
    (["--gin.META_STEPS=2.5"], ["META_STEPS = 2.5", "expected an integer"]),
    (["--gin.META_STEPS=0"], ["META_STEPS: must be an integer > 0, got 0"]),
    (["--gin.XLING_STEPS=-3"], ["phase 'phase2': XLING_STEPS: must be an integer > 0, got -3"]),
    (["--gin.BATCH_SIZE='sixteen'"], ["BATCH_SIZE = 'sixteen'", "expected an integer"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.seed='zero'"],
     ["train.seed = 'zero'", "expected an integer"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.sed=1"], ["doesn't have a parameter named 'sed'"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.log_every=0"],
     ["train.log_every = 0", "integer > 0"]),
    (["--gin.BATCH_SIZE=[8"], ["gin config"]),
    # gin's own text for these is Python's "<ast.Name object at 0x...>" / a bare EOF.
    (["--gin.META_STEPS=abc"], ["binding 'META_STEPS = abc'", "'abc' is not a value"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.mesh_shape=(8, 1"],
     ["binding 'xlmeta_jax.pretrain.trainer.train.mesh_shape = (8, 1'", "never closed"]),
    (["--gin_file=no_such.gin"], ["gin file 'no_such.gin' not found"]),
    (["--frobnicate=1"], ["unknown arguments", "--frobnicate=1"]),
    (["--gin_file"], ["flag --gin_file needs a value"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.mesh_shape=(3, 1, 1)"], ["mesh_shape", "(3, 1, 1)"]),
    (["--gin.BATCH_SIZE=12"], ["batch_size=12 is not divisible"]),
    (["--gin.SEQUENCE_LENGTH=4096"], ["sequence_length (SEQUENCE_LENGTH) = 4096 exceeds"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.rng_impl='philox'"], ["rng_impl='philox'"]),
    # A run whose stored config differs: named field, not Orbax's "strict=False" dump.
    (["--gin.xlmeta_jax.model.network.get_config.hidden_size=32"],
     ["EncoderConfig.hidden_size=64", "asks for 32"]),
    (["--gin.xlmeta_jax.model.network.get_config.hidden_size=32", "--gin.XLING_STEPS=8"],
     ["EncoderConfig.hidden_size=64", "asks for 32"]),
    (["--gin.xlmeta_jax.model.network.get_config.num_layers=3", "--gin.META_STEPS=8",
      "--gin.phase1/xlmeta_jax.model.optimizer.OptimizerConfig.total_steps=8"],
     ["EncoderConfig.num_layers=2", "asks for 3"]),
    (["--gin.SEQUENCE_LENGTH=16"], ["sequence_length=32", "asks for 16"]),
    (["--gin.SEQUENCE_LENGTH=2"],
     ["sequence_length (SEQUENCE_LENGTH) = 2 must be an integer of at least", "8 tokens"]),
    (["--gin.META_STEPS=2"], ["phase1/4 is at step 4", "num_steps=2"]),
    # In range, but at L=32 it predicts nothing in almost every block: refused, not trained.
    (["--gin.MASK_RATE=0.001"], ["masking rate 0.001 (MASK_RATE) selects 0.03 of a block's 30",
                                 "most blocks would predict nothing"]),
    # The masking is checked before the finished run is found complete.
    *[([f"--gin.MASK_RATE={rate}"],
       ["MASK_RATE: masking rate must be a number in (0, 1)", f"got {rate}"])
      for rate in ("1.5", "0", "-0.1")],
    (["--gin.MASK_RATE='high'"], ["MASK_RATE = 'high'", "expected a number"]),
    (["--gin.xlmeta_jax.model.mlm.Masking.rate=1.0"], ["Masking.rate: masking rate", "got 1.0"]),
    (["--gin.xlmeta_jax.model.mlm.Masking.mask_token_share=0.95"],
     ["xlmeta_jax.model.mlm.Masking.mask_token_share: mask_token_share=0.95"]),
    (["--gin.phase1/xlmeta_jax.pretrain.trainer.Phase.task='xlmeta_other'"], ["task='synthetic'"]),
    (["--gin.MODEL_SIZE='huge'"], ["MODEL_SIZE: unknown model size 'huge'", "'base'"]),
    # The encoder's fields: the binding the user gave (EncoderConfig checks them).
    (["--gin.xlmeta_jax.model.network.get_config.num_heads=3"],
     ["xlmeta_jax.model.network.get_config.num_heads: ", "num_heads=3"]),
    (["--gin.xlmeta_jax.model.network.get_config.remat_policy='most'"],
     ["xlmeta_jax.model.network.get_config.remat_policy: ", "'most'"]),
    (["--gin.xlmeta_jax.model.network.get_config.hiden_size=64"],
     ["xlmeta_jax.model.network.get_config.hiden_size: not an EncoderConfig field"]),
    # Optimizer settings: the binding the user gave, not only the internal field.
    (["--gin.phase1/xlmeta_jax.model.optimizer.OptimizerConfig.warmup_steps=20"],
     ["phase1/OptimizerConfig.warmup_steps: must be in [0, total_steps=4], got 20"]),
    (["--gin.xlmeta_jax.model.optimizer.OptimizerConfig.learning_rate=1e999"],
     ["OptimizerConfig.learning_rate: must be a finite number > 0, got inf"]),
    # Stages in tokens, RoPE per stage, the merge step (mmBERT's recipe).
    (["--gin.phase1/xlmeta_jax.pretrain.trainer.Phase.num_tokens=2048"],
     ["phase1/xlmeta_jax.pretrain.trainer.Phase.num_tokens", "num_steps=4", "give one"]),
    (["--gin.phase2/xlmeta_jax.pretrain.trainer.Phase.num_tokens=-5"],
     ["phase2/xlmeta_jax.pretrain.trainer.Phase.num_tokens", "> 0"]),
    (["--gin.phase2/xlmeta_jax.pretrain.trainer.Phase.global_rope_theta=160000.0"],
     ["global_rope_theta=160000.0", "'xlmr' family"]),
    (["--gin.phase2/xlmeta_jax.pretrain.trainer.Phase.local_rope_theta=0.5"],
     ["phase2/xlmeta_jax.pretrain.trainer.Phase.local_rope_theta", "RoPE base > 1"]),
    (["--gin.xlmeta_jax.pretrain.trainer.train.checkpoint_every_tokens=0"],
     ["train.checkpoint_every_tokens = 0", "integer > 0"]),
    *[(["--gin.xlmeta_jax.pretrain.trainer.train.merge=@xlmeta_jax.pretrain.trainer.Merge()",
        *[f"--gin.xlmeta_jax.pretrain.trainer.Merge.{b}" for b in bindings]], parts)
      for bindings, parts in [
          (["branches=['phase2', 'nope']", "base='phase1'"],
           ["Merge.branches names 'nope'", "not a phase of the run"]),
          (["branches=['phase1', 'phase2']"], ["Merge.base", "needs base"]),
          (["branches=['phase2']", "base='phase1'"], ["Merge.branches", "2 or more"]),
          (["branches=['phase1', 'phase2']", "base='phase1'"],
           ["Merge.base='phase1' is one of the branches"]),
          (["branches=['phase1', 'phase2']", "method='linear'", "density=0.5"],
           ["Merge.density", "linear"]),
      ]],
]


@pytest.mark.parametrize("extra, parts", BAD_BINDINGS, ids=lambda x: str(x)[:60])
def test_bad_binding_is_one_line_and_run_untouched(finished, run_gin, capsys, extra, parts):
    before = digest(finished)
    code, err = _train(train_argv(run_gin, finished, *extra), capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, *parts)
    assert digest(finished) == before


@pytest.mark.parametrize("text, parts", [
    ("XLING_STEPS = (4\n", ["never closed"]),
    ("\nXLING_STEPS = four\n", ["line 2", "'four' is not a value"]),
])
def test_unparsable_gin_file_is_named(finished, run_gin, tmp_path, capsys, text, parts):
    bad = tmp_path / "bad.gin"
    bad.write_text(text)
    before = digest(finished)
    code, err = _train([*train_argv(run_gin, finished), f"--gin_file={bad}"], capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, f"gin file {bad}", *parts)
    assert "ast." not in err
    assert digest(finished) == before


def test_missing_required_macro_is_named(run_gin, tmp_path, capsys):
    code, err = _train(["--gin_file=models/tiny.gin", f"--gin_file={run_gin}"], capsys)
    assert code == errors.EXIT_USER_ERROR
    _one_line(err, "MODEL_DIR")


def test_no_gin_file(capsys):
    code, err = _train([], capsys)
    assert code == errors.EXIT_USER_ERROR
    _one_line(err, "--gin_file")


def test_rerun_of_complete_run_changes_nothing(finished, run_gin, capsys):
    before = digest(finished)
    code, err = _train(train_argv(run_gin, finished), capsys)
    assert code == 0, err
    assert digest(finished) == before  # config.gin not rewritten either


def test_paths_are_read_as_a_shell_would(finished, run_gin, capsys, monkeypatch, tmp_path):
    # MODEL_DIR='~/...' is the run in the home folder, not a folder named '~' here.
    monkeypatch.setenv("HOME", str(finished.parent))
    monkeypatch.chdir(tmp_path)
    before = digest(finished)
    code, err = _train(train_argv(run_gin, f"~/{finished.name}"), capsys)
    assert code == 0, err
    assert digest(finished) == before and os.listdir(tmp_path) == []
    # A variable the shell would expand but that is not set is named, with the setting.
    monkeypatch.delenv("XLMETA_NO_SUCH", raising=False)
    code, err = _train(train_argv(run_gin, "$XLMETA_NO_SUCH/run"), capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, "MODEL_DIR='$XLMETA_NO_SUCH/run': the environment variable XLMETA_NO_SUCH "
              "is not set")
    assert os.listdir(tmp_path) == []


def test_debug_shows_the_traceback(finished, run_gin, capsys, monkeypatch):
    with pytest.raises(gin_cli.GinConfigError, match="BATCH_SIZ"):
        errors.run_command(train_cli.main, [*train_argv(run_gin, finished), "--gin.BATCH_SIZ=8",
                                        "--debug"], prog=PROG)
    gin.clear_config()
    monkeypatch.setenv(errors.DEBUG_ENV, "1")
    with pytest.raises(gin_cli.GinConfigError):
        errors.run_command(train_cli.main, [*train_argv(run_gin, finished), "--gin.BATCH_SIZ=8"],
                           prog=PROG)


def test_bugs_keep_their_traceback():
    def buggy(argv):
        return {}["missing"]

    with pytest.raises(KeyError):
        errors.run_command(buggy, [], prog="x")


# ---------------------------------------------------------------------------
# Damaged run directories (on copies of the finished run).
# ---------------------------------------------------------------------------


def _damage(model_dir, how: str):
    final = model_dir / "phase2" / str(STEPS)
    if how == "delete_array_file":
        array_files(final)[0].unlink()
    elif how == "truncate_array_files":
        for f in array_files(final):
            f.write_bytes(f.read_bytes()[:7])
    elif how == "corrupt_metadata":
        (final / "meta" / "metadata").write_bytes(os.urandom(64) + b"\xff\xfe")
    elif how == "metadata_not_json_object":
        (final / "meta" / "metadata").write_text("[1, 2]")
    elif how == "corrupt_step_metadata":  # Orbax's own per-step file: not UTF-8
        (final / "_CHECKPOINT_METADATA").write_bytes(os.urandom(64) + b"\xff\xfe")
    elif how == "truncated_step_metadata":  # valid UTF-8, not JSON
        path = final / "_CHECKPOINT_METADATA"
        path.write_bytes(path.read_bytes()[:10])
    elif how == "delete_state_metadata":
        (final / "state" / "_METADATA").unlink()
    elif how == "phase1_final_truncated":
        # phase 2 not started yet: it must not initialise from a damaged phase 1
        import shutil

        shutil.rmtree(model_dir / "phase2")
        for f in array_files(model_dir / "phase1" / str(STEPS)):
            f.write_bytes(b"")
    return final


@pytest.mark.parametrize("how, parts", [
    ("delete_array_file", ["checkpoint", "phase2/4", "is damaged"]),
    ("truncate_array_files", ["checkpoint", "phase2/4", "is damaged"]),
    ("corrupt_metadata", ["checkpoint metadata", "phase2/4/meta/metadata", "is corrupted"]),
    ("metadata_not_json_object", ["phase2/4/meta/metadata", "is corrupted"]),
    ("corrupt_step_metadata", ["phase2/4/_CHECKPOINT_METADATA", "is corrupted"]),
    ("truncated_step_metadata", ["phase2/4/_CHECKPOINT_METADATA", "is corrupted"]),
    ("delete_state_metadata", ["phase2/4", "is damaged"]),
    ("phase1_final_truncated", ["phase1/4", "is damaged"]),
])
def test_damaged_checkpoint_is_one_line(finished, run_gin, tmp_path, capsys, caplog, how,
                                        parts):
    model_dir = copy_run(finished, tmp_path / "run")
    _damage(model_dir, how)
    before = digest(model_dir)
    code, err = _train(train_argv(run_gin, model_dir), capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, *parts)
    assert "already complete" not in err + caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert digest(model_dir) == before


@pytest.mark.parametrize("how", ["delete_array_file", "corrupt_metadata",
                                 "corrupt_step_metadata"])
def test_hf_export_of_damaged_checkpoint_is_one_line(finished, tmp_path, capsys, how):
    from xlmeta_jax.cli import hf

    model_dir = copy_run(finished, tmp_path / "run")
    _damage(model_dir, how)
    code = errors.run_command(hf.main, ["to_hf", f"--checkpoint={model_dir}",
                                        f"--output={tmp_path / 'out'}"], prog="xlmeta_jax.hf")
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR
    assert len(err.splitlines()) == 1 and "phase2/4" in err, err
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("task", ["xnli", "tatoeba"])
def test_finetune_of_damaged_checkpoint_leaves_no_run(finished, shared_data, tmp_path, capsys,
                                                     task):
    from xlmeta_jax.cli import finetune as finetune_cli

    model_dir = copy_run(finished, tmp_path / "run")
    _damage(model_dir, "truncate_array_files")
    out = tmp_path / "eval"
    try:
        code = errors.run_command(finetune_cli.main, [
            f"--gin_file=finetune/{task}.gin", "--gin_file=finetune/demo.gin",
            f"--gin.INITIAL_CHECKPOINT_PATH='{model_dir}'", f"--gin.MODEL_DIR='{out}'",
            f"--gin.DATA_DIR='{shared_data}'"], prog="xlmeta_jax.finetune")
    finally:
        gin.clear_config()
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR
    assert len(err.splitlines()) == 1 and "phase2/4 is damaged" in err, err
    # Neither a config.gin nor an empty folder that would look like a started evaluation.
    assert not out.exists()


def test_load_pretrained_names_damage(finished, tmp_path):
    model_dir = copy_run(finished, tmp_path / "run")
    _damage(model_dir, "truncate_array_files")
    with pytest.raises(checkpoints.CheckpointError, match=r"phase2/4 is damaged"):
        loading.load_pretrained(model_dir)


# ---------------------------------------------------------------------------
# The run-directory lock.
# ---------------------------------------------------------------------------


def test_live_lock_names_its_holder(finished, run_gin, capsys):
    before = digest(finished)
    with run_dir.RunLock(finished):
        code, err = _train(train_argv(run_gin, finished), capsys)
    assert code == errors.EXIT_USER_ERROR
    _one_line(err, f"is in use by pid {os.getpid()} on host {socket.gethostname()} since")
    after = digest(finished)
    # The holder's own record was cleared on release; nothing else changed.
    assert after == before


def test_stale_lock_of_dead_process_is_taken_over(tmp_path, caplog):
    (tmp_path / run_dir.LOCK_NAME).write_text(json.dumps(
        {"host": "elsewhere", "pid": 999999, "since": "2020-01-01T00:00:00"}))
    with caplog.at_level("INFO", logger="xlmeta_jax.train"):
        with run_dir.RunLock(tmp_path) as lock:
            held = json.loads(open(lock.path).read())
    assert held["pid"] == os.getpid()
    assert "pid 999999 on host elsewhere" in caplog.text
    assert (tmp_path / run_dir.LOCK_NAME).read_text() == ""


def test_lock_fallback_without_flock_checks_pid(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    (tmp_path / run_dir.LOCK_NAME).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": os.getppid(), "since": "t"}))
    with pytest.raises(run_dir.RunLockedError, match=f"pid {os.getppid()}"):
        run_dir.RunLock(tmp_path).acquire()
    (tmp_path / run_dir.LOCK_NAME).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": 999999, "since": "t"}))
    run_dir.RunLock(tmp_path).acquire().release()


# ---------------------------------------------------------------------------
# Vocabulary and schedule validation (issue #13's two checks).
# ---------------------------------------------------------------------------


def _write_toy_text(path) -> None:
    """300 lines of pangram text, the toy vocabularies' training corpus."""
    path.write_text("\n".join(f"the quick brown fox {i} jumps over {i * 7} lazy dogs, "
                               f"sphinx of black quartz judge my vow {i % 13}"
                               for i in range(300)))


@pytest.fixture(scope="module")
def toy_spm(tmp_path_factory):
    import sentencepiece as spm

    folder = tmp_path_factory.mktemp("spm")
    text = folder / "t.txt"
    _write_toy_text(text)
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(folder / "v"), vocab_size=60, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, num_threads=1,
    )
    return folder / "v.model"


def _tiny(**kw):
    from xlmeta_jax.model import network

    kw.setdefault("pad_token_id", 0)
    return network.get_config("tiny", **kw)


def test_vocab_path_not_sentencepiece_is_named(tmp_path):
    bad = tmp_path / "spm.model"
    bad.write_bytes(b"\x08\x96\x01 this is not a model" * 10)
    with pytest.raises(train.ConfigError, match=f"VOCAB_PATH {bad} is not a SentencePiece"):
        train.check_vocabulary(os.fspath(bad), _tiny())
    with pytest.raises(train.ConfigError, match="does not exist"):
        train.check_vocabulary(os.fspath(tmp_path / "nope.model"), _tiny())
    with pytest.raises(train.ConfigError, match=f"VOCAB_PATH {tmp_path}: .* has no tokenizer"):
        train.check_vocabulary(os.fspath(tmp_path), _tiny())


def test_vocab_larger_than_embedding_and_pad_mismatch(toy_spm):
    train.check_vocabulary(os.fspath(toy_spm), _tiny(vocab_size=64))
    with pytest.raises(train.ConfigError, match=r"vocab_size=32 does not cover the 60 pieces"):
        train.check_vocabulary(os.fspath(toy_spm), _tiny(vocab_size=32))
    with pytest.raises(train.ConfigError, match=r"pad_token_id=1 differs from the pad id 0"):
        train.check_vocabulary(os.fspath(toy_spm), _tiny(vocab_size=64, pad_token_id=1))


def test_schedule_must_cover_carried_step_count(tmp_path):
    from xlmeta_jax.model.optimizer import OptimizerConfig

    p1 = train.Phase("phase1", "synthetic", 4, 8, 32)
    p2 = train.Phase("phase2", "synthetic", 4, 8, 32, init_from="phase1", reset_schedule=False,
                     optimizer=OptimizerConfig(total_steps=4, warmup_steps=1))
    with pytest.raises(train.ConfigError, match=r"total_steps=4 .* < step_offset 4 \+ num_steps 4"):
        train.validate(os.fspath(tmp_path), _tiny(), [p1, p2], (8, 1, 1), 8)
    p2.optimizer = OptimizerConfig(total_steps=8, warmup_steps=1)
    train.validate(os.fspath(tmp_path), _tiny(), [p1, p2], (8, 1, 1), 8)
    p2.reset_schedule = True
    p2.optimizer = OptimizerConfig(total_steps=4, warmup_steps=1)
    train.validate(os.fspath(tmp_path), _tiny(), [p1, p2], (8, 1, 1), 8)


@pytest.mark.parametrize("family, overrides, packed, backend, message", [
    ("tiny", {}, True, None, "Corpora.packing='documents' (xlmeta_jax.data.corpora.Corpora."
     "packing) packs documents that attend only to themselves, which the xlmr family does not"),
    ("tiny", {"attention_impl": "cudnn"}, False, None, "attention_impl='cudnn' (xlmeta_jax."
     "model.network.get_config.attention_impl) is cuDNN's kernel, on NVIDIA GPUs only; this "
     "run's backend is 'cpu'"),
    ("modernbert_tiny", {"attention_impl": "splash"}, True, None, "attention_impl='splash' "
     "(xlmeta_jax.model.network.get_config.attention_impl) is Pallas' TPU kernel, on TPUs "
     "only; this run's backend is 'cpu'"),
    ("modernbert_tiny", {"attention_impl": "splash", "local_window": 16}, True, "tpu",
     "phase 'phase1': sequence_length=32 is not a multiple of 128, which "
     "attention_impl='splash' (xlmeta_jax.model.network.get_config.attention_impl) needs"),
    ("modernbert_tiny", {"local_window": 32}, False, None, "phase 'phase1': local_window=32 "
     "(xlmeta_jax.model.network.get_config.local_window) must be shorter than "
     "sequence_length=32"),
    ("modernbert_tiny", {"local_window": 16}, True, None, None),
    ("modernbert_tiny", {"local_window": 16, "attention_impl": "auto"}, False, None, None),
    # 'auto' on a TPU: splash where the rows allow it, XLA for 32-token rows.
    ("modernbert_tiny", {"local_window": 16, "attention_impl": "auto"}, True, "tpu", None),
])
def test_family_settings_are_checked_against_the_run(tmp_path, family, overrides, packed,
                                                     backend, message):
    """Settings the model's config cannot check alone: packed rows for the family, the
    attention kernel for the backend and the row length, the local window for the row
    length."""
    from xlmeta_jax.model import network

    model = network.get_config(family, pad_token_id=0, **overrides)
    p1 = train.Phase("phase1", "synthetic", 4, 8, 32)

    def check():
        train.validate(os.fspath(tmp_path), model, [p1], (8, 1, 1), 8, packed=packed,
                       backend=backend)

    if message is None:
        check()
        return
    with pytest.raises(train.ConfigError) as err:
        check()
    assert message in str(err.value), str(err.value)


# ---------------------------------------------------------------------------
# Disk full while writing a checkpoint.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("error, what", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
    # TensorFlow's SaveV2 (the tf.data iterator's state) past `ulimit -f`.
    (RuntimeError("{{function_node __wrapped__SaveV2}} /x/part-00000.tempstate1; File too "
                  "large [Op:SaveV2]"), r"file size limit exceeded \(ulimit -f\)"),
], ids=["enospc", "edquot", "efbig"])
def test_disk_full_is_one_line_and_leaves_no_partial_checkpoint(tmp_path, error, what):
    import numpy as np

    from xlmeta_jax.pretrain import step as step_lib

    class Iterator:
        def save(self, filename):
            # The state item is written by then; the disk fills on the data item.
            raise error

    ckpt = checkpoints.PhaseCheckpoints(os.fspath(tmp_path), save_interval_steps=1,
                                        max_to_keep=None, async_save=True)
    state = step_lib.TrainState(step=np.int32(1), params={"w": np.ones(3, np.float32)},
                                opt_state=())
    with pytest.raises(errors.NoSpaceError,
                       match=what + r" while writing checkpoint .*/1 .*"
                             r"resumes from the phase's start\)"):
        ckpt.save(1, state, Iterator(), {}, force=True)
        ckpt.wait()
    ckpt.close()
    assert os.listdir(tmp_path) == []


def test_no_space_is_recognised_through_tensorstore_messages():
    e = ValueError('RESOURCE_EXHAUSTED: Failed to write 9 bytes: No space left on device '
                   "[os_error_code='28']")
    assert errors.is_no_space(RuntimeError("wrapped").with_traceback(None)) is False
    wrapped = RuntimeError("background save failed")
    wrapped.__cause__ = e
    assert errors.is_no_space(wrapped)


# ---------------------------------------------------------------------------
# Data commands and corpora.
# ---------------------------------------------------------------------------


def test_vocabulary_refuses_an_unknown_language(tmp_path, capsys):
    from xlmeta_jax.data import vocabulary

    (tmp_path / "t.txt").write_text("some text\n")
    code = errors.run_command(vocabulary.main, [
        "--files", f"zz={tmp_path}/t.txt", "--files", f"en={tmp_path}/t.txt",
        f"--output_prefix={tmp_path}/v"], prog="xlmeta_jax.data.vocabulary")
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR
    assert len(err.splitlines()) == 1 and "--files" in err and "'zz'" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_vocabulary_on_a_small_text_says_what_it_trains_on(tmp_path, capsys, caplog):
    """--num_lines is reached by repeating lines: the log says how many are distinct, and
    SentencePiece's refusal of the settings is one line."""
    import logging

    from xlmeta_jax.data import vocabulary

    (tmp_path / "t.txt").write_text("Hello world, this is a test line.\nAnother line here.\n")
    args = ["--files", f"en={tmp_path}/t.txt", f"--output_prefix={tmp_path}/out/v",
            "--num_lines=1000", "--num_threads=1"]
    caplog.set_level(logging.INFO)
    code = errors.run_command(vocabulary.main, [*args, "--vocab_size=1000"],
                              prog="xlmeta_jax.data.vocabulary")
    assert "on 1000 sampled lines, 2 of them distinct" in caplog.text
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR
    assert err.splitlines() == [err] and "Vocabulary size too high (1000)" in err, err
    assert "--vocab_size=1000 is more than this text allows" in err, err
    # Found on the 2 distinct lines before the run on all 1000, and no output folder left.
    assert "found on the sample's 2 distinct lines, before training on all 1000" in err, err
    assert not (tmp_path / "out").exists()
    assert errors.run_command(vocabulary.main, [*args, "--vocab_size=280"],
                              prog="xlmeta_jax.data.vocabulary") == 0


def test_corpus_of_undecodable_bytes_is_refused_naming_the_file(tmp_path):
    import random

    from xlmeta_jax.data import text_files

    rng = random.Random(0)
    binary = tmp_path / "en.txt"
    binary.write_bytes(bytes(rng.randrange(256) for _ in range(20000)))
    with pytest.raises(text_files.CorpusError, match=f"{binary}: .*% of its lines are not valid"):
        text_files.corpus_stats([os.fspath(binary)], cache_dir=os.fspath(tmp_path / "cache"))
    # A text file with one stray undecodable line is fine.
    text = tmp_path / "fr.txt"
    text.write_bytes("\n".join(f"ligne {i} de texte" for i in range(50)).encode() + b"\n\xff\xfe\n")
    (stats,) = text_files.corpus_stats([os.fspath(text)], cache_dir=os.fspath(tmp_path / "cache"))
    assert stats.lines == 50 and stats.skipped_invalid_utf8 == 1


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_utf16_or_utf32_corpus_is_refused_naming_the_file(tmp_path, encoding):
    # Split at b"\n", UTF-16 lines decode as "valid" UTF-8 full of NULs: they must not
    # be trained on. "utf-16"/"utf-32" write a byte-order mark, "-le"/"-be" do not.
    from xlmeta_jax.data import text_files

    text = "".join(f"an English sentence number {i}\n" for i in range(200))
    path = tmp_path / "en.txt"
    path.write_bytes(text.encode(encoding))
    with pytest.raises(text_files.CorpusError) as info:
        text_files.corpus_stats([os.fspath(path)], cache_dir=os.fspath(tmp_path / "cache"))
    message = str(info.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"{path}: "), message
    assert "UTF-8" in message, message
    assert not (tmp_path / "cache").exists()  # refused before anything was counted
    # Listing the files refuses it too (a run with given cc100_counts counts nothing).
    with pytest.raises(text_files.CorpusError, match=f"^{path}: "):
        text_files.list_text_files(os.fspath(path), what="CC-100 language 'en'")


def test_utf8_corpus_with_a_byte_order_mark_is_accepted(tmp_path):
    # A UTF-8 mark is UTF-8 text: it only adds an invisible U+FEFF to the first line.
    from xlmeta_jax.data import text_files

    path = tmp_path / "en.txt"
    path.write_bytes("".join(f"line {i}\n" for i in range(20)).encode("utf-8-sig"))
    (stats,) = text_files.corpus_stats([os.fspath(path)], cache_dir=os.fspath(tmp_path / "cache"))
    assert stats.lines == 20 and stats.skipped_invalid_utf8 == 0


def test_closed_loop_callbacks_of_a_failed_read_are_dropped_and_nothing_else(monkeypatch):
    # A damaged checkpoint's other reads may complete on Orbax's closed event loop; their
    # unraisable RuntimeError would print a bare traceback next to the one line.
    seen = []
    monkeypatch.setattr(errors, "_previous_unraisablehook", lambda u: seen.append(u.exc_value))
    unraisable = lambda exc: type("Unraisable", (), {"exc_value": exc})()
    errors._drop_closed_loop_callbacks(unraisable(RuntimeError("Event loop is closed")))
    other = RuntimeError("a real bug")
    errors._drop_closed_loop_callbacks(unraisable(other))
    assert seen == [other]


@pytest.fixture(scope="module")
def data_spm(tmp_path_factory):
    """A vocabulary of the pretraining data's kind (data.vocabulary), on generated text."""
    from xlmeta_jax.data import vocabulary

    folder = tmp_path_factory.mktemp("data_spm")
    text = folder / "en.txt"
    _write_toy_text(text)
    # A sample of the text's own size (the default, 2M lines, repeats its 300 lines for
    # minutes of training on repeats).
    return vocabulary.train_vocabulary({"en": [os.fspath(text)]}, os.fspath(folder / "v"), 400,
                                       alpha=0.3, seed=0, num_lines=600, num_threads=1,
                                       print_report=False)


@pytest.mark.parametrize("kind, why", [("missing", "does not exist"),
                                       ("file", "is not a directory")])
def test_missing_cc100_dir_is_one_line_before_training(data_spm, tmp_path, capsys, monkeypatch,
                                                      kind, why):
    # The data modules' errors (CorpusError, VocabularyError, UnknownLanguageError) are
    # user errors: one line naming the folder and the macro, exit 2, no traceback.
    # Progress lines need a stdout of this test's (see the UTF-16 test below).
    monkeypatch.setattr(logging.getLogger("xlmeta_jax.train"), "handlers", [])
    missing = tmp_path / "no_cc100"
    if kind == "file":
        missing.write_text("not a folder")
    code, err = _train([
        "--gin_file=native/xlmr.gin", "--gin_file=models/tiny.gin",
        f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.VOCAB_PATH='{data_spm}'",
        f"--gin.CC100_DIR='{missing}'", "--gin.CC100_LANGUAGES=['en', 'de']",
        "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.META_STEPS=2",
        "--gin.XLING_STEPS=2", "--gin.WARMUP_STEPS=1"], capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, f"the CC-100 folder {missing} (CC100_DIR) {why}")
    assert not (tmp_path / "run" / "xlmr").exists()


def test_a_cc100_dir_under_home_is_named_expanded(data_spm, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger("xlmeta_jax.train"), "handlers", [])
    monkeypatch.setenv("HOME", str(tmp_path))
    code, err = _train([
        "--gin_file=native/xlmr.gin", "--gin_file=models/tiny.gin",
        "--gin.MODEL_DIR='~/run'", f"--gin.VOCAB_PATH='{data_spm}'",
        "--gin.CC100_DIR='~/no_cc100'", "--gin.CC100_LANGUAGES=['en', 'de']",
        "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.META_STEPS=2",
        "--gin.XLING_STEPS=2", "--gin.WARMUP_STEPS=1"], capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, f"the CC-100 folder {tmp_path / 'no_cc100'} (CC100_DIR) does not exist")
    assert os.listdir(tmp_path) == []  # the MODEL_DIR it created is removed


def test_utf16_cc100_file_is_one_line_before_training(data_spm, tmp_path, capsys, monkeypatch):
    # Progress lines go to the stdout of the first in-process run, which an earlier
    # test's capsys may have closed: this run sets up its own.
    monkeypatch.setattr(logging.getLogger("xlmeta_jax.train"), "handlers", [])
    cc100 = tmp_path / "cc100"
    cc100.mkdir()
    (cc100 / "en.txt").write_bytes("".join(f"English line {i}\n" for i in range(300))
                                   .encode("utf-16"))
    (cc100 / "de.txt").write_text("".join(f"deutsche Zeile {i}\n" for i in range(300)))
    before = digest(cc100)
    code, err = _train([
        "--gin_file=native/xlmr.gin", "--gin_file=models/tiny.gin",
        f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.VOCAB_PATH='{data_spm}'",
        f"--gin.CC100_DIR='{cc100}'", "--gin.CC100_LANGUAGES=['en', 'de']",
        "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.META_STEPS=2",
        "--gin.XLING_STEPS=2", "--gin.WARMUP_STEPS=1"], capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, f"{cc100 / 'en.txt'}: starts with a UTF-16 byte-order mark")
    assert not (tmp_path / "run" / "xlmr").exists() and digest(cc100) == before


@pytest.mark.parametrize("name", [
    "xlmeta_jax.data.text_files.CorpusError", "xlmeta_jax.data.vocabulary.VocabularyError",
    "xlmeta_jax.data.languages.UnknownLanguageError",
    "xlmeta_jax.model.partitioning.MeshShapeError",
    "xlmeta_jax.experiment.arms.ArmError", "xlmeta_jax.interop.hf.tokenizer.VocabularyLayoutError"])
def test_input_errors_are_user_errors(name, capsys):
    import importlib

    module, cls = name.rsplit(".", 1)
    error = getattr(importlib.import_module(module), cls)

    def main(argv):
        raise error("the bad thing, named\nwith context")

    assert errors.run_command(main, [], prog="x") == errors.EXIT_USER_ERROR
    assert capsys.readouterr().err.strip() == "x: error: the bad thing, named"


@pytest.mark.parametrize("content", [b'{"task": "xnli", ', b"\xff\xfe{}", b"[1, 2]"])
def test_report_of_broken_results_json_names_the_file(tmp_path, capsys, content):
    from xlmeta_jax.tools import report

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_bytes(content)
    before = digest(run)
    code = errors.run_command(report.main, [os.fspath(run), "--output",
                                            os.fspath(tmp_path / "out")],
                              prog="xlmeta_jax.tools.report")
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR, err
    assert len(err.splitlines()) == 1 and f"{run / 'results.json'}: not a results.json" in err, err
    assert not (tmp_path / "out").exists() and digest(run) == before


def test_hf_to_flax_of_a_missing_path_names_it(tmp_path, capsys):
    from xlmeta_jax.cli import hf

    missing = tmp_path / "missing"
    code = errors.run_command(hf.main, ["to_flax", f"--hf_path={missing}",
                                        f"--output={tmp_path / 'out'}"], prog="xlmeta_jax.hf")
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR, err
    assert len(err.splitlines()) == 1 and f"HF model path {missing} does not exist" in err, err
    assert "config.json" not in err and not (tmp_path / "out").exists()


def test_hf_flags_read_paths_as_a_shell_would(tmp_path, capsys, monkeypatch):
    from xlmeta_jax.cli import hf

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = errors.run_command(hf.main, ["to_flax", "--hf_path=~/missing", "--output=~/out"],
                              prog="xlmeta_jax.hf")
    err = capsys.readouterr().err.strip()
    assert code == errors.EXIT_USER_ERROR, err
    assert len(err.splitlines()) == 1 and (
        f"HF model path {tmp_path / 'missing'} does not exist" in err), err
    assert os.listdir(tmp_path) == []


def _never_retrieved(kind: str, exc: Exception) -> None:
    """Lets asyncio itself report ``exc`` as a task's or a bare future's, never retrieved."""
    loop = asyncio.new_event_loop()
    try:
        if kind == "task":
            async def fail():
                raise exc
            fut = loop.create_task(fail())
            loop.run_until_complete(asyncio.sleep(0))
        else:
            fut = loop.create_future()
            fut.set_exception(exc)
        del fut
        gc.collect()  # asyncio logs from the future's __del__
    finally:
        loop.close()


@pytest.mark.parametrize("kind", ["task", "future"])
def test_leftover_failed_checkpoint_reads_are_not_logged_as_errors(kind, caplog, capsys):
    # A damaged checkpoint: Orbax's gather reports one read's error (the command's line)
    # and asyncio later logs the other failed reads as "Task (or Future) exception was
    # never retrieved" ERRORs. Those are dropped; another never-retrieved one is logged.
    def main(argv):
        _never_retrieved(kind, ValueError('OUT_OF_RANGE: Error opening "zarr" driver: Error '
                                          'reading "params.x/.zarray" in OCDBT database'))
        _never_retrieved(kind, ValueError("a bug of someone else's"))
        raise checkpoints.CheckpointError("checkpoint /x is damaged")

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        assert errors.run_command(main, [], prog="x") == errors.EXIT_USER_ERROR
    kept = [r for r in caplog.records if r.name == "asyncio"]
    assert len(kept) == 1 and "someone else" in str(kept[0].exc_info[1]), kept
    assert "exception was never retrieved" in kept[0].getMessage()
    assert capsys.readouterr().err.strip() == "x: error: checkpoint /x is damaged"


@pytest.mark.parametrize("text", ["No space left on device", "Disk quota exceeded",
                                  "/x/part-0.tempstate1; File too large [Op:SaveV2]"])
def test_background_save_tracebacks_of_a_full_disk_are_not_logged(text):
    """The save raises the same error again, reported as one line; the background thread's
    logged traceback would print before it."""
    try:
        raise RuntimeError(text)
    except RuntimeError:
        record = logging.LogRecord("absl", logging.ERROR, __file__, 1, "save failed", None,
                                   sys.exc_info())
    assert checkpoints._ORBAX_LOG_FILTER.filter(record) is False
    other = logging.LogRecord("absl", logging.ERROR, __file__, 1, "a real error", None, None)
    assert checkpoints._ORBAX_LOG_FILTER.filter(other) is True


def test_ctrl_c_without_a_message_says_interrupted(capsys):
    # A bare KeyboardInterrupt (Ctrl-C outside the trainer's own handling, e.g. while the
    # demo's corpus is written) is truthy but has no text.
    def main(argv):
        raise KeyboardInterrupt

    assert errors.run_command(main, [], prog="xlmeta_jax.train") == errors.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "xlmeta_jax.train: interrupted\n"


@pytest.fixture(scope="module")
def prepared_cc100(tmp_path_factory):
    """A folder python -m xlmeta_jax.data.prepare wrote: en and de, two shards each."""
    pytest.importorskip("apache_beam")
    from xlmeta_jax.data import prepare

    root = tmp_path_factory.mktemp("prepared")
    (root / "in").mkdir()
    for lang, word in (("en", "English"), ("de", "deutsche")):
        (root / "in" / f"{lang}.txt").write_text(
            "".join(f"{word} line {i}\n" + ("\n" if i % 4 == 3 else "") for i in range(300)))
    assert prepare.main([f"--input={root / 'in'}/*", f"--output={root / 'out'}",
                         "--shard_bytes=3000"]) == 0
    return root / "out"


@pytest.mark.parametrize("case, parts", [
    ("no_completed", ["{out}", "without COMPLETED"]),
    ("shard_missing", ["{out}", "de.txt-00001-of-00002.gz", "listed", "absent"]),
    ("shard_resized", ["{out}", "de.txt-00000-of-00002.gz", "bytes"]),
    ("shard_unlisted", ["{out}", "de.txt-00002-of-00003.gz", "not listed"]),
    ("english_link_loop", ["english_files", "a.txt", "symbolic link loop"]),
])
def test_training_refuses_incomplete_data_in_one_line(data_spm, prepared_cc100, tmp_path, capsys,
                                                      monkeypatch, case, parts):
    """A prepared folder a run must not trust, and English files that lead nowhere: one line,
    exit 2, nothing trained, the folder untouched."""
    monkeypatch.setattr(logging.getLogger("xlmeta_jax.train"), "handlers", [])
    out = copy_run(prepared_cc100, tmp_path / "cc100")
    english = tmp_path / "english"
    english.mkdir()
    (english / "en.txt").write_text("".join(f"English line {i}\n" for i in range(300)))
    if case == "no_completed":
        (out / "COMPLETED").unlink()
    elif case == "shard_missing":
        (out / "de.txt-00001-of-00002.gz").unlink()
    elif case == "shard_resized":
        with open(out / "de.txt-00000-of-00002.gz", "ab") as f:
            f.write(b"\0")
    elif case == "shard_unlisted":
        (out / "de.txt-00002-of-00003.gz").write_bytes(
            (out / "de.txt-00000-of-00002.gz").read_bytes())
    else:
        os.symlink(english / "b.txt", english / "a.txt")
        os.symlink(english / "a.txt", english / "b.txt")
        (english / "en.txt").unlink()
    before = digest(out)
    code, err = _train([
        "--gin_file=native/meta.gin", "--gin_file=models/tiny.gin",
        f"--gin.MODEL_DIR='{tmp_path / 'run'}'", f"--gin.VOCAB_PATH='{data_spm}'",
        f"--gin.ENGLISH_FILES=['{english}/*.txt']",
        f"--gin.CC100_DIR='{out}'", "--gin.CC100_LANGUAGES=['en', 'de']",
        "--gin.BATCH_SIZE=8", "--gin.SEQUENCE_LENGTH=32", "--gin.META_STEPS=2",
        "--gin.XLING_STEPS=2", "--gin.WARMUP_STEPS=1"], capsys)
    assert code == errors.EXIT_USER_ERROR, err
    _one_line(err, *[p.format(out=out) for p in parts])
    assert not (tmp_path / "run").exists() and digest(out) == before


def test_a_file_where_the_compilation_cache_goes_is_one_line(tmp_path):
    """12-06's sweep: training went on without a cache, JAX's two-line warning on stderr."""
    import jax

    from xlmeta_jax.pretrain import run_dir

    (tmp_path / "compilation_cache").write_text("not a folder")
    before = jax.config.jax_compilation_cache_dir
    with pytest.raises(run_dir.CompilationCacheError) as e:
        run_dir.use_compilation_cache(str(tmp_path), str(tmp_path / "compilation_cache"))
    assert str(e.value) == (
        f"the compilation cache {tmp_path / 'compilation_cache'} is a file, not a directory: "
        "remove it, or set train.compilation_cache_dir (a folder, or '' for none)")
    assert jax.config.jax_compilation_cache_dir == before  # refused before any change
