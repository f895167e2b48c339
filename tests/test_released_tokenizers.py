"""A released model's tokenizer, in its own ids: reading, parity with transformers, masking,
packing, and the refusals of another tokenizer (xlmeta_jax/data/hf_tokenizer.py,
seqio_vocabularies.py, special_ids.py, evaluation/tokenization.py, pretrain/checks.py).

Every folder is made here (tests/hf_toy.py): mmBERT's Gemma layout, ModernBERT's and XLM-R's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hf_toy import LAYOUTS, tokenizer_folder

from xlmeta_jax import errors
from xlmeta_jax.data import hf_tokenizer, special_ids, vocabulary
from xlmeta_jax.evaluation import tokenization

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# FLORES-200 devtest in 20 languages and scripts: sentences 0-19 are tested, 20-219 train.
FLORES = ("eng_Latn", "fra_Latn", "deu_Latn", "spa_Latn", "rus_Cyrl", "zho_Hans", "jpn_Jpan",
          "kor_Hang", "arb_Arab", "urd_Arab", "hin_Deva", "ben_Beng", "tam_Taml", "tha_Thai",
          "ell_Grek", "heb_Hebr", "amh_Ethi", "swh_Latn", "tur_Latn", "vie_Latn")


@pytest.fixture(scope="module")
def flores(shared_data):
    lines = {lang: (shared_data / "flores200" / "devtest" / f"{lang}.devtest").read_text(
        encoding="utf-8").splitlines() for lang in FLORES}
    return ([s for lang in FLORES for s in lines[lang][:20]],
            [s for lang in FLORES for s in lines[lang][20:220]])


@pytest.fixture(scope="module")
def latin(shared_data):
    """FLORES lines of seven Latin-script languages: a 500-id tokenizer's text."""
    return [s for lang in FLORES if lang.endswith("_Latn")
            for s in (shared_data / "flores200" / "devtest" / f"{lang}.devtest").read_text(
                encoding="utf-8").splitlines()[20:220]]


