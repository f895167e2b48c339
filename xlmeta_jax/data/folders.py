"""Files and folders on any file system Beam reads (local, ``gs://``, ...), for prepare.

Local paths use ``os`` directly; other schemes go through ``apache_beam``'s
``FileSystems``. :func:`swap` replaces a folder's entries with a new set as a series of
renames that it undoes on any failure, Ctrl-C included: prepare's ``--overwrite`` never
leaves the old folder half-removed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from xlmeta_jax.data import prepared


def fs():
    """Beam's ``FileSystems`` (every scheme Beam reads)."""
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415 - the beam extra

    return FileSystems


def join(folder: str, *names: str) -> str:
    """``os.path.join`` here, Beam's join on other file systems."""
    return fs().join(folder, *names) if "://" in folder else os.path.join(folder, *names)


def open_read(path: str):
    """A binary reader of ``path`` as stored (no decompression)."""
    from apache_beam.io.filesystem import CompressionTypes  # noqa: PLC0415 - the beam extra

    return fs().open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def open_write(path: str):
    """A binary writer of ``path`` as stored (no compression)."""
    from apache_beam.io.filesystem import CompressionTypes  # noqa: PLC0415 - the beam extra

    return fs().create(path, compression_type=CompressionTypes.UNCOMPRESSED)


def write_text(path: str, text: str) -> None:
    """Writes ``path`` whole: through a temporary name renamed over it."""
    tmp = f"{path}.tmp"
    with open_write(tmp) as f:
        f.write(text.encode("utf-8"))
    if fs().exists(path):
        fs().delete([path])
    fs().rename([tmp], [path])


def mkdirs(path: str) -> None:
    """Makes ``path`` and its parents where missing."""
    if "://" not in path:
        os.makedirs(path, exist_ok=True)
    elif not fs().exists(path):
        fs().mkdirs(path)


def entries(folder: str) -> list[str]:
    """Names directly inside ``folder`` (empty when it does not exist)."""
    if "://" not in folder:
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    prefix = folder.rstrip("/") + "/"
    found = fs().match([prefix + "**"])[0].metadata_list
    return sorted({m.path[len(prefix):].split("/")[0] for m in found})


def remove(folder: str, names: Sequence[str]) -> None:
    """Removes ``names`` (files or folders, whole) from ``folder``; missing ones are skipped."""
    for name in names:
        path = join(folder, name)
        if "://" not in path:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
        else:
            found = {m.path for result in fs().match([path, path + "/**"])
                     for m in result.metadata_list}
            if found:
                fs().delete(sorted(found))


def exists(path: str) -> bool:
    """Whether ``path`` is a file, a folder or a link (on object stores: a prefix)."""
    if "://" not in path:
        return os.path.lexists(path)
    return fs().exists(path) or bool(fs().match([path + "/**"])[0].metadata_list)


def move(src: str, dst: str) -> None:
    """Renames a file or folder: one rename here, each object's on other file systems."""
    if "://" not in src:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
        return
    found = sorted({m.path for result in fs().match([src, src + "/**"])
                    for m in result.metadata_list})
    fs().rename(found, [dst + path[len(src):] for path in found])


def remove_folder(path: str) -> None:
    """Removes the folder ``path`` whole (nothing where it does not exist)."""
    parent, name = path.rstrip("/").rsplit("/", 1)
    remove(parent, [name])


def _completed_first(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda n: (n != prepared.COMPLETED, n))


def swap(outgoing: Sequence[tuple[str, str]], incoming: Sequence[tuple[str, str]]) -> None:
    """Moves ``outgoing`` aside, then ``incoming`` in, each (source, destination) in order.

    On any failure, Ctrl-C included, every move made is undone in reverse order, so the
    destination folder is as it was. Sources that do not exist are skipped.
    """
    done = []
    try:
        for src, dst in [*outgoing, *incoming]:
            if exists(src):
                move(src, dst)
                done.append((src, dst))
    except BaseException:
        for src, dst in reversed(done):
            move(dst, src)
        raise


def replace(target: str, outgoing: Sequence[str], new: str, aside: str) -> None:
    """Replaces ``outgoing`` (entries of ``target``) with every entry of the complete folder
    ``new``, through ``aside``; ``new`` is removed in any case.

    ``COMPLETED`` leaves ``target`` first (readers stop trusting the old entries) and comes
    in last (they trust the new ones only once all are in place). On any failure, Ctrl-C
    included, the moves are undone (:func:`swap`) and ``aside`` is removed only where the
    undo emptied it: whatever could not be moved back stays there for the user.
    """
    try:
        swap([(join(target, n), join(aside, n)) for n in _completed_first(outgoing)],
             [(join(new, n), join(target, n))
              for n in reversed(_completed_first(entries(new)))])
    except BaseException:
        if not entries(aside):
            remove_folder(aside)
        raise
    finally:
        remove_folder(new)
    remove_folder(aside)
