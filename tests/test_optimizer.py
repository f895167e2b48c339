"""AdamW as RoBERTa/XLM-R train it: hyper-parameters, decay mask, schedule, clipping.

The optimizer is checked against a hand-written NumPy AdamW (with global-norm
clipping and decoupled, masked weight decay) over several steps, so a wrong
beta, epsilon placement, bias correction, decay mask or clipping order fails; the
schedule against fairseq's ``polynomial_decay`` as its trainer drives it.
"""

import dataclasses
import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from xlmeta_jax.model import network, optimizer
from xlmeta_jax.model.optimizer import OptimizerConfig

# Every parameter of the tiny (non-scanned) model and whether it is decayed:
# kernels and embedding tables yes; biases and LayerNorm scale/bias no.
_DECAYED = {
    "encoder/embeddings/word_embeddings": True,
    "encoder/embeddings/position_embeddings": True,
    "encoder/embeddings/token_type_embeddings": True,
    "encoder/embeddings/layer_norm/scale": False,
    "encoder/embeddings/layer_norm/bias": False,
    "lm_head/dense/kernel": True,
    "lm_head/dense/bias": False,
    "lm_head/layer_norm/scale": False,
    "lm_head/layer_norm/bias": False,
    "lm_head/bias": False,
}
for _i in range(2):
    _layer = f"encoder/layers_{_i}"
    for _proj in ("query", "key", "value", "out"):
        _DECAYED[f"{_layer}/attention/{_proj}/kernel"] = True
        _DECAYED[f"{_layer}/attention/{_proj}/bias"] = False
    for _dense in ("wi", "wo"):
        _DECAYED[f"{_layer}/{_dense}/kernel"] = True
        _DECAYED[f"{_layer}/{_dense}/bias"] = False
    for _ln in ("attention_layer_norm", "output_layer_norm"):
        _DECAYED[f"{_layer}/{_ln}/scale"] = False
        _DECAYED[f"{_layer}/{_ln}/bias"] = False


def _tiny_param_shapes():
    cfg = network.get_config("tiny", pad_token_id=0)
    model = network.XLMRForMaskedLM(cfg)
    ids = jnp.ones((1, 8), jnp.int32)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))
    return nn.unbox(abstract["params"])


def _flat(tree):
    return flax.traverse_util.flatten_dict(tree, sep="/")


def test_roberta_defaults():
    # RoBERTa's pretraining command: --adam-betas '(0.9,0.98)' --adam-eps 1e-6
    # --weight-decay 0.01 --clip-norm 0.0; fairseq's Adam decays every parameter.
    cfg = OptimizerConfig()
    assert (cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay) == (0.9, 0.98, 1e-6, 0.01)
    assert cfg.max_grad_norm == 0.0
    assert cfg.decay_all_parameters is True
    assert cfg.end_learning_rate == 0.0


def test_decay_mask_on_model_parameters():
    shapes = _tiny_param_shapes()
    mask = _flat(optimizer.decay_mask(shapes))
    assert mask == _DECAYED


@pytest.mark.parametrize("decay_all", [True, False])
def test_weight_decay_applied_only_where_expected(decay_all):
    # Zero gradients make Adam's step exactly 0 (0 / (0 + eps)), so after one
    # update each parameter is either untouched or shrunk by lr * weight_decay.
    shapes = _tiny_param_shapes()
    params = jax.tree.map(lambda s: np.full(s.shape, 2.0, np.float32), shapes)
    cfg = OptimizerConfig(learning_rate=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5,
                          decay_all_parameters=decay_all)
    tx = optimizer.make_optimizer(cfg)

    @jax.jit
    def one_step(params):
        grads = jax.tree.map(jnp.zeros_like, params)
        updates, _ = tx.update(grads, tx.init(params), params)
        return optax.apply_updates(params, updates)

    new = _flat(one_step(params))
    assert set(new) == set(_DECAYED)
    for path, decayed in _DECAYED.items():
        expected = 2.0 * (1 - 0.1 * 0.5) if decayed or decay_all else 2.0
        np.testing.assert_allclose(np.asarray(new[path]), expected, rtol=1e-6, err_msg=path)


