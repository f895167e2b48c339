"""Bad inputs found by a sweep of the commands: each is refused before anything is built,
with exit status 2 and one line ``<program>: error: ...`` naming the bad thing."""

from __future__ import annotations

import gzip
import pickle
import random

import pytest
from errors_fixtures import train_argv, write_gin

from xlmeta_jax import errors
from xlmeta_jax.cli import finetune as finetune_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.data import corpora, vocabulary
from xlmeta_jax.model import network
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import progress


def _one_line(capsys, main, argv, prog, *parts):
    code = errors.run_command(main, argv, prog=prog)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == errors.EXIT_USER_ERROR, err
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    for part in parts:
        assert part in lines[0], (part, lines[0])


@pytest.mark.parametrize("value", ["0", "-2", "abc"])
def test_finetune_seeds_not_a_positive_integer(capsys, value):
    _one_line(capsys, finetune_cli.main, ["--gin_file=finetune/xnli.gin", f"--seeds={value}"],
              "xlmeta_jax.finetune", "--seeds", repr(value))


@pytest.mark.parametrize("argv, parts", [
    (["--gin_file=finetune/xnli.gin", "--steps=3"], ["unknown arguments", "--steps=3"]),
    (["--gin.MODEL_DIR='/tmp/x'"], ["no --gin_file given"]),
])
def test_finetune_bad_flags(capsys, argv, parts):
    _one_line(capsys, finetune_cli.main, argv, "xlmeta_jax.finetune", *parts)


@pytest.mark.parametrize("argv, parts", [
    (["--files=/data/en.txt"], ["--files expects LANG=GLOB", "/data/en.txt"]),
    ([], ["--cc100_dir", "--files"]),
])
def test_vocabulary_without_a_source(capsys, tmp_path, argv, parts):
    _one_line(capsys, vocabulary.main, [*argv, f"--output_prefix={tmp_path}/spm"],
              "xlmeta_jax.data.vocabulary", *parts)


def test_non_finite_loss_stops_in_one_line_after_the_checkpoint_in_flight(
        capsys, tmp_path, clean_gin, monkeypatch):
    """Step 2 is checkpointed (in the background), step 3's loss is NaN: the run waits for
    step 2's checkpoint, then stops with one line; no temporary directory stays."""
    real = progress.host_metrics

    def nan_at_step_3(phase, phase_step, metrics, *args, **kwargs):
        if phase_step == 3:  # steps 1 and 2 pass, step 3 "diverges"
            metrics = dict(metrics, loss=float("nan"))
        return real(phase, phase_step, metrics, *args, **kwargs)

    monkeypatch.setattr(progress, "host_metrics", nan_at_step_3)
    model_dir = tmp_path / "run"
    _one_line(capsys, train_cli.main, train_argv(write_gin(tmp_path), model_dir),
              "xlmeta_jax.train", "[phase1] non-finite loss", "at step 3", "last checkpoint: 2")
    phase1 = sorted(p.name for p in (model_dir / "phase1").iterdir())
    assert "2" in phase1 and not [p for p in phase1 if "tmp" in p], phase1
    assert (model_dir / "config.gin").exists()


@pytest.mark.parametrize("name, data, parts", [
    ("bad.txt.gz", b"not a gzip stream" * 10, ["bad.txt.gz", "not a readable gzip file"]),
    # mtime fixed: test ids must be equal in every test process (pytest-xdist).
    ("cut.txt.gz", gzip.compress(b"some english text\n" * 1000, mtime=0)[:40],
     ["cut.txt.gz", "not a readable gzip file"]),
    ("rand.txt", random.Random(0).randbytes(20_000), ["rand.txt", "not valid UTF-8"]),
    ("long.txt", b"word " * 400, ["long.txt", "has no usable text", "exceed 1000 bytes"]),
], ids=["bad_gzip", "cut_gzip", "random_bytes", "long_line"])
def test_vocabulary_corpus_refused_in_one_line(capsys, tmp_path, name, data, parts):
    """No traceback for a broken .gz, and no 'skipping N lines' warning before the line
    that refuses the file."""
    (tmp_path / name).write_bytes(data)
    _one_line(capsys, vocabulary.main,
              [f"--files=en={tmp_path / name}", f"--output_prefix={tmp_path}/spm",
               "--vocab_size=100", "--max_line_bytes=1000"],
              "xlmeta_jax.data.vocabulary", *parts)


