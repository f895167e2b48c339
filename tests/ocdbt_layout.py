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

import jax
import orbax.checkpoint as ocp
import tensorstore as ts

from xlmeta_jax.errors import CheckpointError


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


def nested(flat: dict) -> dict:
    """``{name: array}`` back into ``{entry: {rest of name: array}}`` for checksums.damaged."""
    out: dict = {}
    for name, x in flat.items():
        entry, _, rest = name.partition(".")
        if rest:
            out.setdefault(entry, {})[rest] = x
        else:  # a top-level array (the step) stays one: its name is the entry's
            out[entry] = x
    return out


def restore_targets(step_dir) -> dict:
    """Every entry of a checkpoint's state as restore targets on the first device.

    ``{entry: pytree of ShapeDtypeStructs}`` for ``checkpoints.restore_items``: the whole
    state (parameters, optimizer state, step), as a resumed run reads it.
    """
    meta = ocp.PyTreeCheckpointer().metadata(pathlib.Path(step_dir, "state"))
    tree = dict(getattr(getattr(meta, "item_metadata", meta), "tree", meta))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        tree, is_leaf=lambda x: hasattr(x, "shape"))


def flip(span: Span, at: float = 0.5) -> bytes:
    """Flips one bit of the byte at fraction ``at`` of ``span``; returns the file as it was.

    The middle of a chunk is past its zstd frame header, among the compressed values.
    """
    data = span.path.read_bytes()
    flipped = bytearray(data)
    flipped[span.offset + min(span.length - 1, int(span.length * at))] ^= 0x10
    span.path.write_bytes(bytes(flipped))
    return data


def flip_each_array(step_dir, read) -> dict[str, str | None]:
    """Flips one byte of each array of ``step_dir`` in turn, calling ``read`` each time.

    An array kept in a data file gets its byte in the middle of its (first) chunk, and
    further in while ``read`` accepts the flip (a flip can land where the decoder does not
    look); an array inline in a b-tree node gets its byte in that node, at its own place
    (the inline arrays of a node are spread over it). The file is restored after each read.

    Args:
      step_dir: ``<step>`` with its ``state/`` item.
      read: reads and checks every array of the checkpoint; raises CheckpointError.

    Returns:
      ``{array name: the refusal's message, or None when every flip was accepted}``.
    """
    spans = array_spans(pathlib.Path(step_dir, "state"))
    inline = sorted(name for name, [span, *_] in spans.items() if span.inline)
    outcomes: dict[str, str | None] = {}
    for name, [span, *_] in sorted(spans.items()):
        places = ([(inline.index(name) + 0.5) / len(inline)] if span.inline
                  else [0.5, 0.6, 0.7, 0.8, 0.9])
        outcomes[name] = None
        for at in places:
            data = flip(span, at)
            try:
                read()
            except CheckpointError as e:
                outcomes[name] = str(e)
                break
            finally:
                span.path.write_bytes(data)
    return outcomes


def assert_each_flip_refused(step_dir, outcomes: dict[str, str | None], kinds) -> None:
    """Every array's flip was refused in one line naming the checkpoint: by our checksum
    naming the array, or (chunk or node not decodable) as damaged; ``kinds`` are name
    prefixes that must all occur (parameters, both AdamW moments, step counters)."""
    for kind in kinds:
        assert any(n.startswith(kind) for n in outcomes), (kind, sorted(outcomes))
    accepted = sorted(n for n, line in outcomes.items() if line is None)
    assert not accepted, f"flips accepted silently: {accepted}"
    for name, line in outcomes.items():
        assert "\n" not in line and f"checkpoint {step_dir} " in line, (name, line)
        assert (f"is damaged: array {name} differs" in line
                or "is damaged or incomplete (its array " in line), (
            name, line)
