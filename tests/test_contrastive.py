"""The contrastive loss and step against sentence-transformers, GradCache's gradients, and
the global batch's negatives across a mesh.

Reference: sentence-transformers' ``MultipleNegativesRankingLoss`` and
``CachedMultipleNegativesRankingLoss`` (the versions installed), on the same weights
(our tiny XLM-R exported with ``save_hf``, loaded by ``SentenceTransformer``), the same
batches and AdamW without warm-up in fp32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlmeta_jax.evaluation import embedding_step
from xlmeta_jax.evaluation.embedding_step import LossSettings
from xlmeta_jax.model import contrastive, partitioning
from xlmeta_jax.model.network import EncoderConfig

torch = pytest.importorskip("torch")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

HIDDEN = 32


def _st_loss(kind, scale=20.0, symmetric=False, mini_batch_size=4, model=None):
    # The losses read only the embeddings given here; the cached one checks its model's
    # first module.
    model = model if model is not None else torch.nn.Sequential(torch.nn.Identity())
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    mode = "per_direction" if symmetric else "joint"
    if kind == "cached":
        return st_losses.CachedMultipleNegativesRankingLoss(
            model, scale=scale, directions=directions, partition_mode=mode,
            mini_batch_size=mini_batch_size)
    return st_losses.MultipleNegativesRankingLoss(model, scale=scale, directions=directions,
                                                  partition_mode=mode)


@pytest.mark.parametrize("rows,negatives,scale,symmetric", [
    (8, 0, 20.0, False),   # pairs, sentence-transformers' defaults
    (8, 2, 20.0, False),   # two columns of hard negatives
    (6, 1, 50.0, True),    # symmetric (per-direction partitions), another scale
    (1, 0, 20.0, False),   # one row: a zero loss
])
def test_loss_equals_sentence_transformers(rows, negatives, scale, symmetric):
    rng = np.random.default_rng(rows + negatives)
    columns = [rng.standard_normal((rows, HIDDEN)).astype(np.float32)
               for _ in range(2 + negatives)]
    ours = contrastive.ranking_loss(columns[0], np.concatenate(columns[1:]), scale=scale,
                                    symmetric=symmetric)
    plain = _st_loss("plain", scale, symmetric).compute_loss_from_embeddings(
        [torch.from_numpy(c) for c in columns], None)
    cached = _st_loss("cached", scale, symmetric, mini_batch_size=3).calculate_loss(
        [[torch.from_numpy(c[i:i + 3]) for i in range(0, rows, 3)] for c in columns])
    np.testing.assert_allclose(float(ours), float(plain), rtol=0, atol=1e-5)
    np.testing.assert_allclose(float(ours), float(cached), rtol=0, atol=1e-5)


def test_margin_lowers_only_the_positive_pairs():
    """LaBSE's margin, checked by hand: two orthogonal pairs, unit cosines on the diagonal."""
    q = np.eye(2, dtype=np.float32)
    d = np.eye(2, dtype=np.float32)
    m, s = 0.3, 2.0
    # Row i: positive s * (1 - m), the other s * 0: loss = log(1 + exp(-s(1 - m))).
    expected = np.log1p(np.exp(-s * (1 - m)))
    got = contrastive.ranking_loss(q, d, scale=s, margin=m)
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)
    # Symmetric: the documents' direction has the same margin, so the same value.
    got = contrastive.ranking_loss(q, d, scale=s, margin=m, symmetric=True)
    np.testing.assert_allclose(float(got), expected, rtol=1e-6)


def test_pooling_counts_only_real_tokens():
    hidden = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    ids = np.array([[5, 6, 0], [7, 0, 0]])
    mean = contrastive.pool(hidden, ids, 0, "mean")
    np.testing.assert_allclose(mean, [[1.0, 2.0], [6.0, 7.0]])
    np.testing.assert_allclose(contrastive.pool(hidden, ids, 0, "cls"), [[0, 1], [6, 7]])


