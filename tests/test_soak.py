"""A short kill soak: random kill -9 during training and checkpoint writes, then the run
finishes bit-identical to an uninterrupted one (the 20-kill version is the documented
command ``python -m xlmeta_jax.tools.soak --work_dir=DIR --kills=20``)."""

import pytest

from xlmeta_jax.tools import soak


@pytest.mark.slow
def test_three_kills_end_bit_identical(tmp_path):
    result = soak.soak(tmp_path, kills=3, seed=1, steps=12)
    assert len(result["kills"]) == 3, result
    assert result["differences"] == []
    assert result["leftover_tmp_dirs"] == []


def test_compare_names_a_differing_parameter(tmp_path):
    import numpy as np

    from xlmeta_jax.pretrain import checkpoints
    from xlmeta_jax.pretrain import step as step_lib

    for name, value in (("a", 1.0), ("b", 1.0), ("c", 2.0)):
        ckpt = checkpoints.PhaseCheckpoints(str(tmp_path / name / "phase1"),
                                            save_interval_steps=1, max_to_keep=None,
                                            async_save=False)
        state = step_lib.TrainState(step=np.int32(2),
                                    params={"w": np.full(3, value, np.float32)}, opt_state=())
        ckpt.save(2, state, None, {"metrics": {"loss": value}}, force=True)
        ckpt.close()
    assert soak.compare(tmp_path / "a", tmp_path / "b") == []
    diffs = soak.compare(tmp_path / "a", tmp_path / "c")
    assert any("parameter ['w'] differs" in d for d in diffs), diffs
    assert any("final metrics" in d for d in diffs), diffs
