"""The MLM batch contract: prediction slots follow the masking rate; synthetic batches obey it."""

import numpy as np
import pytest

from xlmeta_jax.data import feeding
from xlmeta_jax.model import mlm


def test_max_predictions():
    # ceil(rate * L) + 1
    assert mlm.max_predictions(32, 0.15) == 6
    assert mlm.max_predictions(128, 0.15) == 21
    assert mlm.max_predictions(512, 0.15) == 78
    assert mlm.max_predictions(512, 0.4) == 206


def test_feature_tuples_agree():
    assert set(mlm.STEP_FEATURES) <= set(mlm.FEATURES)
    assert set(mlm.FULL_HEAD_FEATURES) <= set(mlm.FEATURES)
    assert mlm.DEFAULT_MASKING == mlm.Masking(0.15, 0.8, 0.1)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(rate=0.0), "rate"), (dict(rate=1.0), "rate"),
     (dict(mask_token_share=0.95), "sum to at most 1"),
     (dict(random_token_share=-0.1), "must be >= 0")],
)
def test_bad_masking_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mlm.Masking(**kwargs)


def test_synthetic_batch_is_consistent():
    b = feeding.mlm_batch(np.random.default_rng(1), 3, 40, 100)
    slots = mlm.max_predictions(40, 0.15)
    assert tuple(b) == mlm.FEATURES
    assert b["mlm_positions"].shape == (3, slots)
    assert (b["inputs"][:, 0] == 3).all()
    for r in range(3):
        used = b["mlm_weights"][r] == 1
        pos = b["mlm_positions"][r, used]
        assert (pos > 0).all() and len(set(pos)) == len(pos)
        assert (b["inputs"][r, pos] == 4).all()
        np.testing.assert_array_equal(b["targets"][r, pos], b["mlm_targets"][r, used])
        np.testing.assert_array_equal(np.flatnonzero(b["weights"][r]), np.sort(pos))
        unmasked = np.setdiff1d(np.arange(40), pos)
        np.testing.assert_array_equal(b["inputs"][r, unmasked], b["targets"][r, unmasked])
    assert (b["targets"][:, 1:] >= 5).all() and (b["targets"] < 100).all()


def test_a_higher_masking_rate_is_never_capped_by_the_slots():
    """Raising the rate raises the slots: the selection is exactly round(rate (L - 1))."""
    length = 64
    for rate in (0.15, 0.3, 0.5):
        b = feeding.mlm_batch(np.random.default_rng(0), 4, length, 1000,
                                masking=mlm.Masking(rate=rate))
        assert b["mlm_positions"].shape == (4, mlm.max_predictions(length, rate))
        np.testing.assert_array_equal(
            b["mlm_weights"].sum(axis=1), round(rate * (length - 1))
        )
        np.testing.assert_array_equal(b["weights"].sum(axis=1), round(rate * (length - 1)))


def test_synthetic_stream_sends_what_the_step_reads():
    import jax

    from xlmeta_jax.model import partitioning

    mesh = partitioning.create_mesh(data=-1, devices=jax.devices()[:1])
    it = feeding.SyntheticMLMIterator(
        sequence_length=32, global_batch_size=4, mesh=mesh, seed=0, vocab_size=100,
        masking=mlm.Masking(rate=0.3),
    )
    batch = next(it)
    assert tuple(batch) == mlm.STEP_FEATURES
    assert batch["mlm_positions"].shape == (4, mlm.max_predictions(32, 0.3))
    assert it.element_spec["mlm_positions"].shape == (4, mlm.max_predictions(32, 0.3))
