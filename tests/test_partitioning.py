"""The (data, fsdp, tensor) mesh, logical-axis rules and every parameter's sharding.

The golden tables below spell out, for mesh (2, 2, 2), the PartitionSpec of each
parameter of the tiny model of each family in both layouts; a changed rule or a parameter with
the wrong logical names fails here. Nothing in this file compiles a step.
"""

import flax
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from xlmeta_jax.model import network, partitioning
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.model.partitioning import MeshShapeError
from xlmeta_jax.pretrain import step

# Every parameter of the tiny model (non-scanned layout) -> its mesh PartitionSpec
# on mesh (data, fsdp, tensor) = (2, 2, 2).
GOLDEN_SPECS_222 = {
    "encoder/embeddings/word_embeddings": P("tensor", "fsdp"),
    "encoder/embeddings/position_embeddings": P(None, "fsdp"),
    "encoder/embeddings/token_type_embeddings": P(None, "fsdp"),
    "encoder/embeddings/layer_norm/scale": P("fsdp"),
    "encoder/embeddings/layer_norm/bias": P("fsdp"),
    "encoder/layers_0/attention/query/kernel": P("fsdp", "tensor", None),
    "encoder/layers_0/attention/query/bias": P("tensor", None),
    "encoder/layers_0/attention/key/kernel": P("fsdp", "tensor", None),
    "encoder/layers_0/attention/key/bias": P("tensor", None),
    "encoder/layers_0/attention/value/kernel": P("fsdp", "tensor", None),
    "encoder/layers_0/attention/value/bias": P("tensor", None),
    "encoder/layers_0/attention/out/kernel": P("tensor", None, "fsdp"),
    "encoder/layers_0/attention/out/bias": P("fsdp"),
    "encoder/layers_0/attention_layer_norm/scale": P("fsdp"),
    "encoder/layers_0/attention_layer_norm/bias": P("fsdp"),
    "encoder/layers_0/wi/kernel": P("fsdp", "tensor"),
    "encoder/layers_0/wi/bias": P("tensor"),
    "encoder/layers_0/wo/kernel": P("tensor", "fsdp"),
    "encoder/layers_0/wo/bias": P("fsdp"),
    "encoder/layers_0/output_layer_norm/scale": P("fsdp"),
    "encoder/layers_0/output_layer_norm/bias": P("fsdp"),
    "encoder/layers_1/attention/query/kernel": P("fsdp", "tensor", None),
    "encoder/layers_1/attention/query/bias": P("tensor", None),
    "encoder/layers_1/attention/key/kernel": P("fsdp", "tensor", None),
    "encoder/layers_1/attention/key/bias": P("tensor", None),
    "encoder/layers_1/attention/value/kernel": P("fsdp", "tensor", None),
    "encoder/layers_1/attention/value/bias": P("tensor", None),
    "encoder/layers_1/attention/out/kernel": P("tensor", None, "fsdp"),
    "encoder/layers_1/attention/out/bias": P("fsdp"),
    "encoder/layers_1/attention_layer_norm/scale": P("fsdp"),
    "encoder/layers_1/attention_layer_norm/bias": P("fsdp"),
    "encoder/layers_1/wi/kernel": P("fsdp", "tensor"),
    "encoder/layers_1/wi/bias": P("tensor"),
    "encoder/layers_1/wo/kernel": P("tensor", "fsdp"),
    "encoder/layers_1/wo/bias": P("fsdp"),
    "encoder/layers_1/output_layer_norm/scale": P("fsdp"),
    "encoder/layers_1/output_layer_norm/bias": P("fsdp"),
    "lm_head/dense/kernel": P("fsdp", "tensor"),
    "lm_head/dense/bias": P("tensor"),
    "lm_head/layer_norm/scale": P("fsdp"),
    "lm_head/layer_norm/bias": P("fsdp"),
    "lm_head/bias": P("tensor"),
}

