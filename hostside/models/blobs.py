"""Verified archives kept by their SHA256, so that this host can serve them to its peers.

The version store keeps what an archive unpacks to, not the archive: once unpacked, the download
is deleted. A peer must serve exactly the bytes whose SHA256 the fleet file declares, so an
install asked to (``fetch_model.py install … --keep-blob``) keeps them beside the store::

    <models-dir>/.blobs/          (0755)
    <models-dir>/.blobs/<sha256>  (0644) the verified archive or single file, named by its digest

A blob is written only after its digest matched, and appears in one rename (or one hard link):
a blob name is a promise about its content. What it costs on disk:

- an archive: the verified download is *moved* here instead of deleted, so one more archive's
  size (about the model's size: weights barely compress) while the blob is kept;
- a single file (``.gguf``, ``unpack: false``): a hard link to the version's file, no extra
  bytes; the space is freed only once both the version and the blob are gone.

Blobs stay until they are dropped explicitly (``fetch_model.py drop-blobs``; ``remove`` drops
the blobs of the versions it removes): the deploy that distributes a model keeps them for the
fan-out and drops them after. Names are content addresses, so two models with the same bytes
share one blob.

Example:
    >>> blob_path(Path("/m"), "ab" * 32).as_posix()
    '/m/.blobs/abababababababababababababababababababababababababababababababab'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from hostside.models import common
from hostside.models.common import FetchError, human_bytes, say
from hostside.models.transport import hash_file

#: The folder of kept blobs under the models directory.
BLOBS = ".blobs"
#: A blob's name: a whole SHA256 in lower-case hex, nothing else.
BLOB_NAME = r"[0-9a-f]{64}"


def blobs_dir(models_dir: Path) -> Path:
    """The folder of kept blobs.

    >>> blobs_dir(Path("/var/lib/vllm-fleet/models")).as_posix()
    '/var/lib/vllm-fleet/models/.blobs'
    """
    return models_dir / BLOBS


def blob_path(models_dir: Path, sha256: str) -> Path:
    """The path of the blob of ``sha256`` (refused unless it is 64 lower-case hex digits).

    >>> blob_path(Path("/m"), "../etc/passwd")
    Traceback (most recent call last):
    ...
    ValueError: a blob is named by a 64-hex sha256, not '../etc/passwd'
    """
    if not re.fullmatch(BLOB_NAME, sha256):
        raise ValueError(f"a blob is named by a 64-hex sha256, not {sha256!r}")
    return blobs_dir(models_dir) / sha256


def _prepare(models_dir: Path) -> Path:
    folder = blobs_dir(models_dir)
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    return folder


def keep_moved(models_dir: Path, verified: Path, sha256: str) -> Path:
    """Move a verified download (whose digest the caller has just matched) into the blobs.

    Made durable first (``fsync``) when the installer is: a torn blob would be served.
    """
    target = blob_path(models_dir, sha256)
    folder = _prepare(models_dir)
    if common.DURABLE:
        fd = os.open(verified, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.chmod(verified, 0o644)
    os.replace(verified, target)
    common.fsync_dir(folder)
    return target


def keep_linked(models_dir: Path, verified: Path, sha256: str) -> Path:
    """Hard-link a verified file of a version as the blob of ``sha256`` (no extra bytes)."""
    target = blob_path(models_dir, sha256)
    folder = _prepare(models_dir)
    temporary = folder / f".{sha256}.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    os.link(verified, temporary)
    os.replace(temporary, target)
    common.fsync_dir(folder)
    return target


def keep_from_version(models_dir: Path, version: Path, manifest: dict[str, Any]) -> str:
    """Keep the blob of an installed version that has none yet; say what happened.

    A single-file version holds the pinned bytes: its file is re-hashed, then linked. An
    unpacked archive does not: the archive is gone, and this host cannot serve the model until
    it is fetched again with ``--keep-blob``.
    """
    sha256 = str(manifest.get("sha256") or "")
    if not re.fullmatch(BLOB_NAME, sha256):
        return f"{version.name} has no sha256 pin (a Hugging Face snapshot): no blob to keep"
    if blob_path(models_dir, sha256).is_file():
        return f"{version.name}: its blob is already kept"
    files = manifest.get("files", {})
    single = [name for name, meta in files.items() if meta.get("sha256") == sha256]
    if len(files) != 1 or not single:
        return (f"{version.name} was unpacked from an archive that was not kept: this host "
                "cannot serve it to peers until it is fetched again with --keep-blob")
    path = version / single[0]
    digest = hashlib.sha256()
    hash_file(path, [digest])
    if digest.hexdigest() != sha256:
        return f"{version.name}: {single[0]} no longer matches its sha256: no blob kept"
    keep_linked(models_dir, path, sha256)
    return f"{version.name}: kept its file as blob {sha256[:16]} (a hard link, no extra bytes)"


def listing(models_dir: Path) -> list[dict[str, Any]]:
    """The kept blobs: digest, bytes, links (2 or more: shared with a version's file).

    Anything in the folder that is not a regular file named by a digest is left out.
    """
    folder = blobs_dir(models_dir)
    found = []
    if folder.is_dir():
        for entry in sorted(folder.iterdir()):
            if not re.fullmatch(BLOB_NAME, entry.name):
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(entry)
                if stat.S_ISREG(st.st_mode):
                    found.append({"sha256": entry.name, "bytes": st.st_size,
                                  "links": st.st_nlink})
    return found


def drop(models_dir: Path, digests: list[str] | None) -> str:
    """Remove the named blobs (every blob when ``digests`` is None); say what went.

    A peer server still sending one keeps its open file until the transfer ends.
    """
    if digests is not None:
        for digest in digests:
            blob_path(models_dir, digest)  # refuses anything that is not a digest
    kept = listing(models_dir)
    chosen = [b for b in kept if digests is None or b["sha256"] in digests]
    missing = sorted(set(digests or []) - {b["sha256"] for b in kept})
    if missing:
        say(f"no blob {', '.join(d[:16] for d in missing)} is kept; nothing to drop for it")
    for blob in chosen:
        try:
            blob_path(models_dir, blob["sha256"]).unlink()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise FetchError(f"cannot drop blob {blob['sha256'][:16]}: {err}") from None
    freed = sum(b["bytes"] for b in chosen if b["links"] == 1)
    return (f"dropped {len(chosen)} blob{'s' if len(chosen) != 1 else ''} "
            f"({human_bytes(freed)} freed)")