def _tiny(dropout=0.0):
    return EncoderConfig(vocab_size=120, hidden_size=HIDDEN, num_layers=2, num_heads=2,
                         mlp_dim=64, max_position_embeddings=40, pad_token_id=0,
                         dropout_rate=dropout, attention_dropout_rate=dropout)


def _params(cfg, seed=0):
    import flax.linen as nn

    from xlmeta_jax.model import network

    variables = network.masked_lm(cfg).init(jax.random.key(seed), np.ones((1, 4), np.int32),
                                            deterministic=True)
    # Non-trivial values everywhere (an init's small weights give tiny gradients).
    leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, nn.unbox(variables["params"])))
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(tree, [(x + 0.2 * rng.standard_normal(x.shape)).astype(x.dtype)
                                     for x in leaves])


def _columns(rows, negatives=0, seed=0, lengths=(7, 11)):
    rng = np.random.default_rng(seed)
    out = []
    for c in range(2 + negatives):
        length = lengths[min(c, 1)]
        ids = rng.integers(5, 120, (rows, length)).astype(np.int32)
        ids[:, 0] = 3
        # Rows of different lengths, padded with 0.
        for r in range(rows):
            ids[r, rng.integers(2, length + 1):] = 0
        out.append(ids)
    return out


@pytest.mark.parametrize("mini_batch_size,negatives,symmetric,pooling", [
    (1, 0, False, "mean"),
    (2, 1, False, "mean"),
    (4, 0, True, "cls"),
    (8, 2, False, "mean"),   # one mini-batch: the cache's passes over the whole batch
])
def test_gradcache_gives_the_uncached_gradients(mini_batch_size, negatives, symmetric,
                                                pooling):
    cfg = _tiny()
    params = _params(cfg)["encoder"]
    columns = [jnp.asarray(c) for c in _columns(8, negatives)]
    embed = embedding_step.embedder(cfg, pooling)
    key = jax.random.key(0)
    plain = LossSettings(pooling=pooling, symmetric=symmetric)
    cached = LossSettings(pooling=pooling, symmetric=symmetric,
                          mini_batch_size=mini_batch_size)
    loss_a, grads_a = jax.jit(lambda p: embedding_step.loss_and_grads(
        embed, p, columns, key, plain, deterministic=True))(params)
    loss_b, grads_b = jax.jit(lambda p: embedding_step.loss_and_grads(
        embed, p, columns, key, cached, deterministic=True))(params)
    # Rounding of float32 sums in another order: a few ulps of the loss.
    np.testing.assert_allclose(float(loss_a), float(loss_b), rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(grads_a)[0],
                            jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5,
                                   err_msg=jax.tree_util.keystr(path))
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads_a)) > 1e-3


def _optimizer(learning_rate=1e-3, steps=10):
    from xlmeta_jax.evaluation import training

    return training.make_finetune_optimizer(
        learning_rate=learning_rate, warmup_steps=0, total_steps=steps, weight_decay=0.01,
        b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0)


def _train(cfg, params, batches, settings, mesh, seed=0):
    fns = embedding_step.make_embedding_step(cfg, _optimizer(steps=len(batches)), mesh,
                                             settings, seed=seed)
    state = fns.from_params(jax.device_put(params, fns.state_sharding.params))
    losses, norms = [], []
    for batch in batches:
        state, metrics = fns.train_step(state, batch)
        losses.append(float(metrics["loss"]))
        norms.append(float(metrics["grad_norm"]))
    return losses, norms, jax.device_get(state.params)


def contrastive_of_shard(cfg, params, batch, settings):
    """The mean of the losses of the batch's two halves, each with its own negatives."""
    embed = embedding_step.embedder(cfg, settings.pooling)
    losses = []
    for half in (slice(0, 4), slice(4, 8)):
        columns = [jnp.asarray(batch[k][half]) for k in embedding_step.columns_of(batch)]
        embeddings = [embed(params["encoder"], c) for c in columns]
        losses.append(float(embedding_step.loss_of(settings)(embeddings)))
    return float(np.mean(losses))


