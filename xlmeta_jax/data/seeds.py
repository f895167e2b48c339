"""The seeds of a run's randomness: which streams are shared and which are independent.

One run seed (gin: ``train.seed``, t5x's ``SEED``) gives every stream its own seed:

* **A phase's data and dropout** come from ``(run seed, data source, occurrence)``
  (:func:`phase_seed`): the source is the phase's task or mixture, the occurrence how
  many earlier phases of the run read it. So two arms that read the same source from
  its start get the same stream, masks and dropout — meta-pretraining's phase 2 and a
  run that trains on the mixture alone are paired, and the comparison isolates
  phase 1 — while a run's phases never replay each other's streams.
* **Each host's data** folds its shard index in (:func:`host_seed`): mixture sampling,
  masking and shuffling differ between hosts, so a global batch of H hosts holds H
  independent draws. Which documents a host reads does not depend on the seed (the
  sources split files or documents by the shard index alone), so the hosts still
  partition the data.
* Parameter initialisation keeps the run seed itself: every arm of a seed starts from
  the same parameters.
* **A phase resumed on another process count** (``train.new_process_count='reseed'``)
  cannot continue its hosts' streams, which are one per process: every host restarts
  from :func:`reseeded`, a seed of (phase seed, step, process count), so the new
  streams repeat neither the old ones nor those of another resume.
"""

from __future__ import annotations

import hashlib

_MASK = 0x7FFFFFFF


def _derive(*parts) -> int:
    """A 31-bit seed from ``parts`` (stable across processes, machines and releases)."""
    text = "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & _MASK


def phase_seed(seed: int, source: str, occurrence: int = 0) -> int:
    """The seed of a phase's data stream and dropout.

    Args:
      seed: the run seed.
      source: the phase's seqio task or mixture (or ``'synthetic'``).
      occurrence: how many earlier phases of the run read ``source``.
    """
    return _derive("phase", int(seed), source, int(occurrence))


def occurrences(sources) -> list[int]:
    """For each source of a run's phases, in order, how many earlier phases read it."""
    seen: dict[str, int] = {}
    out = []
    for source in sources:
        out.append(seen.get(source, 0))
        seen[source] = out[-1] + 1
    return out


def phase_seeds(sources, seed: int) -> list[int]:
    """:func:`phase_seed` of each phase of a run, given the phases' sources in order."""
    sources = list(sources)
    return [phase_seed(seed, s, n) for s, n in zip(sources, occurrences(sources))]


def host_seed(seed: int, shard_index: int) -> int:
    """The data seed of one host (input shard) of a stream seeded ``seed``."""
    return _derive("host", int(seed), int(shard_index))


def reseeded(phase_seed_: int, step: int, process_count: int) -> int:
    """The stream seed of a phase resumed at ``step`` on ``process_count`` processes,
    after it ran on another count (the old streams cannot continue)."""
    return _derive("reseed", int(phase_seed_), int(step), int(process_count))