@pytest.mark.parametrize("build", [
    lambda: corpora.Corpora(languages=[]),
    lambda: OptimizerConfig(learning_rate=float("inf"), warmup_steps=0, total_steps=4),
    lambda: network.get_config("tiny", num_heads=3),
], ids=["Corpora", "OptimizerConfig", "EncoderConfig"])
def test_every_setting_error_crosses_processes_whole(build):
    # Each kind of refusal, whatever its constructor takes, pickles to the same class, line
    # and setting (a Beam worker's or a pool's error reaches the command as it was raised).
    with pytest.raises(errors.SettingError) as raised:
        build()
    e = raised.value
    e.name("A_MACRO")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and str(back) == str(e) and str(e).startswith("A_MACRO: ")
    assert (back.configurable, back.field, back.value) == (e.configurable, e.field, e.value)


@pytest.mark.parametrize("languages, part", [
    ([], "the language list is empty"),
    ("en", "expected a list of codes, got the string 'en'"),
    ([1], "1 is not one of the 100 XLM-R/CC-100 language codes"),
])
def test_cc100_languages_errors_name_the_macro(languages, part):
    from xlmeta_jax.cli import configurables
    from xlmeta_jax.cli import flags as gin_flags

    # Refused where the settings are built; named by the field without gin ...
    with pytest.raises(errors.SettingError) as e:
        corpora.Corpora(languages=languages)
    assert str(e.value).startswith(f"Corpora.languages: {part}"), e.value
    # It crosses processes whole (a Beam worker, a multiprocessing pool).
    assert str(pickle.loads(pickle.dumps(e.value))) == str(e.value)
    # ... and by the macro the user set in a command's line.
    gin_flags.apply_gin(["data/cc100.gin"], ["VOCAB_PATH = '/unused'",
                                             f"CC100_LANGUAGES = {languages!r}"],
                        finalize=False)
    with pytest.raises(errors.SettingError) as e:
        configurables.corpora_settings()
    assert errors.user_message(e.value).startswith(f"CC100_LANGUAGES: {part}"), e.value


@pytest.mark.parametrize("case, part", [
    ("cc100_missing", "--cc100_dir {tmp}/none does not exist"),
    ("cc100_file", "--cc100_dir {tmp}/f is not a directory"),
    ("cc100_empty", "--cc100_dir {tmp}/empty holds no CC-100 files"),
    ("vocab_size", "--vocab_size must be > 5, got 0"),
    ("alpha", "--alpha must be in (0, 1], got -1.0"),
    ("num_lines", "--num_lines must be > 0, got 0"),
    ("coverage", "--character_coverage must be in (0, 1], got 2.0"),
    ("output_under_file", "the folder of --output_prefix {tmp}/f is a file, not a directory"),
])
def test_vocabulary_flags_are_named(capsys, tmp_path, case, part):
    (tmp_path / "f").write_text("a file")
    (tmp_path / "empty").mkdir()
    (tmp_path / "en.txt").write_text("some english text\n" * 50)
    text = [f"--files=en={tmp_path}/en.txt"]
    argv = {
        "cc100_missing": [f"--cc100_dir={tmp_path}/none"],
        "cc100_file": [f"--cc100_dir={tmp_path}/f"],
        "cc100_empty": [f"--cc100_dir={tmp_path}/empty"],
        "vocab_size": [*text, "--vocab_size=0"],
        "alpha": [*text, "--alpha=-1"],
        "num_lines": [*text, "--num_lines=0"],
        "coverage": [*text, "--character_coverage=2"],
        "output_under_file": text,
    }[case]
    prefix = f"{tmp_path}/f/spm" if case == "output_under_file" else f"{tmp_path}/out/spm"
    _one_line(capsys, vocabulary.main, [*argv, f"--output_prefix={prefix}"],
              "xlmeta_jax.data.vocabulary", part.format(tmp=tmp_path))
    assert (tmp_path / "f").read_text() == "a file" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, part", [
    ([], "the following arguments are required: command"),
    (["to_hf"], "the following arguments are required: --checkpoint, --output"),
    (["to_flax", "--hf_path=x", "--output=y", "--frobnicate"], "unrecognized arguments"),
])
def test_argparse_mistakes_are_one_line(capsys, argv, part):
    """No usage block before the line: argparse's error is a user error like the rest."""
    from xlmeta_jax.cli import hf

    _one_line(capsys, hf.main, argv, "xlmeta_jax.hf", part, "(see --help)")


