"""The sharded train step on 8 fake CPU devices.

* Loss and updated state on meshes (8,1,1), (2,2,2), (1,2,4), (1,1,8) equal the
  single-device step, with dropout on (jax's partitionable threefry makes the
  dropout masks independent of the mesh).
* The sharded init equals the single-device init and lands in the declared
  shardings; the step donates its input state.
* Dropout is deterministic: same seed and step, same masks; a step resumed from a
  restored state, with freshly built step functions, reproduces the uninterrupted
  update bit for bit.
* XLA does not replicate activations to reshard them ("involuntary full
  rematerialization") when compiling the step on mesh (2, 2, 2), in both layouts.
* bf16 compute keeps fp32 parameters and optimizer state, with bf16 matmuls and logits.
* Activation sharding constraints are bound while tracing (they were once silent no-ops).
"""

import collections
import os
import pathlib
import subprocess
import sys
import tempfile

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax.data import feeding
from xlmeta_jax.model import losses, mlm, network, partitioning
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import step

# (2, 2, 2) splits every axis and is in the quick loop; the others are slow-marked variants.
MESHES = [
    pytest.param((8, 1, 1), marks=pytest.mark.slow),
    (2, 2, 2),
    pytest.param((1, 2, 4), marks=pytest.mark.slow),
    pytest.param((1, 1, 8), marks=pytest.mark.slow),
]
SEED = 17
# Dropout on (the default rates): the mesh-equality tests then cover the masks too.
CFG = network.get_config("tiny", pad_token_id=0)
# No warm-up, so the first step already moves the parameters; gradient norms of
# the tiny model (~2.3) exceed max_grad_norm=1, so clipping is active too.
OPT = OptimizerConfig(learning_rate=1e-3, warmup_steps=0, total_steps=10, max_grad_norm=1.0)
STEPS = 2




# Compiled in a subprocess with XLA's warnings on (the test process silences
# them): the sharded train step must not make XLA replicate activations. The
# control is the pattern that once did (a lookup in a table split on `embed`
# over fsdp, constrained to the batch-split layout), to prove warnings show.
_REMAT_PROBE = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from xlmeta_jax.model import network, partitioning
from xlmeta_jax.data import feeding
from xlmeta_jax.pretrain import step
from xlmeta_jax.model.optimizer import OptimizerConfig

jax.config.update("jax_disable_most_optimizations", True)
mesh = partitioning.create_mesh(2, 2, 2)

def done(what):
    print(f"PROBE {what} DONE", file=sys.stderr, flush=True)

def lookup(table, ids):
    x = jnp.take(table, ids, axis=0)
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, P(("data", "fsdp"), None, None)))

