"""Bad inputs found by a sweep of the commands: each is refused before anything is built,
with exit status 2 and one line ``<program>: error: ...`` naming the bad thing."""

from __future__ import annotations

import pytest

from xlmeta_jax import errors
from xlmeta_jax.cli import finetune as finetune_cli


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
