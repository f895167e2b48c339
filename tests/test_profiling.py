"""Profile attribution: name stacks map to model parts; a profiled tiny step is explained."""

import os

import pytest

from xlmeta_jax.tools import bench, profiling

# Real op_name metadata from the compiled train step (scanned layers, dropout on).
_STEP = "jit(train_step_fn)/"
_FWD = _STEP + "jvp(XLMRForMaskedLM)/encoder/while/body/closed_call/layers/"
_BWD = _STEP + "transpose(jvp(XLMRForMaskedLM))/encoder/while/body/closed_call/layers/"


@pytest.mark.parametrize("op_name, component, pass_", [
    (_FWD + "attention/query/dot_general", "attention: q/k/v/out projections", "forward"),
    (_BWD + "attention/out/dot_general", "attention: q/k/v/out projections", "backward"),
    (_FWD + "attention/bqhd,bkhd->bhqk/dot_general", "attention: scores, softmax, dropout",
     "forward"),
    (_FWD + "attention/Dropout_0/jit(_bernoulli)/jit(_uniform)/iota_2x32_shape",
     "dropout masks (PRNG)", "forward"),
    (_FWD + "Dropout_1/jit(_bernoulli)/jit(_uniform)/rng_bit_generator",
     "dropout masks (PRNG)", "forward"),
    # Masks of fewer bits (jax.random.bits, no scope of its own): threefry's rounds.
    (_FWD + "Dropout_0/while/body/closed_call/shift_right_logical", "dropout masks (PRNG)",
     "forward"),
    (_FWD + "Dropout_0/iota_2x32_shape", "dropout masks (PRNG)", "forward"),
    (_FWD + "attention/Dropout_0/select_n", "attention: scores, softmax, dropout", "forward"),
    (_FWD + "Dropout_1/select_n", "layer: residual, LayerNorm, dropout", "forward"),
    (_BWD + "wi/dot_general", "MLP: wi, GELU, wo", "backward"),
    (_STEP + "jvp(XLMRForMaskedLM)/encoder/layers_3/wo/dot_general", "MLP: wi, GELU, wo",
     "forward"),
    (_FWD + "output_layer_norm/reduce_sum", "layer: residual, LayerNorm, dropout", "forward"),
    (_STEP + "transpose(jvp(XLMRForMaskedLM))/lm_head/encoder.attend/embeddings.attend/"
     "...e,ve->...v/dot_general", "LM head: gather, dense, vocabulary projection", "backward"),
    (_STEP + "jvp(XLMRForMaskedLM)/jit(take_along_axis)/gather",
     "LM head: gather, dense, vocabulary projection", "forward"),
    (_STEP + "transpose(jvp(XLMRForMaskedLM))/encoder/embeddings/jit(_take)/scatter-add",
     "embeddings: look-up, LayerNorm", "backward"),
    (_STEP + "transpose(jvp(XLMRForMaskedLM))/encoder/while", "encoder: layer loop, other",
     "backward"),
    (_STEP + "jvp()/exp", "loss: log-softmax, cross-entropy", "forward"),
    (_STEP + "sqrt", "optimizer: AdamW, clipping, norms", "-"),
    ("", profiling.OTHER, "-"),
])
def test_components_of_real_name_stacks(op_name, component, pass_):
    assert profiling.component_of(op_name) == component
    assert profiling.pass_of(op_name) == pass_


def test_exclusive_times_subtract_nested_ops():
    # A while loop (0-100 ns) running two body ops, then an op after it.
    events = [(0, 100, "while"), (10, 30, "dot"), (50, 20, "add"), (60, 5, "inner"),
              (120, 10, "dot")]
    assert profiling._exclusive_times(events) == {
        "while": 50, "dot": 40, "add": 15, "inner": 5,
    }


def test_hlo_op_names_reads_metadata():
    text = (
        'ENTRY %main {\n'
        '  %dot.1 = f32[2,2]{1,0} dot(%a, %b), metadata={op_name="jit(f)/dot_general" '
        'source_file="x.py"}\n'
        '  ROOT %fusion.2 = f32[2]{0} fusion(%dot.1), kind=kLoop, calls=%c, '
        'metadata={op_name="jit(f)/jvp(M)/reduce_sum"}\n'
        '  %copy.3 = f32[2]{0} copy(%x)\n}\n'
    )
    assert profiling.hlo_op_names(text) == {
        "dot.1": "jit(f)/dot_general", "fusion.2": "jit(f)/jvp(M)/reduce_sum",
    }


