"""Archive safety: unpack a model archive into a new folder, hashing every file, refusing escapes.

Refused: absolute names, ``..``, devices, FIFOs, hard links to anything but an earlier file,
symbolic links that resolve outside the model, writing through a link, a member named like
the fleet manifest. Plain tars are read with ``pread`` straight into the pipeline's buffers;
gzip, bzip2 and xz through :mod:`tarfile`; zstd through ``tarfile`` (Python ≥ 3.14) or the
``zstd`` tool.

Example:
    >>> is_archive("https://models.example/qwen3-8b.tar.zst")
    True
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from hostside.models import common
from hostside.models.common import CHUNK, FetchError
from hostside.models.store import MANIFEST
from hostside.models.transport import HashingReader, Pipeline, Progress, Sink, copy_stream

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: gzip, bzip2, xz, zstd: anything else is read as a plain tar.
COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", ZSTD_MAGIC)


def is_archive(name: str) -> bool:
    """Whether a URL or file name is an archive to unpack (by its suffix).

    >>> is_archive("a/model.tgz"), is_archive("model.gguf"), is_archive("x.tar?sig=1")
    (True, False, False)
    """
    return name.lower().endswith(ARCHIVE_SUFFIXES)



def member_parts(name: str) -> tuple[str, ...]:
    """The path parts of an archive member; FetchError if it could land outside the model.

    >>> member_parts("./m/config.json")
    ('m', 'config.json')
    >>> member_parts("../etc/passwd")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    FetchError: archive member '../etc/passwd' points outside the model directory
    """
    path = PurePosixPath(name)
    parts = tuple(p for p in path.parts if p not in ("", "."))
    if path.is_absolute() or ".." in parts or "\0" in name:
        raise FetchError(f"archive member {name!r} points outside the model directory")
    return parts


def link_escapes(member_parts_: tuple[str, ...], target: str) -> bool:
    """Whether a symbolic link at ``member_parts_`` pointing to ``target`` leaves the root.

    >>> link_escapes(("m", "w.bin"), "../shared/w.bin"), link_escapes(("w.bin",), "../x")
    (False, True)
    """
    if target.startswith("/"):
        return True
    joined = os.path.normpath(os.path.join(*member_parts_[:-1], target) if member_parts_[:-1]
                              else target)
    return joined == ".." or joined.startswith("../") or joined.startswith("/")


class Unpacked:
    """The files of an unpacked archive, hashed while written, for the manifest."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, dict[str, Any]] = {}
        self.links: dict[str, str] = {}
        self.bytes = 0


