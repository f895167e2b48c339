"""Contrastive fine-tuning's data (rows, malformed lines, batches without duplicates) and
gin/demo_embeddings.gin end to end: from the demo's pretrained model, Tatoeba before and
after, exact resume, a rerun with other settings refused, and the sentence-transformers
export with our embeddings."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from xlmeta_jax import errors
from xlmeta_jax.evaluation import pairs

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name,content,message", [
    ("a.jsonl", '{"query": "q", "positive": "p"}\nnot json\n', "a.jsonl:2: not JSON"),
    ("a.jsonl", '{"query": "q"}\n', "a.jsonl:1: no 'positive'"),
    ("a.jsonl", '{"query": "q", "positive": "p", "negatives": 3}\n',
     "a.jsonl:1: 'negatives' must be a list of strings, got int"),
    ("a.jsonl", '{"query": "q", "positive": "p", "neg": []}\n', "a.jsonl:1: unknown keys ['neg']"),
    ("a.jsonl", '{"query": " ", "positive": "p"}\n',
     "a.jsonl:1: 'query' must be a non-empty string, got ' '"),
    ("a.jsonl", '[1, 2]\n', "a.jsonl:1: expected an object with 'query' and 'positive', got list"),
    ("a.jsonl", '\n\n', "a.jsonl holds no rows"),
    ("a.jsonl", b'{"query": "\xff"}', "a.jsonl: not UTF-8"),
    ("a.tsv", 'query\tpositive\nonly one field\n', "a.tsv:2: expected query<TAB>positive"),
    ("a.tsv", 'q\t\n', "a.tsv:1: field 2 must be a non-empty string"),
    ("a.tsv", 'q\tp\tn\nq2\tp2\n', "a.tsv: row 2 has 0 negatives, the first has 1"),
    ("a.csv", 'q,p\n', "a.csv: expected a .jsonl or .tsv file"),
])
def test_a_malformed_file_is_refused_naming_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(pairs.PairsError) as e:
        pairs.read_pairs(path)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("field,value,message", [
    ("steps", 0, "embeddings.steps: must be a whole number >= 1, got 0"),
    ("mini_batch_size", 5, "embeddings.mini_batch_size: 5 does not divide batch_size=64"),
    ("pooling", "max", "embeddings.pooling: must be one of ('mean', 'cls'), got 'max'"),
    ("margin", 1.5, "embeddings.margin: must be in [0, 1), got 1.5"),
    ("scale", 0.0, "embeddings.scale: must be a number > 0, got 0.0"),
    ("dropout_rate", 1.0, "embeddings.dropout_rate: must be in [0, 1) or None, got 1.0"),
    ("evaluate", ["xnli"], "embeddings.evaluate: unknown tasks ['xnli']"),
    ("train_files", [], "embeddings.train_files: no training data"),
])
def test_a_bad_setting_is_refused_where_the_config_is_built(field, value, message):
    from xlmeta_jax.evaluation.embedding_config import EmbeddingConfig

    fields = {"initial_checkpoint_path": "/ckpt", "model_dir": "/out", "steps": 10,
              "train_files": ["/rows.jsonl"], field: value}
    with pytest.raises(errors.SettingError) as e:
        EmbeddingConfig(**fields)
    assert str(e.value).startswith(message), str(e.value)


def test_rows_of_both_formats(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '{"query": "q1", "positive": "p1", "negatives": "n1"}\n\n'
        '{"query": "q2", "positive": "p2", "negatives": ["n2"]}\n', encoding="utf-8")
    (tmp_path / "b.tsv").write_text("query\tpositive\tnegative\nq3\tp3\tn3\n", encoding="utf-8")
    assert pairs.read_pairs(tmp_path / "a.jsonl") == [
        pairs.Pair("q1", "p1", ("n1",)), pairs.Pair("q2", "p2", ("n2",))]
    assert pairs.read_pairs(tmp_path / "b.tsv") == [pairs.Pair("q3", "p3", ("n3",))]


def test_batches_never_repeat_a_text_as_sentence_transformers_samples_them():
    rows = [pairs.Pair(*p) for p in (("a", "b"), ("a", "c"), ("d", "e"), ("f", "b"),
                                     ("g", "h"), ("i", "j"), ("k", "a"))]
    # Checked by hand with NoDuplicatesBatchSampler's rule: row 1 meets 'a' of row 0 and
    # waits; row 3 meets 'b'; the last, incomplete batch ([6]) is dropped.
    assert pairs.no_duplicate_batches(rows, range(7), 2) == [[0, 2], [1, 3], [4, 5]]


def test_batch_order_of_any_step_is_the_uninterrupted_runs(shared_data):
    rows = pairs.bitext_pairs(shared_data / "flores200" / "devtest", ["fra_Latn", "deu_Latn"])
    assert len(rows) == 2 * 1012
    order = pairs.BatchOrder(rows, 64, seed=3)
    run = order.batches(0)
    first = [next(run) for _ in range(80)]  # past the end of the first epoch (31 batches)
    for batch in first:
        texts = [t for i in batch for t in rows[i].texts()]
        assert len(texts) == len(set(texts))
    epoch = [i for b in first[:31] for i in b]
    assert len(epoch) == len(set(epoch))
    for start in (0, 5, 30, 31, 47):
        resumed = pairs.BatchOrder(rows, 64, seed=3).batches(start)
        assert [next(resumed) for _ in range(80 - start)] == first[start:]
    other = pairs.BatchOrder(rows, 64, seed=4).batches(0)
    assert next(other) != first[0]


# ------------------------------------------------------------------------------------------
# gin/demo_embeddings.gin, shortened, from the session's demo run.
# ------------------------------------------------------------------------------------------


def _command(model_dir, demo_model, shared_data, *extra):
    return [
        sys.executable, "-m", "xlmeta_jax.finetune", "--gin_file=gin/demo_embeddings.gin",
        f"--gin.INITIAL_CHECKPOINT_PATH='{demo_model}'", f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.BITEXT_DIR='{shared_data / 'flores200' / 'devtest'}'",
        f"--gin.DATA_DIR='{shared_data}'", "--gin.STEPS=8", "--gin.BATCH_SIZE=8",
        "--gin.MINI_BATCH_SIZE=4",
        "--gin.embeddings.bitext_languages=['fra_Latn', 'deu_Latn']",
        "--gin.embeddings.eval_languages=['fr', 'de']",
        # XQuAD-R's pool of the evaluated languages it has: German alone.
        "--gin.embeddings.evaluate=['tatoeba', 'xquad_r']",
        "--gin.embeddings.max_eval_sentences=50", "--gin.embeddings.checkpoint_every=4",
        "--gin.embeddings.log_every=4", "--gin.embeddings.warmup_steps=1", *extra]


def _run(cmd):
    # One device, as the demo runs on a CPU: the step on a mesh of fake devices is
    # tests/test_contrastive.py's (in one process: XLA's CPU collectives inside GradCache's
    # loops have stalled a command of two fake devices on a loaded 2-core machine).
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               JAX_DISABLE_MOST_OPTIMIZATIONS="true")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def _final_params(model_dir):
    from xlmeta_jax.pretrain import loading

    _, params, _ = loading.load_pretrained(model_dir)
    return params


@pytest.mark.slow
def test_embeddings_demo_trains_scores_resumes_and_exports(demo_run, shared_data, tmp_path):
    demo_model = demo_run["model_dir"]
    model_dir = tmp_path / "embeddings"
    cmd = _command(model_dir, demo_model, shared_data)
    out = _run(cmd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "tatoeba (accuracy): before -> after" in out.stdout
    assert "over 8 steps of" in out.stdout

    results = json.loads((model_dir / "results.json").read_text())
    assert len(results["train"]["losses"]) == 8
    by_lang = results["evaluation"]["tatoeba"]["languages"]
    assert sorted(by_lang) == ["de", "fr"]
    for v in by_lang.values():
        assert v["difference"] == pytest.approx(v["after"] - v["before"])
        assert 0 <= v["before"] <= 100 and 0 <= v["after"] <= 100
    assert results["after"]["tatoeba"]["languages"]["fr"]["num_examples"] == 50
    xquad = results["after"]["xquad_r"]
    assert list(xquad["languages"]) == ["de"] and xquad["pool"]["questions"] == 1190
    assert 0 <= results["evaluation"]["xquad_r"]["languages"]["de"]["after"] <= 100
    assert "sentence breaks" in xquad["differences"]
    # No training row holds a Tatoeba sentence of the evaluated languages.
    tatoeba = set()
    for code in ("fra", "deu"):
        for side in (code, "eng"):
            path = shared_data / "tatoeba" / f"tatoeba.{code}-eng.{side}"
            tatoeba |= {s.strip() for s in path.read_text(encoding="utf-8").splitlines()}
    rows = pairs.bitext_pairs(shared_data / "flores200" / "devtest", ["fra_Latn", "deu_Latn"])
    kept = pairs.without_texts(rows, tatoeba)
    assert results["train"]["data"]["rows"] == len(kept)
    assert results["train"]["data"]["dropped_evaluation_sentences"] == len(rows) - len(kept)
    assert sorted(p.name for p in (model_dir / "embeddings").iterdir()
                  if p.name.isdigit()) == ["4", "8"]

    # Resume: without the final checkpoint the rerun trains steps 5-8 again from step 4,
    # on the same batches and dropout: the same parameters, bit for bit. It reads the rows'
    # ids from their token cache, written by the caching command with the run's flags.
    final = _final_params(model_dir)
    losses = results["train"]["losses"]
    shutil.rmtree(model_dir / "embeddings" / "8")
    (model_dir / "results.json").unlink()
    cache_dir = tmp_path / "seqio_cache"
    out = _run([cmd[0], "-m", "xlmeta_jax.tools.caching", *cmd[3:], f"--cache_dir={cache_dir}"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"cached the contrastive run's rows in {cache_dir}" in out.stdout
    out = _run([*cmd, f"--gin.CACHE_DIR='{cache_dir}'"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resuming from step 4 of 8" in out.stdout + out.stderr
    resumed = _final_params(model_dir)
    import jax

    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    assert json.loads((model_dir / "results.json").read_text())["train"]["losses"] == losses

    # Another batch size on this run: one line, exit 2, nothing touched.
    stamp = (model_dir / "results.json").stat().st_mtime_ns
    out = _run([*cmd, "--gin.BATCH_SIZE=16"])
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    line = out.stderr.strip()
    assert "\n" not in line and "embeddings.batch_size=8, not 16" in line, line
    assert (model_dir / "results.json").stat().st_mtime_ns == stamp

    # A malformed training file: one line naming file and line, no MODEL_DIR left.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "positive": "p"}\n{"query": "q2"}\n', encoding="utf-8")
    out = _run([*_command(tmp_path / "never", demo_model, shared_data),
                f"--gin.TRAIN_FILES=['{bad}']"])
    assert out.returncode == 2
    assert out.stderr.strip().endswith(f"{bad}:2: no 'positive' (keys: ['query'])"), out.stderr
    assert not (tmp_path / "never").exists()

    # The export loads in sentence-transformers with our embeddings.
    _check_export(model_dir, tmp_path / "st")


def _check_export(model_dir, folder):
    st = pytest.importorskip("sentence_transformers")
    from xlmeta_jax.evaluation import embeddings
    from xlmeta_jax.interop.hf import convert

    convert.to_hf(os.fspath(model_dir), os.fspath(folder))
    texts = ["All human beings are born free and equal in dignity and rights.",
             "Tous les êtres humains naissent libres et égaux en dignité et en droits.",
             "Alle Menschen sind frei und gleich an Würde und Rechten geboren.",
             "短い", "  leading and trailing spaces  "]
    ours = embeddings.load(model_dir).encode(texts)
    theirs = st.SentenceTransformer(os.fspath(folder), device="cpu").encode(
        texts, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (5, ours.shape[1])
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-5)
    np.testing.assert_allclose(embeddings.load(folder).encode(texts), ours, rtol=0, atol=1e-5)
