"""Our checkpoints <-> Hugging Face directories of either family (``python -m xlmeta_jax.hf``).

``to_flax`` writes a checkpoint in the trainer's own format (a phase directory with one
step, :func:`xlmeta_jax.pretrain.checkpoints.save_params`), which
``INITIAL_CHECKPOINT_PATH``, fine-tuning and ``to_hf`` read like any pretraining
checkpoint; ``to_hf`` exports one (weights, config and tokenizer)::

    python -m xlmeta_jax.hf to_flax --hf_path=DIR --output=DIR [--scan_layers]
    python -m xlmeta_jax.hf to_hf --checkpoint=DIR --output=DIR

The weights themselves: :mod:`xlmeta_jax.interop.hf.weights`.
"""

from __future__ import annotations

import functools
import os
import pathlib

from xlmeta_jax import files
from xlmeta_jax.data import hf_tokenizer as hf_tokenizer_files
from xlmeta_jax.evaluation import embeddings
from xlmeta_jax.interop.hf import families, st_export
from xlmeta_jax.interop.hf import tokenizer as hf_tokenizer
from xlmeta_jax.interop.hf.weights import (
    CONFIG_NAME,
    FLAX_VOCAB_NAME,
    SAFE_WEIGHTS_NAME,
    ConversionError,
    load_hf,
    read_json,
    save_hf,
    write_file,
)
from xlmeta_jax.pretrain import checkpoints, loading


def to_flax(hf_path: str, output: str, *, scan_layers: bool = False,
            allow_pickle: bool = False, report=None) -> pathlib.Path:
    """HF ``save_pretrained`` dir -> a checkpoint in the trainer's format (+ ``spm.model``).

    ``output`` becomes a phase directory with one step (``output/0/state`` holding the
    params, ``output/0/meta`` the encoder config and vocabulary), the layout
    :func:`xlmeta_jax.pretrain.loading.load_pretrained` reads. A model that :func:`to_hf`
    exported from our vocabulary gets our ids back (the round trip is exact) and
    ``output/spm.model`` is our SentencePiece model again; any other model keeps its own
    ids: its tokenizer files (``tokenizer.json`` and the special tokens' files) are
    copied there and recorded, or, without them, XLM-R's ``sentencepiece.bpe.model``.

    ``report`` (e.g. ``print``) receives the parity line of :mod:`xlmeta_jax.interop.hf.parity`:
    both networks on the converted weights, refused above its tolerance.

    Raises:
      ConversionError: ``output`` exists and is not empty, or the parity check fails.
    """
    out = pathlib.Path(checkpoints.absolute(output))
    _check_output(out)
    if out.exists() and any(out.iterdir()):
        raise ConversionError(f"{out} is not empty; convert into a new directory")
    src = pathlib.Path(hf_path)
    src_dir = src if src.is_dir() else src.parent
    config_path = src_dir / CONFIG_NAME
    seqio = config_path.is_file() and (
        hf_tokenizer.CONFIG_KEY in read_json(config_path, "HF config"))
    cfg, params = load_hf(hf_path, allow_pickle=allow_pickle, seqio_ids=seqio,
                          parity_report=report, scan_layers=scan_layers)
    vocab_path, extra_meta = None, None
    if not seqio and (src_dir / hf_tokenizer_files.TOKENIZER_JSON).is_file():
        # The folder's own tokenizer (a released model's), copied beside the checkpoint
        # byte for byte and recorded: the parameters stay in its ids.
        tok = hf_tokenizer_files.read(src_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, data in tok.files.items():
            write_file(out / name, lambda p, data=data: pathlib.Path(p).write_bytes(data))
        vocab_path, extra_meta = out, {"tokenizer": tok.record()}
    elif (src_dir / hf_tokenizer.SPM_NAME).is_file():
        vocab = (hf_tokenizer.seqio_vocabulary_bytes(src_dir) if seqio
                 else (src_dir / hf_tokenizer.SPM_NAME).read_bytes())
        out.mkdir(parents=True, exist_ok=True)
        vocab_path = out / FLAX_VOCAB_NAME
        write_file(vocab_path, lambda p: pathlib.Path(p).write_bytes(vocab))
    checkpoints.save_params(out, cfg, params, vocab_path=vocab_path and os.fspath(vocab_path),
                            initialized_from=os.fspath(src.absolute()), extra_meta=extra_meta)
    return out


def to_hf(checkpoint: str, output: str, *, vocab_path: str | None = None,
          report=None) -> pathlib.Path:
    """Our checkpoint -> HF directory with weights, config and tokenizer (:func:`save_hf`).

    Args:
      checkpoint: a pretraining checkpoint of ``xlmeta_jax.train`` (MODEL_DIR,
        ``MODEL_DIR/phaseN`` or ``MODEL_DIR/phaseN/<step>``) or a :func:`to_flax`
        directory, read with ``xlmeta_jax.pretrain.loading.load_pretrained``.
      output: output directory.
      vocab_path: the model's SentencePiece file or Hugging Face tokenizer folder; default:
        the one the checkpoint records. A tokenizer folder's files are written as they are
        (and one other than the checkpoint's is refused).
      report: receives the parity line (``print`` in the command); None skips the check.
    """
    _check_output(pathlib.Path(output))
    existing = [n for n in (CONFIG_NAME, SAFE_WEIGHTS_NAME) if (pathlib.Path(output) / n).exists()]
    if existing:
        raise ConversionError(f"{output} already holds {existing}; export into a new directory")
    if vocab_path is not None and not os.path.exists(vocab_path):
        raise FileNotFoundError(f"vocabulary {vocab_path} does not exist")
    cfg, params, recorded = loading.load_pretrained(checkpoint)
    vocab = vocab_path or recorded
    stored = loading.recorded_tokenizer(checkpoint)
    if vocab and stored and os.path.exists(vocab):
        given = hf_tokenizer_files.record_of(vocab)
        if not hf_tokenizer_files.same_tokenizer(stored, given):
            raise ConversionError(
                f"{checkpoint} was trained in another tokenizer: "
                f"{hf_tokenizer_files.describe(stored, 'its')}, not "
                f"{hf_tokenizer_files.describe(given, f'--vocab_path {vocab}')}")
    # A contrastive run's checkpoint: sentence-transformers' files too, in the same export.
    settings = embeddings.recorded_settings(checkpoint)
    also_write = None if settings is None else functools.partial(
        st_export.write, settings=settings, hidden_size=cfg.hidden_size,
        max_tokens=families.of(cfg).max_tokens(cfg))
    if vocab and hf_tokenizer_files.is_tokenizer_path(vocab) and os.path.exists(vocab):
        # A Hugging Face tokenizer the model was trained in: its files go with the model as
        # they are, and the rows stay in its ids.
        tok = hf_tokenizer_files.read(vocab)
        return save_hf(output, cfg, params, tokenizer_files=tok.files,
                       special=tok.specials.as_dict(), parity_report=report,
                       also_write=also_write)
    return save_hf(output, cfg, params, vocab_path=vocab, parity_report=report,
                   also_write=also_write)


def _check_output(out: pathlib.Path) -> None:
    """The output folder, or the first of its parents that exists, must be a folder."""
    problem = files.not_a_folder(out, "--output")
    if problem:
        raise ConversionError(problem)
