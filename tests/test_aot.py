"""The ahead-of-time TPU compile tool (xlmeta_jax/tools/aot.py): slice names, the fit
search's order, user errors, and one real compile of the tiny run for a v4-8 (libtpu)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from xlmeta_jax import errors
from xlmeta_jax.model import mlm, network
from xlmeta_jax.pretrain import hardware
from xlmeta_jax.tools import aot, aot_compile

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
# .ci/run's second pass installs the aot extra and sets XLMETA_EXPECT_EXTRAS: there a missing
# libtpu fails the test instead.
_skip_without_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU and not os.environ.get("XLMETA_EXPECT_EXTRAS"),
    reason="libtpu is not installed (pip install -e '.[aot]'): no TPU compiler")


def needs_libtpu(test):
    """Skipped without the aot extra; .ci/run runs it again with libtpu (``-m extras``)."""
    return pytest.mark.extras(_skip_without_libtpu(test))


@pytest.fixture(autouse=True, scope="module")
def optimised_compiles():
    """XLA's optimisation passes on (conftest turns them off for the session): the figures
    checked here (memory, fit, FLOPs) are those of the optimised compile the tool makes."""
    import jax

    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


@pytest.mark.parametrize("name, topology, devices, config", [
    ("v2-8", "v2:2x2", 8, "default"),
    ("v4-8", "v4:2x2x1", 4, "megacore"),
    ("v4-32", "v4:2x2x4", 16, "megacore"),
    ("v4-256", "v4:4x4x8", 128, "megacore"),
    ("v5p-128", "v5p:4x4x4", 64, "megacore"),
    ("v5e-16", "v5e:4x4", 16, "default"),
    ("v5e-256", "v5e:16x16", 256, "default"),
    ("v6e-256", "v6e:16x16", 256, "default"),
])
def test_slice_names_map_to_libtpu_topologies(name, topology, devices, config):
    s = hardware.tpu_slice(name)
    assert (s.topology_name, s.num_devices, s.chip_config_name) == (topology, devices, config)


def test_remat_order_covers_the_networks_policies():
    assert set(aot_compile.REMAT_BY_COST) == {"none", *network.REMAT_POLICIES}
    assert aot_compile.REMAT_BY_COST[0] == "none" and aot_compile.REMAT_BY_COST[-1] == "full"


def test_search_tries_remat_first_then_bigger_changes():
    base = aot_compile.Variant("none", 1, (-1, 1, 1))
    tried = aot.candidates(base, batch_size=256, num_devices=4)
    assert [v.remat_policy for v in tried[:4]] == ["dots", "dots_no_batch", "save_named", "full"]
    assert all(v.mesh_shape == (-1, 1, 1) for v in tried[:4])
    later = tried[4:]
    micro = [v.microbatches for v in later if v.microbatches > 1 and v.remat_policy == "none"
             and v.mesh_shape == (-1, 1, 1)]
    # 256 sequences over 4 devices: 64 per device, so 2 ... 64 microbatches.
    assert micro == [2, 4, 8, 16, 32, 64]
    # Last resort: the state sharded over the slice, with microbatches.
    assert later[-1] == aot_compile.Variant("none", 64, (-1, 4, 1))
    assert (-1, 4, 1) in [v.mesh_shape for v in later]
    assert aot.change_flags(base, aot_compile.Variant("full", 1, (-1, 1, 1))) == [
        "--gin.xlmeta_jax.model.network.get_config.remat_policy=\"'full'\""]


def test_search_skips_microbatch_counts_xla_already_rules_out():
    base = aot_compile.Variant("none", 1, (-1, 1, 1))
    refused = aot_compile.Compiled(base, False, 0.0, needed_bytes=100 * 2**30,
                                   available_bytes=10 * 2**30)
    micro = [v.microbatches for v in aot.candidates(base, 256, 4, refused)
             if v.remat_policy == "none" and v.microbatches > 1 and v.mesh_shape == (-1, 1, 1)]
    # Temporaries shrink at most in proportion to the microbatch: 10x too much needs >= 10.
    assert micro == [16, 32, 64]


def test_a_program_xla_accepts_must_also_fit_with_its_arguments():
    # XLA:TPU checks temporaries alone; the state and batch share the same HBM.
    c = aot_compile.Compiled(aot_compile.Variant("dots", 1, (-1, 1, 1)), True, 0.0,
                             argument_bytes=3 * 2**30, temp_bytes=28 * 2**30)
    aot.check_footprint(c, 30.75 * 2**30)
    assert not c.fits and c.needed_bytes == 31 * 2**30
    ok = aot_compile.Compiled(c.variant, True, 0.0, argument_bytes=3 * 2**30,
                              temp_bytes=20 * 2**30)
    aot.check_footprint(ok, 30.75 * 2**30)
    assert ok.fits


@pytest.mark.parametrize("argv, names", [
    (["--topology=v9-8", "--gin_file=gin/demo.gin"], "'v9-8'"),
    (["--topology=v4-12", "--gin_file=gin/demo.gin"], "'v4-12'"),
    (["--topology=v4-8"], "--gin_file"),
    (["--topology=v4-8", "--gin_file=gin/demo.gin", "--gin.BATCH_SIZ=8"], "BATCH_SIZ"),
])
def test_user_errors_are_one_line_exit_2(argv, names, capsys):
    status = errors.run_command(aot.main, argv, prog=aot.PROG)
    err = capsys.readouterr().err.strip()
    assert status == errors.EXIT_USER_ERROR
    assert len(err.splitlines()) == 1 and names in err, err


def test_help_names_the_slices_and_gin_files(capsys):
    assert errors.run_command(aot.main, ["--help"], prog=aot.PROG) == 0
    out = capsys.readouterr().out
    for part in ("--topology=SLICE", "v2-8", "--gin_file", "native/meta.gin", "example:"):
        assert part in out, part


@needs_libtpu
def test_batch_not_divisible_by_the_slice_is_one_line(capsys):
    # gin/demo.gin's batch of 16 over v4-256's 128 chips: refused before anything compiles.
    status = errors.run_command(aot.main, ["--topology=v4-256", "--gin_file=gin/demo.gin"],
                                prog=aot.PROG)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == errors.EXIT_USER_ERROR
    assert "batch_size=16" in err[-1] and "128" in err[-1]


@pytest.mark.parametrize("gin_file, groups", [
    # Each annealed stage masks at its own rate (30%, 15%, 5% of 512): three programs.
    ("gin/native/annealed.gin", [(["stage1"], 0.3, 155), (["stage2"], 0.15, 78),
                                 (["stage3"], 0.05, 27)]),
    # meta's two phases share batch, length and the run's 15%: one program.
    ("gin/native/meta.gin", [(["phase1", "phase2"], 0.15, 78)]),
    # mmBERT's recipe: the ramp's three batches, base, ext at 8192 tokens (RoPE 160k) and
    # the three decay branches (one program): each stage at its own shape.
    ("gin/native/mmbert.gin", [(["ramp1"], 0.3, 309), (["ramp2"], 0.3, 309),
                               (["ramp3"], 0.3, 309), (["base"], 0.3, 309),
                               (["ext"], 0.15, 1230),
                               (["decay_eng", "decay_cont", "decay_all"], 0.05, 411)]),
    # The English stage in front shares base's shape.
    ("gin/native/meta_mmbert.gin", [(["english", "base"], 0.3, 309), (["ramp1"], 0.3, 309),
                                    (["ramp2"], 0.3, 309), (["ramp3"], 0.3, 309),
                                    (["ext"], 0.15, 1230),
                                    (["decay_eng", "decay_cont", "decay_all"], 0.05, 411)]),
])
def test_each_stage_compiles_with_its_own_masking(gin_file, groups):
    from xlmeta_jax.cli import flags as gin_cli

    gin_cli.apply_gin([gin_file], ["MODEL_DIR='/unused'", "VOCAB_PATH='/unused'",
                                   "CC100_DIR='/unused'"], finalize=False)
    run = aot.configured_run()
    got = [([p.name for p in phases], phases[0].mask_rate, slots)
           for (_, _, slots, _), phases in aot.shape_groups(run.phases).items()]
    assert got == groups
    assert all(slots == mlm.max_predictions(length, phases[0].mask_rate)
               for (_, length, slots, _), phases in aot.shape_groups(run.phases).items())
    if "mmbert" in gin_file:
        # Each program compiles its stages' encoder: RoPE base 10k at 1024, 160k at 8192.
        assert {(length, model.global_rope_theta, model.local_rope_theta)
                for (_, length, _, model) in aot.shape_groups(run.phases)} == {
            (1024, 10000.0, 10000.0), (8192, 160000.0, 160000.0)}


@pytest.fixture(scope="module")
def tiny_on_v4_8():
    """gin/demo.gin (tiny encoder, 16 x 64, unrolled layers) compiled for a v4-8."""
    from xlmeta_jax.cli import flags as gin_cli

    gin_cli.apply_gin(["gin/demo.gin"], [], finalize=False)
    run = aot.configured_run()
    tpu = hardware.tpu_slice("v4-8")
    results = aot.run_aot(run, tpu, say=lambda _: None)
    devices = aot_compile.topology_devices(tpu)
    return run, tpu, results, devices


@needs_libtpu
def test_tiny_run_compiles_once_and_fits(tiny_on_v4_8):
    run, tpu, results, devices = tiny_on_v4_8
    # Both phases share their shapes: one compile.
    assert len(results) == 1 and [p.name for p in results[0].phases] == ["phase1", "phase2"]
    c = results[0].base
    assert c.fits and results[0].fitted is c
    phase = run.phases[0]
    slots = phase.slots
    state = aot_compile.state_bytes_per_device(run.model, phase.optimizer, devices,
                                               run.mesh_shape)
    batch = phase.batch_size // tpu.num_devices * (phase.sequence_length + 3 * slots) * 4
    # Arguments are this device's shard of the state plus its rows of the batch; TPU tiles
    # pad minor dimensions (64-wide tiny arrays to 128 lanes), hence at most twice that.
    assert state + batch <= c.argument_bytes <= 2 * (state + batch)
    # The donated state comes back in place: every state output aliases its input.
    assert c.alias_bytes >= state
    assert c.total_bytes == (c.argument_bytes + c.output_bytes - c.alias_bytes + c.temp_bytes
                             + c.code_bytes)
    assert c.total_bytes < tpu.chip.device_hbm_bytes


@needs_libtpu
def test_tiny_run_flops_match_the_analytic_count(tiny_on_v4_8):
    """XLA's FLOPs per device against tools/flops.py's matmul count.

    The tiny run's layers are unrolled, so XLA counts every matmul (no scan undercount)
    and can never be below the matmul-only analytic count: a count of the scan body
    only, a missing backward pass or a figure per slice instead of per device would
    leave [1.0, 2.5]. XLA also counts element-wise work (softmax, LayerNorm, GELU, the
    dropout PRNG, AdamW), which at width 64 is comparable to the matmuls: measured
    2.15 with jax/libtpu 0.10.2 (1.10 for the 256-wide small encoder, 1.04 without
    dropout). 2.5 leaves ~15% for another XLA's accounting of fused element-wise ops,
    far below the 4x of a per-slice figure.
    """
    run, tpu, results, _ = tiny_on_v4_8
    c = results[0].base
    phase = run.phases[0]
    slots = phase.slots
    analytic = hardware.mlm_flops_per_token(run.model, phase.sequence_length, slots) * (
        phase.batch_size * phase.sequence_length / tpu.num_devices)
    assert 1.0 <= c.xla_flops / analytic <= 2.5
    est = aot.estimate(run, phase, c, tpu)
    assert est.model_flops == pytest.approx(analytic)
    assert 0 < est.mfu <= 1.0
    text = aot.report(run, tpu, results)
    assert "fits" in text and "XLA's cost analysis" in text and "run: phase1 120" in text


@needs_libtpu
def test_packed_modernbert_compiles_with_the_splash_kernel():
    """A packed ModernBERT run (128-token rows, global and local layers, scanned) for a
    v4-8: 'auto' is splash on a TPU, and the compiled step holds its Mosaic kernels."""
    from xlmeta_jax.model import optimizer, partitioning
    from xlmeta_jax.pretrain import step

    model = network.get_config("modernbert_tiny", local_window=32, scan_layers=True,
                               pad_token_id=0, attention_impl="auto")
    assert network.resolve_attention_impl(model.attention_impl, model.dtype, "tpu", 128) == (
        "splash")
    devices = aot_compile.topology_devices(hardware.tpu_slice("v4-8"))
    mesh = partitioning.create_mesh(-1, 1, 1, devices=devices)
    fns = step.make_step_functions(model.replace(attention_impl="splash"),
                                   optimizer.OptimizerConfig(total_steps=10, warmup_steps=1), mesh,
                                   packed=True)
    batch = aot_compile.abstract_batch(8, 128, 20, fns.batch_sharding, packed=True)
    lowered = fns.train_step_jit.lower(fns.abstract_state, batch, fns.seed_spec)
    assert "tpu_custom_call" in lowered.as_text()
    assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


@needs_libtpu
def test_a_run_of_stages_of_other_shapes_adds_each_stages_steps_at_its_own_step_time(
        tiny_on_v4_8, monkeypatch):
    """Days: each program's steps at its own step time (mmBERT's ext steps are ~13x base's),
    not every step at the longest."""
    run, tpu, results, _ = tiny_on_v4_8
    short = dataclasses.replace(run.phases[0], name="base", num_steps=86400)
    long = dataclasses.replace(run.phases[0], name="ext", num_steps=8640, sequence_length=128)
    staged = dataclasses.replace(run, phases=[short, long], total_steps=86400 + 8640,
                                 steps_note="base 86,400 + ext 8,640 steps")
    groups = [aot.PhaseResult([short], results[0].base, results[0].base, []),
              aot.PhaseResult([long], results[0].base, results[0].base, [])]
    real = aot.estimate
    seconds = {"base": 1.0, "ext": 10.0}
    monkeypatch.setattr(aot, "estimate", lambda run, p, c, tpu: dataclasses.replace(
        real(run, p, c, tpu), step_seconds=seconds[p.name]))
    text = aot.report(staged, tpu, groups)
    # 86,400 s + 86,400 s = 2 days (every step at 10 s would say 11).
    assert "run: base 86,400 + ext 8,640 steps ~ 2.0 days" in text
    assert text.rstrip().endswith("| 10000 ms | 2.0 |")


def test_embeddings_search_halves_the_gradcache_rows_per_device():
    from xlmeta_jax.tools import aot_embeddings

    shape = aot_embeddings.EmbeddingShape(
        model=network.get_config("tiny"), batch_size=64, mini_batch_size=None,
        query_length=16, document_length=32, negatives=0, mesh_shape=(-1, 1, 1),
        pooling="mean")
    # 4 shards: 16 rows a device without the cache, then 8, 4, 2, 1 a device.
    assert aot_embeddings._mini_batches(shape, 4) == [None, 32, 16, 8, 4]


@needs_libtpu
def test_embeddings_run_compiles_and_the_search_finds_a_mini_batch(capsys):
    """gin/finetune/embeddings.gin with the tiny model for a v4-8: the contrastive step
    compiles (GradCache's mini-batch as bound), and the table says it fits."""
    status = errors.run_command(aot.main, [
        "--topology=v4-8", "--gin_file=gin/finetune/embeddings.gin",
        "--gin_file=gin/models/tiny.gin", "--gin.BATCH_SIZE=64", "--gin.MINI_BATCH_SIZE=16",
        "--gin.embeddings.query_length=32", "--gin.embeddings.document_length=64",
        "--gin.TRAIN_FILES=[]"], prog=aot.PROG)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "v4-8 (4 devices" in out and "64 pairs of 32 + 64 tokens" in out
    assert "mini-batch 16: fits" in out