def test_schedule_shape():
    cfg = OptimizerConfig(learning_rate=1.0, warmup_steps=10, total_steps=30,
                          end_learning_rate=0.1)
    sched = optimizer.linear_warmup_linear_decay(cfg)
    steps = np.arange(0, 41)
    got = np.array([float(sched(s)) for s in steps])
    expected = np.where(
        steps < 10,
        steps / 10,
        np.where(steps <= 30, 1.0 - 0.9 * (steps - 10) / 20, 0.1),
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert got.argmax() == 10 and got[10] == pytest.approx(1.0)
    assert got[0] == 0.0 and got[30] == pytest.approx(0.1)


def _fairseq_rates(lr, warmup, total, end, updates):
    """The rate of each update under fairseq's polynomial_decay (power 1), as its trainer runs it.

    fairseq/optim/lr_scheduler/polynomial_decay_schedule.py ``step_update``; the trainer
    calls ``step_update(0)`` when it builds the scheduler (``Trainer._build_optimizer``)
    and ``step_update(num_updates)`` after each update, so update ``t`` (0-based) runs at
    the rate ``step_update(t)`` set.
    """

    def step_update(num_updates):
        if warmup > 0 and num_updates <= warmup:
            return num_updates / float(warmup) * lr
        if num_updates >= total:
            return end
        pct_remaining = 1 - (num_updates - warmup) / (total - warmup)
        return (lr - end) * pct_remaining + end

    return [step_update(t) for t in range(updates)]


@pytest.mark.parametrize("warmup", [0, 1, 10])
def test_schedule_equals_fairseq_polynomial_decay(warmup):
    cfg = OptimizerConfig(learning_rate=6e-4, warmup_steps=warmup, total_steps=30,
                          end_learning_rate=1e-5)
    sched = optimizer.linear_warmup_linear_decay(cfg)
    got = [float(sched(t)) for t in range(40)]
    want = _fairseq_rates(6e-4, warmup, 30, 1e-5, 40)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    if warmup:
        assert got[0] == 0.0  # fairseq's first update, too, has rate 0


def test_schedule_without_warmup_starts_at_peak():
    sched = optimizer.linear_warmup_linear_decay(
        OptimizerConfig(learning_rate=2.0, warmup_steps=0, total_steps=4)
    )
    np.testing.assert_allclose([float(sched(s)) for s in range(6)],
                               [2.0, 1.5, 1.0, 0.5, 0.0, 0.0], atol=1e-7)


def _numpy_adamw(params, grads_per_step, cfg, mask):
    """Reference AdamW (PyTorch/HF semantics) with global-norm clipping, float64."""
    sched = optimizer.linear_warmup_linear_decay(cfg)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, grads in enumerate(grads_per_step, start=1):
        g = {k: np.asarray(x, np.float64) for k, x in grads.items()}
        norm = np.sqrt(sum((x**2).sum() for x in g.values()))
        if cfg.max_grad_norm > 0 and norm > cfg.max_grad_norm:
            g = {k: x * cfg.max_grad_norm / norm for k, x in g.items()}
        lr = float(sched(t - 1))
        for k in p:
            m[k] = cfg.b1 * m[k] + (1 - cfg.b1) * g[k]
            v[k] = cfg.b2 * v[k] + (1 - cfg.b2) * g[k] ** 2
            m_hat = m[k] / (1 - cfg.b1**t)
            v_hat = v[k] / (1 - cfg.b2**t)
            decay = cfg.weight_decay * p[k] if mask[k] else 0.0
            p[k] = p[k] - lr * (m_hat / (np.sqrt(v_hat) + cfg.eps) + decay)
    return p


def _run_optax(params, grads_per_step, cfg):
    tx = optimizer.make_optimizer(cfg)
    tree = flax.traverse_util.unflatten_dict(
        {tuple(k.split("/")): jnp.asarray(v) for k, v in params.items()})
    state = tx.init(tree)
    update = jax.jit(tx.update)
    for grads in grads_per_step:
        g = flax.traverse_util.unflatten_dict(
            {tuple(k.split("/")): jnp.asarray(v) for k, v in grads.items()})
        updates, state = update(g, state, tree)
        tree = optax.apply_updates(tree, updates)
    return {k: np.asarray(v) for k, v in _flat(tree).items()}


def _tiny_problem(rng):
    params = {
        "dense/kernel": rng.normal(size=(3, 4)),
        "dense/bias": rng.normal(size=(4,)),
        "layer_norm/scale": 1 + 0.1 * rng.normal(size=(4,)),
        "layer_norm/bias": rng.normal(size=(4,)),
        "embeddings/word_embeddings": rng.normal(size=(5, 3)),
    }
    params = {k: v.astype(np.float32) for k, v in params.items()}
    # Gradient norms above and below the clipping threshold, and one leaf whose
    # gradients are ~eps, where epsilon's placement (outside the sqrt) matters.
    scales = [30.0, 0.2, 5.0, 0.05, 12.0]
    grads = []
    for s in scales:
        g = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
        g["layer_norm/bias"] *= 1e-6
        norm = np.sqrt(sum((x.astype(np.float64) ** 2).sum() for x in g.values()))
        grads.append({k: (x * s / norm).astype(np.float32) for k, x in g.items()})
    mask = {k: not (k.endswith("bias") or k.startswith("layer_norm")) for k in params}
    return params, grads, mask


@pytest.mark.parametrize("decay_all", [True, False])
@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_adamw_matches_numpy_reference(max_grad_norm, decay_all):
    params, grads, mask = _tiny_problem(np.random.default_rng(0))
    if decay_all:
        mask = {k: True for k in mask}
    # Default betas/eps; a large rate and decay so every term is visible.
    cfg = OptimizerConfig(learning_rate=0.05, warmup_steps=2, total_steps=6,
                          end_learning_rate=0.01, weight_decay=0.3,
                          max_grad_norm=max_grad_norm, decay_all_parameters=decay_all)
    got = _run_optax(params, grads, cfg)
    want = _numpy_adamw(params, grads, cfg, mask)
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)


