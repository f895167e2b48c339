"""Our encoder under t5x (xlmeta_jax/interop/t5x/model.py), in process on 8 fake CPU devices:
partitioning through t5x's rules, the feature converter on a real task, one t5x trainer
step against one step of our trainer, fill-mask and scoring."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf
from t5x_toy import register_corpus, require_t5x, write_corpus

require_t5x()

pytestmark = pytest.mark.extras

from flax.linen import partitioning as flax_partitioning  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from t5x import trainer as t5x_trainer  # noqa: E402
from t5x import utils as t5x_utils  # noqa: E402

from xlmeta_jax.data import task_names as names  # noqa: E402
from xlmeta_jax.data.vocabulary import MASK_ID  # noqa: E402
from xlmeta_jax.interop.t5x import model as t5x_model  # noqa: E402
from xlmeta_jax.model import losses, mlm, network, partitioning  # noqa: E402
from xlmeta_jax.model.optimizer import OptimizerConfig  # noqa: E402
from xlmeta_jax.pretrain import step  # noqa: E402

LENGTH, BATCH = 32, 8


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    return write_corpus(shared_data, str(tmp_path_factory.mktemp("t5x_corpus")))


def _dataset_config(task, seed=3):
    return t5x_utils.DatasetConfig(
        mixture_or_task_name=task, task_feature_lengths={"inputs": LENGTH, "targets": LENGTH},
        split="train", batch_size=BATCH, shuffle=True, seed=seed, use_cached=False, pack=False,
    )


def _first_batches(corpus, task, n=1):
    register_corpus(corpus)
    ds = t5x_utils.get_dataset(_dataset_config(task), 0, 1, t5x_model.MLMFeatureConverter)
    return [dict(b) for b in ds.take(n).as_numpy_iterator()]


def _model(cfg, total_steps=10):
    opt = OptimizerConfig(learning_rate=1e-3, warmup_steps=2, total_steps=total_steps)
    return t5x_model.MaskedLMModel(cfg, t5x_model.adamw(opt)), opt


@pytest.mark.parametrize("scan", [False, True])
def test_params_axes_are_the_networks_logical_names_mapped_by_t5x_rules(scan):
    cfg = network.get_config("tiny", scan_layers=scan)
    model, _ = _model(cfg)
    shapes = {"inputs": (BATCH, LENGTH), "mlm_positions": (BATCH, 6),
              "mlm_targets": (BATCH, 6), "mlm_weights": (BATCH, 6)}
    variables = jax.eval_shape(
        lambda: model.get_initial_variables(jax.random.PRNGKey(0), shapes))
    names = flax_partitioning.get_axis_names(variables["params_axes"])
    expected = step.param_logical_specs(model.module)
    flat = lambda t: {jax.tree_util.keystr(k): tuple(v) for k, v in
                      jax.tree_util.tree_flatten_with_path(
                          t, is_leaf=lambda x: isinstance(x, P))[0]}
    assert flat(names) == flat(expected)
    assert any("layers" in axes for axes in flat(names).values()) == scan

    partitioner = t5x_model.MeshPartitioner(mesh_shape=(4, 2))
    init = t5x_utils.TrainStateInitializer(
        model.optimizer_def, model.get_initial_variables, shapes, partitioner,
        {k: jnp.int32 for k in shapes})
    axes = init.train_state_axes.params
    layer = axes["encoder"]["layers"] if scan else axes["encoder"]["layers_0"]
    lead = (None,) if scan else ()
    assert axes["encoder"]["embeddings"]["word_embeddings"] == P("model", None)
    assert layer["attention"]["query"]["kernel"] == P(*lead, None, "model", None)
    assert layer["wi"]["kernel"] == P(*lead, None, "model")
    assert axes["lm_head"]["bias"] == P("model")
    # AdamW's moments are partitioned like the parameters they belong to.
    adam = init.train_state_axes.param_states[1][0]
    assert adam.mu["encoder"]["embeddings"]["word_embeddings"] == P("model", None)


def test_feature_converter_keeps_every_selected_position_in_the_loss(corpus):
    batches = _first_batches(corpus, names.ENGLISH_TEXT_TASK, n=4)
    slots = mlm.max_predictions(LENGTH, 0.15)
    assert {k: v.shape for k, v in batches[0].items()} == {
        "inputs": (BATCH, LENGTH), "mlm_positions": (BATCH, slots),
        "mlm_targets": (BATCH, slots), "mlm_weights": (BATCH, slots)}
    batch = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    rows = np.arange(4 * BATCH)[:, None]
    weighted = batch["mlm_weights"] > 0
    at = batch["inputs"][rows, batch["mlm_positions"]][weighted]
    # 80/10/10: about a fifth of the predicted positions show a real token (random or kept),
    # and each carries loss weight 1 (weights of `inputs == <mask>` would drop them).
    assert weighted.sum() > 120
    unmasked = at != MASK_ID
    assert 0.05 < unmasked.mean() < 0.4
    assert (batch["mlm_weights"][weighted] == 1.0).all()
    assert (batch["inputs"] == MASK_ID).sum() == (~unmasked).sum()
    with pytest.raises(ValueError, match="DatasetConfig.pack = False"):
        t5x_model.MLMFeatureConverter(pack=True)
    # Rows packed from whole documents carry segment ids that t5x's model would drop.
    packed = tf.data.Dataset.from_tensors(
        {**{k: tf.zeros([LENGTH], tf.int32) for k in ("inputs", "targets", *mlm.PACKED_FEATURES)},
         **{k: tf.zeros([slots], tf.int32) for k in ("mlm_positions", "mlm_targets")},
         "mlm_weights": tf.zeros([slots])})
    with pytest.raises(t5x_model.PackedRowsError, match="python -m xlmeta_jax.train"):
        t5x_model.MLMFeatureConverter()(packed, {"inputs": LENGTH, "targets": LENGTH})


def test_t5x_trainer_steps_equal_our_trainer_steps(corpus):
    """Same params, same real batches: the losses (step 0 first) and the params agree."""
    cfg = network.get_config("tiny", dropout_rate=0.0, attention_dropout_rate=0.0)
    model, opt = _model(cfg)
    batches = _first_batches(corpus, names.ENGLISH_TEXT_TASK, n=2)
    shapes = {k: v.shape for k, v in batches[0].items()}
    types = {k: v.dtype for k, v in batches[0].items()}

    partitioner = t5x_model.MeshPartitioner(mesh_shape=(4, 2))
    init = t5x_utils.TrainStateInitializer(
        model.optimizer_def, model.get_initial_variables, shapes, partitioner, types)
    state = init.from_scratch(jax.random.PRNGKey(0))
    params0 = flax.core.unfreeze(jax.tree.map(np.asarray, jax.device_get(state.params)))
    trainer = t5x_trainer.Trainer(
        model, state, partitioner, eval_names=[], summary_dir=None,
        train_state_axes=init.train_state_axes, rng=jax.random.PRNGKey(1),
        learning_rate_fn=t5x_model.learning_rate(opt), num_microbatches=None)
    t5x_losses = [
        float(trainer.train(iter([b]), 1, start_step=i).result()["loss"].value)
        for i, b in enumerate(batches)
    ]

    mesh = partitioning.create_mesh(data=4, fsdp=1, tensor=2)
    fns = step.make_step_functions(cfg, opt, mesh)
    ours = fns.init(jax.random.key(0))
    ours = ours.replace(params=jax.device_put(params0, fns.state_sharding.params))
    our_losses = []
    for b in batches:
        ours, metrics = fns.train_step(ours, b)
        our_losses.append(float(metrics["loss"]))
    assert t5x_losses == pytest.approx(our_losses, rel=1e-6)
    assert t5x_losses[0] == pytest.approx(float(losses.mlm_loss_and_metrics(
        model.module, params0, batches[0])[0]), rel=1e-6)

    after_t5x = jax.tree_util.tree_leaves_with_path(jax.device_get(trainer.train_state.params))
    after_ours = dict(zip(
        (jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(ours.params)),
        jax.tree.leaves(jax.device_get(ours.params))))
    assert len(after_t5x) == len(after_ours)
    moved = 0
    for path, x in after_t5x:
        y = after_ours[jax.tree_util.keystr(path)]
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))
        moved += int(not np.array_equal(x, _leaf(params0, path)))
    assert moved == len(after_t5x)


def _leaf(params, path):
    for k in path:
        params = params[k.key]
    return params


def test_fill_mask_and_masked_token_scores():
    cfg = network.get_config("tiny")
    model, _ = _model(cfg)
    params = model.get_initial_variables(jax.random.PRNGKey(7), {"inputs": (2, 16)})["params"]
    rng = np.random.default_rng(0)
    inputs = rng.integers(5, cfg.vocab_size, size=(2, 16)).astype(np.int32)
    inputs[:, 0] = 3
    inputs[0, [2, 5, 9]] = MASK_ID
    inputs[1, [4]] = MASK_ID

    filled, aux = jax.jit(model.predict_batch_with_aux)(params, {"inputs": inputs})
    logits = jax.jit(model.module.apply)({"params": params}, inputs)
    log_probs = jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1)
    masked = inputs == MASK_ID
    np.testing.assert_array_equal(np.asarray(filled)[~masked], inputs[~masked])
    np.testing.assert_array_equal(np.asarray(filled)[masked],
                                  np.argmax(np.asarray(logits), -1)[masked])
    np.testing.assert_allclose(np.asarray(aux["log_probs"])[masked],
                               np.max(log_probs, -1)[masked], rtol=1e-5)
    assert (np.asarray(aux["log_probs"])[~masked] == 0).all()

    batch = {
        "inputs": inputs,
        "mlm_positions": np.array([[2, 5, 9, 0], [4, 7, 0, 0]], np.int32),
        "mlm_targets": np.array([[11, 12, 13, 0], [14, 15, 0, 0]], np.int32),
        "mlm_weights": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32),
    }
    scores, inter = jax.jit(model.score_batch, static_argnums=2)(params, batch, True)
    expected = [log_probs[0, 2, 11] + log_probs[0, 5, 12] + log_probs[0, 9, 13],
                log_probs[1, 4, 14] + log_probs[1, 7, 15]]
    np.testing.assert_allclose(np.asarray(scores), expected, rtol=1e-5)
    assert np.asarray(inter["mlm_log_probs"])[1, 2:].tolist() == [0.0, 0.0]


def test_masking_rate_sets_shapes_before_any_dataset_and_fills_that_many_masks():
    cfg = network.get_config("tiny")
    opt = OptimizerConfig(learning_rate=1e-3, warmup_steps=2, total_steps=10)
    model = t5x_model.MaskedLMModel(cfg, t5x_model.adamw(opt), masking=mlm.Masking(rate=0.3))
    lengths = model.FEATURE_CONVERTER_CLS(pack=False).get_model_feature_lengths(
        {"inputs": 16, "targets": 16})
    assert lengths["mlm_positions"] == mlm.max_predictions(16, 0.3) == 6
    params = model.get_initial_variables(jax.random.PRNGKey(7), {"inputs": (1, 16)})["params"]
    inputs = np.full((1, 16), 9, np.int32)
    inputs[0, 0] = 3
    inputs[0, 1:7] = MASK_ID  # six masks: 30%'s slots, two more than 15%'s
    filled, _ = jax.jit(model.predict_batch_with_aux)(params, {"inputs": inputs})
    assert (np.asarray(filled) != MASK_ID).all()
    default, _ = _model(cfg)
    filled, _ = jax.jit(default.predict_batch_with_aux)(params, {"inputs": inputs})
    assert (np.asarray(filled) == MASK_ID).sum() == 6 - mlm.max_predictions(16, 0.15)


def test_converter_refuses_a_task_masked_at_another_rate(corpus):
    from xlmeta_jax.data import tasks

    tasks.register(vocab_path=corpus["vocab"], english_files=corpus["english"],
                   cc100_dir=corpus["cc100_dir"], languages=corpus["languages"],
                   masking=mlm.Masking(rate=0.3))
    cfg = _dataset_config(names.ENGLISH_TEXT_TASK)
    opt = OptimizerConfig(learning_rate=1e-3, warmup_steps=2, total_steps=10)
    model = t5x_model.MaskedLMModel(network.get_config("tiny"), t5x_model.adamw(opt),
                                    masking=mlm.Masking(rate=0.3))
    ds = t5x_utils.get_dataset(cfg, 0, 1, model.FEATURE_CONVERTER_CLS)
    assert next(ds.as_numpy_iterator())["mlm_positions"].shape == (
        BATCH, mlm.max_predictions(LENGTH, 0.3))
    with pytest.raises(mlm.MaskingError, match=r"carry 11 prediction slots, but "
                       r"MaskedLMModel.masking.rate=0.15 gives 6"):
        t5x_utils.get_dataset(cfg, 0, 1, t5x_model.MLMFeatureConverter)


@pytest.mark.parametrize("shape, match", [
    ((3, 2), r"\(data, model\)=\(3, 2\) has 6 devices but 8 are available"),
    ((-1, 3), "8 devices are not divisible by 3"),
    ((-1, -1), "at most one -1"),
])
def test_mesh_partitioner_names_a_bad_mesh(shape, match):
    with pytest.raises(ValueError, match=match):
        t5x_model.MeshPartitioner(mesh_shape=shape)


def test_unnamed_parameter_is_named():
    with pytest.raises(ValueError, match=r"without logical axis names: \['dense/kernel'\]"):
        t5x_model.params_axes({"dense": {"kernel": np.zeros((2, 2))}})


def test_step_time_command_times_both_trainers(capsys):
    from benchmarks import t5x_step_time

    report = t5x_step_time.main(["--size=tiny", "--batch=8", "--length=16", "--steps=1",
                                 "--rounds=1"])
    assert set(report["ms_per_step"]) == {"ours", "t5x"}
    assert all(v > 0 for v in report["ms_per_step"].values())
    assert "t5x / ours = " in capsys.readouterr().out


def test_microbatched_t5x_trainer_equals_one_batch():
    # num_microbatches=4 through MaskedLMTrainer against t5x's own step without
    # microbatches, on the same 32 rows: the same loss (normalised over the whole
    # batch's predictions, not a mean of microbatch means) and the same update.
    from xlmeta_jax.data import feeding

    cfg = network.get_config("tiny", dropout_rate=0.0, attention_dropout_rate=0.0)
    model, opt = _model(cfg)
    batch = feeding.mlm_batch(np.random.default_rng(2), 32, LENGTH, cfg.vocab_size)
    batch = {k: batch[k] for k in mlm.STEP_FEATURES}
    batch["mlm_weights"][1::4, 3:] = 0.0  # one microbatch predicts far fewer tokens
    shapes = {k: v.shape for k, v in batch.items()}
    types = {k: v.dtype for k, v in batch.items()}
    partitioner = t5x_model.MeshPartitioner(mesh_shape=(4, 2))
    init = t5x_utils.TrainStateInitializer(
        model.optimizer_def, model.get_initial_variables, shapes, partitioner, types)
    runs = {}
    for k in (None, 4):
        trainer = t5x_model.MaskedLMTrainer(
            model, init.from_scratch(jax.random.PRNGKey(0)), partitioner, eval_names=[],
            summary_dir=None, train_state_axes=init.train_state_axes,
            rng=jax.random.PRNGKey(1), learning_rate_fn=t5x_model.learning_rate(opt),
            num_microbatches=k)
        first = trainer.train(iter([batch]), 1, start_step=0).result()
        # After step 0 (learning rate 0 in warm-up) AdamW's first moment is 0.1 x the
        # step's gradients: the gradients themselves, compared below.
        mu = [np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(
            jax.device_get(trainer.train_state.param_states)) if "mu" in jax.tree_util.keystr(path)]
        second = trainer.train(iter([batch]), 1, start_step=1).result()
        runs[k] = ([float(m["loss"].value) for m in (first, second)],
                   [float(m["accuracy"].value) for m in (first, second)], mu)
    (loss1, acc1, mu1), (loss4, acc4, mu4) = runs[None], runs[4]
    np.testing.assert_allclose(loss4, loss1, rtol=1e-6)
    np.testing.assert_allclose(acc4, acc1, rtol=1e-6)
    assert len(mu1) == len(mu4) > 0
    # As in test_step.py's accumulation test: only the summation order differs, and
    # rounding is relative to the summed terms, so errors are measured against the norm
    # of the whole gradient.
    scale = np.sqrt(sum(np.sum(np.square(m)) for m in mu1))
    for a, b in zip(mu4, mu1):
        assert np.linalg.norm(a - b) / scale < 1e-6


def test_t5x_hosts_draw_the_streams_our_trainer_draws(corpus):
    # gin/t5x/run.gin's get_dataset_fn: input shard i of a phase on task T is seeded as
    # our trainer seeds host i of a phase on T, so the two trainers read the same
    # batches, and two shards draw different masks (t5x's own function seeds all alike).
    from xlmeta_jax.data import feeding, seeds
    from xlmeta_jax.interop.t5x import phases as t5x_phases

    register_corpus(corpus)
    cfg = _dataset_config(names.CC100_MIXTURE, seed=3)
    shards = []
    for i in range(2):
        ds = t5x_phases.get_dataset(cfg, i, 2, t5x_model.MLMFeatureConverter)
        shards.append(next(ds.as_numpy_iterator()))
        ours = feeding.host_dataset(
            names.CC100_MIXTURE, sequence_length=LENGTH,
            seed=seeds.phase_seeds([names.CC100_MIXTURE], 3)[0],
            shard=seqio.ShardInfo(index=i, num_shards=2))
        rows = list(ours.take(BATCH // 2).as_numpy_iterator())
        for name in mlm.STEP_FEATURES:
            np.testing.assert_array_equal(shards[i][name], np.stack([r[name] for r in rows]))
    assert not np.array_equal(shards[0]["mlm_positions"], shards[1]["mlm_positions"])