@pytest.fixture(scope="module")
def folders(flores, tmp_path_factory):
    """One tokenizer folder per layout, trained on the same FLORES lines (4000 ids)."""
    _, train = flores
    root = tmp_path_factory.mktemp("tokenizers")
    spm = vocabulary.train_sentencepiece(root / "ours", 4000, sentences=train)
    return {layout: tokenizer_folder(root / layout, layout, train, spm_path=spm,
                                     vocab_size=4000)
            for layout in LAYOUTS} | {"ours": spm}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ids_equal_transformers_on_flores_in_20_languages(layout, folders, flores):
    """Our vocabulary (tf.data and Python) and fine-tuning tokenizer give transformers'
    AutoTokenizer's ids, its special ids, its wrapping of a sequence and of a pair."""
    import tensorflow as tf
    import transformers

    texts, _ = flores
    ref = transformers.AutoTokenizer.from_pretrained(folders[layout])
    vocab = vocabulary.load_vocabulary(folders[layout])
    tok = tokenization.load_tokenizer(folders[layout])
    want = [ref(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert vocab.encode_batch(texts) == want
    assert [vocab.encode(t) for t in texts[:40]] == want[:40]
    assert vocab.encode_tf(tf.constant(texts)).to_list() == want
    assert tok.encode_batch(texts) == want
    specials = vocab.specials
    assert (specials.pad, specials.cls, specials.sep, specials.mask, specials.unk) == (
        ref.pad_token_id, ref.cls_token_id, ref.sep_token_id, ref.mask_token_id,
        ref.unk_token_id)
    assert (vocab.pad_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (
        ref.pad_token_id, ref.cls_token_id, ref.sep_token_id, ref.mask_token_id)
    assert specials.size == len(ref)
    for a, b in zip(texts[:20], texts[20:40]):
        assert tok.single(tok.encode(a), 512) == ref(a)["input_ids"]
        assert tok.pair(tok.encode(a), tok.encode(b), 512) == ref(a, b)["input_ids"]
    if layout == "gemma":  # not seqio's layout: <bos> and <unk> swap places
        assert (specials.pad, specials.sep, specials.cls, specials.unk, specials.mask) == (
            0, 1, 2, 3, 4)


def test_our_vocabulary_keeps_seqios_ids(folders):
    vocab = vocabulary.load_vocabulary(folders["ours"])
    assert vocab.specials == special_ids.seqio_layout(4000)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.cls_id, vocab.mask_id) == (
        0, 1, 2, 3, 4)
    assert vocab.record()["special_ids"] == {"pad": 0, "cls": 3, "sep": 1, "mask": 4, "unk": 2}
    # The fine-tuning tokenizer of the same file records the same tokenizer.
    tok = tokenization.load_tokenizer(folders["ours"], "seqio")
    assert hf_tokenizer.same_tokenizer(tok.record(), vocab.record())
    other = vocabulary.load_vocabulary(folders["gemma"])
    assert not hf_tokenizer.same_tokenizer(other.record(), vocab.record())


@pytest.mark.parametrize("layout", ["gemma", "modernbert"])
def test_masking_never_selects_or_draws_a_reserved_id(layout, folders):
    """Over 400 rows holding every id, reserved ones included: no reserved id is selected
    or drawn as a replacement, the tokenizer's mask id is the mask, and replacements cover
    the other ids uniformly."""
    import tensorflow as tf

    from xlmeta_jax.data import preprocessors

    specials = vocabulary.load_vocabulary(folders[layout]).specials
    rng = np.random.default_rng(0)
    reserved = np.array(specials.never_masked)
    selected, drawn = [], []
    for seed in range(400):
        targets = rng.integers(0, specials.size, 128).astype(np.int32)
        targets[:len(reserved)] = reserved  # every reserved id in every row
        out = preprocessors.mask_block(tf.constant(targets), tf.constant([seed, 7]),
                                       specials=specials)
        inputs, weights = out["inputs"].numpy(), out["weights"].numpy()
        selected.append(targets[weights > 0])
        changed = (weights > 0) & (inputs != targets) & (inputs != specials.mask)
        drawn.append(inputs[changed])
        assert np.all(inputs[weights == 0] == targets[weights == 0])
    selected, drawn = np.concatenate(selected), np.concatenate(drawn)
    assert not np.isin(selected, reserved).any() and not np.isin(drawn, reserved).any()
    assert specials.mask not in drawn and len(drawn) > 500
    # Uniform over the non-reserved ids: their mean and spread are the uniform's.
    allowed = specials.replacement_ids()
    assert abs(drawn.mean() - allowed.mean()) < 4 * allowed.std() / np.sqrt(len(drawn))


@pytest.mark.parametrize("layout", ["gemma", "modernbert"])
def test_packed_rows_are_wrapped_and_padded_in_the_tokenizers_ids(layout, folders, flores):
    import seqio
    import tensorflow as tf

    from xlmeta_jax.data import preprocessors

    vocab = vocabulary.load_vocabulary(folders[layout])
    features = {"targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32)}
    texts, _ = flores
    ds = tf.data.Dataset.from_tensor_slices(
        {"text": texts[:60], "ends_document": [True] * 60})
    tokens = preprocessors.tokenize_documents(ds, features, eos_after="document")
    rows = list(preprocessors.pack_documents(tokens, {"inputs": 96, "targets": 96},
                                             features).as_numpy_iterator())
    s = vocab.specials
    docs = [vocab.encode(t) for t in texts[:60]]
    pieces = [p for d in docs for p in [d[i:i + 95] for i in range(0, len(d) + 1, 95)]]
    seen = []
    for row in rows:
        for seg in range(1, row["segment_ids"].max() + 1):
            part = row["targets"][row["segment_ids"] == seg].tolist()
            assert part[0] == s.cls
            seen.append(part[1:])
        assert np.all(row["targets"][row["segment_ids"] == 0] == s.pad)
    # Each document is its ids and the tokenizer's sep, cut into pieces of 95.
    joined = [x for p in seen for x in p]
    assert joined == [x for d in docs for x in [*d, s.sep]]
    assert len(seen) >= len(pieces) - 1


def _bad(folder, **edits):
    """A copy of the gemma folder with files replaced (None: removed)."""
    for name, content in edits.items():
        path = folder / name.replace("__", ".")
        if content is None:
            path.unlink()
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


@pytest.mark.parametrize("case, edit, message", [
    ("unparsable", {"tokenizer__json": "{ not json"},
     "tokenizer.json is not a tokenizers tokenizer.json ("),
    ("no mask", {"tokenizer_config__json": {"pad_token": "<pad>", "bos_token": "<bos>",
                                             "eos_token": "<eos>"},
                 "special_tokens_map__json": None},
     "tokenizer_config.json names no mask_token: masked-LM training and fill-mask need one"),
    ("slow only", {"tokenizer__json": None, "sentencepiece__bpe__model": "x"},
     "holds a slow tokenizer only (sentencepiece.bpe.model), no tokenizer.json"),
    ("config disagrees", {"config__json": {"model_type": "modernbert", "pad_token_id": 3}},
     "config.json has pad_token_id=3, but the tokenizer files give pad id 0"),
    ("unknown token", {"tokenizer_config__json": {"mask_token": "[MASK]"}},
     "names mask_token '[MASK]', which"),
])
def test_bad_tokenizer_folders_are_one_line(case, edit, message, folders, tmp_path):
    folder = shutil.copytree(folders["gemma"], tmp_path / "folder")
    _bad(folder, **edit)
    with pytest.raises(hf_tokenizer.TokenizerError) as e:
        vocabulary.load_vocabulary(folder)
    assert message in str(e.value) and "\n" not in str(e.value), (case, str(e.value))
    assert isinstance(e.value, errors.UserError)


def test_tokenizer_larger_than_the_model_is_refused_a_smaller_one_is_padding(released, caplog):
    from xlmeta_jax.model import network
    from xlmeta_jax.pretrain import checks

    cfg = network.get_config("modernbert_tiny", vocab_size=1024, pad_token_id=0)
    with caplog.at_level("INFO", logger="xlmeta_jax.train"):
        record = checks.check_vocabulary(os.fspath(released), cfg)
    assert record == hf_tokenizer.read(released).record()
    assert "has 1000 ids, the embedding 1024 rows: rows 1000 to 1023 are padding" in caplog.text
    small = network.get_config("modernbert_tiny", vocab_size=512, pad_token_id=0)
    with pytest.raises(checks.ConfigError, match=r"vocab_size=512 does not cover the 1000 ids "
                       f"of VOCAB_PATH {released}"):
        checks.check_vocabulary(os.fspath(released), small)


# ----------------------------------------------------------------- continued pretraining
# One run of gin/demo_continue.gin (gin/native/continue.gin on the demo's release: a tiny
# ModernBERT saved by transformers, 1000 ids in Gemma's layout, 1024 rows), 4 steps.


def _train(model_dir, *extra):
    from errors_fixtures import env

    return subprocess.run(
        [sys.executable, "-m", "xlmeta_jax.train", "--gin_file=gin/demo_continue.gin",
         f"--gin.MODEL_DIR='{model_dir}'", "--gin.STEPS=4", "--gin.WARMUP_STEPS=1",
         "--gin.BATCH_SIZE=8", "--gin.xlmeta_jax.pretrain.trainer.train.checkpoint_every=2",
         "--gin.xlmeta_jax.pretrain.trainer.train.log_every=2", *extra],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)


# The recipe's options on: a context extension (128 tokens, RoPE base 160k), then two decay
# branches TIES-merged against it; the merge is the run's product.
_RECIPE_OPTIONS = ("--gin.EXTENSION_STEPS=2", "--gin.EXTENSION_LENGTH=128",
                   "--gin.EXTENSION_ROPE_THETA=160000.0", "--gin.DECAY_STEPS=2",
                   "--gin.DECAY_BRANCHES=[{'name': 'decay_a'}, "
                   "{'name': 'decay_b', 'mask_rate': 0.3}]")


@pytest.fixture(scope="module")
def continued(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("continued") / "run"
    done = _train(model_dir, *_RECIPE_OPTIONS)
    assert done.returncode == 0, done.stderr[-4000:]
    return model_dir


@pytest.fixture(scope="module")
def released(continued):
    """The demo's release: what a user downloads (tokenizer.json, config.json, weights)."""
    return continued / "demo_data" / "released"


@pytest.fixture(scope="module")
def other_tokenizer(latin, tmp_path_factory):
    """Gemma's layout and 1000 ids again, trained on other text: other pieces behind the
    same special ids and size, so only the files tell it apart."""
    return tokenizer_folder(tmp_path_factory.mktemp("other") / "gemma", "gemma", latin,
                            vocab_size=1000)


@pytest.fixture(scope="module")
def small_spm(latin, tmp_path_factory):
    """Our SentencePiece model of 1000 pieces: it fits the release's 1024 rows and pad id
    0, so only the tokenizer tells it apart (the case that trained silently before)."""
    return vocabulary.train_sentencepiece(tmp_path_factory.mktemp("spm") / "latin", 1000,
                                          sentences=latin)


@pytest.mark.slow
def test_a_released_folder_continues_in_its_own_ids(continued, released):
    """Without VOCAB_PATH the run takes the folder's tokenizer: its checkpoints record it,
    and fine-tuning reads the run in the same ids."""
    from xlmeta_jax.evaluation import encoders
    from xlmeta_jax.pretrain import checkpoints, loading

    product = loading.find_step_dir(continued)
    assert product.parent.name == "merged"  # the TIES merge of decay_a and decay_b
    for phase in ("continue", "ext", "decay_a", "decay_b", "merged"):
        meta = checkpoints.read_meta(loading.find_step_dir(continued / phase))
        assert meta["vocab_path"] == os.fspath(released), phase
        assert meta["tokenizer"] == hf_tokenizer.read(released).record(), phase
    ext = checkpoints.read_meta(loading.find_step_dir(continued / "ext"))
    assert (ext["sequence_length"], ext["model_config"]["global_rope_theta"]) == (128, 160000.0)
    assert meta["tokenizer"]["special_ids"] == {"pad": 0, "cls": 2, "sep": 1, "mask": 4,
                                                "unk": 3}
    loaded = encoders.load_encoder(os.fspath(continued))
    assert isinstance(loaded.tokenizer, tokenization.HFTokenizer)
    assert (loaded.tokenizer.cls_id, loaded.tokenizer.sep_id) == (2, 1)
    assert (loaded.config.family, loaded.config.vocab_size) == ("modernbert", 1024)


@pytest.mark.slow
def test_another_tokenizer_is_refused_in_one_line(continued, released, other_tokenizer,
                                                  small_spm, tmp_path):
    """Resume, a fresh start from the folder, and fine-tuning, each under a tokenizer the
    model was not trained in: one line naming both, exit 2, nothing written."""
    from errors_fixtures import foreign_lines

    from xlmeta_jax.evaluation import encoders

    before = sorted(p.name for p in continued.rglob("*"))
    cases = [
        # Resume under another tokenizer (ModernBERT's layout, 500 ids too).
        (continued, other_tokenizer, f"{continued}/continue/4 was trained in another "
         "tokenizer"),
        # The silent case: our SentencePiece model of 500 pieces (pad 0) fits the model's
        # 512 rows; the folder's weights are in Gemma's ids.
        (tmp_path / "fresh", small_spm, f"INITIAL_CHECKPOINT_PATH {released} was trained "
         "in another tokenizer"),
    ]
    for model_dir, vocab, message in cases:
        done = _train(model_dir, *_RECIPE_OPTIONS, f"--gin.VOCAB_PATH='{vocab}'",
                      f"--gin.INITIAL_CHECKPOINT_PATH='{released}'",
                      f"--gin.TEXT_FILES=['{continued}/demo_data/new_languages/*.txt']")
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("xlmeta_jax.")]
        assert done.returncode == errors.EXIT_USER_ERROR, done.stderr[-3000:]
        assert len(lines) == 1 and message in lines[0], done.stderr[-3000:]
        assert not foreign_lines(done.stderr), done.stderr[-3000:]
        assert f"VOCAB_PATH {vocab}" in lines[0]
    assert not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in continued.rglob("*")) == before
    with pytest.raises(errors.UserError, match="was trained in another tokenizer"):
        encoders.load_encoder(os.fspath(continued), os.fspath(small_spm))
    # Export with a --vocab_path of another kind (before: the rows renumbered as if they were
    # our SentencePiece model's).
    code, text = _hf_cli(["to_hf", f"--checkpoint={continued}", f"--output={tmp_path / 'x'}",
                          f"--vocab_path={small_spm}"])
    refused = [ln for ln in text.splitlines() if ln.startswith("xlmeta_jax.hf: error: ")]
    assert code == errors.EXIT_USER_ERROR and len(refused) == 1, text
    assert f"{continued} was trained in another tokenizer" in refused[0]
    assert f"not --vocab_path {small_spm} (sentencepiece, 1000 ids" in refused[0]
    assert not (tmp_path / "x").exists()


def _hf_cli(argv):
    """(exit status, stdout and stderr) of ``python -m xlmeta_jax.hf``, in process."""
    import contextlib
    import io

    from xlmeta_jax.cli import hf as hf_cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = errors.run_command(hf_cli.main, argv, prog="xlmeta_jax.hf")
    return code, out.getvalue()


@pytest.mark.slow
def test_the_export_carries_its_tokenizer_and_fill_mask_gives_our_logits(
        continued, released, other_tokenizer, flores, tmp_path):
    """``hf to_hf`` of the continued run: the folder's tokenizer files byte for byte, the
    rows in its ids, and transformers' AutoTokenizer, model and fill-mask pipeline give our
    ids and logits; ``hf to_flax`` reads it back exactly, with its tokenizer recorded."""
    import torch
    import transformers

    from xlmeta_jax.interop.hf import weights
    from xlmeta_jax.model import network
    from xlmeta_jax.pretrain import checkpoints, loading

    out = tmp_path / "export"
    code, text = _hf_cli(["to_hf", f"--checkpoint={continued}", f"--output={out}"])
    assert code == 0, text
    for name in hf_tokenizer.TOKENIZER_FILES:
        assert (out / name).read_bytes() == (released / name).read_bytes(), name
    texts = flores[0][:40]
    ours = vocabulary.load_vocabulary(released)
    ref = transformers.AutoTokenizer.from_pretrained(out)
    assert [ref(t, add_special_tokens=False)["input_ids"] for t in texts] == (
        ours.encode_batch(texts))
    cfg, params, _ = loading.load_pretrained(continued)
    # Logits both ways on the first FLORES sentence of each of the 20 languages, padded to a
    # batch in the tokenizer's own ids: the export against our trained parameters, and the
    # release as transformers saved it against its import.
    batch = ref([flores[0][20 * i] for i in range(20)], padding=True, truncation=True,
                max_length=128, return_tensors="np")
    ids20, mask20 = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
    assert ids20.shape[0] == 20 and (ids20[mask20 == 0] == ours.specials.pad).all()
    for folder, (cfg_i, params_i) in ((out, (cfg, params)),
                                      (released, weights.load_hf(released))):
        hf_model = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
        with torch.no_grad():
            want = hf_model(input_ids=torch.from_numpy(ids20.astype(np.int64)),
                            attention_mask=torch.from_numpy(mask20)).logits.numpy()
        got = np.asarray(network.masked_lm(cfg_i).apply({"params": params_i}, ids20, mask20))
        np.testing.assert_allclose(got[mask20 == 1], want[mask20 == 1], atol=1e-4, rtol=0)
    # A sentence with its third piece masked, through transformers and through our network.
    ids = ref(texts[0])["input_ids"][:24]
    ids[3] = ref.mask_token_id
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor([ids])).logits.numpy()[0]
    mine = np.asarray(network.masked_lm(cfg).apply(
        {"params": params}, np.array([ids], np.int32), np.ones([1, len(ids)], np.int32)))[0]
    np.testing.assert_allclose(mine, theirs, atol=1e-4, rtol=0)
    # fill-mask on the text of those ids: the same ids again, and our five best with our
    # probabilities.
    masked = ref.decode(ids[1:])
    assert ref(masked)["input_ids"] == ids + [ref.sep_token_id]
    best = transformers.pipeline("fill-mask", model=model, tokenizer=ref, top_k=5)(masked)
    probs = np.exp(mine[3] - mine[3].max())
    probs /= probs.sum()
    assert [b["token"] for b in best] == np.argsort(-probs)[:5].tolist()
    np.testing.assert_allclose([b["score"] for b in best], np.sort(probs)[::-1][:5], atol=1e-5)
    # Back again: the same parameters, the tokenizer recorded beside them.
    code, text = _hf_cli(["to_flax", f"--hf_path={out}", f"--output={tmp_path / 'flax'}"])
    assert code == 0, text
    meta = checkpoints.read_meta(loading.find_step_dir(tmp_path / "flax"))
    assert meta["tokenizer"] == hf_tokenizer.read(released).record()
    _, back, _ = loading.load_pretrained(tmp_path / "flax")
    for a, b in zip(*(jax_leaves(t) for t in (params, back))):
        np.testing.assert_array_equal(a, b)
    # Into a folder that holds another tokenizer: one line, nothing written.
    other = shutil.copytree(other_tokenizer, tmp_path / "other")
    before = sorted(p.name for p in other.iterdir())
    code, text = _hf_cli(["to_hf", f"--checkpoint={continued}", f"--output={other}"])
    refused = [ln for ln in text.splitlines() if ln.startswith("xlmeta_jax.hf: error: ")]
    assert code == errors.EXIT_USER_ERROR and len(refused) == 1, text
    assert f"{other} holds another tokenizer (its tokenizer.json not the model's)" in text
    assert sorted(p.name for p in other.iterdir()) == before


def jax_leaves(tree):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_word_alignment_of_a_byte_level_bpe_follows_its_offsets(folders, flores):
    """ModernBERT's byte-level BPE marks a word's first piece by the space before it: each
    sentence is encoded whole and every piece goes to the word its offsets start in, so the
    words' pieces are the sentence's, in transformers' own ids and offsets."""
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(folders["modernbert"])
    tok = tokenization.load_tokenizer(folders["modernbert"])
    for text in flores[0][:60]:
        words = text.split()
        sentence = " ".join(words)
        enc = ref(sentence, add_special_tokens=False, return_offsets_mapping=True)
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        want = [[] for _ in words]
        for i, (b, e) in zip(enc["input_ids"], enc["offset_mapping"]):
            while b < e and sentence[b].isspace():
                b += 1
            want[int(np.searchsorted(starts, b, side="right")) - 1].append(i)
        assert tok.encode_words(words) == want


@pytest.mark.slow
@pytest.mark.parametrize("task", ["panx", "xquad"])
def test_a_released_folder_fine_tunes_in_its_own_tokenizer(task, released, shared_data,
                                                           tmp_path):
    """``python -m xlmeta_jax.finetune`` with the released folder as INITIAL_CHECKPOINT_PATH
    and nothing else: tagging (word alignment) and QA (question and context as a pair) in
    the folder's ids."""
    import gin

    from xlmeta_jax.cli import finetune

    gin.clear_config()
    results = finetune.main([
        f"--gin_file=gin/finetune/{task}.gin", "--gin_file=gin/finetune/demo.gin",
        f"--gin.INITIAL_CHECKPOINT_PATH='{released}'", f"--gin.MODEL_DIR='{tmp_path / task}'",
        f"--gin.DATA_DIR='{shared_data}'", "--gin.finetune.train_steps=2",
        "--gin.finetune.max_train_examples=16", "--gin.finetune.max_eval_examples=4",
        "--gin.finetune.eval_every=2", "--gin.finetune.log_every=2",
        "--gin.finetune.max_seq_length=64"])
    gin.clear_config()
    assert results["model"]["source"] == "hf"
    assert results["model"]["vocab_path"] == os.fspath(released)
    assert results["train"]["steps"] == 2 and len(results["languages"]) > 1


@pytest.mark.slow
def test_the_experiment_evaluates_a_released_folder_as_an_arm(released, shared_data, tmp_path,
                                                              clean_gin):
    """``experiment.released``: an arm that is a released model, evaluated exactly as the
    pretrained arms (the same fine-tuning command, per seed), in its own tokenizer."""
    import json

    from xlmeta_jax.cli import experiment as experiment_cli

    exp_dir = tmp_path / "exp"
    experiment_cli.main([
        "--gin_file=gin/experiments/tiny.gin", f"--gin.MODEL_DIR='{exp_dir}'",
        f"--gin.SHARED_DATA_DIR='{shared_data}'", "--gin.SEEDS=[0]",
        "--gin.xlmeta_jax.experiment.runner.experiment.arms=[]",
        f"--gin.xlmeta_jax.experiment.runner.experiment.released={{'mmbert_like': '{released}'}}",
        # Retrieval: the released model's own embeddings, no fine-tuning step to compile
        # (its fine-tuning on PAN-X and XQuAD: the test above).
        "--gin.xlmeta_jax.experiment.runner.experiment.tasks=['tatoeba']"])
    results = json.loads((exp_dir / "results.json").read_text())
    assert list(results["runs"]) == ["mmbert_like/seed0"]
    run = results["runs"]["mmbert_like/seed0"]
    assert run["pretraining"]["phases"][0]["checkpoint"] == os.fspath(released)
    assert len(run["evaluations"]["tatoeba"]["layer_sweep"]) == 5  # embeddings + 4 layers
    evaluated = json.loads((exp_dir / "eval/mmbert_like/seed0/tatoeba/results.json")
                           .read_text())
    assert evaluated["model"]["source"] == "hf"
    assert evaluated["model"]["vocab_path"] == os.fspath(released)
    assert "| mmbert_like |" in (exp_dir / "report.md").read_text()
    assert not (exp_dir / "pretrain").exists() and not (exp_dir / "corpus").exists()


@pytest.mark.parametrize("single, pair, config, specials, refused", [
    # Gemma's own post-processor adds <bos> only: the end token is the eos it names.
    ("<bos> $A", "<bos> $A $B", None, (2, 1, (1,)), None),
    # No post-processor: both from the names.
    (None, None, None, (2, 1, (1,)), None),
    # Nothing added and no end token named: refused.
    (None, None, {"bos_token": "<bos>", "pad_token": "<pad>", "mask_token": "<mask>"}, None,
     "tokenizer.json adds no end token to a sequence and"),
    # Two tokens in front: refused.
    ("<bos> <bos> $A <eos>", "<bos> $A <eos> $B <eos>", None, None,
     "post-processor puts 2 token(s) before a sequence and 1 after it"),
])
def test_a_side_the_post_processor_leaves_bare_takes_the_named_token(
        single, pair, config, specials, refused, folders, tmp_path):
    import tokenizers
    from tokenizers import processors

    folder = shutil.copytree(folders["gemma"], tmp_path / "folder")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = None if single is None else processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[("<bos>", 2), ("<eos>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        (folder / "special_tokens_map.json").unlink()
    if refused:
        with pytest.raises(hf_tokenizer.TokenizerError, match=re.escape(refused)):
            hf_tokenizer.read(folder)
        return
    s = hf_tokenizer.read(folder).specials
    assert (s.cls, s.sep, s.pair_middle) == specials
