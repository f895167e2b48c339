"""The encoder network's own mechanisms: dropout masks (statistics, flax parity, sharding)
and the attention padding mask of both kernels (CPU; the cuDNN call is checked through
jax.nn.dot_product_attention's portable implementation with the same arguments).
Parity with Hugging Face's XLM-R is tests/test_hf.py."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from xlmeta_jax.model import network
from xlmeta_jax.model.network import XLMRForMaskedLM, get_config

# ---------------------------------------------------------------------------
# Dropout masks of fewer random bits: same statistics, nn.Dropout at 32 bits.
# ---------------------------------------------------------------------------

RATE = 0.1


def _apply(bits, x, key, rate=RATE, deterministic=False):
    return network.Dropout(rate, mask_bits=bits).apply(
        {}, x, deterministic=deterministic, rngs={"dropout": key}
    )


def test_32_bits_is_flax_dropout():
    x = jax.random.normal(jax.random.key(1), (8, 16, 32))
    key = jax.random.key(2)
    ours = _apply(32, x, key)
    flax_ = nn.Dropout(RATE).apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(ours, flax_)


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_keep_rate_scale_and_independence(bits):
    # 4M elements: the binomial standard error of the kept fraction is 1.5e-4,
    # below the 1.6e-3 that 8 bits move XLM-R's keep probability (230/256).
    x = jnp.ones((1024, 4096), jnp.float32)
    y = np.asarray(_apply(bits, x, jax.random.key(bits)))
    levels = 2**bits
    keep_q = round((1 - RATE) * levels) / levels
    kept = y != 0
    n = kept.size
    sigma = np.sqrt(keep_q * (1 - keep_q) / n)
    assert abs(kept.mean() - keep_q) < 5 * sigma, (kept.mean(), keep_q)
    # Kept values are scaled by the inverse of the rounded keep probability, so the
    # expectation of every element is its input.
    np.testing.assert_allclose(y[kept], 1 / keep_q, rtol=1e-6)
    assert abs(y.mean() - 1.0) < 5 * sigma / keep_q
    # Neighbours share a 32-bit draw at 8 and 16 bits: they must still be independent.
    both = (kept[:, 0::2] & kept[:, 1::2]).mean()
    sigma2 = np.sqrt(keep_q**2 * (1 - keep_q**2) / (n // 2))
    assert abs(both - keep_q**2) < 5 * sigma2, (both, keep_q**2)


def test_masks_differ_by_key_and_deterministic_is_identity():
    x = jnp.ones((64, 256))
    a, b = (np.asarray(_apply(8, x, jax.random.key(k))) != 0 for k in (0, 1))
    assert (a != b).mean() > 0.1
    np.testing.assert_array_equal(_apply(8, x, jax.random.key(0), deterministic=True), x)
    # A last axis the draws cannot split evenly falls back to 32-bit masks.
    odd = jnp.ones((4, 6))
    np.testing.assert_array_equal(
        _apply(8, odd, jax.random.key(3)), _apply(32, odd, jax.random.key(3)))


def test_sharded_masks_equal_unsharded():
    mesh = jax.make_mesh((8,), ("data",))
    x = jax.random.normal(jax.random.key(4), (16, 32, 64))
    key = jax.random.key(5)
    fn = jax.jit(lambda v: _apply(8, v, key))
    sharded = fn(jax.device_put(x, NamedSharding(mesh, PartitionSpec("data"))))
    np.testing.assert_array_equal(sharded, fn(x))


# ---------------------------------------------------------------------------
# The attention kernels honour the padding mask.
# ---------------------------------------------------------------------------

PAD = 0


def _cfg(impl):
    return get_config("tiny", pad_token_id=PAD, attention_impl=impl, scan_layers=True)


@pytest.fixture(scope="module")
def params():
    model = XLMRForMaskedLM(_cfg("xla"))
    variables = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
    return jax.tree.map(np.asarray, nn.unbox(variables["params"]))


def _batch(length=16, lengths=(16, 11, 5)):
    rng = np.random.default_rng(0)
    ids = np.full((len(lengths), length), PAD, np.int32)
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(5, 1024, size=n)
        ids[b, 0] = 3
    return ids, ids != PAD


def _encode(impl, params, ids, mask):
    model = XLMRForMaskedLM(_cfg(impl))
    fn = jax.jit(functools.partial(model.apply, method=XLMRForMaskedLM.encode))
    return np.asarray(fn({"params": params}, ids, mask))


def test_xla_attention_ignores_padded_keys(params):
    ids, mask = _batch()
    out = _encode("xla", params, ids, mask)
    # Other token ids at the padded slots (the mask says they are padding).
    noisy = np.where(mask, ids, np.random.default_rng(1).integers(5, 1024, size=ids.shape))
    out_noisy = _encode("xla", params, noisy.astype(np.int32), mask)
    np.testing.assert_allclose(out_noisy[mask], out[mask], atol=1e-5, rtol=0)
    # Sanity: the changed ids did change the padded positions themselves.
    assert np.abs(out_noisy[~mask] - out[~mask]).max() > 1e-2

    # A padded row equals the same sequence run alone without padding.
    n = int(mask[2].sum())
    alone = _encode("xla", params, ids[2:3, :n], mask[2:3, :n])
    np.testing.assert_allclose(out[2, :n], alone[0], atol=1e-5, rtol=0)


def test_cudnn_branch_arguments_match_xla_path(params, monkeypatch):
    """The 'cudnn' branch's layout, mask broadcast and scale, run by the portable kernel."""
    real = jax.nn.dot_product_attention
    calls = []

    def portable(*args, implementation=None, **kwargs):
        calls.append(implementation)
        return real(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", portable)
    ids, mask = _batch()
    ours = _encode("cudnn", params, ids, mask)
    assert calls and set(calls) == {"cudnn"}
    np.testing.assert_allclose(ours, _encode("xla", params, ids, mask), atol=1e-5, rtol=0)