@pytest.mark.parametrize("where", ["self", "parent"])
def test_model_dir_that_is_a_file_is_named(capsys, tmp_path, where, clean_gin):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    model_dir = a_file if where == "self" else a_file / "run"
    part = (f"MODEL_DIR {a_file} is a file, not a directory" if where == "self"
            else f"MODEL_DIR {model_dir}: {a_file} is a file, not a directory")
    _one_line(capsys, train_cli.main, train_argv(write_gin(tmp_path), model_dir),
              "xlmeta_jax.train", part)
    assert a_file.read_text() == "x"


@pytest.mark.parametrize("what", ["checkpoint", "model_dir"])
def test_finetune_paths_that_are_files_are_named(capsys, tmp_path, what, clean_gin):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    checkpoint = a_file if what == "checkpoint" else tmp_path / "missing_ckpt"
    model_dir = a_file if what == "model_dir" else tmp_path / "ft"
    part = (f"{a_file} is a file, not a checkpoint directory" if what == "checkpoint"
            else f"MODEL_DIR {a_file} is a file, not a directory")
    _one_line(capsys, finetune_cli.main,
              ["--gin_file=finetune/xnli.gin", f"--gin.INITIAL_CHECKPOINT_PATH='{checkpoint}'",
               f"--gin.MODEL_DIR='{model_dir}'", f"--gin.DATA_DIR='{tmp_path}'"],
              "xlmeta_jax.finetune", part)
    assert a_file.read_text() == "x"


@pytest.mark.parametrize("binding, part", [
    ("finetune.train_steps=0", "finetune.train_steps = 0: must be None or an integer > 0"),
    ("finetune.learning_rate=-1.0", "finetune.learning_rate = -1.0: must be a finite number"),
    ("finetune.learning_rate=1e999", "finetune.learning_rate = inf: must be a finite number"),
    ("finetune.warmup_steps=-5", "finetune.warmup_steps = -5: must be an integer >= 0"),
    ("finetune.dtype='fp8'", "finetune.dtype = 'fp8': must be 'float32' or 'bfloat16'"),
])
def test_finetune_settings_out_of_range_are_named(capsys, tmp_path, binding, part, clean_gin):
    """Refused before any data or checkpoint is read (the checkpoint does not exist)."""
    _one_line(capsys, finetune_cli.main,
              ["--gin_file=finetune/pawsx.gin", f"--gin.{binding}",
               f"--gin.INITIAL_CHECKPOINT_PATH='{tmp_path}/no_ckpt'",
               f"--gin.MODEL_DIR='{tmp_path}/ft'", f"--gin.DATA_DIR='{tmp_path}'"],
              "xlmeta_jax.finetune", part)
    assert not (tmp_path / "ft").exists()


def test_experiment_dry_run_refuses_a_model_dir_that_is_a_file(capsys, tmp_path, clean_gin):
    """The dry run writes nothing, but says before its estimate that the run would fail."""
    from xlmeta_jax.cli import experiment

    a_file = tmp_path / "f"
    a_file.write_text("x")
    _one_line(capsys, experiment.main,
              ["--gin_file=experiments/cpu.gin", f"--gin.MODEL_DIR='{a_file}'", "--dry_run"],
              "xlmeta_jax.experiment", f"MODEL_DIR {a_file} is a file, not a directory")
    assert a_file.read_text() == "x"


@pytest.mark.parametrize("content", [None, b"", "English text\n".encode("utf-16")],
                         ids=["missing", "empty", "utf16"])