jax.jit(lookup).lower(
    jax.ShapeDtypeStruct((130, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "fsdp"))),
    jax.ShapeDtypeStruct((8, 32), jnp.int32,
                         sharding=NamedSharding(mesh, P(("data", "fsdp"), None))),
).compile()
done("CONTROL")
fns = step.make_step_functions(network.get_config("tiny", pad_token_id=0), OptimizerConfig(), mesh)
batch = feeding.mlm_batch(np.random.default_rng(0), 8, 32, 1024)
batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
jax.jit(fns.train_step).lower(fns.abstract_state, batch).compile()
done("STEP")
scan_cfg = network.get_config("tiny", pad_token_id=0, scan_layers=True, remat_policy="full")
fns = step.make_step_functions(scan_cfg, OptimizerConfig(), mesh)
jax.jit(fns.train_step).lower(fns.abstract_state, batch).compile()
done("SCAN STEP")
"""


@pytest.fixture(scope="module", autouse=True)
def remat_probe(request):
    # Started first so that it compiles on the second core while this module's
    # own compiles run; its verdict is read by the test at the end of the file.
    wanted = any(item.name == "test_no_involuntary_rematerialization"
                 for item in request.session.items)
    if not wanted:
        yield None
        return
    # Warnings on; no persistent compilation cache, whose hits would skip the
    # very compiles (and warnings) the probe is about.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", JAX_ENABLE_COMPILATION_CACHE="false")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _REMAT_PROBE], env=env, cwd=pathlib.Path(__file__).parents[1],
            stdout=subprocess.DEVNULL, stderr=log, text=True,
        )
        yield proc, log
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _batch():
    batch = feeding.mlm_batch(np.random.default_rng(0), 8, 32, CFG.vocab_size)
    # Padded tails in two rows exercise the attention mask and position ids.
    for row in (1, 6):
        batch["inputs"][row, 20:] = 0
        batch["mlm_weights"][row, batch["mlm_positions"][row] >= 20] = 0.0
    return batch


BATCH = _batch()

_FNS = {}


def _fns(shape, cfg=CFG, seed=SEED):
    key = (shape, cfg, seed)
    if key not in _FNS:
        devices = jax.devices()[: int(np.prod(shape))]
        mesh = partitioning.create_mesh(*shape, devices=devices)
        _FNS[key] = step.make_step_functions(cfg, OPT, mesh, seed=seed)
    return _FNS[key]


def _host(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def _flat(tree):
    return flax.traverse_util.flatten_dict(flax.serialization.to_state_dict(tree), sep="/")


@pytest.fixture(scope="module")
def host_state0():
    """The initial state, initialised sharded on (2, 2, 2), as host arrays."""
    fns = _fns((2, 2, 2))
    state = fns.init(jax.random.key(0))
    for (path, leaf), sharding in zip(
        jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(fns.state_sharding)
    ):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), jax.tree_util.keystr(path)
    return _host(state)


def _run(shape, host_state, steps=STEPS):
    """Runs `steps` train steps on `shape`; returns host metrics and host states."""
    fns = _fns(shape)
    state = jax.device_put(host_state, fns.state_sharding)
    metrics, states = [], [host_state]
    for _ in range(steps):
        state, m = fns.train_step(state, BATCH)
        metrics.append(_host(m))
        states.append(_host(state))
    return metrics, states


_RUNS = {}


def _cached_run(shape, host_state):
    if shape not in _RUNS:
        _RUNS[shape] = _run(shape, host_state)
    return _RUNS[shape]


@pytest.fixture(scope="module")
def baseline(host_state0):
    return _cached_run((1, 1, 1), host_state0)


def test_threefry_is_partitionable():
    # Mesh-independent random bits are what make dropout (and init) equal on
    # every mesh; jax enables this by default since 0.5.
    assert jax.config.jax_threefry_partitionable


def test_sharded_init_equals_single_device_init(host_state0):
    single = _host(_fns((1, 1, 1)).init(jax.random.key(0)))
    a, b = _flat(single), _flat(host_state0)
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    params = _flat(host_state0.params)
    # RoBERTa's init: N(0, 0.02) weights, zero biases, unit LayerNorm scales.
    assert abs(params["encoder/embeddings/word_embeddings"].std() - 0.02) < 1e-3
    assert (params["encoder/layers_0/wi/bias"] == 0).all()
    assert (params["lm_head/layer_norm/scale"] == 1).all()
    assert int(host_state0.step) == 0


def test_abstract_state_matches_init(host_state0):
    fns = _fns((2, 2, 2))
    abstract = _flat(fns.abstract_state)
    real = _flat(host_state0)
    assert set(abstract) == set(real)
    for k, a in abstract.items():
        assert (a.shape, a.dtype) == (real[k].shape, real[k].dtype), k


def test_baseline_trains(baseline):
    metrics, states = baseline
    assert metrics[0]["num_predictions"] == BATCH["mlm_weights"].sum()
    np.testing.assert_allclose([m["learning_rate"] for m in metrics], [1e-3, 9e-4], rtol=1e-6)
    assert [int(s.step) for s in states] == [0, 1, 2]
    assert all(m["grad_norm"] > OPT.max_grad_norm for m in metrics)  # clipping is active
    moved = _flat(states[1].params)["encoder/layers_0/wi/kernel"] - _flat(
        states[0].params)["encoder/layers_0/wi/kernel"]
    # Adam's first step moves each weight by about the learning rate.
    assert 0.5e-3 < np.abs(moved).mean() < 1.1e-3


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_step_on_mesh_equals_single_device(shape, host_state0, baseline):
    metrics, states = _cached_run(shape, host_state0)
    base_metrics, base_states = baseline
    for m, b in zip(metrics, base_metrics):
        np.testing.assert_allclose(m["loss"], b["loss"], rtol=1e-6)
        np.testing.assert_allclose(m["grad_norm"], b["grad_norm"], rtol=1e-5)
        assert m["accuracy"] == b["accuracy"]
        assert m["num_predictions"] == b["num_predictions"]
    got, want = _flat(states[-1]), _flat(base_states[-1])
    assert set(got) == set(want)
    for k in want:
        if want[k].dtype.kind == "i":  # step counters
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        elif k.startswith("params/"):
            # Each step moves a weight by ~1e-3; sharded reductions only reorder
            # float sums (measured differences ~1.5e-7).
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
        else:
            # Adam's moments, relative to the largest moment of their kind: the
            # attention key biases have an exactly-zero gradient in theory (softmax
            # is shift-invariant), so their own moments are rounding noise.
            kind = k.split("/")[3]
            scale = max(np.abs(v).max() for j, v in want.items() if j.split("/")[3:4] == [kind])
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5 * scale,
                                       err_msg=k)


def test_train_step_donates_state(host_state0):
    fns = _fns((2, 2, 2))
    state = jax.device_put(host_state0, fns.state_sharding)
    new_state, _ = fns.train_step(state, BATCH)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))
    for (path, leaf), sharding in zip(
        jax.tree_util.tree_leaves_with_path(new_state), jax.tree.leaves(fns.state_sharding)
    ):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), jax.tree_util.keystr(path)


def test_same_seed_and_step_give_same_dropout(host_state0):
    fns = _fns((2, 2, 2))
    metrics, states = _cached_run((2, 2, 2), host_state0)
    again, m_again = fns.train_step(jax.device_put(host_state0, fns.state_sharding), BATCH)
    assert _host(m_again)["loss"] == metrics[0]["loss"]
    for k, v in _flat(_host(again)).items():
        np.testing.assert_array_equal(v, _flat(states[1])[k], err_msg=k)

    # Another step number draws other masks: same parameters, another loss.
    later = host_state0.replace(step=np.asarray(5, np.int32))
    _, m_later = fns.train_step(jax.device_put(later, fns.state_sharding), BATCH)
    assert _host(m_later)["loss"] != metrics[0]["loss"]

    # Dropout is really on: the deterministic loss of the same parameters differs.
    evaluated = fns.eval_step(jax.device_put(host_state0, fns.state_sharding), BATCH)
    assert abs(float(evaluated["loss"]) - metrics[0]["loss"]) > 1e-4


def test_another_seed_is_the_same_program_with_other_dropout(host_state0):
    # The seed is an argument of the step: phases and runs that differ only in their seed
    # share one compiled program (and the compilation cache's entry), not one each.
    fns, other = _fns((2, 2, 2)), _fns((2, 2, 2), seed=SEED + 1)
    batch = {k: BATCH[k] for k in mlm.STEP_FEATURES}
    texts = [f.train_step_jit.lower(f.abstract_state, batch, f.seed_spec).as_text()
             for f in (fns, other)]
    assert texts[0] == texts[1]
    metrics, _ = _cached_run((2, 2, 2), host_state0)
    _, m_other = other.train_step(jax.device_put(host_state0, other.state_sharding), BATCH)
    assert _host(m_other)["loss"] != metrics[0]["loss"]


@pytest.mark.slow
def test_rbg_dropout_is_deterministic_and_resumable(host_state0, baseline):
    # XLA's RngBitGenerator (rng_impl="rbg"): another stream than threefry's, but
    # a rebuilt step (a resumed run) on another mesh draws the same masks.
    def step_once(shape, state):
        mesh = partitioning.create_mesh(*shape, devices=jax.devices()[: int(np.prod(shape))])
        fns = step.make_step_functions(CFG, OPT, mesh, seed=SEED, rng_impl="rbg")
        new, m = fns.train_step(jax.device_put(state, fns.state_sharding), BATCH)
        return _host(new), _host(m)

    first, m1 = step_once((2, 2, 2), host_state0)
    resumed, m2 = step_once((2, 2, 2), host_state0)
    single, m3 = step_once((1, 1, 1), host_state0)
    # Other masks than threefry's change the loss far beyond rounding.
    assert abs(m1["loss"] - baseline[0][0]["loss"]) > 1e-4
    assert m1["loss"] == m2["loss"]
    for k, v in _flat(first).items():
        np.testing.assert_array_equal(v, _flat(resumed)[k], err_msg=k)
    # Same masks on one device (tolerances of the mesh-equality test: only the
    # reduction order differs).
    np.testing.assert_allclose(m3["loss"], m1["loss"], rtol=1e-6)
    for k, v in _flat(first).items():
        np.testing.assert_allclose(v, _flat(single)[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_resumed_step_reproduces_update(host_state0):
    # A resumed run builds its step functions afresh (same seed), restores the
    # state after step 1 (host copy, as from a checkpoint) into the shardings and
    # takes step 2 again: bit-identical to the uninterrupted run.
    metrics, states = _cached_run((2, 2, 2), host_state0)
    fns = step.make_step_functions(CFG, OPT, _fns((2, 2, 2)).mesh, seed=SEED)
    resumed, m = fns.train_step(jax.device_put(states[1], fns.state_sharding), BATCH)
    m = _host(m)
    for key in ("loss", "grad_norm", "learning_rate"):
        assert m[key] == metrics[1][key], key
    for k, v in _flat(_host(resumed)).items():
        np.testing.assert_array_equal(v, _flat(states[2])[k], err_msg=k)


def test_eval_step_matches_single_device(host_state0):
    sharded = _host(_fns((2, 2, 2)).eval_step(
        jax.device_put(host_state0, _fns((2, 2, 2)).state_sharding), BATCH))
    single = _host(_fns((1, 1, 1)).eval_step(
        jax.device_put(host_state0, _fns((1, 1, 1)).state_sharding), BATCH))
    np.testing.assert_allclose(sharded["loss"], single["loss"], rtol=1e-6)
    assert sharded["num_predictions"] == single["num_predictions"] == BATCH["mlm_weights"].sum()
    # Deterministic: no dropout in evaluation.
    again = _host(_fns((1, 1, 1)).eval_step(
        jax.device_put(host_state0, _fns((1, 1, 1)).state_sharding), BATCH))
    assert again["loss"] == single["loss"]


def test_batch_errors_name_the_feature(host_state0):
    fns = _fns((2, 2, 2))
    incomplete = {k: v for k, v in BATCH.items() if k != "mlm_weights"}
    with pytest.raises(KeyError, match="mlm_weights"):
        fns.train_step(fns.abstract_state, incomplete)
    # A batch the mesh cannot split is refused by the run's checks (pretrain/checks.py,
    # tests/test_errors.py); called directly, the step fails loudly too (JAX's own error),
    # never training on part of it.
    odd = {k: v[:6] for k, v in BATCH.items()}
    with pytest.raises(ValueError, match="should evenly divide the shape"):
        fns.train_step(fns.abstract_state, odd)


def _walk(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _walk(inner)


def _abstract_batch():
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in BATCH.items()}


@pytest.fixture(scope="module")
def bf16_fns():
    return _fns((2, 2, 2), cfg=CFG.replace(dtype="bfloat16"))


def test_bf16_compute_keeps_fp32_state(bf16_fns):
    new_state, metrics = jax.eval_shape(
        bf16_fns.train_step, bf16_fns.abstract_state, _abstract_batch()
    )
    for path, leaf in jax.tree_util.tree_leaves_with_path(new_state.params):
        assert leaf.dtype == jnp.float32, jax.tree_util.keystr(path)
    adam = new_state.opt_state[1][0]
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves((adam.mu, adam.nu)))
    assert metrics["loss"].dtype == jnp.float32

    model = network.XLMRForMaskedLM(bf16_fns.model.config)
    logits = jax.eval_shape(
        lambda p: model.apply({"params": p}, BATCH["inputs"],
                              mlm_positions=BATCH["mlm_positions"]),
        bf16_fns.abstract_state.params,
    )
    assert logits.dtype == jnp.bfloat16
    assert logits.shape == (8, BATCH["mlm_positions"].shape[1], CFG.vocab_size)


def test_bf16_matmuls_in_step(bf16_fns):
    jaxpr = jax.make_jaxpr(bf16_fns.train_step)(bf16_fns.abstract_state, _abstract_batch())
    dots = [e for e in _walk(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    assert dots
    dtypes = collections.Counter(str(e.outvars[0].aval.dtype) for e in dots)
    assert set(dtypes) == {"bfloat16"}, dtypes
    vocab = [e for e in dots
             if e.outvars[0].aval.shape == (8, BATCH["mlm_positions"].shape[1], CFG.vocab_size)]
    assert vocab, "no [batch, slots, vocab] logits matmul in the step"


def test_activation_constraints_are_bound():
    fns = _fns((2, 2, 2))
    jaxpr = jax.make_jaxpr(fns.train_step)(fns.abstract_state, _abstract_batch())
    specs = collections.Counter(
        (e.outvars[0].aval.shape, tuple(e.params["sharding"].spec))
        for e in _walk(jaxpr.jaxpr) if e.primitive.name == "sharding_constraint"
    )
    batch_axes = ("data", "fsdp")
    assert specs[((8, 32, 64), (batch_axes, None, None))] > 0
    assert specs[((8, 32, 8, 8), (batch_axes, None, "tensor", None))] > 0
    assert specs[((8, 32, 128), (batch_axes, None, "tensor"))] > 0
    # The embedding tables are all-gathered over fsdp before the lookup.
    assert specs[((1024, 64), ("tensor", None))] > 0


def test_no_involuntary_rematerialization(remat_probe):
    proc, log = remat_probe
    proc.wait(timeout=600)
    log.seek(0)
    err = log.read()
    assert proc.returncode == 0, err[-3000:]
    control, _, rest = err.partition("PROBE CONTROL DONE")
    assert "Involuntary full rematerialization" in control, "XLA's warnings did not show"
    assert "PROBE STEP DONE" in rest and "PROBE SCAN STEP DONE" in rest, err[-3000:]
    offending = [line for line in rest.splitlines() if "Involuntary full rematerialization" in line]
    assert not offending, "\n".join(offending)


# ---------------------------------------------------------------------------
# Gradient accumulation.
# ---------------------------------------------------------------------------

# No dropout: the microbatched step must equal the one-batch step on the same batch.
NO_DROPOUT = network.get_config("tiny", pad_token_id=0, dropout_rate=0.0,
                                attention_dropout_rate=0.0)


def _wide_batch():
    """32 rows (8 per microbatch of 4 on data x fsdp = 4), with uneven masked counts:
    a mean of microbatch means would then differ from the batch mean."""
    batch = feeding.mlm_batch(np.random.default_rng(1), 32, 32, CFG.vocab_size)
    batch["mlm_weights"][1::4, 3:] = 0.0  # microbatch 1 predicts far fewer tokens
    return batch


def test_microbatches_equal_one_batch(host_state0):
    batch = _wide_batch()
    mesh = _fns((2, 2, 2)).mesh
    metrics, grads = {}, {}
    for k in (1, 4):
        fns = step.make_step_functions(NO_DROPOUT, OPT, mesh, seed=SEED, microbatches=k)
        state = jax.device_put(host_state0, fns.state_sharding)
        # The gradients the step computes (its own accumulation, on the mesh).
        sharded = jax.device_put({f: batch[f] for f in mlm.STEP_FEATURES},
                                 fns.batch_sharding)
        with partitioning.mesh_context(mesh):
            grads[k] = _flat(_host(jax.jit(lambda p, b, k=k, fns=fns: step.accumulated_grads(
                lambda p, b, key: losses.mlm_sums(fns.model, p, b, deterministic=True),
                p, b, jax.random.key(0), microbatches=k,
                rows_sharding=jax.sharding.NamedSharding(mesh, partitioning.batch_spec(1)),
                grads_sharding=fns.state_sharding.params,
            )[0])(state.params, sharded)))
        metrics[k] = []
        for _ in range(STEPS):
            state, m = fns.train_step(state, batch)
            metrics[k].append(_host(m))
    # Only the summation order differs (float32). Rounding is relative to the summed
    # terms, not to their sum: entries whose terms cancel (an embedding row hit at many
    # positions; the attention key bias, whose true gradient is 0) keep absolute noise
    # of float32's epsilon times the terms, so errors are measured against the norm of
    # the whole gradient.
    scale = np.sqrt(sum(np.sum(np.square(g)) for g in grads[1].values()))
    for key, g in grads[1].items():
        error = np.linalg.norm(grads[4][key] - g) / scale
        assert error < 1e-6, (key, error)
    for m1, m4 in zip(metrics[1], metrics[4]):
        assert m4["num_predictions"] == m1["num_predictions"] == batch["mlm_weights"].sum()
        for key in ("loss", "accuracy", "grad_norm", "param_norm"):
            np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, err_msg=key)
    # (The parameters after an AdamW step are not compared element-wise: its first
    # update is about lr * g / |g|, which turns float32 rounding in near-zero
    # gradient entries into update differences of up to lr.)


def test_microbatch_gradients_are_normalised_over_the_whole_batch():
    # The definition: sum over microbatches of d(loss_sum_i) / total count, microbatch i
    # on rows i, i + k, ... with dropout key fold_in(key, i).
    model = network.XLMRForMaskedLM(CFG)
    params = flax.core.unfreeze(model.init(
        jax.random.key(0), jnp.ones((1, 8), jnp.int32), deterministic=True))["params"]
    params = flax.linen.unbox(params)
    batch = {k: jnp.asarray(v) for k, v in _wide_batch().items() if k in mlm.STEP_FEATURES}
    key = jax.random.key(5)

    def sums_fn(p, b, k):
        return losses.mlm_sums(model, p, b, rngs={"dropout": k}, deterministic=False)

    grads, sums = jax.jit(lambda p, b: step.accumulated_grads(
        sums_fn, p, b, key, microbatches=4))(params, batch)
    def microbatch_loss(p, rows, i):
        return sums_fn(p, rows, jax.random.fold_in(key, i))[0]

    # One compiled gradient for the four microbatches (they share a shape): op by op,
    # the tiny model's backward pass takes half a minute on 2 cores.
    grad_fn = jax.jit(jax.grad(microbatch_loss))
    expected, total = None, 0.0
    for i in range(4):
        rows = {k: v[i::4] for k, v in batch.items()}
        g = grad_fn(params, rows, i)
        expected = g if expected is None else jax.tree.map(jnp.add, expected, g)
        total += float(rows["mlm_weights"].sum())
    assert float(sums[1]) == total
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads),
                            jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b / total, rtol=1e-4, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))
    # Each microbatch draws its own dropout masks: with one shared key the four
    # microbatches of a batch of four copies of the same rows would give equal sums.
    copies = {k: jnp.repeat(v[:8], 4, axis=0) for k, v in batch.items()}
    loss_sum = jax.jit(microbatch_loss)
    per_microbatch = [float(loss_sum(params, {k: v[i::4] for k, v in copies.items()}, i))
                      for i in range(4)]
    assert len(set(per_microbatch)) == 4


def test_microbatches_shrink_step_memory():
    # Activation memory follows the microbatch: XLA's buffer assignment for the step
    # at 4 microbatches needs well under the temporaries of the whole batch at once.
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
             for k, v in _wide_batch().items() if k in mlm.STEP_FEATURES}
    temps = {}
    for k in (1, 4):
        fns = step.make_step_functions(NO_DROPOUT, OPT, _fns((2, 2, 2)).mesh, microbatches=k)
        compiled = fns.train_step_jit.lower(fns.abstract_state, batch, fns.seed_spec).compile()
        temps[k] = compiled.memory_analysis().temp_size_in_bytes
    assert temps[4] < 0.75 * temps[1], temps
