"""Where each array of an Orbax checkpoint keeps its bytes, and one-byte flips there.

Orbax writes a checkpoint's arrays into one OCDBT database (``<step>/state/``): a b-tree
whose leaf entries map each zarr key (``params.embed.embedding/0.0`` for a chunk) to its
value, held either in a data file (an "indirect" value: file, offset, length) or, when
small, inline in the b-tree node itself (zstd-compressed with a CRC-32C). TensorStore's
public ``tensorstore.ocdbt.dump`` reads that tree, so a test can flip a byte inside a
given array's chunk instead of guessing from file contents.
"""

from __future__ import annotations

import dataclasses
import pathlib

import tensorstore as ts


@dataclasses.dataclass(frozen=True)
class Span:
    """Bytes of one array chunk: ``length`` bytes at ``offset`` of ``path``.

    ``inline``: the chunk sits inside this b-tree node (the span is the whole node), so a
    flip anywhere in it breaks the node's CRC and with it the read of every key it holds.
    """

    path: pathlib.Path
    offset: int
    length: int
    inline: bool


def _parse(root: pathlib.Path, location: str) -> tuple[pathlib.Path, int, int]:
    # "<kind>:<base>:<file>:<offset>:<length>", e.g. "value:ocdbt.process_0/:d/ab..:0:7713".
    _, base, name, offset, length = location.split(":")
    return root / base / name, int(offset), int(length)


def _children(entry: dict) -> list[str]:
    return [v for v in entry.values() if isinstance(v, str) and v.startswith("btreenode:")]


def array_spans(state_dir) -> dict[str, list[Span]]:
    """``{array name: spans of its chunks}`` of an Orbax OCDBT item (``<step>/state``).

    Array names are Orbax's (``params.embed.embedding``, ``opt_state.1.0.mu.x``), as
    :func:`xlmeta_jax.pretrain.checksums.name_of` names them.
    """
    root = pathlib.Path(state_dir)
    base = ts.KvStore.open({"driver": "file", "path": f"{root}/"}).result()
    manifest = ts.ocdbt.dump(base).result()
    out: dict[str, list[Span]] = {}
    pending = [manifest["versions"][-1]["root"]["location"]]
    while pending:
        location = pending.pop()
        node = ts.ocdbt.dump(base, location).result()
        path, offset, length = _parse(root, location)
        for entry in node["entries"]:
            pending.extend(_children(entry))
            key = entry.get("key", b"").decode()
            name, _, chunk = key.rpartition("/")
            if not name or chunk.startswith("."):  # a node reference or zarr's .zarray
                continue
            if "indirect_value" in entry:
                out.setdefault(name, []).append(Span(*_parse(root, entry["indirect_value"]),
                                                     inline=False))
            elif "inline_value" in entry:
                out.setdefault(name, []).append(Span(path, offset, length, inline=True))
    return out


def flip(span: Span, at: float = 0.5) -> bytes:
    """Flips one bit of the byte at fraction ``at`` of ``span``; returns the file as it was.

    The middle of a chunk is past its zstd frame header, among the compressed values.
    """
    data = span.path.read_bytes()
    flipped = bytearray(data)
    flipped[span.offset + min(span.length - 1, int(span.length * at))] ^= 0x10
    span.path.write_bytes(bytes(flipped))
    return data