def test_reference_is_sensitive_to_each_hyper_parameter():
    # The comparison above would not notice a hyper-parameter that changes nothing.
    params, grads, mask = _tiny_problem(np.random.default_rng(0))
    base = OptimizerConfig(learning_rate=0.05, warmup_steps=2, total_steps=6,
                           end_learning_rate=0.01, weight_decay=0.3, max_grad_norm=1.0,
                           decay_all_parameters=False)
    want = _numpy_adamw(params, grads, base, mask)
    every = _numpy_adamw(params, grads, base, {k: True for k in mask})
    assert max(np.abs(every[k] - want[k]).max() for k in params) > 1e-4, "decay mask"
    variants = {
        "b1": dict(b1=0.8), "b2": dict(b2=0.999), "eps": dict(eps=1e-8),
        "weight_decay": dict(weight_decay=0.0), "max_grad_norm": dict(max_grad_norm=0.0),
    }
    for name, change in variants.items():
        other = _numpy_adamw(params, grads, dataclasses.replace(base, **change), mask)
        diff = max(np.abs(other[k] - want[k]).max() for k in params)
        assert diff > 1e-4, name


def test_clipping_uses_global_norm():
    # Adam normalises each element, so the clipped gradient shows in the first
    # moment: mu = (1 - b1) * clipped_g after one step.
    cfg = OptimizerConfig(learning_rate=0.1, warmup_steps=0, total_steps=10, max_grad_norm=1.0)
    tx = optimizer.make_optimizer(cfg)
    params = {"a": np.zeros(3, np.float32), "b": np.zeros(4, np.float32)}
    grads = {"a": np.full(3, 3.0, np.float32), "b": np.full(4, 4.0, np.float32)}
    _, state = jax.jit(tx.update)(grads, tx.init(params), params)
    adam_state = state[1][0]
    norm = np.sqrt(3 * 9 + 4 * 16)
    np.testing.assert_allclose(adam_state.mu["a"], (1 - cfg.b1) * 3.0 / norm, rtol=1e-6)
    np.testing.assert_allclose(adam_state.mu["b"], (1 - cfg.b1) * 4.0 / norm, rtol=1e-6)
    np.testing.assert_allclose(float(optimizer.global_norm(grads)), norm, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(total_steps=0), "total_steps"),
        (dict(warmup_steps=11, total_steps=10), "warmup_steps"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(learning_rate=float("inf")), "learning_rate"),
        (dict(learning_rate=float("nan")), "learning_rate"),
        (dict(end_learning_rate=-1e-4), "end_learning_rate"),
        (dict(b1=1.0), "b1"),
        (dict(b2=-0.1), "b2"),
        (dict(eps=0.0), "eps"),
        (dict(weight_decay=-0.01), "weight_decay"),
        (dict(max_grad_norm=-1.0), "max_grad_norm"),
    ],
)
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=f"OptimizerConfig.{field}") as e:
        OptimizerConfig(**kwargs)
    # The field and value travel with the error: a command line names the setting.
    assert e.value.field == field
    if field in kwargs:
        assert repr(e.value.value) == repr(kwargs[field])


def test_state_structure_does_not_depend_on_clipping_or_decay_mask():
    # A run resumes (and restores onto another mesh) by the state's tree structure:
    # changing clipping or the decay mask must not change it.
    params = {"dense": {"kernel": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32)}}
    structures = {
        (clip, every): jax.tree.structure(optimizer.make_optimizer(OptimizerConfig(
            warmup_steps=1, total_steps=10, max_grad_norm=clip, decay_all_parameters=every,
        )).init(params))
        for clip in (0.0, 1.0) for every in (True, False)
    }
    assert len(set(structures.values())) == 1, structures


# ---------------------------------------------------------------- other schedules
# Each against a plain-Python transcription of its reference formula.