def test_global_batch_is_every_rows_negative_on_a_mesh():
    """The same steps on one device and on 8 (data 2 x fsdp 2 x tensor 2), with dropout:
    equal losses and gradient norms, so each row met the whole global batch's negatives
    (with a device's rows only, the loss would be another). Parameters are not compared:
    Adam's first updates are about the learning rate times the gradient's sign, so
    rounding-level gradients flip them. Without GradCache: its loops are compiled for a
    mesh below (XLA's CPU runtime can stall running collectives inside loops on fake
    devices of a loaded machine; the run refuses that setting, see embedding_run)."""
    cfg = _tiny(dropout=0.1)
    params = _params(cfg, seed=1)
    batches = [dict(zip(("query", "positive", "negative_0"), _columns(8, 1, seed=s)))
               for s in range(3)]
    settings = LossSettings(mini_batch_size=None)
    one = partitioning.create_mesh(data=1, devices=jax.devices()[:1])
    eight = partitioning.create_mesh(data=2, fsdp=2, tensor=2)
    losses_1, norms_1, params_1 = _train(cfg, params, batches, settings, one)
    losses_8, norms_8, _ = _train(cfg, params, batches, settings, eight)
    np.testing.assert_allclose(losses_1, losses_8, rtol=0, atol=1e-5)
    np.testing.assert_allclose(norms_1, norms_8, rtol=1e-5)
    # A device's own rows as the negatives give another loss.
    local = contrastive_of_shard(cfg, params, batches[0], settings)
    assert abs(local - losses_1[0]) > 1e-2
    # The LM head is carried, not trained.
    np.testing.assert_array_equal(params_1["lm_head"]["bias"], params["lm_head"]["bias"])
    assert losses_1[0] > 0.5


# ------------------------------------------------------------------------------------------
# Ten training steps against sentence-transformers, from the same weights.
# ------------------------------------------------------------------------------------------