def test_vocabulary_files_are_checked_before_the_first_progress_line(
        capsys, caplog, tmp_path, content):
    import logging

    if content is not None:
        (tmp_path / "en.txt").write_bytes(content)
    caplog.set_level(logging.INFO)
    _one_line(capsys, vocabulary.main,
              [f"--files=en={tmp_path}/en.txt", f"--output_prefix={tmp_path}/out/spm"],
              "xlmeta_jax.data.vocabulary", "en.txt")
    assert "sampling" not in caplog.text


@pytest.mark.parametrize("macro, value, line", [
    # 12-06's sweep: "phase 'tokens': tokens/…Phase.num_tokens: must be … > 0" named neither.
    ("BASE_TOKENS", 0, "stage 'base': BASE_TOKENS: must be a number of tokens > 0"),
    ("DECAY_TOKENS", -5, "stage 'decay_cont': DECAY_TOKENS: must be a number of tokens > 0"),
    # The recipe's own parameters, named as bound (gin/native/mmbert.gin binds the rest).
    ("TOTAL_TOKENS", 0, "TOTAL_TOKENS: must be a number of tokens > 0"),
    ("xlmeta_jax.pretrain.recipes.mmbert.ramp_batches", (4, 0, 12),
     "stage 'ramp2': xlmeta_jax.pretrain.recipes.mmbert.ramp_batches: must be an integer > 0, "
     "got 0"),
    ("xlmeta_jax.pretrain.recipes.mmbert.ext_alpha", 1.5,
     "stage 'ext': xlmeta_jax.pretrain.recipes.mmbert.ext_alpha: alpha must be in (0, 1] (1 = "
     "proportional to size, XLM-R uses 0.3), got 1.5"),
    ("xlmeta_jax.pretrain.recipes.mmbert.ext_rope_theta", 0.5,
     "stage 'ext': xlmeta_jax.pretrain.recipes.mmbert.ext_rope_theta: must be a RoPE base > 1 "
     "(mmBERT: 10000, 160000)"),
    ("xlmeta_jax.pretrain.recipes.mmbert.branches", ["decay_xx"],
     "xlmeta_jax.pretrain.recipes.mmbert.branches: must be some of ['decay_eng', "
     "'decay_cont', 'decay_all'], got ['decay_xx']"),
])
def test_a_stage_length_in_tokens_names_the_stage_and_its_macro(macro, value, line, clean_gin):
    from xlmeta_jax.cli import flags as gin_flags

    gin_flags.apply_gin(["demo_mmbert.gin"], ["MODEL_DIR = '/unused'", f"{macro} = {value}"],
                        finalize=False)
    with pytest.raises(errors.SettingError) as e:
        gin_flags.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
    assert errors.user_message(e.value) == line


@pytest.mark.parametrize("gin_file, extra, part", [
    ("gin/data/english_files.gin", [], "--task: name a task to cache (or give a contrastive "
                                       "run's gin files)"),
    ("gin/finetune/embeddings.gin", ["--task=xlmeta_english_text"],
     "--task=xlmeta_english_text: a contrastive run's gin files cache its own rows; leave "
     "--task out"),
])
def test_caching_task_flags(capsys, tmp_path, clean_gin, gin_file, extra, part):
    from xlmeta_jax.tools import caching

    argv = [f"--gin_file={gin_file}", f"--cache_dir={tmp_path / 'cache'}",
            "--gin.INITIAL_CHECKPOINT_PATH='/ckpt'", "--gin.MODEL_DIR='/out'",
            "--gin.TRAIN_FILES=['/rows.jsonl']", "--gin.VOCAB_PATH='/v.model'",
            "--gin.ENGLISH_FILES=['/en.txt']", *extra]
    if "english" in gin_file:
        argv = [a for a in argv if "CHECKPOINT" not in a and "MODEL_DIR" not in a
                and "TRAIN_FILES" not in a]
    else:
        argv = [a for a in argv if "VOCAB_PATH" not in a and "ENGLISH_FILES" not in a]
    _one_line(capsys, caching.main, argv, "xlmeta_jax.tools.caching", part)
    assert not (tmp_path / "cache").exists()
