"""Checkpoint merging: linear and TIES against NumPy references, self-merges bit for bit,
refusals in one line, and the output read as every parameters checkpoint is."""

from __future__ import annotations

import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from xlmeta_jax.model import network
from xlmeta_jax.pretrain import checkpoints, loading, merging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reference_ties(thetas, base, density, scaling=1.0):
    """The TIES reference code (ties_merging: topk_values_mask, resolve_sign, disjoint_merge)
    on flat vectors, one model at a time."""
    d = base.size
    trimmed = []
    for theta in thetas:
        tv = theta.astype(np.float64) - base
        k = d - int(d * density)
        if k > 0:  # torch.kthvalue(k): the k-th smallest magnitude
            kth = np.sort(np.abs(tv))[k - 1]
            tv = np.where(np.abs(tv) >= kth, tv, 0.0)
        trimmed.append(tv)
    stacked = np.stack(trimmed)
    sign = np.sign(stacked.sum(0))
    sign[sign == 0] = np.sign(sign.sum())  # resolve_zero_signs(..., "majority")
    merged = np.zeros(d)
    for i in range(d):
        agree = [t[i] for t in trimmed if (t[i] > 0 if sign[i] > 0 else t[i] < 0)]
        merged[i] = sum(agree) / max(len(agree), 1)
    return base + scaling * merged


def _init(cfg):
    model = network.XLMRForMaskedLM(cfg)
    variables = model.init(jax.random.key(0), np.ones((1, 8), np.int32))
    return jax.tree.map(np.asarray, nn.unbox(variables["params"]))


def _tree(rng, scale=1.0):
    return {"a": {"kernel": (scale * rng.standard_normal((3, 4))).astype(np.float32)},
            "b": (scale * rng.standard_normal(5)).astype(np.float32)}


def _flat(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)]).astype(np.float64)


@pytest.mark.parametrize("density", [0.2, 0.5, 1.0])
def test_ties_matches_reference(density):
    rng = np.random.default_rng(0)
    base = _tree(rng)
    models = [jax.tree.map(lambda x: x + rng.standard_normal(x.shape).astype(np.float32), base)
              for _ in range(3)]
    got = merging.ties(models, base, density=density, scaling=0.7)
    want = _reference_ties([_flat(m) for m in models], _flat(base), density, 0.7)
    np.testing.assert_allclose(_flat(got), want, rtol=1e-6, atol=1e-6)
    assert jax.tree.structure(got) == jax.tree.structure(base)
    if density < 1:
        # Trimming matters: the merge differs from the disjoint mean of untrimmed vectors.
        full = _reference_ties([_flat(m) for m in models], _flat(base), 1.0, 0.7)
        assert not np.allclose(want, full)


def _mergekit_ties(base, thetas, weights, density):
    """mergekit's ``ties`` on one tensor, transcribed in torch: ``sparsify.magnitude``
    (exactly k entries), ``get_mask(method='sum')`` and ``GTATask.execute`` with
    ``normalize=True`` (the weighted disjoint mean)."""
    torch = pytest.importorskip("torch")
    base_t = torch.tensor(base, dtype=torch.float64)
    deltas = []
    for x in thetas:
        delta = torch.tensor(x, dtype=torch.float64) - base_t
        if density < 1:
            k = int(density * delta.numel())
            mask = torch.zeros_like(delta)
            topk = torch.argsort(delta.abs().view(-1), descending=True)[:k]
            mask.view(-1)[topk] = 1
            delta = delta * mask
        deltas.append(delta)
    deltas = torch.stack(deltas, dim=0)
    w = torch.tensor(weights, dtype=deltas.dtype)
    while len(deltas.shape) > len(w.shape):
        w.unsqueeze_(-1)
    weighted = deltas * w
    sign = weighted.sign()
    majority = (weighted.sum(dim=0) >= 0).to(weighted.dtype) * 2 - 1
    mask = sign == majority
    mixed = (weighted * mask).sum(dim=0)
    divisor = (w * mask).sum(dim=0)
    divisor[divisor == 0] = 1
    return (base_t + mixed / divisor).numpy()


