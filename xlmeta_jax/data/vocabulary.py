"""The project's SentencePiece vocabularies: the one trainer, the id checks, the command.

One unigram SentencePiece model (as XLM-R) serves both phases: phase 1 trains on
English with the same ids phase 2 uses. Its training text is a sample drawn with
the pretraining language distribution ``q_l ∝ n_l^alpha``, so low-resource
languages get pieces of their own.

Special ids (fixed; seqio and the network rely on them):

=====  =========  =====================================================
id     piece      role
=====  =========  =====================================================
0      ``<pad>``  padding (seqio's PAD_ID)
1      ``</s>``   end of sequence / document separator (seqio's EOS)
2      ``<unk>``  unknown (rare with byte fallback)
3      ``<s>``    sequence start, the CLS position
4      ``<mask>`` MLM mask
=====  =========  =====================================================

``<s>`` and ``<mask>`` are SentencePiece *control* symbols: text that spells
"<mask>" is tokenized as ordinary characters, so raw data cannot inject them.

Train from the command line (CC-100 layout, see docs/data.md)::

  python -m xlmeta_jax.data.vocabulary --cc100_dir=/data/cc100 \\
      --output_prefix=/data/vocab/xlmeta_250k --vocab_size=250000 --alpha=0.3

or programmatically with :func:`train_vocabulary`. :func:`train_sentencepiece` is the
one place that sets the SentencePiece trainer's options; the evaluation side's small
demo and test vocabularies are trained by it too. The fertility report is
:mod:`xlmeta_jax.data.fertility`.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import logging
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence

from xlmeta_jax import errors, files
from xlmeta_jax.data import hf_tokenizer, prepared, text_files
from xlmeta_jax.data.fertility import fertility_report, format_fertility_table
from xlmeta_jax.data.languages import XLMR_LANGUAGE_NAMES, check_languages
from xlmeta_jax.data.line_sample import sample_training_lines
from xlmeta_jax.data.special_ids import (  # noqa: F401 - the layout's names, re-exported
    BOS_ID,
    EOS_ID,
    MASK_ID,
    NUM_SPECIAL_TOKENS,
    PAD_ID,
    UNK_ID,
)

# seqio's layout (xlmeta_jax.data.special_ids): ids below NUM_SPECIAL_TOKENS are special.
BOS_PIECE = "<s>"
MASK_PIECE = "<mask>"


class VocabularyError(errors.UserError, ValueError):
    """A vocabulary file that does not follow the project's id convention, or bad
    vocabulary training settings."""


def check_sentencepiece_model(processor, path: str = "<model>") -> None:
    """Raises VocabularyError unless the special ids are pad=0 eos=1 unk=2 <s>=3 <mask>=4."""
    expected = {
        "pad": (processor.pad_id(), PAD_ID),
        "eos": (processor.eos_id(), EOS_ID),
        "unk": (processor.unk_id(), UNK_ID),
    }
    for name, (got, want) in expected.items():
        if got != want:
            raise VocabularyError(f"{path}: {name} id is {got}, expected {want}")
    size = processor.get_piece_size()
    for want_id, piece in ((BOS_ID, BOS_PIECE), (MASK_ID, MASK_PIECE)):
        got = processor.id_to_piece(want_id) if want_id < size else None
        if got != piece:
            raise VocabularyError(f"{path}: id {want_id} is {got!r}, expected {piece!r}")
        if not processor.is_control(want_id):
            raise VocabularyError(f"{path}: {piece!r} must be a control symbol")


def load_vocabulary(path: str | os.PathLike | None):
    """A model's vocabulary, as one seqio ``Vocabulary`` whatever its kind.

    Our SentencePiece ``.model`` (seqio's ids, checked for the convention above) or a
    Hugging Face tokenizer in its own ids: a ``tokenizer.json`` or the folder holding it
    (a released model's folder), with the special tokens its files name
    (:mod:`xlmeta_jax.data.hf_tokenizer`). One instance per path, so every task of a
    mixture shares it. Either kind answers ``encode(text)`` (ids without special
    tokens), ``encode_batch(texts)``, ``specials`` (and ``pad_id``, ``cls_id``,
    ``sep_id``, ``mask_id``, ``unk_id``) and ``record()``
    (:mod:`xlmeta_jax.data.seqio_vocabularies`).

    Args:
      path: a ``.model`` file (any file system TF reads), a ``tokenizer.json`` or a
        folder holding one.

    Raises:
      VocabularyError: if no path is given, the file is missing or its ids differ from
        the convention; ``hf_tokenizer.TokenizerError`` for a tokenizer folder that
        cannot serve (both one line).
    """
    if not path:
        raise VocabularyError(
            "no vocabulary configured: set VOCAB_PATH (tasks.register(vocab_path=...)) to a "
            ".model file from `python -m xlmeta_jax.data.vocabulary`, or to a Hugging Face "
            "tokenizer folder"
        )
    return _load_checked(os.fspath(path))


@functools.cache
def _load_checked(path: str):
    import tensorflow as tf  # noqa: PLC0415 - TensorFlow is imported only by the data pipeline

    from xlmeta_jax.data import seqio_vocabularies  # noqa: PLC0415 - imports seqio and TF

    if "://" not in path and hf_tokenizer.is_tokenizer_path(path) and os.path.exists(path):
        return seqio_vocabularies.TokenizerVocabulary(hf_tokenizer.read(path))
    if not tf.io.gfile.exists(path):
        raise VocabularyError(f"vocabulary file {path} does not exist")
    if tf.io.gfile.isdir(path):
        raise VocabularyError(f"vocabulary file {path} is a folder, not a SentencePiece .model")
    vocab = seqio_vocabularies.SentencePieceVocabulary(path)
    try:
        tokenizer = vocab.tokenizer
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, sentencepiece's own
        # A .vocab file or an empty one fail inside protobuf or sentencepiece with a
        # message that names no file.
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise VocabularyError(f"vocabulary file {path} is not a SentencePiece .model ("
                              f"{reason}): give the .model that python -m "
                              "xlmeta_jax.data.vocabulary wrote, or a Hugging Face tokenizer "
                              "folder") from None
    check_sentencepiece_model(tokenizer, path)
    return vocab


# --------------------------------------------------------------------------- training


def train_sentencepiece(
    model_prefix: str | os.PathLike,
    vocab_size: int,
    *,
    sentences: Iterable[str] | None = None,
    input_file: str | None = None,
    seed: int = 0,
    character_coverage: float = 0.9995,
    num_threads: int = 1,
    trainer_options: Mapping[str, object] | None = None,
) -> str:
    """Trains a unigram SentencePiece model with the project's special ids.

    The one place that builds the trainer's arguments: pad 0, eos 1, unk 2, and
    ``<s>`` 3, ``<mask>`` 4 as *control* symbols (user-defined symbols would turn
    a literal "<mask>" in the text into the mask id). Give the text as exactly one
    of ``sentences`` or ``input_file``.

    Args:
      model_prefix: writes ``{model_prefix}.model`` and ``.vocab``.
      vocab_size: pieces, including the 5 special ones.
      sentences: the training text, one sentence or paragraph per item.
      input_file: the training text as a file, one sentence or paragraph per line.
      seed: SentencePiece's random seed (set globally before training).
      character_coverage: share of characters the pieces must cover.
      num_threads: trainer threads; the model can differ with the thread count.
      trainer_options: further ``SentencePieceTrainer`` options; they override the
        ones above (tests use this to train XLM-R's id layout).

    Returns:
      The path of the ``.model`` file.
    """
    import sentencepiece as spm  # noqa: PLC0415 - heavy optional dependency, loaded on use

    if (sentences is None) == (input_file is None):
        raise TypeError("train_sentencepiece: give exactly one of sentences and input_file")
    model_prefix = os.fspath(model_prefix)
    options = dict(
        model_type="unigram",
        vocab_size=int(vocab_size),
        character_coverage=float(character_coverage),
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        control_symbols=[BOS_PIECE, MASK_PIECE],
        # Use every input line: callers pass exactly the sample they want trained on.
        input_sentence_size=0,
        num_threads=int(num_threads),
        minloglevel=2,
    )
    options.update(trainer_options or {})
    if input_file is not None:
        # In a child process: SentencePiece's C++ trainer holds the interpreter for its
        # whole run, so Ctrl-C would act only once it returns; the child gets the signal
        # too and subprocess.run stops it.
        options["input"] = input_file
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_CHILD,
             json.dumps({"prefix": model_prefix, "seed": int(seed), "options": options})],
            capture_output=True, text=True, check=False)
        if done.returncode == _SETTINGS_REFUSED:
            raise _settings_error(done.stderr, options)
        if done.returncode:
            raise RuntimeError(f"SentencePiece's trainer failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        return f"{model_prefix}.model"
    options["sentence_iterator"] = iter(sentences)
    spm.set_random_generator_seed(int(seed))
    try:
        spm.SentencePieceTrainer.train(model_prefix=model_prefix, **options)
    except RuntimeError as e:
        raise _settings_error(str(e), options) from e
    return f"{model_prefix}.model"


_SETTINGS_REFUSED = 3  # the child's exit status when SentencePiece refuses the settings
_TRAIN_IN_CHILD = f"""
import json, sys
import sentencepiece as spm
a = json.loads(sys.argv[1])
spm.set_random_generator_seed(a["seed"])
try:
    spm.SentencePieceTrainer.train(model_prefix=a["prefix"], **a["options"])
except RuntimeError as e:
    sys.stderr.write(str(e))
    sys.exit({_SETTINGS_REFUSED})
"""


# A sample with at least this many lines per distinct line is first tried on its distinct
# lines alone (a vocabulary too large for the text is then refused in a fraction of the time).
TRIAL_SHARE = 4
TRIAL_MARGIN = 1.1


def _write_lines(path: str, lines: Iterable[str]) -> str:
    """Writes one line per item (newlines inside an item become spaces); returns ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line.replace("\n", " ") + "\n")
    return path


def _settings_error(message: str, options: dict) -> VocabularyError:
    """SentencePiece's refusal of the settings, after its source location, as one line."""
    text = message.strip().rpartition("] ")[2]
    if "Vocabulary size too high" in text:  # "... Please set it to a value <= 284."
        text = f"--vocab_size={options['vocab_size']} is more than this text allows ({text})"
    return VocabularyError(f"SentencePiece: {text}")


def train_vocabulary(
    text_files_by_lang: dict[str, list[str]] | None,
    output_prefix: str,
    vocab_size: int,
    alpha: float = 0.3,
    seed: int = 0,
    *,
    num_lines: int = 2_000_000,
    character_coverage: float = 0.9995,
    byte_fallback: bool = True,
    max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES,
    num_threads: int = 16,
    counts: Mapping[str, int] | None = None,
    stats_cache_dir: str | None = None,
    report_lines_per_language: int = 2000,
    print_report: bool = True,
    trainer_options: Mapping[str, object] | None = None,
    prepared_dir: str | None = None,
) -> str:
    """Trains the unigram SentencePiece vocabulary on an alpha-sampled text mix.

    Args:
      text_files_by_lang: language label -> text files or globs (CC-100 layout:
        one paragraph per line). Labels are free-form here (they only name the
        rows of the report); tasks check codes against the XLM-R list. None with
        ``prepared_dir``.
      output_prefix: writes ``{output_prefix}.model``, ``.vocab`` and the
        fertility report ``.fertility.tsv``.
      vocab_size: pieces including the 5 special ids (XLM-R: 250000).
      alpha: sampling exponent in (0, 1] (XLM-R: 0.3).
      seed: makes the sample and the training deterministic.
      num_lines: paragraphs in the training sample, over all languages.
      character_coverage: SentencePiece's character coverage (XLM-R: 0.9995).
      byte_fallback: decompose unknown characters into UTF-8 byte pieces instead
        of ``<unk>`` (uses 256 ids).
      max_line_bytes: longer lines are skipped (as in the pipeline).
      num_threads: trainer threads. SentencePiece's result depends on the
        thread count, so the default is a fixed 16 on every machine: the model
        is byte-identical for the same text, seed and ``num_threads``.
      counts: optional n_l per language (lines) instead of counting the files.
      stats_cache_dir: where the line counts are cached (default: next to the
        data, see :func:`text_files.corpus_stats`).
      report_lines_per_language: paragraphs per language for the report.
      print_report: print the per-language fertility table.
      trainer_options: extra ``SentencePieceTrainer`` options (e.g.
        ``{"train_extremely_large_corpus": True}`` for 250k pieces on a large
        sample).
      prepared_dir: train on the line sample ``python -m xlmeta_jax.data.prepare
        --vocab_sample_lines=N`` drew into this folder instead of sampling files
        (its alpha, seed and size replace ``alpha``, ``seed``, ``num_lines``).

    Returns:
      The path of the ``.model`` file.

    Raises:
      CorpusError: for missing/empty files or alpha outside (0, 1].
      VocabularyError: for vocab_size <= 5, character_coverage outside (0, 1] or
        a model that violates the id convention.
    """
    import sentencepiece as spm  # noqa: PLC0415 - heavy optional dependency, loaded on use

    if int(vocab_size) <= NUM_SPECIAL_TOKENS:
        raise VocabularyError(f"vocab_size must exceed {NUM_SPECIAL_TOKENS}, got {vocab_size}")
    if not text_files_by_lang and not prepared_dir:
        raise text_files.CorpusError("train_vocabulary: no languages given")
    if not 0.0 < character_coverage <= 1.0:
        raise VocabularyError(
            f"character_coverage must be in (0, 1], got {character_coverage}"
        )
    if prepared_dir:
        lines_by_lang, q, meta = prepared.vocab_sample(prepared_dir)
        alpha, seed = float(meta["alpha"]), int(meta["seed"])
        logging.info("the %d-line sample of %d languages (alpha %.2f, seed %d) drawn by "
                     "prepare in %s", meta["num_lines"], len(q), alpha, seed, prepared_dir)
    else:
        # Every file is found and checked before the first progress line.
        files_by_lang = {
            lang: text_files.list_text_files(f, what=f"vocabulary text for {lang!r}")
            for lang, f in text_files_by_lang.items()}
        logging.info("sampling %d lines from %d languages (alpha %.2f; counting each "
                     "language's lines first, cached per folder)", num_lines,
                     len(files_by_lang), alpha)
        lines_by_lang, q = sample_training_lines(
            files_by_lang,
            num_lines=num_lines,
            alpha=alpha,
            seed=seed,
            max_line_bytes=max_line_bytes,
            counts=counts,
            stats_cache_dir=stats_cache_dir,
        )
    all_lines = [line for lang in sorted(lines_by_lang) for line in lines_by_lang[lang]]
    random.Random(seed).shuffle(all_lines)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    created = not os.path.exists(out_dir)
    # --num_lines is the sample's size, reached by repeating lines where a language has
    # fewer than its share of the sample: say how much text that is.
    distinct = set(all_lines)
    logging.info("training the %d-piece SentencePiece model (%d threads) on %d sampled "
                 "lines, %d of them distinct%s", int(vocab_size), int(num_threads),
                 len(all_lines), len(distinct), "" if len(distinct) == len(all_lines) else
                 ": a language with fewer lines than its share of the sample repeats them")
    train = functools.partial(
        train_sentencepiece, vocab_size=vocab_size, seed=seed,
        character_coverage=character_coverage, num_threads=num_threads,
        trainer_options={
            "byte_fallback": bool(byte_fallback),
            # The sample is already alpha-sampled and shuffled: use it in order.
            "shuffle_input_sentence": False,
            **(trainer_options or {}),
        })
    with tempfile.TemporaryDirectory() as tmp:
        if TRIAL_SHARE * len(distinct) <= len(all_lines):
            # The pieces a text allows follow from its distinct lines, but SentencePiece
            # says "too high" only after its whole run on the repeated sample: a run on
            # the distinct lines (twice, so every substring is frequent) says it first.
            trial = _write_lines(os.path.join(tmp, "distinct.txt"), sorted(distinct) * 2)
            try:
                train(os.path.join(tmp, "trial"), input_file=trial)
            except VocabularyError as e:
                # Its limit can differ a little from the whole sample's: a size near it is
                # left to the real run, which knows exactly.
                limit = re.search(r"<= (\d+)", str(e))
                if limit is None or int(vocab_size) > TRIAL_MARGIN * int(limit.group(1)):
                    raise VocabularyError(f"{e}; found on the sample's {len(distinct)} "
                                          f"distinct lines, before training on all "
                                          f"{len(all_lines)}") from e
        try:
            os.makedirs(out_dir, exist_ok=True)
            model_path = train(output_prefix, input_file=_write_lines(
                os.path.join(tmp, "sample.txt"), all_lines))
        except BaseException:
            # A run that fails leaves no folder it created (nothing was written in it).
            if created and os.path.isdir(out_dir) and not os.listdir(out_dir):
                os.rmdir(out_dir)
            raise
    _drop_temporary_paths(model_path, alpha=alpha, seed=seed)
    processor = spm.SentencePieceProcessor(model_file=model_path)
    check_sentencepiece_model(processor, model_path)
    rows = fertility_report(
        model_path,
        {lang: lines[:report_lines_per_language] for lang, lines in lines_by_lang.items()},
        q,
    )
    logging.info("wrote %s; measuring fertility per language", model_path)
    text = format_fertility_table(rows)
    with open(f"{output_prefix}.fertility.tsv", "w", encoding="utf-8") as f:
        f.write(format_fertility_table(rows, tsv=True))
    if print_report:
        print(text)
    return model_path


def _drop_temporary_paths(model_path: str, *, alpha: float, seed: int) -> None:
    """Replaces the paths the trainer records in the model (input, output folder).

    Without this the same seed would give different bytes in another folder.
    """
    from sentencepiece import (  # noqa: PLC0415 - heavy optional dependency, loaded on use
        sentencepiece_model_pb2,
    )

    with open(model_path, "rb") as f:
        model = sentencepiece_model_pb2.ModelProto.FromString(f.read())
    del model.trainer_spec.input[:]
    model.trainer_spec.input.append(f"alpha-sampled text (alpha={alpha}, seed={seed})")
    model.trainer_spec.model_prefix = os.path.basename(model.trainer_spec.model_prefix)
    with open(model_path, "wb") as f:
        f.write(model.SerializeToString(deterministic=True))


# --------------------------------------------------------------------------- command


def _files_from_args(args) -> dict[str, list[str]] | None:
    if args.prepared:
        if args.cc100_dir or args.files or args.languages:
            raise errors.UsageError("--prepared trains on the sample prepare drew: give no "
                                    "--cc100_dir, --files or --languages with it")
        for flag in ("alpha", "seed", "num_lines"):
            if getattr(args, flag) is not None:
                raise errors.UsageError(f"--{flag}: with --prepared the sample's own is used "
                                        f"(set it when preparing: --vocab_sample_lines, "
                                        "--alpha, --seed)")
        return None
    by_lang: dict[str, list[str]] = {}
    if args.cc100_dir:
        if not os.path.isdir(args.cc100_dir):
            what = "is not a directory" if os.path.exists(args.cc100_dir) else "does not exist"
            raise errors.UserError(f"--cc100_dir {args.cc100_dir} {what}")
        languages = (
            [s for s in args.languages.split(",") if s]
            if args.languages
            else sorted(
                lang
                for lang in XLMR_LANGUAGE_NAMES
                if glob.glob(os.path.join(args.cc100_dir, f"{lang}.txt*"))
            )
        )
        if not languages and not args.languages:
            raise errors.UserError(
                f"--cc100_dir {args.cc100_dir} holds no CC-100 files ({{lang}}.txt*, e.g. "
                "en.txt.xz, with a code of xlmeta_jax/data/languages.py)")
        check_languages(languages, what="--languages")
        for lang in languages:
            by_lang[lang] = [os.path.join(args.cc100_dir, f"{lang}.txt*")]
    for spec in args.files or []:
        lang, sep, pattern = spec.partition("=")
        if not sep or not lang or not pattern:
            raise errors.UserError(f"--files expects LANG=GLOB, got {spec!r}")
        by_lang.setdefault(lang, []).append(files.user_path(pattern, f"--files {lang}"))
    if args.files:
        check_languages(sorted({spec.partition("=")[0] for spec in args.files}), what="--files")
    if not by_lang:
        raise errors.UserError("give --cc100_dir (with --languages), --files LANG=GLOB or "
                               "--prepared=DIR")
    return by_lang


def _check_args(args) -> None:
    """The flags' ranges, named as flags, before any text is read."""
    for flag, ok, rule in (
        ("vocab_size", args.vocab_size > NUM_SPECIAL_TOKENS, f"> {NUM_SPECIAL_TOKENS}"),
        ("alpha", 0 < args.alpha <= 1, "in (0, 1]"),
        ("num_lines", args.num_lines > 0, "> 0"),
        ("character_coverage", 0 < args.character_coverage <= 1, "in (0, 1]"),
        ("num_threads", args.num_threads > 0, "> 0"),
        ("max_line_bytes", args.max_line_bytes > 0, "> 0"),
    ):
        if not ok:
            raise errors.UserError(f"--{flag} must be {rule}, got {getattr(args, flag)}")
    folder = os.path.dirname(os.path.abspath(args.output_prefix))
    problem = files.not_a_folder(folder, "the folder of --output_prefix")
    if problem:
        raise errors.UserError(problem)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m xlmeta_jax.data.vocabulary`` (see the module docstring)."""
    parser = errors.ArgumentParser(
        prog="python -m xlmeta_jax.data.vocabulary",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train the multilingual unigram SentencePiece vocabulary on an "
        "alpha-sampled sample and print per-language fertility.",
        epilog="No gin files. Example: python -m xlmeta_jax.data.vocabulary "
        "--cc100_dir=/data/cc100 --languages=en,fr,sw --output_prefix=/data/vocab/xlmeta_8k "
        "--vocab_size=8000 --num_lines=200000",
    )
    parser.add_argument("--cc100_dir", type=files.path_flag("--cc100_dir"),
                        help="folder of CC-100 files {lang}.txt*")
    parser.add_argument("--languages", help="comma-separated CC-100 codes (default: all found)")
    parser.add_argument(
        "--files", action="append",
        help="LANG=GLOB, repeatable (adds to --cc100_dir); LANG is a CC-100 code",
    )
    parser.add_argument("--output_prefix", required=True, type=files.path_flag("--output_prefix"),
                        help="writes PREFIX.model, PREFIX.vocab and PREFIX.fertility.tsv")
    parser.add_argument("--vocab_size", type=int, default=250_000,
                        help="pieces, including the 5 special ones (XLM-R: 250000)")
    parser.add_argument(
        "--prepared", type=files.path_flag("--prepared"),
        help="a folder of python -m xlmeta_jax.data.prepare --vocab_sample_lines=N: train on "
        "the line sample it drew (its alpha, seed and size)")
    parser.add_argument("--alpha", type=float, default=None,
                        help="language sampling exponent: q_l ~ n_l^alpha (default: 0.3, "
                        "XLM-R's)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the line sample and of the trainer (default: 0)")
    parser.add_argument("--num_lines", type=int, default=None,
                        help="lines in the training sample, over all languages "
                        "(default: 2000000)")
    parser.add_argument("--character_coverage", type=float, default=0.9995,
                        help="share of characters the pieces must cover (rest: bytes/unk)")
    parser.add_argument(
        "--byte_fallback", action=argparse.BooleanOptionalAction, default=True,
        help="spell uncovered characters as UTF-8 byte pieces instead of <unk>",
    )
    parser.add_argument("--max_line_bytes", type=int, default=text_files.DEFAULT_MAX_LINE_BYTES,
                        help="longer lines are skipped when sampling")
    parser.add_argument(
        "--num_threads", type=int, default=os.cpu_count() or 1,
        help="trainer threads (default: this machine's cores); the trained model can differ "
        "with the thread count, so give a fixed value to reproduce a vocabulary elsewhere",
    )
    parser.add_argument(
        "--train_extremely_large_corpus", action="store_true",
        help="SentencePiece option needed for very large samples with big vocabularies",
    )
    errors.add_debug_flag(parser)
    args = parser.parse_args(argv)
    by_lang = _files_from_args(args)
    args.alpha = 0.3 if args.alpha is None else args.alpha
    args.seed = 0 if args.seed is None else args.seed
    args.num_lines = 2_000_000 if args.num_lines is None else args.num_lines
    _check_args(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = train_vocabulary(
            by_lang,
            args.output_prefix,
            args.vocab_size,
            args.alpha,
            args.seed,
            prepared_dir=args.prepared,
            num_lines=args.num_lines,
            character_coverage=args.character_coverage,
            byte_fallback=args.byte_fallback,
            max_line_bytes=args.max_line_bytes,
            num_threads=args.num_threads,
            trainer_options=(
                {"train_extremely_large_corpus": True}
                if args.train_extremely_large_corpus
                else None
            ),
        )
    except ValueError as e:
        # Corpus and vocabulary errors are user errors already; SentencePiece's own
        # refusals (a vocabulary larger than the text allows) come as ValueError.
        if isinstance(e, errors.UserError):
            raise
        raise VocabularyError(str(e)) from e
    print(f"wrote {path} (fertility table: {args.output_prefix}.fertility.tsv)")
    return 0


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.data.vocabulary")
