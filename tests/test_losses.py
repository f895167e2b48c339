"""MLM loss with the LM head applied only at the gathered prediction slots.

The gathered ("masked-head") loss must equal the full-vocabulary computation
restricted to the same positions: loss, accuracy and every parameter gradient.
"""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax.data import feeding
from xlmeta_jax.model import losses, network
from xlmeta_jax.pretrain import hardware

_CFG = network.get_config("tiny", pad_token_id=0, dropout_rate=0.0, attention_dropout_rate=0.0)


def test_weighted_cross_entropy_hand_computed():
    # Row 0: uniform over 4 classes -> nll ln 4; argmax picks class 0, target 1: wrong.
    # Row 1: logits (ln 1, ln 3, ln 0.5, ln 0.5) -> p(target=1) = 3/5, argmax 1: right.
    # Row 2: weight 0, contributes nothing.
    logits = np.log(np.array([[1, 1, 1, 1], [1, 3, 0.5, 0.5], [9, 1, 1, 1]], np.float32))
    targets = np.array([1, 1, 3], np.int32)
    weights = np.array([1.0, 2.0, 0.0], np.float32)
    loss_sum, weight_sum, correct = jax.jit(losses.weighted_cross_entropy)(logits, targets, weights)
    np.testing.assert_allclose(float(loss_sum), np.log(4) + 2 * -np.log(3 / 5), rtol=1e-6)
    assert float(weight_sum) == 3.0
    assert float(correct) == 2.0


def test_weighted_cross_entropy_is_fp32_for_bf16_logits():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 7)), jnp.bfloat16)
    outs = jax.jit(losses.weighted_cross_entropy)(
        logits, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3))
    )
    assert all(o.dtype == jnp.float32 for o in outs)


def test_mlm_flops_per_token_hand_computed():
    cfg = types.SimpleNamespace(family="xlmr", hidden_size=2, mlp_dim=3, vocab_size=5,
                                num_layers=1)
    # per layer: 2*(4*4 + 2*2*3) + 2*(2*4*2) = 88; head: 2*(4 + 10) = 28 (x 2/4 slots).
    assert hardware.mlm_flops_per_token(cfg, 4, 2) == 3 * (88 + 14)
    assert hardware.mlm_flops_per_token(cfg, 4, 2, masked_head=False) == 3 * (88 + 28)


@pytest.fixture(scope="module")
def model_and_batch():
    model = network.XLMRForMaskedLM(_CFG)
    rng = np.random.default_rng(0)
    batch = feeding.mlm_batch(rng, 4, 32, _CFG.vocab_size)
    # Row 2 ends in padding: its tail is never a prediction target.
    batch["inputs"][2, 24:] = 0
    batch["targets"][2, 24:] = 0
    drop = batch["mlm_positions"][2] >= 24
    batch["mlm_weights"][2, drop] = 0.0
    batch["weights"][2, 24:] = 0.0
    # Row 3 predicts only two positions; its other slots are unused.
    batch["mlm_weights"][3, 2:] = 0.0
    batch["weights"][3] = 0.0
    batch["weights"][3, batch["mlm_positions"][3, :2]] = 1.0
    # Unused slots carry arbitrary targets: weight 0 must drop them entirely.
    unused = batch["mlm_weights"] == 0
    batch["mlm_targets"][unused] = 7
    params = jax.jit(lambda r: nn.unbox(model.init(r, batch["inputs"])["params"]))(
        jax.random.key(0)
    )
    # Make some predictions right, so accuracy is neither 0 nor 1: the logits do
    # not depend on the targets, so set every other used target to the argmax.
    full_logits = np.asarray(jax.jit(model.apply)({"params": params}, batch["inputs"]))
    for r in range(4):
        for s in range(0, batch["mlm_positions"].shape[1], 2):
            if batch["mlm_weights"][r, s]:
                p = batch["mlm_positions"][r, s]
                best = int(full_logits[r, p].argmax())
                batch["mlm_targets"][r, s] = best
                batch["targets"][r, p] = best
    return model, params, batch


def full_vocab_mlm_loss(module, params, batch):
    """Reference: LM head over *every* position, loss restricted by ``weights``.

    Returns ``(loss, accuracy)`` over the positions of weight 1 (no dropout).
    """
    logits = module.apply({"params": params}, batch["inputs"], deterministic=True)
    loss_sum, weight_sum, correct_sum = losses.weighted_cross_entropy(
        logits, batch["targets"], batch["weights"]
    )
    return loss_sum / jnp.maximum(weight_sum, 1.0), correct_sum / jnp.maximum(weight_sum, 1.0)