STEPS = 10
ROWS = 8
MAX_LENGTH = 24


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Our tiny XLM-R in our vocabulary, with non-trivial weights, and its HF export."""
    import flax.linen as nn
    import gflanguages

    from xlmeta_jax.data import vocabulary
    from xlmeta_jax.interop.hf import weights as hf
    from xlmeta_jax.model import network

    root = tmp_path_factory.mktemp("contrastive")
    languages = gflanguages.LoadLanguages()
    texts = []
    for key in ("en_Latn", "fr_Latn", "de_Latn", "es_Latn", "ru_Cyrl", "tr_Latn"):
        sample = languages[key].sample_text
        texts += [t.strip() for t in (getattr(sample, f.name) for f in sample.DESCRIPTOR.fields)
                  if isinstance(t, str) and t.strip()]
    (root / "text.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    vocab = vocabulary.train_vocabulary({"xx": [str(root / "text.txt")]}, str(root / "spm"),
                                        400, num_lines=2000, num_threads=1,
                                        print_report=False)
    cfg = EncoderConfig(vocab_size=400, hidden_size=HIDDEN, num_layers=2, num_heads=2,
                        mlp_dim=64, max_position_embeddings=MAX_LENGTH + 2, pad_token_id=0,
                        dropout_rate=0.0, attention_dropout_rate=0.0)
    variables = network.masked_lm(cfg).init(jax.random.key(3), np.ones((1, 4), np.int32),
                                            deterministic=True)
    leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, nn.unbox(variables["params"])))
    rng = np.random.default_rng(3)
    params = jax.tree.unflatten(tree, [(x + 0.05 * rng.standard_normal(x.shape)).astype(x.dtype)
                                       for x in leaves])
    folder = hf.save_hf(root / "hf", cfg, params, vocab_path=vocab)
    return cfg, params, vocab, folder, texts


def _st_model(folder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(0)
    return SentenceTransformer(
        modules=[Transformer(str(folder), max_seq_length=MAX_LENGTH), Pooling(HIDDEN, "mean")],
        device="cpu")


def _reference_losses(folder, batches, cached):
    """sentence-transformers' loss, torch's AdamW (no decay on biases and LayerNorms, as
    the Trainer), no warm-up, linear decay, clipping at 1.0."""
    import transformers

    model = _st_model(folder)
    model.train()
    loss_fn = (_st_loss("cached", mini_batch_size=3, model=model) if cached
               else _st_loss("plain", model=model))
    named = list(model.named_parameters())
    no_decay = [p for n, p in named if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in named if not ("bias" in n or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    sched = transformers.get_linear_schedule_with_warmup(opt, 0, STEPS)
    out = []
    for queries, positives in batches:
        features = [model.tokenize(queries), model.tokenize(positives)]
        loss = loss_fn(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    return out


def _our_batch(tokenizer, texts):
    ids = np.zeros((len(texts), MAX_LENGTH), np.int32)
    for r, text in enumerate(texts):
        row = tokenizer.single(tokenizer.encode(text), MAX_LENGTH)
        ids[r, :len(row)] = row
    return ids


@pytest.mark.parametrize("cached", [False, True], ids=["plain", "cached"])
def test_ten_steps_equal_sentence_transformers(exported, cached):
    from xlmeta_jax.evaluation.tokenization import load_tokenizer

    cfg, params, vocab, folder, texts = exported
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        idx = rng.choice(len(texts) - 1, ROWS, replace=False)
        batches.append(([texts[i] for i in idx], [texts[i + 1] for i in idx]))
    reference = _reference_losses(folder, batches, cached)
    tokenizer = load_tokenizer(vocab)
    ours_batches = [{"query": _our_batch(tokenizer, q), "positive": _our_batch(tokenizer, p)}
                    for q, p in batches]
    # Mini-batches of 2 here, 3 in the reference: the losses do not depend on it.
    settings = LossSettings(mini_batch_size=2 if cached else None)
    mesh = partitioning.create_mesh(data=1, devices=jax.devices()[:1])
    ours, _, _ = _train(cfg, params, ours_batches, settings, mesh)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4)
    # Training moved: the losses are not all the first one.
    assert abs(ours[-1] - ours[0]) > 1e-3


def test_gradcache_step_compiles_for_a_mesh_with_the_parameters_shardings():
    """GradCache on data 2 x fsdp 2 x tensor 2, compiled (not run): the updated state keeps
    pretraining's parameter shardings, and the step holds the cache's loops."""
    cfg = _tiny(dropout=0.1)
    mesh = partitioning.create_mesh(data=2, fsdp=2, tensor=2)
    fns = embedding_step.make_embedding_step(cfg, _optimizer(), mesh,
                                             LossSettings(mini_batch_size=4))
    batch = {k: jax.ShapeDtypeStruct((8, 11), jnp.int32, sharding=fns.batch_sharding)
             for k in ("query", "positive", "negative_0")}
    with partitioning.axis_rules_context(), partitioning.mesh_context(mesh):
        compiled = fns.train_step_jit.lower(fns.abstract_state, batch, fns.seed_spec).compile()
    state_out, _ = compiled.output_shardings
    kernels = [(jax.tree_util.keystr(p), s.spec) for p, s in
               jax.tree_util.tree_flatten_with_path(state_out.params)[0]]
    expected = [(jax.tree_util.keystr(p), s.spec) for p, s in
                jax.tree_util.tree_flatten_with_path(fns.state_sharding.params)[0]]
    assert kernels == expected
    assert any("fsdp" in str(spec) for _, spec in kernels)
    assert any("tensor" in str(spec) for _, spec in kernels)
    assert "while" in compiled.as_text()