@pytest.mark.slow
def test_bench_profile_explains_the_tiny_step(tmp_path, capsys):
    report = bench.main([
        "--gin_file=models/tiny.gin", "--batch=4", "--length=16", "--num_devices=1",
        "--steps=1", "--warmup=1", "--hf=off", f"--profile_dir={tmp_path}",
        "--profile_steps=2", "--variants=dropout;dropout_rate=0,attention_dropout_rate=0",
    ])
    with_dropout, without = (r["profile"] for r in report["results"])
    # tiny at 4 x 16 tokens: (64 * (1 + 2*2) + 2*8*16) mask elements per token, one
    # 32-bit draw each (XLM-R's exact masks, as the model files configure them).
    assert [r["dropout_draws_per_step"] for r in report["results"]] == [576 * 64, 0]
    for prof in (with_dropout, without):
        rows = {name: (fwd, bwd, rest, total) for name, fwd, bwd, rest, total in prof["rows"]}
        # Every part of the model that does work shows up, forward and backward.
        for part in ("attention: q/k/v/out projections", "attention: scores, softmax, dropout",
                     "MLP: wi, GELU, wo", "LM head: gather, dense, vocabulary projection"):
            fwd, bwd, _, _ = rows[part]
            assert fwd > 0 and bwd > 0, (part, rows[part])
        assert rows["optimizer: AdamW, clipping, norms"][2] > 0
        assert prof["total_ms"] == pytest.approx(sum(r[3] for r in rows.values()))
        # Op time is time of one step, not of all profiled steps: it cannot exceed the
        # step's wall clock beyond what overlapping CPU threads add. No lower bound: on a
        # shared machine the wall clock also holds the time the process waited for a core
        # (the per-step division itself is pinned by test_breakdown_per_step_and_kernel_names).
        assert 0 < prof["total_ms"] < 3 * prof["wall_ms"]
        # Most time is attributed to a named part of the model.
        assert rows.get(profiling.OTHER, (0, 0, 0, 0))[3] < 0.5 * prof["total_ms"]
        assert any(f.endswith(".xplane.pb") for f in os.listdir(prof["trace_dir"]))
    # Dropout masks cost time only when dropout is on.
    assert dict((r[0], r[4]) for r in with_dropout["rows"])["dropout masks (PRNG)"] > 0
    assert "dropout masks (PRNG)" not in [r[0] for r in without["rows"]]
    printed = capsys.readouterr().out
    assert "fwd ms" in printed and "top ops:" in printed


def test_breakdown_per_step_and_kernel_names():
    names = {
        "fusion.3": "jit(f)/jvp(XLMRForMaskedLM)/encoder/layers_0/wi/dot_general",
        "dot.1": "jit(f)/transpose(jvp(XLMRForMaskedLM))/encoder/layers_0/wo/dot_general",
        "add.2": "jit(f)/add",
    }
    # Times summed over 2 steps; "loop_fusion_3"-style kernel names (GPU) resolve to
    # their instruction; unknown kernels count as other.
    op_ns = {"fusion_3": 4_000_000, "dot.1": 6_000_000, "add.2": 2_000_000,
             "cutlass_kernel": 1_000_000}
    rows, total, top = profiling.breakdown(op_ns, names, steps=2)
    by = {r[0]: r[1:] for r in rows}
    assert by["MLP: wi, GELU, wo"] == (2.0, 3.0, 0.0, 5.0)
    assert by["optimizer: AdamW, clipping, norms"] == (0.0, 0.0, 1.0, 1.0)
    assert by[profiling.OTHER] == (0.0, 0.0, 0.5, 0.5)
    assert total == 6.5
    assert rows[0][0] == "MLP: wi, GELU, wo"  # largest first
    assert [t[1] for t in top] == ["dot.1", "fusion_3", "add.2", "cutlass_kernel"]
