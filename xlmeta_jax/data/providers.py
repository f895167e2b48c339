"""seqio data sources of the pretraining text (registered by :func:`tasks.register`).

Every source yields
``{"text": string, "ends_document": bool}`` (scalars or equal-length vectors);
the tokenizer appends ``eos`` after each text whose ``ends_document`` is true.

Text files follow CC-100's layout: one paragraph per line, a blank line between
documents; each file ends a document. A line that is not valid UTF-8 or that is
longer than ``max_line_bytes`` is skipped (counted beforehand by
:func:`xlmeta_jax.data.text_files.corpus_stats`, which applies the same rules).
Text files are read LINES_PER_ELEMENT lines per element (``text`` and
``ends_document`` are then vectors); TFDS sources yield one document per element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

from xlmeta_jax.data import text_files


@dataclasses.dataclass(frozen=True)
class TextFiles:
    """Files of one split of a text corpus.

    Attributes:
      files: the files (already expanded and checked).
      max_line_bytes: longer lines are skipped.
    """

    files: tuple[str, ...]
    max_line_bytes: int = text_files.DEFAULT_MAX_LINE_BYTES


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


# Files of a task read side by side when shuffling (tf.data interleave cycle length).
INTERLEAVED_FILES = 16


def _end_with_document_boundary(ex):
    """Appends a document end to an element that stops inside a document."""
    open_doc = tf.logical_not(ex["ends_document"][-1])
    extra = tf.cast(open_doc, tf.int32)
    return {
        "text": tf.concat([ex["text"], tf.fill([extra], "")], axis=0),
        "ends_document": tf.concat([ex["ends_document"], tf.fill([extra], True)], axis=0),
    }


class TextLineDocumentsSource(seqio.DataSource):
    """Paragraphs of text files (CC-100 layout), one :class:`TextFiles` per split.

    Sharding (``shard_info``): by file when there are at least as many files as
    shards, otherwise by document, so that no document is split across
    processes. Shuffling permutes the files (each epoch anew, from the seed) and
    reads up to INTERLEAVED_FILES of them side by side, one element (up to
    LINES_PER_ELEMENT paragraphs) of each in turn, so that neighbouring blocks come
    from different files; each element then ends a document (a document longer than
    an element is cut into eos-separated pieces), so no block joins the text of two
    files without an eos. Without shuffling, files are read one after the other.
    """

    def __init__(self, files_by_split: Mapping[str, TextFiles]):
        """Args:
        files_by_split: split name -> its files (already listed and checked).
        """
        self.files_by_split = dict(files_by_split)
        super().__init__(splits=tuple(self.files_by_split))

    @property
    def supports_arbitrary_sharding(self) -> bool:
        # Handled here: by file or by document (see the class docstring).
        return True

    def list_shards(self, split: str) -> Sequence[str]:
        return list(self.files_by_split[split].files)

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
        if split not in self.files_by_split:
            raise text_files.CorpusError(f"no {split!r} files configured (splits: {self.splits})")
        split_files = self.files_by_split[split]
        files = list(split_files.files)
        document_shard = None
        if shard_info is not None and shard_info.num_shards > 1:
            if len(files) >= shard_info.num_shards:
                files = files[shard_info.index :: shard_info.num_shards]
            else:
                document_shard = shard_info
        files_ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
        if shuffle:
            files_ds = files_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        max_line_bytes = int(split_files.max_line_bytes)
        if shuffle and len(files) > 1:
            return files_ds.interleave(
                lambda path: _read_paragraphs(path, max_line_bytes, document_shard).map(
                    _end_with_document_boundary
                ),
                cycle_length=min(len(files), INTERLEAVED_FILES),
                block_length=1,
            )
        return files_ds.flat_map(
            lambda path: _read_paragraphs(path, max_line_bytes, document_shard)
        )


class TfdsDocumentsSource(seqio.DataSource):
    """Documents of a TFDS dataset (one example = one document) as ``text`` entries.

    Sharding: by file where the split has at least as many files as shards, else by
    example from the files in their stored order (not shuffled), so that what a shard
    reads never depends on the seed: hosts seed their streams differently
    (``seeds.host_seed``) and must still partition the data.
    """

    def __init__(self, source: seqio.TfdsDataSource, text_feature: str = "text"):
        """Args:
        source: the TFDS data, its splits mapped to seqio's canonical names.
        text_feature: the feature holding the document text.
        """
        self.tfds_source = source
        self.text_feature = text_feature
        super().__init__(splits=tuple(source.splits))

    @property
    def supports_arbitrary_sharding(self) -> bool:
        # Handled here (see the class docstring).
        return True

    def list_shards(self, split: str) -> Sequence[str]:
        return self.tfds_source.list_shards(split)

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
        feature = self.text_feature
        by_example = (shard_info is not None and shard_info.num_shards > 1
                      and not self.tfds_source.supports_arbitrary_sharding
                      and len(self.list_shards(split)) < shard_info.num_shards)
        if by_example:
            ds = self.tfds_source.get_dataset(split=split, shuffle=False, seed=None)
            ds = ds.shard(shard_info.num_shards, shard_info.index)
        else:
            ds = self.tfds_source.get_dataset(
                split=split, shuffle=shuffle, seed=seed, shard_info=shard_info
            )
        if feature not in ds.element_spec:
            raise text_files.CorpusError(
                f"{self.tfds_source}: no text feature {feature!r}; "
                f"features are {sorted(ds.element_spec)}"
            )
        return ds.map(
            lambda ex: {"text": ex[feature], "ends_document": tf.constant(True)},
            num_parallel_calls=tf.data.AUTOTUNE,
        )