# The scanned layout: per-layer parameters stacked on a leading, unsharded
# `layers` dimension.
GOLDEN_SPECS_222_SCAN = {
    "encoder/embeddings/word_embeddings": P("tensor", "fsdp"),
    "encoder/embeddings/position_embeddings": P(None, "fsdp"),
    "encoder/embeddings/token_type_embeddings": P(None, "fsdp"),
    "encoder/embeddings/layer_norm/scale": P("fsdp"),
    "encoder/embeddings/layer_norm/bias": P("fsdp"),
    "encoder/layers/attention/query/kernel": P(None, "fsdp", "tensor", None),
    "encoder/layers/attention/query/bias": P(None, "tensor", None),
    "encoder/layers/attention/key/kernel": P(None, "fsdp", "tensor", None),
    "encoder/layers/attention/key/bias": P(None, "tensor", None),
    "encoder/layers/attention/value/kernel": P(None, "fsdp", "tensor", None),
    "encoder/layers/attention/value/bias": P(None, "tensor", None),
    "encoder/layers/attention/out/kernel": P(None, "tensor", None, "fsdp"),
    "encoder/layers/attention/out/bias": P(None, "fsdp"),
    "encoder/layers/attention_layer_norm/scale": P(None, "fsdp"),
    "encoder/layers/attention_layer_norm/bias": P(None, "fsdp"),
    "encoder/layers/wi/kernel": P(None, "fsdp", "tensor"),
    "encoder/layers/wi/bias": P(None, "tensor"),
    "encoder/layers/wo/kernel": P(None, "tensor", "fsdp"),
    "encoder/layers/wo/bias": P(None, "fsdp"),
    "encoder/layers/output_layer_norm/scale": P(None, "fsdp"),
    "encoder/layers/output_layer_norm/bias": P(None, "fsdp"),
    "lm_head/dense/kernel": P("fsdp", "tensor"),
    "lm_head/dense/bias": P("tensor"),
    "lm_head/layer_norm/scale": P("fsdp"),
    "lm_head/layer_norm/bias": P("fsdp"),
    "lm_head/bias": P("tensor"),
}


def _modernbert_layer(prefix, lead=(), attn_norm=True):
    """One ModernBERT layer's parameters -> specs (``lead``: the scanned layers axis)."""
    specs = {
        **{f"{prefix}/attention/{p}/kernel": P(*lead, "fsdp", "tensor", None)
           for p in ("query", "key", "value")},
        f"{prefix}/attention/out/kernel": P(*lead, "tensor", None, "fsdp"),
        f"{prefix}/mlp_norm/scale": P(*lead, "fsdp"),
        f"{prefix}/wi_0/kernel": P(*lead, "fsdp", "tensor"),
        f"{prefix}/wi_1/kernel": P(*lead, "fsdp", "tensor"),
        f"{prefix}/wo/kernel": P(*lead, "tensor", "fsdp"),
    }
    if attn_norm:
        specs[f"{prefix}/attn_norm/scale"] = P(*lead, "fsdp")
    return specs


# The ModernBERT family (modernbert_tiny: 4 layers), bias-free. Layer 0 has no attention
# norm and stays outside the scan; the scanned layout stacks layers 1..3.
_MODERNBERT_OUTSIDE = {
    "encoder/word_embeddings": P("tensor", "fsdp"),
    "encoder/embedding_norm/scale": P("fsdp"),
    "encoder/final_norm/scale": P("fsdp"),
    "lm_head/dense/kernel": P("fsdp", "tensor"),
    "lm_head/norm/scale": P("fsdp"),
    "lm_head/bias": P("tensor"),
    **_modernbert_layer("encoder/layers_0", attn_norm=False),
}
GOLDEN_SPECS_222_MODERNBERT = {
    **_MODERNBERT_OUTSIDE,
    **{k: v for i in (1, 2, 3) for k, v in _modernbert_layer(f"encoder/layers_{i}").items()},
}
GOLDEN_SPECS_222_MODERNBERT_SCAN = {
    **_MODERNBERT_OUTSIDE, **_modernbert_layer("encoder/layers", lead=(None,)),
}


