"""Files written whole (xlmeta_jax.files): the old content or the new, never half."""

import os

import pytest

from xlmeta_jax import files


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
