"""The attention kernels honour the padding mask (CPU; the cuDNN call is checked through
jax.nn.dot_product_attention's portable implementation with the same arguments)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax import network
from xlmeta_jax.network import XLMRForMaskedLM, get_config

PAD = 0


def _cfg(impl):
    return get_config("tiny", pad_token_id=PAD, attention_impl=impl, scan_layers=True)


@pytest.fixture(scope="module")
def params():
    model = XLMRForMaskedLM(_cfg("xla"))
    variables = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
    return jax.tree.map(np.asarray, network.nn.unbox(variables["params"]))


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

    monkeypatch.setattr(network.jax.nn, "dot_product_attention", portable)
    ids, mask = _batch()
    ours = _encode("cudnn", params, ids, mask)
    assert calls and set(calls) == {"cudnn"}
    np.testing.assert_allclose(ours, _encode("xla", params, ids, mask), atol=1e-5, rtol=0)
