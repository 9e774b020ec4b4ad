"""Where a version comes from: an HTTP(S) URL or a file pushed to the host (``--url``, ``--file``).

Each source fetches into staging and hands :func:`hostside.models.store.install` a
:class:`~hostside.models.store.Staged` version; the store reuses, switches and prunes. A URL
may come from peers first (:mod:`hostside.models.peers`), and with ``keep_blob`` the verified
archive is kept for peers (:mod:`hostside.models.blobs`) instead of deleted. The
Hugging Face source, the one that needs a library (``huggingface_hub``), is
:mod:`hostside.models.huggingface`.

Example:
    >>> file_name("https://h/x/model-q4.gguf?download=1")
    'model-q4.gguf'
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostside.models import blobs, common
from hostside.models.archive import strip_top, unpack
from hostside.models.common import DiskFull, FetchError, free_bytes, human_bytes, say
from hostside.models.peers import Source, download_first
from hostside.models.store import Layout, Staged, install, read_manifest
from hostside.models.transport import hash_file


def file_name(source: str) -> str:
    """The name a single-file download gets inside its version directory.

    >>> file_name("https://h/x/model-q4.gguf?download=1")
    'model-q4.gguf'
    >>> file_name("/srv/weights/../odd name!.bin")
    'odd_name_.bin'
    """
    path = source.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.rsplit("/", 1)[-1]).lstrip(".")
    return name or "model"



def _staging_dir(layout: Layout, ident: str, kind: str) -> Path:
    path = layout.staging / f"{layout.name}-{ident[:16]}.{kind}"
    if path.exists() or path.is_symlink():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return path


def _unpack_into_version(
    layout: Layout, archive: Path, ident: str, progress_every: float, digest: Any = None
) -> tuple[Path, dict[str, Any], dict[str, str], Path]:
    work = _staging_dir(layout, ident, "d")
    try:
        unpacked = unpack(archive, work, progress_every, layout.name, digest)
    except OSError as err:
        shutil.rmtree(work, ignore_errors=True)
        if err.errno == errno.ENOSPC:
            raise DiskFull(
                f"the disk filled up while unpacking {layout.name} into {layout.staging} "
                f"({human_bytes(free_bytes(layout.staging))} free now); the unpacked files were "
                "removed and the previous model keeps serving. The verified download is kept "
                f"({human_bytes(archive.stat().st_size)}), so the next deploy does not fetch it "
                "again. Free space (or lower keep), then deploy again"
            ) from None
        raise FetchError(f"cannot unpack {layout.name}: {err}") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    root, files, links = strip_top(unpacked)
    return root, files, links, work


def install_url(
    layout: Layout,
    sources: list[Source],
    sha256: str,
    keep: int,
    unpack_it: bool,
    name_in_version: str,
    *,
    retry_wait: float,
    progress_every: float,
    deep: bool = False,
    keep_blob: bool = False,
) -> str:
    """Download (resumable) from the first source that delivers (peers, then the origin:
    the last of ``sources``), verify, unpack or place, and switch; return a summary."""
    origin = sources[-1].url

    def fetch() -> Staged:
        partial = layout.staging / f"{layout.name}-{sha256[:16]}.partial"
        state = partial.with_name(partial.name + ".json")
        size, source = download_first(
            layout.name, sources, partial, sha256, retry_wait=retry_wait,
            progress_every=progress_every,
            need_extra=(lambda total: total) if unpack_it else (lambda total: 0),
            durable=common.DURABLE and not unpack_it,
        )  # fmt: skip

        def cleanup() -> None:
            partial.unlink(missing_ok=True)
            state.unlink(missing_ok=True)

        record: dict[str, Any] = {"kind": "url", "url": origin}
        if source.url != origin:
            record["via"] = source.label
        return _stage_verified(layout, partial, sha256, unpack_it, name_in_version, record,
                               size, progress_every, cleanup=cleanup, keep_blob=keep_blob)

    return install(layout, sha256, keep, fetch, deep=deep,
                   reused=lambda: _keep_reused(layout, sha256) if keep_blob else None)


def _keep_reused(layout: Layout, sha256: str) -> None:
    """``--keep-blob`` on a version already installed: keep its blob if it still can be."""
    version = layout.version(sha256)
    say(blobs.keep_from_version(layout.models_dir, version, read_manifest(version) or {}))


def _stage_verified(
    layout: Layout,
    verified: Path,
    sha256: str,
    unpack_it: bool,
    name_in_version: str,
    source: dict[str, Any],
    size: int,
    progress_every: float,
    cleanup: Callable[[], None],
    keep_blob: bool = False,
) -> Staged:
    """Stage a verified download or upload: unpacked, or as the version's single file.

    With ``keep_blob``, the verified bytes stay as the blob of ``sha256``: the archive moved
    there once unpacked, the single file hard-linked.
    """
    manifest: dict[str, Any] = {"source": source, "sha256": sha256, "size": size}
    if unpack_it:
        try:
            root, files, links, work = _unpack_into_version(
                layout, verified, sha256, progress_every
            )
        except DiskFull:
            raise
        except BaseException:
            cleanup()  # a verified archive that cannot be unpacked will not get better
            raise
        try:
            manifest.update(files=files, links=links)
            if keep_blob:
                blobs.keep_moved(layout.models_dir, verified, sha256)
            cleanup()
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return Staged(root, manifest, work)
    work = _staging_dir(layout, sha256, "d")
    work.mkdir(mode=0o755)
    try:
        target = work / name_in_version
        os.rename(verified, target)
        cleanup()
        os.chmod(target, 0o644)
        if keep_blob:
            blobs.keep_linked(layout.models_dir, target, sha256)
        st = os.stat(target)
        manifest.update(
            files={name_in_version: {"size": st.st_size, "sha256": sha256,
                                     "mtime_ns": st.st_mtime_ns}},
            links={},
        )
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Staged(work, manifest, work)


def install_file(
    layout: Layout,
    path: Path,
    sha256: str,
    keep: int,
    unpack_it: bool,
    name_in_version: str,
    progress_every: float,
    deep: bool = False,
    keep_blob: bool = False,
) -> str:
    """Install a file already on this host (pushed from the control machine)."""

    def fetch() -> Staged:
        if not path.is_file():
            raise FetchError(f"{path} is missing: the upload of {layout.name} did not arrive")
        digest = hashlib.sha256()
        size = path.stat().st_size
        source = {"kind": "file", "file": name_in_version}

        def mismatch() -> FetchError:
            path.unlink(missing_ok=True)
            return FetchError(
                f"checksum mismatch for the uploaded {layout.name}: expected sha256 {sha256}, "
                f"got {digest.hexdigest()} ({size} bytes); the local file is not the one the "
                "fleet file names. The previous model keeps serving"
            )

        if not unpack_it:
            hash_file(path, [digest])
            if digest.hexdigest() != sha256:
                raise mismatch()
            return _stage_verified(layout, path, sha256, False, name_in_version, source, size,
                                   progress_every, cleanup=lambda: None, keep_blob=keep_blob)
        # One read: the archive is hashed while it is unpacked into staging; nothing goes
        # live unless the digest matches.
        root, files, links, work = _unpack_into_version(
            layout, path, sha256, progress_every, digest
        )
        if digest.hexdigest() != sha256:
            shutil.rmtree(work, ignore_errors=True)
            raise mismatch()
        if keep_blob:
            blobs.keep_moved(layout.models_dir, path, sha256)
        path.unlink(missing_ok=True)
        manifest = {"source": source, "sha256": sha256, "size": size, "files": files,
                    "links": links}
        return Staged(root, manifest, work)

    def reused() -> None:
        path.unlink(missing_ok=True)
        if keep_blob:
            _keep_reused(layout, sha256)

    return install(layout, sha256, keep, fetch, deep=deep, reused=reused)
