"""What every concern of the model installer shares: its error, status lines, units, settings.

The installer (:mod:`hostside.fetch_model`, its command line) is split by concern into this
package, so that each part can be read and tested alone: :mod:`.transport` (streaming, hashing,
resumable downloads), :mod:`.archive` (safe unpacking), :mod:`.store` (the version store:
layout, manifest, switch, check, rollback, prune, remove, and the one install shape),
:mod:`.sources` (url and file), :mod:`.peers` (peers before the origin), :mod:`.blobs` (archives
kept for peers) and :mod:`.huggingface` (hf). Arrows: sources → peers, blobs, store, archive,
transport → common; nothing here imports the command line.

Example:
    >>> human_bytes(3 * 2**30 + 2**29)
    '3.50 GiB'
"""

from __future__ import annotations

import os
from pathlib import Path

#: Bytes read, hashed and written at a time.
CHUNK = 4 << 20
#: Buffers in flight between the reader, the hashing and the writing thread.
DEPTH = 8
#: What a model name may be (the fleet file allows no more).
NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,62}"
#: Flush files to disk before the live link switches (``--no-fsync`` turns it off).
DURABLE = True


class FetchError(Exception):
    """A failure a person can act on; the version being served is untouched."""


class DiskFull(FetchError):
    """The disk filled up; what was verified is kept for the next attempt."""



def human_bytes(count: float) -> str:
    """Bytes for people, in binary units.

    >>> human_bytes(512), human_bytes(1536), human_bytes(5 * 2**40)
    ('512 B', '1.50 KiB', '5.00 TiB')
    """
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def human_seconds(seconds: float) -> str:
    """A duration for an ETA.

    >>> human_seconds(42), human_seconds(125), human_seconds(7300)
    ('42 s', '2 min 5 s', '2 h 1 min')
    """
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def say(text: str) -> None:
    """One progress or status line on stdout, flushed (pyinfra streams it per host)."""
    print(text, flush=True)


def free_bytes(path: Path) -> int:
    """Bytes available to unprivileged writers on the filesystem of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fsync_dir(path: Path) -> None:
    """Make a folder's entries durable (a rename or link in it) when the installer is
    (:data:`DURABLE`); nothing otherwise."""
    if not DURABLE:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
