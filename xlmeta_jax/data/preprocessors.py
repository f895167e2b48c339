"""MLM preprocessing in the tf.data graph: tokenize, pack, mask.

The pretraining tasks run, in order::

  tokenize_documents        {"text", "ends_document"} -> {"tokens"}  (eos after each line)
  seqio.CacheDatasetPlaceholder()                      (offline cache of tokens, optional)
  pack_blocks               {"tokens"} -> {"targets": [L]}  contiguous full blocks
   or pack_documents        {"tokens"} -> + {"segment_ids", "positions"}  whole documents
  mlm_mask                  {"targets"} -> the MLM batch format (xlmeta_jax.model.mlm)
  add_language              + {"language": string}  (tasks of a language mixture)

seqio repeats the dataset between the cache placeholder and ``pack_blocks``, so
packing runs across epoch boundaries and each epoch draws new masks (dynamic
masking, as RoBERTa).

``</s>`` (eos) follows every line of text and ends every document once more, as in
fairseq's binarised data, where each line of the raw text (a blank line between
documents included) is encoded with ``</s>`` appended: a document of lines ``a, b``
is ``a </s> b </s> </s>``. ``Corpora.eos_after='document'`` instead puts one
``</s>`` after each document only (``a b </s>``). TFDS documents are cut into lines
at ``\n`` (blank lines dropped) for the per-line form.

Packing: documents (each ending in ``eos``) are concatenated and cut into blocks
of ``L - 1`` tokens, each prefixed with ``<s>``; every block is full, none is
padded, and the cut falls wherever ``L - 1`` tokens end: mid-sentence and
mid-document (fairseq's ``--sample-break-mode none``). RoBERTa's FULL-SENTENCES
and XLM-R instead fill a block with whole sentences, across documents, and leave
the rest of the block empty (``complete``): their blocks never begin or end
mid-sentence, ours do, and ours have no padding.

Masking (:class:`xlmeta_jax.model.mlm.Masking`, default 15% and 80/10/10), per block
of length L with ``n`` candidate positions (every id but the vocabulary's reserved ones,
``SpecialIds.never_masked``: in ours ``<pad>``, ``</s>``, ``<unk>``, ``<s>`` and
``<mask>``, in a Hugging Face tokenizer every special or added token — ``<unk>`` because
it carries nothing to predict): select exactly
``floor(rate * n + u)``, ``u ~ U[0, 1)`` positions uniformly (fairseq's
probabilistic rounding, so the expected rate is exactly ``rate``) into
``mlm.max_predictions(L, rate)`` slots; of those, 80% become ``<mask>``, 10% an id drawn
uniformly from the non-reserved ones, 10% stay. All draws
are stateless, seeded per block from the pipeline seed (seqio's map seeds), the
task and the block's place in the stream: deterministic for a seed, different
every epoch.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

from xlmeta_jax.data import seqio_vocabularies, special_ids
from xlmeta_jax.data.special_ids import SpecialIds
from xlmeta_jax.model import mlm

# Documents tokenized per SentencePiece call (sources of one document per element).
_TOKENIZE_BATCH = 64
# Lines tokenized per SentencePiece call when TFDS documents are cut into lines.
_TOKENIZE_LINES = 256

# Token runs concatenated per packing step.
_PACK_BATCH = 16

# The graph functions below have no Python control flow on tensors; skipping
# autograph's source conversion makes building 100 language pipelines faster.
_no_autograph = tf.autograph.experimental.do_not_convert

def block_length(sequence_length: Mapping[str, int] | None) -> int:
    """L from seqio's ``sequence_length`` ({"inputs": L, "targets": L})."""
    if not sequence_length or not sequence_length.get("inputs"):
        raise ValueError(
            "the MLM tasks need sequence_length={'inputs': L, 'targets': L}, got "
            f"{sequence_length!r}"
        )
    length = int(sequence_length["inputs"])
    if sequence_length.get("targets") not in (None, length):
        raise ValueError(f"inputs and targets lengths must be equal, got {sequence_length!r}")
    if length < mlm.MIN_SEQUENCE_LENGTH:
        raise ValueError(
            f"block length must be at least {mlm.MIN_SEQUENCE_LENGTH} tokens, got {length}")
    return length


