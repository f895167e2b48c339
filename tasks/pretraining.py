"""Registers the MLM pretraining tasks and mixtures (names in :mod:`tasks.names`).

Every task yields packed, masked blocks in the MLM batch format of
:mod:`xlmeta_jax.losses` (preprocessing: :mod:`xlmeta_jax.data.preprocessors`);
call ``get_dataset`` with ``sequence_length={"inputs": L, "targets": L}``.
Corpus locations come from the gin-configurable functions of
:mod:`xlmeta_jax.data.corpora`, looked up when a dataset is built; the
vocabulary from ``get_vocabulary.path`` (gin macro ``VOCAB_PATH``).
"""

from __future__ import annotations

import functools

import seqio
import tensorflow as tf

from tasks import names
from xlmeta_jax.data import corpora, mixtures, preprocessors, providers
from xlmeta_jax.data.languages import XLMR_LANGUAGES, mc4_split_name
from xlmeta_jax.data.vocabulary import configured_vocabulary


def mlm_output_features() -> dict[str, seqio.Feature]:
    """The MLM features every pretraining task yields (one shared vocabulary)."""
    vocab = configured_vocabulary()
    # Non-token features still need a vocabulary object in seqio.
    aux = seqio.PassThroughVocabulary(size=0)
    return {
        "inputs": seqio.Feature(vocab, add_eos=False, dtype=tf.int32),
        "targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32),
        "weights": seqio.Feature(aux, add_eos=False, dtype=tf.float32),
        "mlm_positions": seqio.Feature(aux, add_eos=False, dtype=tf.int32),
        "mlm_targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32),
        "mlm_weights": seqio.Feature(aux, add_eos=False, dtype=tf.float32),
    }


def _mlm_preprocessors(task_name: str) -> list:
    return [
        preprocessors.tokenize_documents,
        # Offline caches (xlmeta_jax.data.caching or seqio's cache_tasks_main) hold tokens.
        seqio.CacheDatasetPlaceholder(),
        preprocessors.pack_blocks,
        functools.partial(preprocessors.mlm_mask, salt=preprocessors.task_salt(task_name)),
    ]


def _add_task(name: str, source: seqio.DataSource) -> None:
    if name in seqio.TaskRegistry.names():
        return
    seqio.TaskRegistry.add(
        name,
        source=source,
        output_features=mlm_output_features(),
        preprocessors=_mlm_preprocessors(name),
    )


# ----------------------------------------------------------------- phase 1: English


def _english_text_files(split: str) -> providers.TextFiles:
    config = corpora.english_text_corpus()
    patterns = config.file_patterns if split == "train" else config.validation_file_patterns
    if split not in ("train", "validation"):
        raise mixtures.CorpusError(f"{names.ENGLISH_TEXT_TASK} has no split {split!r}")
    if not patterns:
        binding = "file_patterns" if split == "train" else "validation_file_patterns"
        macro = "set ENGLISH_FILES or bind" if split == "train" else "bind"
        raise mixtures.CorpusError(
            f"no English text files configured for {split!r}: {macro} "
            f"english_text_corpus.{binding} (gin/data/english_files.gin)"
        )
    files = mixtures.list_text_files(patterns, what=f"english_text_corpus ({split})")
    # Validates every file once (cached): no file without usable text.
    mixtures.corpus_stats(
        files, max_line_bytes=config.max_line_bytes, cache_dir=config.stats_cache_dir
    )
    return providers.TextFiles(tuple(files), config.max_line_bytes)


@functools.lru_cache(maxsize=64)
def _tfds_source(
    tfds_name: str, tfds_data_dir: str | None, splits: tuple[tuple[str, str], ...]
) -> seqio.TfdsDataSource:
    return seqio.TfdsDataSource(
        tfds_name=tfds_name, tfds_data_dir=tfds_data_dir, splits=dict(splits)
    )


def _english_tfds() -> tuple[seqio.TfdsDataSource, str]:
    name, data_dir, feature, splits = corpora.english_tfds_corpus()
    return _tfds_source(name, data_dir, tuple(sorted(splits.items()))), feature


# ----------------------------------------------------------------- phase 2: CC-100, mC4


def _cc100_files(lang: str, split: str) -> providers.TextFiles:
    config = corpora.cc100_corpus()
    files = corpora.cc100_files(config, lang, split)
    mixtures.corpus_stats(
        files, max_line_bytes=config.max_line_bytes, cache_dir=config.stats_cache_dir
    )
    return providers.TextFiles(tuple(files), config.max_line_bytes)


def _cc100_selection() -> tuple[tuple[str, ...], float]:
    config = corpora.cc100_corpus()
    return config.languages, config.alpha


def _cc100_counts(languages) -> dict[str, float]:
    return corpora.cc100_counts(corpora.cc100_corpus(), languages)


def _mc4_tfds(lang: str) -> tuple[seqio.TfdsDataSource, str]:
    config = corpora.mc4_corpus()
    split = mc4_split_name(lang)
    if split is None:
        raise mixtures.CorpusError(f"mC4 has no split for {lang!r}")
    splits = (("train", split), ("validation", f"{split}-validation"))
    return _tfds_source(config.tfds_name, config.tfds_data_dir, splits), "text"


def _mc4_selection() -> tuple[tuple[str, ...], float]:
    config = corpora.mc4_corpus()
    return config.languages, config.alpha


def _mc4_counts(languages) -> dict[str, float]:
    config = corpora.mc4_corpus()
    if config.counts is not None:
        return mixtures.given_counts(config.counts, languages, what="mc4_corpus.counts")
    out = {}
    for lang in languages:
        source, _ = _mc4_tfds(lang)
        try:
            out[lang] = source.num_input_examples("train")
        except Exception as e:  # noqa: BLE001 - TFDS raises several kinds here
            raise mixtures.CorpusError(
                f"mC4 split {mc4_split_name(lang)!r} (language {lang!r}) is not available in "
                f"{config.tfds_name} at {config.tfds_data_dir or 'the default TFDS folder'}: {e}"
            ) from e
    return out


def register() -> None:
    """Registers every pretraining task and mixture (idempotent)."""
    _add_task(
        names.ENGLISH_TEXT_TASK,
        providers.TextLineDocumentsSource(_english_text_files, splits=("train", "validation")),
    )
    _add_task(
        names.ENGLISH_TFDS_TASK,
        providers.TfdsDocumentsSource(_english_tfds, splits=("train", "validation")),
    )
    for lang in XLMR_LANGUAGES:
        _add_task(
            names.cc100_task(lang),
            providers.TextLineDocumentsSource(
                functools.partial(_cc100_files, lang), splits=("train", "validation")
            ),
        )
    for lang, task_name in names.MC4_TASKS.items():
        _add_task(
            task_name,
            providers.TfdsDocumentsSource(
                functools.partial(_mc4_tfds, lang), splits=("train", "validation")
            ),
        )
    if names.CC100_MIXTURE not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add_provider(
            names.CC100_MIXTURE,
            providers.AlphaMixture(
                names.CC100_MIXTURE, names.CC100_TASKS, _cc100_selection, _cc100_counts
            ),
        )
    if names.MC4_MIXTURE not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add_provider(
            names.MC4_MIXTURE,
            providers.AlphaMixture(names.MC4_MIXTURE, names.MC4_TASKS, _mc4_selection, _mc4_counts),
        )


register()