@pytest.fixture(scope="module")
def outputs(model_and_batch):
    model, params, batch = model_and_batch

    @jax.jit
    def both(params):
        def gathered(p):
            return losses.mlm_loss_and_metrics(model, p, batch)

        def full(p):
            return full_vocab_mlm_loss(model, p, batch)

        (loss_g, metrics), grads_g = jax.value_and_grad(gathered, has_aux=True)(params)
        (loss_f, acc_f), grads_f = jax.value_and_grad(full, has_aux=True)(params)
        slot_logits = model.apply({"params": params}, batch["inputs"],
                                  mlm_positions=batch["mlm_positions"])
        all_logits = model.apply({"params": params}, batch["inputs"])
        return dict(loss_g=loss_g, metrics=metrics, grads_g=grads_g, loss_f=loss_f,
                    acc_f=acc_f, grads_f=grads_f, slot_logits=slot_logits,
                    all_logits=all_logits)

    return jax.tree.map(np.asarray, both(params))


@pytest.fixture(scope="module")
def loss_fn(model_and_batch):
    model = model_and_batch[0]
    return jax.jit(lambda p, b: losses.mlm_loss_and_metrics(model, p, b))


def test_masked_head_equals_full_vocabulary(model_and_batch, outputs):
    batch = model_and_batch[2]
    metrics = outputs["metrics"]
    n_used = batch["mlm_weights"].sum()
    assert float(metrics["num_predictions"]) == n_used == batch["weights"].sum()
    acc = float(metrics["accuracy"])
    assert 0.3 < acc < 0.8  # the construction makes about half of them right
    np.testing.assert_allclose(float(outputs["loss_g"]), float(outputs["loss_f"]), rtol=1e-6)
    np.testing.assert_allclose(acc, float(outputs["acc_f"]), rtol=1e-6)

    # The slot logits are exactly the full logits at the gathered positions.
    pos = batch["mlm_positions"]
    expected = np.take_along_axis(outputs["all_logits"], pos[..., None], axis=1)
    np.testing.assert_allclose(outputs["slot_logits"], expected, rtol=1e-5, atol=1e-5)


def test_masked_head_gradients_equal_full_vocabulary(outputs):
    flat_g = jax.tree_util.tree_leaves_with_path(outputs["grads_g"])
    flat_f = jax.tree.leaves(outputs["grads_f"])
    assert len(flat_g) == len(flat_f) == 42
    for (path, g), f in zip(flat_g, flat_f):
        # Per-leaf scale; the attention key biases have a zero gradient (softmax is
        # shift-invariant), where both sides are rounding noise ~1e-12.
        scale = max(np.abs(f).max(), 1e-4)
        np.testing.assert_allclose(g, f, rtol=0, atol=1e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))
    # The gradient reaches the vocabulary bias at the targets (a non-trivial check).
    assert np.abs(outputs["grads_g"]["lm_head"]["bias"]).max() > 1e-3


def test_loss_matches_numpy_on_slot_logits(model_and_batch, outputs):
    batch = model_and_batch[2]
    logits = outputs["slot_logits"].astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    tgt = np.take_along_axis(logits, batch["mlm_targets"][..., None], -1)[..., 0]
    w = batch["mlm_weights"]
    np.testing.assert_allclose(float(outputs["loss_g"]), ((logz - tgt) * w).sum() / w.sum(),
                               rtol=1e-5)
    acc = ((logits.argmax(-1) == batch["mlm_targets"]) * w).sum() / w.sum()
    np.testing.assert_allclose(float(outputs["metrics"]["accuracy"]), acc, rtol=1e-6)


def test_unused_slots_do_not_matter(model_and_batch, loss_fn):
    _, params, batch = model_and_batch
    other = dict(batch)
    unused = batch["mlm_weights"] == 0
    other["mlm_targets"] = np.where(unused, 11, batch["mlm_targets"])
    other["mlm_positions"] = np.where(unused, 5, batch["mlm_positions"])
    assert float(loss_fn(params, batch)[0]) == float(loss_fn(params, other)[0])


def test_no_predictions_gives_zero_loss_not_nan(model_and_batch, loss_fn):
    _, params, batch = model_and_batch
    empty = dict(batch, mlm_weights=np.zeros_like(batch["mlm_weights"]))
    loss, metrics = loss_fn(params, empty)
    assert float(loss) == 0.0 and float(metrics["accuracy"]) == 0.0
    assert float(metrics["num_predictions"]) == 0.0
