"""Files written whole (xlmeta_jax.files): the old content or the new, never half."""

import os

import pytest

from xlmeta_jax import errors, files


def test_write_atomic_replaces_whole_and_leaves_nothing_on_failure(tmp_path):
    path = tmp_path / "summary.json"
    files.write_atomic(path, "old")
    files.write_atomic(path, b"new")
    assert path.read_bytes() == b"new"

    def fail_halfway(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        files.write_atomic(path, write=fail_halfway)
    assert path.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["summary.json"]


def test_user_paths_read_as_a_shell_would(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XLMETA_TEST_DATA", "/data")
    monkeypatch.delenv("XLMETA_TEST_UNSET", raising=False)
    assert files.user_path("~/runs/a", "MODEL_DIR") == f"{tmp_path}/runs/a"
    assert files.user_path("$XLMETA_TEST_DATA/cc", "CC100_DIR") == "/data/cc"
    assert files.user_path("${XLMETA_TEST_DATA}/cc", "CC100_DIR") == "/data/cc"
    # URLs and None as given; lists (nested, as gin gives them) element by element.
    assert files.user_path("gs://b/~/x", "MODEL_DIR") == "gs://b/~/x"
    assert files.user_path(None, "VOCAB_PATH") is None
    assert files.user_paths(["~/a", ("$XLMETA_TEST_DATA",)], "ENGLISH_FILES") == [
        f"{tmp_path}/a", ("/data",)]
    for typed in ("$XLMETA_TEST_UNSET/x.txt", "${XLMETA_TEST_UNSET}/x.txt"):
        with pytest.raises(errors.UserError) as e:
            files.user_path(typed, "ENGLISH_FILES")
        assert str(e.value) == (f"ENGLISH_FILES={typed!r}: the environment variable "
                                "XLMETA_TEST_UNSET is not set")


def test_every_path_setting_is_expanded_where_the_config_is_built(monkeypatch, tmp_path):
    from xlmeta_jax.data.corpora import Corpora
    from xlmeta_jax.evaluation.finetune import FineTuneConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    corpora = Corpora(vocab_path="~/v.model", english_files=["~/en/*.txt"],
                      cc100_dir="$HOME/cc", stats_cache_dir="~/stats")
    assert (corpora.vocab_path, corpora.english_files, corpora.cc100_dir,
            corpora.stats_cache_dir) == (f"{tmp_path}/v.model", [f"{tmp_path}/en/*.txt"],
                                         f"{tmp_path}/cc", f"{tmp_path}/stats")
    config = FineTuneConfig(task="xnli", initial_checkpoint_path="~/run", model_dir="~/ft",
                            data_dir="$HOME/data", vocab_path="init:tiny")
    assert (config.initial_checkpoint_path, config.model_dir, config.data_dir,
            config.vocab_path) == (f"{tmp_path}/run", f"{tmp_path}/ft", f"{tmp_path}/data",
                                   "init:tiny")