def _wsd_reference(lr, end, warmup, total, decay, shape, t):
    """Warm-up-stable-decay (Hu et al. 2024), cool-downs of Hagele et al. 2024 (eq. 1)."""
    if t < warmup:
        return lr * t / warmup
    start = total - decay
    if t <= start:
        return lr
    p = min(1.0, (t - start) / decay)
    remaining = {"linear": 1 - p, "cosine": 0.5 * (1 + math.cos(math.pi * p)),
                 "1-sqrt": 1 - math.sqrt(p)}[shape]
    return end + (lr - end) * remaining


def _fairseq_inverse_sqrt(lr, warmup_updates, num_updates):
    """fairseq/optim/lr_scheduler/inverse_square_root_schedule.py, warmup_init_lr = 0."""
    warmup_init_lr = 0.0
    lr_step = (lr - warmup_init_lr) / warmup_updates
    decay_factor = lr * warmup_updates**0.5
    if num_updates < warmup_updates:
        return warmup_init_lr + num_updates * lr_step
    return decay_factor * num_updates**-0.5


@pytest.mark.parametrize("shape", optimizer.DECAY_SHAPES)
@pytest.mark.parametrize("warmup", [0, 7])
def test_wsd_schedule_matches_reference(shape, warmup):
    cfg = OptimizerConfig(learning_rate=6e-4, warmup_steps=warmup, total_steps=60,
                          end_learning_rate=1e-5, schedule="wsd", decay_steps=20,
                          decay_shape=shape)
    sched = optimizer.learning_rate_schedule(cfg)
    got = [float(sched(t)) for t in range(70)]
    want = [_wsd_reference(6e-4, 1e-5, warmup, 60, 20, shape, t) for t in range(70)]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    assert got[40] == pytest.approx(6e-4) and got[60] == pytest.approx(1e-5)


def test_wsd_shapes_differ_where_the_cool_down_runs():
    def rates(shape):
        sched = optimizer.learning_rate_schedule(OptimizerConfig(
            learning_rate=1.0, warmup_steps=0, total_steps=10, schedule="wsd",
            decay_steps=4, decay_shape=shape))
        return [float(sched(t)) for t in range(12)]

    lin, cos, sqrt = (rates(s) for s in optimizer.DECAY_SHAPES)
    assert lin[:7] == cos[:7] == sqrt[:7] == [1.0] * 7  # warm-up 0, stable to step 6
    # At p = 1/2: linear 1/2, cosine 1/2, 1-sqrt 1 - 0.707.
    assert lin[8] == pytest.approx(0.5) and cos[8] == pytest.approx(0.5)
    assert sqrt[8] == pytest.approx(1 - math.sqrt(0.5), rel=1e-6)
    assert cos[7] > lin[7] > sqrt[7]


@pytest.mark.parametrize("warmup", [1, 10])
def test_inverse_sqrt_matches_fairseq(warmup):
    cfg = OptimizerConfig(learning_rate=5e-4, warmup_steps=warmup, total_steps=100,
                          schedule="inverse_sqrt")
    sched = optimizer.learning_rate_schedule(cfg)
    got = [float(sched(t)) for t in range(100)]
    want = [_fairseq_inverse_sqrt(5e-4, warmup, t) for t in range(100)]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)


def test_optimizer_follows_the_configured_schedule():
    # The update of a zero-decay AdamW on a constant gradient is -lr(t) * (nearly 1), so
    # each step's update is its schedule's rate.
    cfg = OptimizerConfig(learning_rate=1.0, warmup_steps=2, total_steps=8, schedule="wsd",
                          decay_steps=4, decay_shape="1-sqrt", weight_decay=0.0, eps=1e-12)
    tx = optimizer.make_optimizer(cfg)
    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    got = []
    for _ in range(9):
        updates, state = tx.update({"w": jnp.ones(())}, state, params)
        got.append(-float(updates["w"]))
    want = [_wsd_reference(1.0, 0.0, 2, 8, 4, "1-sqrt", t) for t in range(9)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(schedule="step"), "schedule"),
        (dict(schedule="wsd", decay_shape="exp", decay_steps=5), "decay_shape"),
        (dict(schedule="wsd", decay_steps=0), "decay_steps"),
        (dict(schedule="wsd", warmup_steps=10, total_steps=20, decay_steps=11), "decay_steps"),
        (dict(schedule="linear", decay_steps=5), "decay_steps"),
        (dict(schedule="inverse_sqrt", warmup_steps=0), "warmup_steps"),
    ],
)
def test_schedule_settings_are_checked(kwargs, field):
    with pytest.raises(ValueError, match=f"OptimizerConfig.{field}"):
        OptimizerConfig(**kwargs)