@pytest.mark.parametrize("density", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("weights", [None, [1.0, 2.0, 0.5]])
def test_ties_per_tensor_matches_mergekit(density, weights):
    rng = np.random.default_rng(3)
    base = _tree(rng)
    models = [jax.tree.map(lambda x: x + rng.standard_normal(x.shape).astype(np.float32), base)
              for _ in range(3)]
    # A zero weighted sum elects +: one entry where the task vectors cancel exactly.
    models[1]["b"][0] = 2 * base["b"][0] - models[0]["b"][0]
    models[2]["b"][0] = base["b"][0]
    got = merging.ties_per_tensor(models, base, density=density, weights=weights)
    for (path, x), b, *thetas in zip(jax.tree_util.tree_leaves_with_path(got),
                                     jax.tree.leaves(base), *map(jax.tree.leaves, models)):
        want = _mergekit_ties(b, thetas, weights or [1.0] * 3, density)
        np.testing.assert_allclose(x, want.astype(np.float32), rtol=1e-6, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))
    if density < 1:
        # Per tensor is not per model: the trims (hence the merges) differ.
        assert not np.allclose(_flat(got), _flat(merging.ties(models, base, density=density)))


def test_linear_is_the_weighted_mean():
    rng = np.random.default_rng(1)
    models = [_tree(rng) for _ in range(3)]
    got = merging.linear(models, [1.0, 2.0, 1.0])
    want = (_flat(models[0]) + 2 * _flat(models[1]) + _flat(models[2])) / 4
    np.testing.assert_allclose(_flat(got), want, rtol=1e-6)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Three tiny checkpoints of one model (b and c perturbations of a) and one of another."""
    root = tmp_path_factory.mktemp("merge")
    cfg = network.get_config("tiny", pad_token_id=0)
    params = _init(cfg)
    rng = np.random.default_rng(2)
    out = {}
    for name in ("a", "b", "c"):
        p = params if name == "a" else jax.tree.map(
            lambda x: (x + 0.01 * rng.standard_normal(x.shape)).astype(x.dtype), params)
        checkpoints.save_params(root / name, cfg, p)
        out[name] = os.fspath(root / name)
    other = network.get_config("tiny", pad_token_id=0, num_layers=1)
    checkpoints.save_params(root / "other", other, _init(other))
    out["other"] = os.fspath(root / "other")
    out["root"] = root
    return out


def _params(path):
    return loading.load_pretrained(path)[1]


@pytest.mark.parametrize("copies", [2, 3])
def test_a_checkpoint_merged_with_itself_comes_back_bit_for_bit(saved, copies, tmp_path):
    a = _params(saved["a"])
    for method, extra in (("linear", {}), ("ties", {"base": saved["b"], "density": 1.0})):
        out = merging.merge([saved["a"]] * copies, os.fspath(tmp_path / method), method=method,
                            **extra)
        checkpoints.verify_readable(out, all_arrays=True)  # checksums written and matching
        merged = _params(out)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(merged)):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


def test_merged_checkpoint_is_what_the_ties_reference_gives(saved, tmp_path):
    out = merging.merge([saved["b"], saved["c"]], os.fspath(tmp_path / "m"), method="ties",
                        base=saved["a"], density=0.3)
    got = _flat(_params(out))
    want = _reference_ties([_flat(_params(saved[n])) for n in "bc"], _flat(_params(saved["a"])),
                           0.3)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    meta = checkpoints.read_meta(out)
    assert meta["initialized_from"].startswith("ties(density=0.3")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "xlmeta_jax.tools.merge", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_mergekit_ties_of_checkpoints_with_weights(saved, tmp_path):
    out = merging.merge([saved["b"], saved["c"]], os.fspath(tmp_path / "m"), method="ties",
                        base=saved["a"], density=0.3, trim="tensor", weights=[2.0, 1.0])
    merged, base = _params(out), _params(saved["a"])
    thetas = [_params(saved[n]) for n in "bc"]
    for (path, x), b, t1, t2 in zip(jax.tree_util.tree_leaves_with_path(merged),
                                    jax.tree.leaves(base), *map(jax.tree.leaves, thetas)):
        want = _mergekit_ties(b, [t1, t2], [2.0, 1.0], 0.3)
        np.testing.assert_allclose(x, want.astype(x.dtype), rtol=1e-6, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))
    assert checkpoints.read_meta(out)["initialized_from"].startswith(
        "ties(trim=tensor, density=0.3, scaling=1, weights=2,1")


@pytest.mark.parametrize("case, match", [
    ("other", "has num_layers=1"),
    ("one", "merging needs 2 or more"),
    ("ties_no_base", "--method=ties needs --base"),
    ("density", "--density=1.5 must be in (0, 1]"),
    ("output", "exists and is not an empty folder"),
    ("ties_weights", "--weights with --method=ties: the TIES authors' merge (--trim=model)"),
    ("linear_ties_flags", "--base, --density, --scaling are for --method=ties"),
    ("weights_inf", "--weights=1.0,inf: one finite weight >= 0 per checkpoint"),
    ("trim", "--trim='layer' is not one of ('model', 'tensor')"),
    ("tiny_tensor", "keeps none of the"),
])
def test_refusals_are_one_line_and_write_nothing(saved, tmp_path, case, match):
    out = tmp_path / "out"
    args = {
        "other": [f"--checkpoints={saved['a']},{saved['other']}"],
        "one": [f"--checkpoints={saved['a']}"],
        "ties_no_base": [f"--checkpoints={saved['a']},{saved['b']}", "--method=ties"],
        "density": [f"--checkpoints={saved['a']},{saved['b']}", "--method=ties",
                    f"--base={saved['c']}", "--density=1.5"],
        "output": [f"--checkpoints={saved['a']},{saved['b']}"],
        "ties_weights": [f"--checkpoints={saved['a']},{saved['b']}", "--method=ties",
                         f"--base={saved['c']}", "--weights=1,2"],
        "linear_ties_flags": [f"--checkpoints={saved['a']},{saved['b']}",
                              f"--base={saved['c']}", "--density=0.5", "--scaling=2"],
        "weights_inf": [f"--checkpoints={saved['a']},{saved['b']}", "--weights=1,inf"],
        "trim": [f"--checkpoints={saved['a']},{saved['b']}", "--method=ties",
                 f"--base={saved['c']}", "--trim=layer"],
        # A LayerNorm scale of 64 entries at density 0.01 keeps int(0.64) = 0 of them.
        "tiny_tensor": [f"--checkpoints={saved['a']},{saved['b']}", "--method=ties",
                        f"--base={saved['c']}", "--trim=tensor", "--density=0.01"],
    }[case]
    if case == "output":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    r = _cli(*args, f"--output={out}")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xlmeta_jax.tools.merge: error:"), r.stderr
    assert match in lines[0]
    assert (sorted(os.listdir(out)) == ["keep.txt"]) if case == "output" else not out.exists()


def test_a_damaged_merge_is_merged_again_from_its_branches(saved, tmp_path, caplog):
    """12-06's sweep: a truncated ``merged/0/meta`` refused the rerun. The merge is derived
    from the run's own branch checkpoints, so the rerun merges them again, bit for bit."""
    import types

    from xlmeta_jax.pretrain import trainer

    run = tmp_path / "run"
    for name in "abc":
        checkpoints.save_params(run / name, loading.load_pretrained(saved[name])[0],
                                _params(saved[name]), step=4)
    phases = [types.SimpleNamespace(name=n, num_steps=4) for n in "abc"]
    m = trainer.Merge(branches=["b", "c"], base="a", method="ties", density=0.3)
    first = merging.run_step(os.fspath(run), m, phases, ["a", "b", "c", "merged"])
    before = _flat(_params(first["checkpoint"]))
    meta_files = [p for p in (run / "merged" / "0" / "meta").rglob("*") if p.is_file()]
    assert meta_files
    for p in meta_files:
        p.write_bytes(p.read_bytes()[:10])
    with caplog.at_level("INFO", logger="xlmeta_jax.train"):
        again = merging.run_step(os.fspath(run), m, phases, ["a", "b", "c", "merged"])
    assert again["merged_now"] and "is damaged" in caplog.text
    assert "merging its branches again" in caplog.text
    np.testing.assert_array_equal(_flat(_params(again["checkpoint"])), before)