def tokenize_documents(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, seqio.Feature],
    eos_after: str = "line",
) -> tf.data.Dataset:
    """``{"text", "ends_document"}`` -> ``{"tokens": int32[n]}``, with ``eos`` as configured.

    Each output element is a contiguous run of the corpus' token stream: one
    batch of lines or documents (TFDS sources, which yield one document per
    element, are tokenized _TOKENIZE_BATCH documents or _TOKENIZE_LINES lines per
    call) or one batch of paragraphs (text files).

    Args:
      dataset: the source's elements (``text`` and ``ends_document``, scalars or vectors;
        an entry ``("", True)`` marks the end of a document).
      output_features: the task's features (the ``targets`` vocabulary encodes).
      eos_after: ``'line'`` (fairseq): ``eos`` after every entry, so after each line and
        once more at each document's end; ``'document'``: only after each document
        (checked where the task's config is built: ``Corpora``).
    """
    vocab = output_features["targets"].vocabulary
    sep = special_ids.of(vocab).sep
    if dataset.element_spec["text"].shape.rank == 0:
        if eos_after == "line":
            dataset = dataset.map(_document_lines, num_parallel_calls=tf.data.AUTOTUNE)
            dataset = dataset.unbatch().batch(_TOKENIZE_LINES)
        else:
            dataset = dataset.batch(_TOKENIZE_BATCH)

    @_no_autograph
    def tokenize(batch):
        pieces = tf.cast(vocab.encode_tf(batch["text"]), tf.int32)
        ends = batch["ends_document"]
        if eos_after == "line":
            ends = tf.ones_like(ends)
        eos = tf.where(ends, sep, -1)[:, None]
        eos = tf.RaggedTensor.from_tensor(eos, padding=-1)
        return {"tokens": tf.concat([pieces, eos], axis=1).flat_values}

    ds = dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.filter(lambda ex: tf.size(ex["tokens"]) > 0)


# Text-file entries per tokenizer call in :func:`tokenize_entries`.
_ENTRIES_PER_CALL = 4096


def tokenize_entries(entries: Iterable[str | None], vocab, eos_after: str = "line",
                     batch: int = _ENTRIES_PER_CALL) -> Iterator[np.ndarray]:
    """:func:`tokenize_documents` of a text-file source's entries, in Python.

    The token cache job's tokenize step for text files (:mod:`xlmeta_jax.data.token_cache`,
    with :func:`xlmeta_jax.data.text_files.iter_entries`): the same token stream, ids and
    ``eos`` where the tf.data step puts them, cut into runs at other places (one run per
    ``batch`` entries; the cache joins a file's runs). tests/test_data_pipeline.py holds it
    to the tf.data step in both conventions and both kinds of vocabulary.

    Args:
      entries: a paragraph's text, or None where a document ends.
      vocab: the task's vocabulary (its ``encode_batch``: ids without special tokens).
      eos_after: as :func:`tokenize_documents`.
      batch: entries per tokenizer call.

    Yields:
      int32 runs of the token stream, none empty.
    """
    seqio_vocabularies.one_tokenizer_thread()
    sep = special_ids.of(vocab).sep
    entries = iter(entries)
    while chunk := list(itertools.islice(entries, batch)):
        texts = [e for e in chunk if e is not None]
        # An eos goes after the first ``k`` texts' ids for each ``k`` listed: after every
        # text and at every document end ('line'), or at document ends only.
        eos_at, k = [], 0
        for entry in chunk:
            if entry is None:
                eos_at.append(k)
            else:
                k += 1
                if eos_after == "line":
                    eos_at.append(k)
        ids = vocab.encode_batch(texts) if texts else []
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        values = np.fromiter(itertools.chain.from_iterable(ids), np.int32,
                             count=int(lengths.sum()))
        ends = np.concatenate([[0], np.cumsum(lengths)])[eos_at]
        run = np.insert(values, ends, np.int32(sep))
        if run.size:
            yield run


@_no_autograph
def _document_lines(ex):
    """One TFDS document as its non-blank lines and the ``("", True)`` that ends it."""
    lines = tf.strings.split(ex["text"], "\n")
    lines = tf.boolean_mask(lines, tf.strings.length(tf.strings.strip(lines)) > 0)
    n = tf.size(lines)
    return {
        "text": tf.concat([lines, [""]], axis=0),
        "ends_document": tf.concat([tf.zeros([n], tf.bool), [True]], axis=0),
    }