def _flat(tree):
    return flax.traverse_util.flatten_dict(tree, sep="/")


def _normalise(spec):
    # P('a') and P('a', None) shard alike; compare without trailing Nones.
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return P(*parts)


@pytest.mark.parametrize(
    "args, expected",
    [
        ((-1, 1, 1), (8, 1, 1)),
        ((-1, 2, 2), (2, 2, 2)),
        ((2, -1, 1), (2, 4, 1)),
        ((1, 1, -1), (1, 1, 8)),
        ((1, 2, 4), (1, 2, 4)),
    ],
)
def test_mesh_shape_for_fills_minus_one(args, expected):
    assert partitioning.mesh_shape_for(*args) == expected
    assert jax.device_count() == 8


@pytest.mark.parametrize(
    "args, message",
    [
        ((2, 2, 1), r"\(2, 2, 1\) has 4 devices but 8 are available"),
        ((4, 4, 1), r"\(4, 4, 1\) has 16 devices but 8"),
        ((-1, -1, 2), "at most one -1"),
        ((-1, 3, 1), "8 devices are not divisible by 3"),
        ((0, 8, 1), "data size must be >= 1"),
        ((1, -2, 8), "fsdp size must be >= 1"),
        ((1, 8, 1.0), "tensor size must be an integer"),
        (("2", 2, 2), "data size must be an integer"),
    ],
)
def test_mesh_shape_errors(args, message):
    with pytest.raises(MeshShapeError, match=message):
        partitioning.mesh_shape_for(*args)
    with pytest.raises(MeshShapeError, match=message):
        partitioning.create_mesh(*args)


def test_mesh_shape_for_explicit_device_count():
    assert partitioning.mesh_shape_for(-1, 2, 1, num_devices=4) == (2, 2, 1)
    with pytest.raises(MeshShapeError, match="has 8 devices but 4"):
        partitioning.mesh_shape_for(2, 2, 2, num_devices=4)


def test_create_mesh_axes_and_devices():
    mesh = partitioning.create_mesh(2, 2, 2)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
    one = partitioning.create_mesh(1, 1, 1, devices=jax.devices()[3:4])
    assert one.devices.flat[0] == jax.devices()[3]
    assert partitioning.batch_shards(mesh) == 4
    assert partitioning.batch_shards(partitioning.create_mesh(1, 2, 4)) == 2


def test_logical_rules():
    to_mesh = partitioning.logical_to_mesh_spec
    # Activations: batch over both data axes; embed stays whole (fsdp is taken).
    assert to_mesh(P("batch", "length", "embed")) == P(("data", "fsdp"), None, None)
    assert to_mesh(P("batch", "length", "heads", "kv")) == P(("data", "fsdp"), None, "tensor",
                                                             None)
    assert to_mesh(P("batch", "length", "mlp")) == P(("data", "fsdp"), None, "tensor")
    assert to_mesh(P("batch", "length", "vocab")) == P(("data", "fsdp"), None, "tensor")
    # Parameters: embed over fsdp (ZeRO-3), heads/mlp/vocab over tensor.
    assert to_mesh(P("vocab", "embed")) == P("tensor", "fsdp")
    assert to_mesh(P("layers", "embed", "mlp")) == P(None, "fsdp", "tensor")
    assert partitioning.batch_spec(2) == P(("data", "fsdp"), None)
    assert partitioning.batch_spec(3) == P(("data", "fsdp"), None, None)


