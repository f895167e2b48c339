"""The benchmark command: runs on CPU, reports finite positive figures, compares with HF."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from xlmeta_jax.model import mlm
from xlmeta_jax.model.network import get_config
from xlmeta_jax.pretrain import hardware
from xlmeta_jax.tools import bench


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_bench_tiny_with_hf_comparison(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "bench.json"
    report = bench.main([
        "--gin_file=models/tiny.gin", "--gin.xlmeta_jax.model.network.get_config.dropout_rate=0.0",
        "--gin.xlmeta_jax.model.network.get_config.attention_dropout_rate=0.0", "--batch=4",
        "--length=16", "--num_devices=1", "--steps=2", "--warmup=1", "--hf=on",
        f"--json_out={out}",
    ])
    (r,) = report["results"]
    for key in ("tokens_per_s", "step_time_s", "compile_s", "first_step_s",
                "model_tflops_per_s", "flops_per_token", "peak_memory_bytes"):
        assert _positive(r[key]), (key, r[key])
    assert r["tokens_per_step"] == 4 * 16
    assert r["tokens_per_s"] == pytest.approx(64 / r["step_time_s"])
    assert math.isfinite(r["loss"])
    # CPU has no known peak: MFU is skipped, not invented.
    assert r["mfu"] is None and "unknown" in r["mfu_note"]
    assert "masked slots only" in r["lm_head_counted_at"]
    assert r["dropout_draws_per_step"] == 0  # dropout rates 0
    # The model is the trainer's: models/tiny.gin through network.get_config.
    assert r["model_config"] == dataclasses.asdict(get_config(
        "tiny", pad_token_id=0, dropout_rate=0.0, attention_dropout_rate=0.0,
        attention_impl="auto"))

    h = report["hf"]
    for key in ("tokens_per_s", "step_time_s", "model_tflops_per_s", "peak_memory_bytes"):
        assert _positive(h[key]), (key, h[key])
    assert math.isfinite(h["loss"])
    assert _positive(r["ratio_vs_hf"])
    assert r["ratio_vs_hf"] == pytest.approx(r["tokens_per_s"] / h["tokens_per_s"])

    printed = capsys.readouterr().out
    for text in ("tokens/s", "TFLOP/s", "ours/HF", "HF XLMRobertaForMaskedLM",
                 "LM head counted at masked slots only", "peak FLOP/s source"):
        assert text in printed
    saved = json.loads(out.read_text())
    assert saved["results"][0]["tokens_per_s"] == r["tokens_per_s"]
    assert saved["hf"]["tokens_per_s"] == h["tokens_per_s"]


def test_flops_per_token_hand_checked():
    # tiny: h=64, f=128, V=1024, 2 layers; L=16, P=ceil(0.15*16)+1=4.
    cfg = get_config("tiny")
    per_layer = 2 * (4 * 64 * 64 + 2 * 64 * 128) + 2 * (2 * 16 * 64)  # 69632
    head = 2 * (64 * 64 + 64 * 1024)  # per position where the head runs: 139264
    assert mlm.max_predictions(16, 0.15) == 4
    assert hardware.mlm_flops_per_token(cfg, 16, 4) == 3 * (2 * per_layer + head * 4 / 16)
    assert hardware.mlm_flops_per_token(cfg, 16, 4, masked_head=False) == 3 * (
        2 * per_layer + head
    )


def test_modernbert_flops_count_the_local_window():
    # modernbert_tiny at 256 tokens, window 32: layers 0 and 3 attend to the row, 1 and 2
    # to 33 keys; GeGLU's three matrices (h=64, f=96, V=1024).
    cfg = get_config("modernbert_tiny", local_window=32)
    dense = 2 * (4 * 64 * 64 + 3 * 64 * 96)
    layers = 4 * dense + 2 * 2 * 64 * (256 + 33 + 33 + 256)
    head = 2 * (64 * 64 + 64 * 1024)
    assert hardware.mlm_flops_per_token(cfg, 256, 40) == 3 * (layers + head * 40 / 256)


def test_variants_and_bad_options():
    cfg, base = get_config("tiny"), bench.BenchOptions()
    variants = bench.parse_variants(
        "default;full_head=true,scan_layers=false;remat_policy=dots;dropout_rate=0", cfg, base)
    assert [n for n, _, _ in variants] == [
        "default", "full_head=true,scan_layers=false", "remat_policy=dots", "dropout_rate=0"]
    assert variants[0][1:] == (cfg, base)
    assert variants[1][2].full_head and not variants[1][1].scan_layers
    assert variants[2][1].remat_policy == "dots"
    assert variants[3][1].dropout_rate == 0.0
    with pytest.raises(ValueError, match="unknown option 'heads'"):
        bench.parse_variants("heads=2", cfg, base)
    with pytest.raises(ValueError, match="not a boolean"):
        bench.parse_variants("scan_layers=maybe", cfg, base)
    with pytest.raises(ValueError, match="unknown remat_policy"):
        bench.parse_variants("remat_policy=sometimes", cfg, base)
    with pytest.raises(ValueError, match="--length=4096 exceeds"):
        bench.run_ours(cfg, bench.BenchOptions(length=4096))
    with pytest.raises(ValueError, match="not divisible by data x fsdp"):
        bench.run_ours(cfg, bench.BenchOptions(batch=3, length=16, data=2, num_devices=2))
    with pytest.raises(ValueError, match="no model size; give a model file"):
        bench.main(["--batch=4"])


def test_bench_and_network_import_without_tensorflow_seqio_torch_gin():
    # Accelerator hosts may have none of these; the bench and profiler must still run.
    code = (
        "import sys, xlmeta_jax.tools.bench, xlmeta_jax.hf, xlmeta_jax.pretrain.step\n"
        "bad = [m for m in ('tensorflow', 'seqio', 'torch', 'transformers', 'gin')\n"
        "       if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_dropout_draws_hand_checked():
    # tiny: h=64, 2 layers, 8 heads; L=16. Hidden: 64 * (1 + 2*2) = 320 per token;
    # attention probabilities: 2 layers * 8 heads * 16 keys = 256 per token.
    cfg = get_config("tiny")
    assert hardware.dropout_mask_elements_per_token(cfg, 16) == 320 + 256
    assert hardware.dropout_mask_elements_per_token(cfg, 16, attention_dropout=False) == 320
    off = get_config("tiny", dropout_rate=0.0, attention_dropout_rate=0.0)
    assert hardware.dropout_mask_elements_per_token(off, 16) == 0