def _open_tar(
    archive: Path, raw: BinaryIO | None = None
) -> tuple[tarfile.TarFile, subprocess.Popen | None]:
    """A streaming tar reader for a .tar, .tar.gz/.bz2/.xz or .tar.zst file (or ``raw``)."""
    with open(archive, "rb") as fh:
        magic = fh.read(6)
    if raw is None and not magic.startswith(COMPRESSED_MAGIC):
        # A plain tar: headers through tarfile, file data read straight from the archive.
        tar = tarfile.open(archive, mode="r:")  # noqa: SIM115 - closed by unpack
        tar.fleet_seekable = True  # type: ignore[attr-defined]
        return tar, None
    if not magic.startswith(ZSTD_MAGIC):
        return tarfile.open(archive, mode="r|*", fileobj=raw, bufsize=CHUNK), None
    if raw is not None:
        with contextlib.suppress(tarfile.CompressionError, ValueError):
            return tarfile.open(mode="r|zst", fileobj=raw, bufsize=CHUNK), None  # Python ≥ 3.14
    else:
        with contextlib.suppress(tarfile.CompressionError, ValueError):
            return tarfile.open(archive, mode="r|zst", bufsize=CHUNK), None  # Python ≥ 3.14
    if raw is not None:
        while raw.read(CHUNK):  # the zstd tool reads the file itself: hash it here first
            pass
    if shutil.which("zstd") is None:
        raise FetchError(
            "the archive is zstd-compressed and this host has no zstd: install it "
            "(apt-get install zstd; the deploy does so for .tar.zst models) and deploy again"
        )
    proc = subprocess.Popen(
        ["zstd", "-dcq", "--", str(archive)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    return tarfile.open(fileobj=proc.stdout, mode="r|", bufsize=CHUNK), proc


def _make_dirs(root: Path, parts: tuple[str, ...]) -> Path:
    """Create ``root/parts`` (0755) and return it; refuse to go through a link."""
    path = root
    for part in parts:
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise FetchError(
                f"archive member path {'/'.join(parts)!r} goes through a link or a file; "
                "refusing to write through it"
            )
    return path


def _replace_existing(target: Path) -> None:
    """A later member of the same name replaces an earlier file or link (tar semantics)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise FetchError(f"archive member {target.name!r} would replace a directory")
    os.unlink(target)


def unpack(
    archive: Path,
    root: Path,
    progress_every: float = 5.0,
    name: str = "",
    digest: Any | None = None,
) -> Unpacked:
    """Unpack ``archive`` into the new directory ``root``, safely; hash every file.

    Refused: absolute names, ``..``, devices, FIFOs, hard links to anything but an earlier
    file, symbolic links that resolve outside ``root``, writing through a link. Files become
    0644 and directories 0755, owned by whoever runs this (root on a host). With ``digest``,
    the archive's own bytes are hashed as they are read (one pass for files already here).
    """
    root.mkdir(mode=0o755)
    result = Unpacked(root)
    raw: BinaryIO | None = None
    if digest is not None:
        raw = HashingReader(open(archive, "rb", buffering=0), digest)  # noqa: SIM115
    tar, proc = _open_tar(archive, raw)
    pipeline = Pipeline(Progress(f"{name} (unpacking)", None, 0, progress_every))
    failure: BaseException | None = None
    try:
        with tar:
            for member in tar:
                _unpack_member(tar, member, root, result, pipeline)
        if raw is not None:
            while raw.read(CHUNK):  # the archive's padding after the end marker
                pass
    except BaseException as err:
        failure = err
    try:
        pipeline.close()
    except BaseException as err:
        failure = failure or err
    if raw is not None:
        raw.close()
    if proc is not None:
        assert proc.stdout is not None
        if failure is None:
            # tar stops at its end marker; zstd may still be writing the padding after it, or
            # not have exited yet (a busy machine): read it to its end, never kill it here
            while proc.stdout.read(CHUNK):
                pass
        elif proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        assert proc.stderr is not None
        problem = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        if failure is None and (proc.returncode != 0 or problem):
            failure = FetchError(f"zstd cannot decompress the archive: {problem}")
    if isinstance(failure, OSError) and failure.errno == errno.ENOSPC:
        raise failure
    if isinstance(failure, (tarfile.TarError, EOFError, zlib.error, OSError)):
        raise FetchError(f"the archive cannot be unpacked: {failure}") from None
    if failure is not None:
        raise failure
    _check_links(root, result)
    return result



def _unpack_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, root: Path, result: Unpacked,
    pipeline: Pipeline,
) -> None:
    parts = member_parts(member.name)
    if not parts:
        return
    if parts == (MANIFEST,):
        raise FetchError(f"archive member {member.name!r} would overwrite the fleet manifest")
    relative = "/".join(parts)
    if member.isdir():
        _make_dirs(root, parts)
        return
    parent = _make_dirs(root, parts[:-1])
    target = parent / parts[-1]
    if member.issym():
        if link_escapes(parts, member.linkname):
            raise FetchError(
                f"archive link {member.name!r} → {member.linkname!r} escapes the model directory"
            )
        _replace_existing(target)
        os.symlink(member.linkname, target)
        result.links[relative] = member.linkname
        return
    if member.islnk():
        source = "/".join(member_parts(member.linkname))
        if source not in result.files:
            raise FetchError(
                f"archive hard link {member.name!r} → {member.linkname!r} does not point to an "
                "earlier file of the archive"
            )
        _replace_existing(target)
        pipeline.call(lambda: _hard_link(root / source, target, result, source, relative))
        return
    if not member.isreg():
        raise FetchError(
            f"archive member {member.name!r} is a device, FIFO or other special file; "
            "a model archive holds only files, directories and links"
        )
    _replace_existing(target)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    sink = Sink(fd, hashlib.sha256(), common.DURABLE)
    seekable = getattr(tar, "fleet_seekable", False) and member.sparse is None
    source_file: Any = (
        _Slice(tar.fileobj, member.offset_data) if seekable else tar.extractfile(member)
    )
    assert source_file is not None
    try:
        copy_stream(source_file, sink, pipeline, limit=member.size)
    except BaseException:
        pipeline.call(lambda: os.close(fd))
        raise

    def finish() -> None:
        if common.DURABLE:
            os.fsync(fd)
        st = os.fstat(fd)
        os.fchmod(fd, 0o644)
        os.close(fd)
        result.files[relative] = {
            "size": st.st_size,
            "sha256": sink.digest.hexdigest(),
            "mtime_ns": st.st_mtime_ns,
        }
        result.bytes += st.st_size

    pipeline.call(finish)


class _Slice:
    """Member data of a plain tar, read with ``pread`` straight into the caller's buffer."""

    def __init__(self, fileobj: Any, offset: int) -> None:
        self.fd = fileobj.fileno()
        self.offset = offset

    def readinto(self, buffer: memoryview) -> int:
        """Read at the current offset (one copy, from the page cache)."""
        count = os.preadv(self.fd, [buffer], self.offset)
        self.offset += count
        return count


def _hard_link(source: Path, target: Path, result: Unpacked, src: str, relative: str) -> None:
    os.link(source, target, follow_symlinks=False)
    result.files[relative] = dict(result.files[src])


def _check_links(root: Path, result: Unpacked) -> None:
    """Every symbolic link must resolve inside ``root`` (chains of links included)."""
    real_root = os.path.realpath(root)
    for relative in result.links:
        resolved = os.path.realpath(root / relative)
        if resolved != real_root and not resolved.startswith(real_root + os.sep):
            raise FetchError(
                f"archive link {relative!r} → {result.links[relative]!r} resolves outside the "
                "model directory"
            )


def strip_top(unpacked: Unpacked) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """If everything is inside one top-level directory, use that directory as the root."""
    entries = os.listdir(unpacked.root)
    if len(entries) == 1:
        only = unpacked.root / entries[0]
        if only.is_dir() and not only.is_symlink():
            prefix = entries[0] + "/"
            files = {k[len(prefix) :]: v for k, v in unpacked.files.items()}
            links = {k[len(prefix) :]: v for k, v in unpacked.links.items()}
            return only, files, links
    return unpacked.root, unpacked.files, unpacked.links