@pytest.mark.parametrize("size, scan, golden", [
    ("tiny", False, GOLDEN_SPECS_222),
    ("tiny", True, GOLDEN_SPECS_222_SCAN),
    ("modernbert_tiny", False, GOLDEN_SPECS_222_MODERNBERT),
    ("modernbert_tiny", True, GOLDEN_SPECS_222_MODERNBERT_SCAN),
], ids=["xlmr-layers", "xlmr-scan", "modernbert-layers", "modernbert-scan"])
def test_golden_parameter_specs_on_mesh_222(size, scan, golden):
    cfg = network.get_config(size, pad_token_id=0, scan_layers=scan)
    fns = step.make_step_functions(cfg, OptimizerConfig(), partitioning.create_mesh(2, 2, 2))
    got = {k: s.spec for k, s in _flat(fns.state_sharding.params).items()}
    assert set(got) == set(golden)
    wrong = {k: (got[k], golden[k]) for k in golden if _normalise(got[k]) != _normalise(golden[k])}
    assert not wrong, wrong
    # The abstract state carries the same shardings, on the same mesh.
    for k, a in _flat(fns.abstract_state.params).items():
        assert a.sharding == _flat(fns.state_sharding.params)[k], k
        assert a.sharding.mesh == fns.mesh

    # Adam's moments are sharded exactly like their parameters; counters replicated.
    adam = fns.state_sharding.opt_state[1][0]
    for moments in (adam.mu, adam.nu):
        assert {k: s.spec for k, s in _flat(moments).items()} == got
    for leaf in jax.tree.leaves(fns.state_sharding.opt_state):
        if leaf.spec not in got.values():
            assert leaf.spec == P()
    assert fns.state_sharding.step.spec == P()
    assert fns.batch_sharding.spec == P(("data", "fsdp"), None)


def test_sharded_shapes_of_golden_specs():
    # Each device holds 1/8 of the word embeddings (vocab/tensor x embed/fsdp) and
    # 1/4 of a per-layer query kernel (embed/fsdp x heads/tensor).
    cfg = network.get_config("tiny", pad_token_id=0)
    fns = step.make_step_functions(cfg, OptimizerConfig(), partitioning.create_mesh(2, 2, 2))
    params = _flat(fns.abstract_state.params)
    word = params["encoder/embeddings/word_embeddings"]
    assert word.sharding.shard_shape(word.shape) == (512, 32)
    query = params["encoder/layers_0/attention/query/kernel"]
    assert query.sharding.shard_shape(query.shape) == (32, 4, 8)


@pytest.mark.parametrize(
    "overrides, mesh_shape, names",
    [
        (dict(vocab_size=1020), (1, 1, 8), "encoder/embeddings/word_embeddings"),
        (dict(mlp_dim=100), (1, 1, 8), "encoder/layers_1/wi/kernel"),
        (dict(num_heads=4), (1, 1, 8), "encoder/layers_0/attention/query/kernel"),
        (dict(hidden_size=60, num_heads=4), (1, 8, 1), "encoder/embeddings/layer_norm/bias"),
    ],
)
def test_indivisible_parameter_names_it(overrides, mesh_shape, names):
    # Every offending parameter is named (the message lists them all).
    cfg = network.get_config("tiny", pad_token_id=0, **overrides)
    mesh = partitioning.create_mesh(*mesh_shape)
    with pytest.raises(MeshShapeError, match=names) as err:
        step.make_step_functions(cfg, OptimizerConfig(), mesh)
    assert "not divisible" in str(err.value)


def test_check_divisible_accepts_exact_fit():
    abstract = {"w": jax.ShapeDtypeStruct((6, 4), np.float32)}
    mesh = partitioning.create_mesh(1, 2, 4)
    partitioning.check_divisible(abstract, {"w": P("fsdp", "tensor")}, mesh)
    with pytest.raises(MeshShapeError, match=r"parameter w of shape \(6, 4\)"):
        partitioning.check_divisible(abstract, {"w": P("tensor", "fsdp")}, mesh)


def test_step_functions_reject_foreign_mesh():
    devices = np.asarray(jax.devices()).reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("batch", "model"))
    cfg = network.get_config("tiny", pad_token_id=0)
    with pytest.raises(MeshShapeError, match=r"mesh axes \('batch', 'model'\)"):
        step.make_step_functions(cfg, OptimizerConfig(), mesh)