def _cut_stream(dataset: tf.data.Dataset, cut) -> tf.data.Dataset:
    """The token stream of ``dataset``'s runs, cut by ``cut(buffer) -> (rest, pieces)``:
    each step appends the next runs to what the last left and yields its pieces."""
    # Several runs per step: cached documents can be short.
    ds = dataset.map(lambda ex: ex["tokens"]).ragged_batch(_PACK_BATCH)
    ds = ds.map(lambda r: r.flat_values)

    @_no_autograph
    def step(carry, chunk):
        return cut(tf.concat([carry, chunk], axis=0))

    return ds.scan(tf.zeros([0], tf.int32), step)


def pack_blocks(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
) -> tf.data.Dataset:
    """Concatenates token runs into full blocks ``[<s>, L-1 tokens]`` (``targets``).

    Blocks are cut every ``L - 1`` tokens, mid-sentence where that falls (see the
    module docstring for how this differs from XLM-R's whole-sentence packing). Each
    starts with the vocabulary's ``cls`` (``<s>``, ``[CLS]``, ``<bos>``).
    """
    cls = special_ids.of(output_features["targets"].vocabulary).cls
    length = block_length(sequence_length)
    body = length - 1

    def step(buf):
        n = tf.shape(buf)[0] // body
        return buf[n * body :], tf.reshape(buf[: n * body], [n, body])

    ds = _cut_stream(dataset, step).unbatch()
    return ds.map(
        lambda b: {"targets": tf.ensure_shape(tf.concat([[cls], b], 0), [length])},
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def pack_documents(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
) -> tf.data.Dataset:
    """Packs whole documents into rows: ``targets``, ``segment_ids``, ``positions`` [L].

    The token stream (one ``</s>`` ending each document: ``eos_after='document'``) is
    split at document ends; each document becomes ``[<s>, its tokens, </s>]`` and
    seqio's packer (``seqio.utils.trim_and_pack_dataset``) fills rows with whole
    documents, each its own segment (1, 2, ...), positions counting from 0 in each, and
    pads the rest of a row with the vocabulary's pad id (segment 0). A document longer
    than ``L - 1`` tokens is cut into pieces of ``L - 1`` tokens, each with its own
    ``<s>`` and segment: no text is dropped, the pieces do not see each other. ``<s>``
    and ``</s>`` are the vocabulary's ``cls`` and ``sep``.
    """
    specials = special_ids.of(output_features["targets"].vocabulary)
    cls, sep, pad = specials.cls, specials.sep, specials.pad
    length = block_length(sequence_length)
    body = length - 1

    def split(buf):
        ends = tf.cast(tf.where(tf.equal(buf, sep))[:, 0], tf.int32)
        done = tf.reduce_max(tf.concat([[-1], ends], 0)) + 1  # tokens of whole documents
        starts = tf.concat([[0], ends[:-1] + 1], 0)[: tf.size(ends)]
        docs = tf.RaggedTensor.from_row_lengths(buf[:done], ends + 1 - starts)
        # Pieces of at most `body` tokens: a long document's cut into several.
        sizes = docs.row_lengths()
        pieces = (sizes + body - 1) // body
        offsets = tf.ragged.range(pieces) * body
        piece_sizes = tf.minimum(body, tf.repeat(sizes, pieces) - offsets.flat_values)
        return buf[done:], tf.RaggedTensor.from_row_lengths(docs.flat_values, piece_sizes)

    ds = _cut_stream(dataset, split).flat_map(tf.data.Dataset.from_tensor_slices)
    ds = ds.map(lambda piece: {"targets": tf.concat([[cls], piece], 0)},
                num_parallel_calls=tf.data.AUTOTUNE)
    packed = seqio.utils.trim_and_pack_dataset(ds, {"targets": length})

    def named(ex):
        # seqio's packer pads with 0, an ordinary token in some tokenizers (ModernBERT's
        # 0 is "|||IP_ADDRESS|||"): padding gets the vocabulary's pad id.
        targets = ex["targets"] if pad == 0 else tf.where(
            ex["targets_segment_ids"] > 0, ex["targets"], pad)
        return {"targets": targets, "segment_ids": ex["targets_segment_ids"],
                "positions": ex["targets_positions"]}

    return packed.map(named, num_parallel_calls=tf.data.AUTOTUNE)


def task_salt(name: str) -> int:
    """A stable int32 per task, folded into its masking seeds.

    seqio hands every task of a mixture the same seed stream; without the salt,
    blocks at the same place in two languages' streams would share their masks.
    """
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@_no_autograph
def mask_block(
    targets: tf.Tensor,
    seed: tf.Tensor,
    *,
    specials: SpecialIds,
    masking: mlm.Masking = mlm.DEFAULT_MASKING,
) -> dict[str, tf.Tensor]:
    """Masks one block; returns the MLM features (see the module docstring).

    Args:
      targets: int32 [L] original tokens.
      seed: int [2] stateless seed.
      specials: the vocabulary's ids: its reserved ids are never selected, random
        replacements are drawn uniformly from the others, masked positions get ``mask``.
      masking: the rate and the 80/10/10 shares; the ``mlm_*`` features have
        ``mlm.max_predictions(L, masking.rate)`` slots.
    """
    length = targets.shape[0]
    num_slots = mlm.max_predictions(length, masking.rate)
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    # Tables rather than a comparison: a tokenizer's reserved ids need not be a prefix.
    # (Drawing an index into the replacement ids is the same draw, id for id, as drawing
    # from [5, size) when they are seqio's 5..size-1.)
    replacements = specials.replacement_ids()
    candidates = tf.gather(tf.constant(specials.is_candidate()), targets)
    n_candidates = tf.reduce_sum(tf.cast(candidates, tf.float32))
    u = tf.random.stateless_uniform([], seed=seeds[0])
    k = tf.cast(tf.floor(masking.rate * n_candidates + u), tf.int32)
    k = tf.minimum(k, num_slots)
    # Random order of the candidates first; specials sort last.
    scores = tf.random.stateless_uniform([length], seed=seeds[1])
    scores = tf.where(candidates, scores, 2.0)
    order = tf.argsort(scores, stable=True)[:num_slots]
    used = tf.range(num_slots) < k
    positions = tf.sort(tf.where(used, order, length))
    used = positions < length
    positions = tf.where(used, positions, 0)
    mlm_targets = tf.where(used, tf.gather(targets, positions), 0)
    action = tf.random.stateless_uniform([num_slots], seed=seeds[2])
    random_tokens = tf.gather(tf.constant(replacements), tf.random.stateless_uniform(
        [num_slots], seed=seeds[3], minval=0, maxval=len(replacements), dtype=tf.int32))
    new_tokens = tf.where(
        action < masking.mask_token_share,
        specials.mask,
        tf.where(
            action < masking.mask_token_share + masking.random_token_share,
            random_tokens,
            mlm_targets,
        ),
    )
    index = tf.boolean_mask(positions, used)[:, None]
    inputs = tf.tensor_scatter_nd_update(targets, index, tf.boolean_mask(new_tokens, used))
    weights = tf.scatter_nd(index, tf.ones_like(index[:, 0], tf.float32), [length])
    return {
        "inputs": inputs,
        "targets": targets,
        "weights": weights,
        "mlm_positions": tf.cast(positions, tf.int32),
        "mlm_targets": mlm_targets,
        "mlm_weights": tf.cast(used, tf.float32),
    }


def mlm_mask(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    salt: int = 0,
    masking: mlm.Masking = mlm.DEFAULT_MASKING,
) -> tf.data.Dataset:
    """Dynamic masking of packed blocks (seeds from seqio's map seed manager)."""
    block_length(sequence_length)  # checks it
    specials = special_ids.of(output_features["targets"].vocabulary)
    if not specials.replacement_ids().size:
        raise ValueError(f"vocabulary of {specials.size} ids has no non-special token")

    packed = tuple(k for k in mlm.PACKED_FEATURES if k in dataset.element_spec)

    @seqio.map_over_dataset(num_seeds=1)
    def mask(ex, seed):
        seed = tf.random.experimental.stateless_fold_in(tf.stack(seed), salt)
        # Padding (0) and the other special ids are never candidates.
        return {**mask_block(ex["targets"], seed, specials=specials, masking=masking),
                **{k: ex[k] for k in packed}}

    return mask(dataset)


def add_language(dataset: tf.data.Dataset, language: str) -> tf.data.Dataset:
    """Adds the block's language code (``language``, a string) for inspecting a mix.

    seqio's ``Mixture.get_dataset`` drops it unless asked for with
    ``passthrough_features=["language"]``; the feeder never sends it.
    """
    return dataset.map(lambda ex: {**ex, "language": tf.constant(language)})
