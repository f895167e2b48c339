"""seqio data sources and the alpha-sampled mixture, configured when read.

Tasks are registered when ``tasks`` is imported, before gin is parsed, so the
sources here take *functions* that return their configuration (file lists, TFDS
names) and call them only when a dataset is built. Every source yields
``{"text": string, "ends_document": bool}`` (scalars or equal-length vectors);
the tokenizer appends ``eos`` after each text whose ``ends_document`` is true.

Text files follow CC-100's layout: one paragraph per line, a blank line between
documents; each file ends a document. A line that is not valid UTF-8 or that is
longer than ``max_line_bytes`` is skipped (counted beforehand by
:func:`xlmeta_jax.data.mixtures.corpus_stats`, which applies the same rules).
Text files are read LINES_PER_ELEMENT lines per element (``text`` and
``ends_document`` are then vectors); TFDS sources yield one document per element.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

from xlmeta_jax.data import mixtures


@dataclasses.dataclass(frozen=True)
class TextFiles:
    """Files of one split of a text corpus.

    Attributes:
      files: the files (already expanded and checked).
      max_line_bytes: longer lines are skipped.
    """

    files: tuple[str, ...]
    max_line_bytes: int = mixtures.DEFAULT_MAX_LINE_BYTES


# Lines handled per tf.data element: the per-line work is vectorised, since
# per-element overhead would otherwise dominate the reader.
LINES_PER_ELEMENT = 256


def _read_paragraphs(
    path: tf.Tensor, max_line_bytes: int, shard: seqio.ShardInfo | None = None
) -> tf.data.Dataset:
    """One file as batches of paragraphs, with a boundary entry after each document.

    Each element holds up to LINES_PER_ELEMENT entries: ``text`` (string [n]) and
    ``ends_document`` (bool [n]). A paragraph has ``ends_document=False``; the end
    of a document (a run of blank lines, or the end of the file) is one entry
    ``("", True)``. With ``shard``, only documents whose index in the file is
    ``index (mod num_shards)`` are kept.
    """
    compression = tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")
    lines = tf.data.TextLineDataset(path, compression_type=compression, buffer_size=1 << 20)
    # The end of the file ends its last document.
    lines = lines.concatenate(tf.data.Dataset.from_tensors(tf.constant("", tf.string)))
    lines = lines.batch(LINES_PER_ELEMENT)

    @tf.autograph.experimental.do_not_convert
    def step(state, batch):
        doc_index, after_boundary = state
        valid = tf.equal(
            tf.strings.unicode_transcode(
                batch, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
            ),
            batch,
        )
        batch = tf.boolean_mask(batch, valid & (tf.strings.length(batch) <= max_line_bytes))
        blank = tf.equal(tf.strings.length(tf.strings.strip(batch)), 0)
        previous_blank = tf.concat([[after_boundary], blank[:-1]], axis=0)
        # Leading blank lines and repeated blank lines are not boundaries.
        keep = tf.logical_not(blank) | tf.logical_not(previous_blank)
        boundary = tf.cast(blank & keep, tf.int64)
        # A boundary belongs to the document it ends.
        index = doc_index + tf.cumsum(boundary, exclusive=True)
        if shard is not None:
            keep &= tf.equal(index % shard.num_shards, shard.index)
        out = {
            "text": tf.boolean_mask(tf.where(blank, "", batch), keep),
            "ends_document": tf.boolean_mask(blank, keep),
        }
        last_blank = tf.cond(tf.size(blank) > 0, lambda: blank[-1], lambda: after_boundary)
        return (doc_index + tf.reduce_sum(boundary), last_blank), out

    initial = (tf.constant(0, tf.int64), tf.constant(True))
    out = lines.scan(initial, step)
    return out.filter(lambda ex: tf.size(ex["text"]) > 0)


class TextLineDocumentsSource(seqio.DataSource):
    """Paragraphs of text files (CC-100 layout) whose list is looked up lazily.

    Sharding (``shard_info``): by file when there are at least as many files as
    shards, otherwise by document, so that no document is split across
    processes. Shuffling permutes the files (each epoch anew, from the seed);
    files are read one after the other so documents stay contiguous.
    """

    def __init__(self, files_fn: Callable[[str], TextFiles], splits: Sequence[str] = ("train",)):
        """Args:
        files_fn: split -> TextFiles, called when a dataset is built.
        splits: the splits ``files_fn`` accepts.
        """
        self._files_fn = files_fn
        super().__init__(splits=splits)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        # Handled here: by file or by document (see the class docstring).
        return True

    def list_shards(self, split: str) -> Sequence[str]:
        return list(self._files_fn(split).files)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        *,
        sequence_length: Mapping[str, int] | None = None,  # Unused
        use_cached: bool = False,  # Unused
        num_epochs: int | None = 1,  # Unused
    ) -> tf.data.Dataset:
        text_files = self._files_fn(split)
        files = list(text_files.files)
        document_shard = None
        if shard_info is not None and shard_info.num_shards > 1:
            if len(files) >= shard_info.num_shards:
                files = files[shard_info.index :: shard_info.num_shards]
            else:
                document_shard = shard_info
        files_ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
        if shuffle:
            files_ds = files_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        max_line_bytes = int(text_files.max_line_bytes)
        return files_ds.flat_map(
            lambda path: _read_paragraphs(path, max_line_bytes, document_shard)
        )


class TfdsDocumentsSource(seqio.DataSource):
    """Documents of a TFDS dataset (one example = one document), configured lazily."""

    def __init__(
        self,
        config_fn: Callable[[], tuple[seqio.TfdsDataSource, str]],
        splits: Sequence[str] = ("train", "validation"),
    ):
        """Args:
        config_fn: () -> (seqio.TfdsDataSource, name of its text feature).
        splits: the canonical splits the TFDS source maps.
        """
        self._config_fn = config_fn
        super().__init__(splits=splits)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return self._config_fn()[0].supports_arbitrary_sharding

    def list_shards(self, split: str) -> Sequence[str]:
        return self._config_fn()[0].list_shards(split)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        *,
        sequence_length: Mapping[str, int] | None = None,  # Unused
        use_cached: bool = False,  # Unused
        num_epochs: int | None = 1,  # Unused
    ) -> tf.data.Dataset:
        source, feature = self._config_fn()
        ds = source.get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)
        if feature not in ds.element_spec:
            raise mixtures.CorpusError(
                f"{source}: no text feature {feature!r}; features are {sorted(ds.element_spec)}"
            )
        return ds.map(
            lambda ex: {"text": ex[feature], "ends_document": tf.constant(True)},
            num_parallel_calls=tf.data.AUTOTUNE,
        )


class AlphaMixture(seqio.Mixture):
    """A mixture over a configured subset of per-language tasks, rates ∝ n_l^alpha.

    It is registered under one name with every language's task; which languages
    take part, alpha and the counts n_l are looked up (gin) when a dataset is
    built. Examples are packed blocks, so a block is drawn from language l with
    probability q_l = n_l^alpha / sum_k n_k^alpha, as XLM-R samples languages.
    """

    def __init__(
        self,
        name: str,
        task_names_by_lang: Mapping[str, str],
        config_fn: Callable[[], tuple[Sequence[str], float]],
        counts_fn: Callable[[Sequence[str]], Mapping[str, float]],
    ):
        """Args:
        name: the mixture's name.
        task_names_by_lang: language -> registered task name (all languages).
        config_fn: () -> (selected languages, alpha), validated by the callee.
        counts_fn: languages -> n_l per language.
        """
        self._task_names_by_lang = dict(task_names_by_lang)
        self._config_fn = config_fn
        self._counts_fn = counts_fn
        self._probabilities_cache: dict[tuple, dict[str, float]] = {}
        # seqio's constructor inspects `tasks` before any configuration exists.
        self._registering = True
        super().__init__(name, list(self._task_names_by_lang.values()), default_rate=1.0)
        self._registering = False
        self._lang_by_task = {t: lang for lang, t in self._task_names_by_lang.items()}

    def languages(self) -> tuple[str, ...]:
        """The configured languages (in configuration order)."""
        return tuple(self._config_fn()[0])

    def probabilities(self) -> dict[str, float]:
        """q_l per configured language (counts looked up once per configuration)."""
        langs, alpha = self._config_fn()
        key = (tuple(langs), alpha)
        if key not in self._probabilities_cache:
            alpha = mixtures.check_alpha(alpha)  # before any counting
            counts = dict(self._counts_fn(langs))
            missing = [lang for lang in langs if lang not in counts]
            if missing:
                raise mixtures.CorpusError(f"{self.name}: no count n_l for {missing}")
            probs = mixtures.alpha_probabilities({lang: counts[lang] for lang in langs}, alpha)
            logging.info(
                "%s: alpha=%s sampling probabilities %s",
                self.name,
                alpha,
                {k: round(v, 5) for k, v in probs.items()},
            )
            self._probabilities_cache[key] = probs
        return self._probabilities_cache[key]

    @property
    def tasks(self) -> list[seqio.Task]:
        if self._registering:
            return [seqio.TaskRegistry.get(t) for t in self._task_names_by_lang.values()]
        return [seqio.TaskRegistry.get(self._task_names_by_lang[lang]) for lang in self.languages()]

    @property
    def rate_per_task_name(self) -> Mapping[str, float]:
        probs = self.probabilities()
        return {self._task_names_by_lang[lang]: q for lang, q in probs.items()}

    def get_rate(self, task: seqio.Task) -> float:
        return self.probabilities().get(self._lang_by_task.get(task.name), 0.0)

    def get_dataset(
        self,
        sequence_length: Mapping[str, int] | None = None,
        split: str = "train",
        use_cached: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        num_epochs: int | None = None,
        copy_pretokenized: bool = False,
        compute_stats_empirically: bool = False,
        log_mixing_proportions: bool = True,
        passthrough_features: Sequence[str] | None = None,
        trim_output_features: bool = True,
        try_in_mem_cache: bool = True,
        shuffle_buffer_size: int | None = None,
    ) -> tf.data.Dataset:
        """seqio's Mixture.get_dataset, plus a per-task ``shuffle_buffer_size``.

        Counts, alpha and languages are validated before any task is built.
        ``passthrough_features=["language"]`` adds each block's language code
        (a string feature) for inspecting the mix.
        """
        del copy_pretokenized, compute_stats_empirically, log_mixing_proportions
        # Cheap checks first: the vocabulary loads, alpha and languages are valid.
        for feature in self.output_features.values():
            _ = feature.vocabulary.vocab_size
        probs = self.probabilities()
        self._check_compatible_features()
        keys = set(self.output_features) | set(passthrough_features or ())
        datasets, weights = [], []
        for lang in self.languages():
            task = seqio.TaskRegistry.get(self._task_names_by_lang[lang])
            if split not in task.splits:
                raise mixtures.CorpusError(f"{task.name} has no split {split!r}")
            ds = task.get_dataset(
                sequence_length=sequence_length,
                split=split,
                use_cached=use_cached,
                shuffle=shuffle,
                shuffle_buffer_size=shuffle_buffer_size,
                seed=seed,
                shard_info=shard_info,
                num_epochs=num_epochs,
                trim_output_features=trim_output_features,
                try_in_mem_cache=try_in_mem_cache,
            )
            ds = ds.map(lambda ex, keys=keys: {k: v for k, v in ex.items() if k in keys})
            if "language" in keys:
                ds = ds.map(lambda ex, lang=lang: {**ex, "language": tf.constant(lang)})
            datasets.append(ds)
            weights.append(probs[lang])
        sample_seed = seed if seed is not None else (None if shuffle else 42)
        return tf.data.Dataset.sample_from_datasets(
            datasets, weights=weights, seed=sample_seed, stop_on_empty_dataset=True
        )
