"""Install a model on this host: download, verify, unpack, switch atomically; check; roll back.

Runs on the host with the standard library only (the Hugging Face source alone imports
``huggingface_hub``, so it runs with the vLLM venv's python). Layout under the models directory::

    NAME -> .versions/NAME-<id16>    the live path servers use: a symbolic link
    .versions/NAME-<id16>/           one verified version: its files and .fleet-manifest.json
    .staging/                        (0700) downloads in progress, unpacking, upload drop-off

``<id16>`` is the first 16 hex digits of the archive's (or single file's) SHA256, or of the
Hugging Face commit. The download is hashed while it is written (one pass: a reader, a hashing
thread and a writing thread share a pool of reused 4 MiB buffers), checked against the expected
SHA256, then unpacked into staging while every file is hashed for the manifest. Only then does
the live link change, in one rename; a truncated download, a wrong checksum, a malicious archive
or a full disk never touch the version being served. ``keep`` older versions stay for rollback.

An interrupted download resumes with an HTTP ``Range`` request: within one run the running
digest simply continues; across runs (the process died) the ``.partial`` file is re-hashed once,
because hashlib cannot save a digest's state (see docs/models.md).

Commands (exit 0 on success, 1 with a message saying what happened and what to do)::

    fetch_model.py install --name NAME --models-dir DIR --url URL --sha256 HEX [--keep N]
    fetch_model.py install --name NAME --models-dir DIR --file PATH --sha256 HEX
    fetch_model.py install --name NAME --models-dir DIR --hf REPO --revision COMMIT \\
        [--endpoint URL] [--token-stdin | --token-file FILE]
    fetch_model.py check --name NAME --models-dir DIR [--deep] [--json]   (exit 3: drift)
    fetch_model.py rollback --name NAME --models-dir DIR [--to ID16]
    fetch_model.py versions --name NAME --models-dir DIR

Example:
    >>> human_bytes(3 * 2**30 + 2**29)
    '3.50 GiB'
    >>> is_archive("https://models.example/qwen3-8b.tar.zst")
    True
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import http.client
import json
import os
import queue
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

CHUNK = 4 << 20
#: Buffers in flight between the reader, the hashing and the writing thread.
DEPTH = 8
MANIFEST = ".fleet-manifest.json"
MANIFEST_FORMAT = 2
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: gzip, bzip2, xz, zstd: anything else is read as a plain tar.
COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", ZSTD_MAGIC)
#: HTTP statuses that no retry will fix.
PERMANENT = {400, 401, 403, 404, 405, 410, 451}
EXIT_DRIFT = 3
#: What a model name may be (the fleet file allows no more).
NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,62}"
#: Flush files to disk before the live link switches (``--no-fsync`` turns it off).
DURABLE = True


class FetchError(Exception):
    """A failure a person can act on; the version being served is untouched."""


class DiskFull(FetchError):
    """The disk filled up; what was verified is kept for the next attempt."""


class Retryable(Exception):
    """A transient network failure: the download resumes where it stopped."""


class StartOver(Exception):
    """The server cannot continue the partial file: download it from the start."""


# --------------------------------------------------------------------------- small helpers


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


def is_archive(name: str) -> bool:
    """Whether a URL or file name is an archive to unpack (by its suffix).

    >>> is_archive("a/model.tgz"), is_archive("model.gguf"), is_archive("x.tar?sig=1")
    (True, False, False)
    """
    return name.lower().endswith(ARCHIVE_SUFFIXES)


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


def say(text: str) -> None:
    """One progress or status line on stdout, flushed (pyinfra streams it per host)."""
    print(text, flush=True)


def free_bytes(path: Path) -> int:
    """Bytes available to unprivileged writers on the filesystem of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Progress:
    """Bytes, rate and ETA of a long transfer, printed every ``every`` seconds.

    >>> p = Progress("m", total=4 << 30, done=1 << 30, every=0)
    >>> p.line(done=2 << 30, elapsed=4.0)
    'm: 2.00 GiB of 4.00 GiB (50.0%) at 256.00 MiB/s, ETA 8 s'
    """

    def __init__(self, name: str, total: int | None, done: int = 0, every: float = 5.0) -> None:
        self.name = name
        self.total = total
        self.start_done = done
        self.done = done
        self.every = every
        self.started = time.monotonic()
        self.last = self.started

    def line(self, done: int, elapsed: float) -> str:
        """The progress line for ``done`` bytes after ``elapsed`` seconds."""
        rate = (done - self.start_done) / elapsed if elapsed > 0 else 0.0
        if self.total:
            eta = (self.total - done) / rate if rate > 0 else float("inf")
            eta_text = human_seconds(eta) if eta != float("inf") else "unknown"
            return (
                f"{self.name}: {human_bytes(done)} of {human_bytes(self.total)} "
                f"({100 * done / self.total:.1f}%) at {human_bytes(rate)}/s, ETA {eta_text}"
            )
        return f"{self.name}: {human_bytes(done)} at {human_bytes(rate)}/s"

    def add(self, count: int) -> None:
        """Count ``count`` more bytes; print a line when one is due."""
        self.done += count
        now = time.monotonic()
        if self.every and now - self.last >= self.every:
            self.last = now
            say(self.line(self.done, now - self.started))


# --------------------------------------------------------------------------- the pipeline


class Sink:
    """Where a stream of bytes goes: a digest and/or a file descriptor.

    With ``durable``, the writer starts the kernel's write-back of every chunk right away
    (``sync_file_range``), so that the ``fsync`` before the switch waits only for the tail.
    """

    def __init__(self, fd: int | None, digest: Any | None = None, durable: bool = False) -> None:
        self.fd = fd
        self.digest = digest
        self.written = 0
        self.durable = durable and _sync_file_range is not None


def _load_sync_file_range() -> Callable[[int, int, int], None] | None:
    """libc's sync_file_range(SYNC_FILE_RANGE_WRITE), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int

    def start_writeback(fd: int, offset: int, count: int) -> None:
        function(fd, offset, count, 2)  # SYNC_FILE_RANGE_WRITE: start, do not wait

    return start_writeback


_sync_file_range = _load_sync_file_range()


class Pipeline:
    """Reader → hashing thread → writing thread, over a pool of reused buffers.

    The caller fills a buffer from :meth:`buffer` (``readinto``, no copies) and hands it over
    with :meth:`submit`; hashlib and ``os.write`` release the GIL, so reading, hashing and
    writing overlap. :meth:`close` waits until everything submitted is written, then raises the
    writer's error (e.g. ENOSPC) if there was one.
    """

    def __init__(self, progress: Progress | None = None, depth: int = DEPTH) -> None:
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(depth):
            self.free.put(bytearray(CHUNK))
        self.to_hash: queue.Queue[Any] = queue.Queue()
        self.to_write: queue.Queue[Any] = queue.Queue()
        self.error: BaseException | None = None
        self.progress = progress
        self.threads = [
            threading.Thread(target=self._hash, daemon=True),
            threading.Thread(target=self._write, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def buffer(self) -> bytearray:
        """A free buffer to read into; raises the writer's error once there is one."""
        buf = self.free.get()
        if self.error is not None:
            self.free.put(buf)
            raise self.error
        return buf

    def submit(self, sink: Sink, buf: bytearray, count: int) -> None:
        """Hash and write ``buf[:count]`` to ``sink`` (in order); ``buf`` returns to the pool."""
        self.to_hash.put((sink, buf, count))

    def call(self, function: Callable[[], None]) -> None:
        """Run ``function`` in the writing thread once everything submitted before is written."""
        self.to_hash.put(function)

    def recycle(self, buf: bytearray) -> None:
        """Give back a buffer that was not submitted."""
        self.free.put(buf)

    def close(self) -> None:
        """Wait for the threads; raise the first error one of them had."""
        self.to_hash.put(None)
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise self.error

    def _hash(self) -> None:
        while True:
            item = self.to_hash.get()
            if isinstance(item, tuple) and self.error is None:
                sink, buf, count = item
                if sink.digest is not None:
                    try:
                        sink.digest.update(memoryview(buf)[:count])
                    except BaseException as err:
                        self.error = err
            self.to_write.put(item)
            if item is None:
                return

    def _write(self) -> None:
        while True:
            item = self.to_write.get()
            if item is None:
                return
            if not isinstance(item, tuple):
                if self.error is None:
                    try:
                        item()
                    except BaseException as err:
                        self.error = err
                continue
            sink, buf, count = item
            try:
                if self.error is None and sink.fd is not None:
                    view = memoryview(buf)[:count]
                    while view:
                        view = view[os.write(sink.fd, view) :]
                    if sink.durable:
                        _sync_file_range(sink.fd, sink.written, count)  # type: ignore[misc]
                if self.error is None:
                    sink.written += count
                    if self.progress is not None:
                        self.progress.add(count)
            except BaseException as err:
                self.error = err
            finally:
                self.free.put(buf)


def copy_stream(source: BinaryIO, sink: Sink, pipeline: Pipeline, limit: int | None = None) -> int:
    """Feed ``source`` (``readinto``) through ``pipeline`` into ``sink``; return bytes read."""
    total = 0
    while limit is None or total < limit:
        buf = pipeline.buffer()
        want = CHUNK if limit is None else min(CHUNK, limit - total)
        try:
            count = source.readinto(memoryview(buf)[:want])
        except BaseException:
            pipeline.recycle(buf)
            raise
        if not count:
            pipeline.recycle(buf)
            break
        pipeline.submit(sink, buf, count)
        total += count
    return total


def hash_file(path: Path, digests: list[Any]) -> int:
    """Update ``digests`` with the content of ``path``; return its size."""
    sink = Sink(None, _Multi(digests) if len(digests) > 1 else digests[0])
    pipeline = Pipeline(depth=3)
    try:
        with open(path, "rb", buffering=0) as source:
            copy_stream(source, sink, pipeline)
    finally:
        pipeline.close()
    return sink.written


class _Multi:
    """Several digests updated with the same bytes."""

    def __init__(self, digests: list[Any]) -> None:
        self.digests = digests

    def update(self, data: memoryview) -> None:
        for digest in self.digests:
            digest.update(data)


# --------------------------------------------------------------------------- download


class Download:
    """One resumable, verified download of ``url`` into ``partial``.

    + url: what to fetch (http, https or file)
    + partial: the file that grows; ``partial.json`` beside it remembers the URL and the
      server's validators (ETag, Last-Modified, size) so that a later run may resume it
    + sha256: the expected digest of the whole file
    """

    def __init__(
        self,
        name: str,
        url: str,
        partial: Path,
        sha256: str,
        *,
        retries: int = 6,
        retry_wait: float = 2.0,
        progress_every: float = 5.0,
        timeout: float = 60.0,
        need_extra: Callable[[int], int] = lambda total: 0,
        durable: bool = False,
    ) -> None:
        self.name = name
        self.durable = durable
        self.url = url
        self.partial = partial
        self.state_path = partial.with_name(partial.name + ".json")
        self.sha256 = sha256
        self.retries = retries
        self.retry_wait = retry_wait
        self.progress_every = progress_every
        self.timeout = timeout
        self.need_extra = need_extra
        self.state: dict[str, Any] = {"url": url}
        self.total: int | None = None

    def run(self) -> int:
        """Download (resuming what a previous run left), verify; return the size."""
        digest = hashlib.sha256()
        offset = self._resume(digest)
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        sink = Sink(fd, digest, self.durable)
        sink.written = offset
        attempt = 0
        checked_space = False
        try:
            while True:
                try:
                    response = self._request(sink.written)
                    if response is None:  # 416 on a complete partial file
                        self.total = self.state.get("total")
                        break
                    start, total = response.start, response.total
                    if start != sink.written:
                        say(f"{self.name}: the server sent the whole file; starting over")
                        os.ftruncate(fd, 0)
                        sink.digest = digest = hashlib.sha256()
                        sink.written = 0
                    os.lseek(fd, sink.written, os.SEEK_SET)
                    self.total = total
                    self._save_state(response)
                    if not checked_space:
                        try:
                            self._check_space(total, sink.written)
                        except FetchError:
                            response.reply.close()
                            if not sink.written:
                                self.discard()
                            raise
                        checked_space = True
                    self._stream(response.reply, sink, total)
                    if total is not None and sink.written < total:
                        raise Retryable(
                            f"the connection closed after {human_bytes(sink.written)} of "
                            f"{human_bytes(total)}"
                        )
                    break
                except StartOver as err:
                    say(f"{self.name}: {err}; starting over")
                    os.ftruncate(fd, 0)
                    sink.digest = digest = hashlib.sha256()
                    sink.written = 0
                    self.state = {"url": self.url}
                    attempt += 1
                    if attempt > self.retries:
                        raise FetchError(self._truncated(0, attempt, err)) from None
                except Retryable as err:
                    attempt += 1
                    if attempt > self.retries:
                        raise FetchError(self._truncated(sink.written, attempt, err)) from None
                    wait = min(self.retry_wait * 2 ** (attempt - 1), 30.0)
                    say(
                        f"{self.name}: {err}; retrying in {wait:.0f} s from byte {sink.written} "
                        f"(attempt {attempt} of {self.retries})"
                    )
                    time.sleep(wait)
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        actual = digest.hexdigest()
        if actual != self.sha256:
            self.discard()
            hint = (
                "the server sent no length, so a cut-off transfer shows up only here; "
                if self.total is None
                else ""
            )
            raise FetchError(
                f"checksum mismatch for {self.url}: expected sha256 {self.sha256}, got {actual} "
                f"({sink.written} bytes); {hint}the file is corrupt, truncated at the source or "
                "not the one the fleet file names. The download was deleted and the previous "
                "model keeps serving: compare the sha256 in the fleet file with the publisher's, "
                "then deploy again"
            )
        return sink.written

    def discard(self) -> None:
        """Forget the partial download and its state."""
        self.partial.unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ steps

    def _resume(self, digest: Any) -> int:
        """Re-hash what a previous run downloaded (once), or start afresh; return the offset."""
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            state = None
        if (
            state
            and state.get("url") == self.url
            and self.partial.is_file()
            and not self.partial.is_symlink()
        ):
            self.state = state
            size = self.partial.stat().st_size
            if size:
                say(
                    f"{self.name}: resuming an interrupted download at "
                    f"{human_bytes(size)}; re-hashing what is already here once"
                )
                hash_file(self.partial, [digest])
            return size
        self.discard()
        return 0

    def _save_state(self, response: _Response) -> None:
        for key in ("etag", "last_modified"):
            value = getattr(response, key)
            if value and not value.startswith("W/"):
                self.state[key] = value
        if response.total is not None:
            self.state["total"] = response.total
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.state_path)

    def _check_space(self, total: int | None, have: int) -> None:
        if total is None:
            say(f"{self.name}: the server sent no length; free space cannot be checked first")
            return
        remaining = max(total - have, 0)
        extra = self.need_extra(total)
        need = remaining + extra
        free = free_bytes(self.partial.parent)
        if need > free:
            unpacked = f" + ~{human_bytes(extra)} unpacked" if extra else ""
            raise FetchError(
                f"not enough free space in {self.partial.parent.parent} for {self.name}: need "
                f"{human_bytes(need)} ({human_bytes(remaining)} still to download{unpacked}), "
                f"{human_bytes(free)} free. Free {human_bytes(need - free)} or more (older "
                "versions kept for rollback count too: lower keep), then deploy again; the "
                "previous model keeps serving"
            )

    def _request(self, offset: int) -> _Response | None:
        headers = {"User-Agent": "vllm-fleet-fetch/1", "Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = self.state.get("etag") or self.state.get("last_modified")
            if validator:
                headers["If-Range"] = validator
        request = urllib.request.Request(self.url, headers=headers)
        try:
            reply = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            err.close()
            if err.code == 416 and offset and offset == self.state.get("total"):
                return None
            if err.code == 416 and offset:
                raise StartOver("the server cannot resume there (416)") from None
            if err.code in PERMANENT:
                raise FetchError(
                    f"download of {self.url} failed: HTTP {err.code} {err.reason}. Check the URL "
                    "(and credentials) in the fleet file; the previous model keeps serving"
                ) from None
            raise Retryable(f"HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)
            raise Retryable(f"cannot reach {self.url}: {reason}") from None
        return _Response(reply, offset)

    def _stream(self, reply: Any, sink: Sink, total: int | None) -> None:
        progress = Progress(self.name, total, sink.written, self.progress_every)
        pipeline = Pipeline(progress)
        try:
            copy_stream(reply, sink, pipeline)
        except (OSError, http.client.HTTPException, ValueError) as err:
            failure: Exception | None = err
        else:
            failure = None
        finally:
            reply.close()
            try:
                pipeline.close()
            except OSError as err:
                raise FetchError(self._write_failed(err, sink.written)) from None
        if failure is not None:
            raise Retryable(f"the transfer broke after {human_bytes(sink.written)}: {failure}")
        if self.progress_every:
            say(progress.line(sink.written, time.monotonic() - progress.started))

    def _write_failed(self, err: OSError, written: int) -> str:
        if err.errno == errno.ENOSPC:
            return (
                f"the disk holding {self.partial.parent} filled up after {human_bytes(written)} "
                f"of {self.name} ({human_bytes(free_bytes(self.partial.parent))} free now). The "
                "partial download is kept so the next deploy resumes it: free space, then deploy "
                "again; the previous model keeps serving"
            )
        return f"cannot write {self.partial}: {err}; the previous model keeps serving"

    def _truncated(self, have: int, attempts: int, err: Exception) -> str:
        total = f" of {human_bytes(self.total)}" if self.total else ""
        return (
            f"download of {self.url} is truncated: {human_bytes(have)}{total} arrived after "
            f"{attempts} attempts (last: {err}). The partial download is kept in "
            f"{self.partial.parent} and the next deploy resumes from byte {have}; the previous "
            "model keeps serving. Check the server, network or proxy, then deploy again"
        )


class _Response:
    """What a GET answered: where the body starts, the whole size, the validators."""

    def __init__(self, reply: Any, offset: int) -> None:
        self.reply = reply
        status = getattr(reply, "status", 200)
        length = reply.headers.get("Content-Length")
        self.etag = reply.headers.get("ETag")
        self.last_modified = reply.headers.get("Last-Modified")
        self.start = 0
        self.total = int(length) if length and length.isdigit() else None
        content_range = reply.headers.get("Content-Range", "")
        match = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", content_range)
        if status == 206 and match:
            self.start = int(match[1])
            self.total = int(match[3]) if match[3] != "*" else None
        elif status == 206:
            reply.close()
            raise Retryable("the server answered a range without Content-Range")
        if self.start not in (0, offset):
            reply.close()
            raise Retryable(f"the server sent bytes from {self.start}, not from {offset}")


# --------------------------------------------------------------------------- unpacking


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
        if proc.poll() is None:
            proc.kill()
        proc.wait()
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


class HashingReader:
    """A raw file whose bytes also go into a digest as they are read."""

    def __init__(self, raw: BinaryIO, digest: Any) -> None:
        self.raw = raw
        self.digest = digest

    def read(self, size: int = -1) -> bytes:
        """Read and hash."""
        data = self.raw.read(size) if size >= 0 else self.raw.readall()
        self.digest.update(data)
        return data

    def close(self) -> None:
        """Close the file."""
        self.raw.close()


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
    sink = Sink(fd, hashlib.sha256(), DURABLE)
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
        if DURABLE:
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


# --------------------------------------------------------------------------- layout


class Layout:
    """Paths of one model under the models directory."""

    def __init__(self, models_dir: Path, name: str) -> None:
        self.models_dir = models_dir
        self.name = name
        self.live = models_dir / name
        self.versions = models_dir / ".versions"
        self.staging = models_dir / ".staging"

    def version(self, ident: str) -> Path:
        """The directory of one version."""
        return self.versions / f"{self.name}-{ident[:16]}"

    def prepare(self) -> None:
        """Create the directories with their modes (staging is private to root)."""
        for folder, mode in ((self.models_dir, 0o755), (self.versions, 0o755),
                             (self.staging, 0o700)):
            folder.mkdir(mode=mode, parents=True, exist_ok=True)
            os.chmod(folder, mode)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One installer per model at a time."""
        with open(self.staging / f"{self.name}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"{self.name}: another installer is running for this model; waiting")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def current(self) -> Path | None:
        """The version the live link points to, if it is one of ours."""
        if not self.live.is_symlink():
            return None
        target = Path(os.path.realpath(self.live))
        return target if target.parent == Path(os.path.realpath(self.versions)) else None

    def all_versions(self) -> list[tuple[Path, dict[str, Any]]]:
        """Installed versions with a manifest, newest first."""
        found = []
        for path in self.versions.glob(f"{self.name}-*"):
            if path.is_symlink() or not path.is_dir():
                continue
            manifest = read_manifest(path)
            if manifest is not None and manifest.get("name") == self.name:
                found.append((path, manifest))
        found.sort(key=lambda item: item[1].get("installed_at", 0), reverse=True)
        return found


def read_manifest(version: Path) -> dict[str, Any] | None:
    """The manifest of a version directory, None if missing or unreadable."""
    try:
        return json.loads((version / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last, atomically: a version without one is not a version."""
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, root / MANIFEST)


def switch(live: Path, version: Path) -> None:
    """Point ``live`` at ``version`` in one atomic rename."""
    if live.exists() and not live.is_symlink():
        aside = live.with_name(f".versions/{live.name}-unmanaged-{int(time.time())}")
        say(f"{live} was not a managed link; moved it to {aside}")
        live.rename(aside)
    temporary = live.with_name(f".{live.name}.new")
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    os.symlink(os.path.relpath(version, live.parent), temporary)
    os.replace(temporary, live)
    _fsync_dir(live.parent)


def _fsync_dir(path: Path) -> None:
    if not DURABLE:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2


def place(staged: Path, version: Path) -> None:
    """Move a staged version into place; a damaged copy there is swapped out atomically."""
    if not version.exists():
        staged.rename(version)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd = -100
    if renameat2 is not None and renameat2(
        at_fdcwd, os.fsencode(staged), at_fdcwd, os.fsencode(version), _RENAME_EXCHANGE
    ) == 0:
        shutil.rmtree(staged)  # now the damaged copy
        return
    old = version.with_name(version.name + f".damaged-{os.getpid()}")
    version.rename(old)
    staged.rename(version)
    shutil.rmtree(old, ignore_errors=True)


def prune(layout: Layout, keep: int) -> list[str]:
    """Remove versions beyond the live one and ``keep`` older ones; return what went."""
    current = layout.current()
    kept = 0
    removed = []
    for path, _ in layout.all_versions():
        if current is not None and path == current:
            continue
        if kept < keep:
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


# --------------------------------------------------------------------------- checks


def check_version(version: Path, deep: bool = False) -> list[dict[str, str]]:
    """Problems of one installed version against its manifest (empty: it is intact).

    Quick: every file's presence, type, size and modification time, every link's target,
    nothing added. Deep: also every file's SHA256 (reads everything).
    """
    manifest = read_manifest(version)
    if manifest is None:
        return [{"path": MANIFEST, "problem": "the manifest is missing or unreadable"}]
    problems = []
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    links: dict[str, str] = manifest.get("links", {})
    for relative, meta in sorted(files.items()):
        path = version / relative
        try:
            st = os.lstat(path)
        except OSError:
            problems.append({"path": relative, "problem": "missing"})
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append({"path": relative, "problem": "not a regular file any more"})
            continue
        if st.st_size != meta.get("size"):
            problems.append(
                {"path": relative, "problem": f"size {st.st_size}, expected {meta.get('size')}"}
            )
            continue
        if "mtime_ns" in meta and st.st_mtime_ns != meta["mtime_ns"]:
            problems.append({"path": relative, "problem": "modified after install (mtime)"})
            continue
        if deep:
            digest = hashlib.sha256()
            hash_file(path, [digest])
            if digest.hexdigest() != meta.get("sha256"):
                problems.append(
                    {"path": relative, "problem": "content differs from the manifest (sha256)"}
                )
    for relative, target in sorted(links.items()):
        try:
            actual = os.readlink(version / relative)
        except OSError:
            problems.append({"path": relative, "problem": "link missing"})
            continue
        if actual != target:
            problems.append({"path": relative, "problem": f"link points to {actual!r}"})
    known = set(files) | set(links) | {MANIFEST}
    for dirpath, dirnames, filenames in os.walk(version):
        base = os.path.relpath(dirpath, version)
        for entry in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            relative = entry if base == "." else f"{base}/{entry}"
            if relative not in known:
                problems.append({"path": relative, "problem": "not part of the model (added)"})
    return problems


def check(layout: Layout, deep: bool = False) -> dict[str, Any]:
    """The state of a model's live path: installed version, manifest summary, problems."""
    report: dict[str, Any] = {
        "name": layout.name,
        "path": str(layout.live),
        "installed": False,
        "ok": False,
        "deep": deep,
        "problems": [],
    }
    if not layout.live.is_symlink():
        if layout.live.exists():
            report["problems"].append({"path": ".", "problem": "not a managed link"})
        return report
    version = Path(os.path.realpath(layout.live))
    manifest = read_manifest(version)
    if manifest is None:
        report["problems"].append({"path": MANIFEST, "problem": "missing or unreadable"})
        return report
    report.update(
        installed=True,
        version=version.name,
        id=manifest.get("id"),
        sha256=manifest.get("sha256"),
        revision=manifest.get("revision"),
        source=manifest.get("source"),
        files=len(manifest.get("files", {})),
        bytes=sum(int(f.get("size", 0)) for f in manifest.get("files", {}).values()),
    )
    report["problems"] = check_version(version, deep)
    report["ok"] = not report["problems"]
    return report


def versions(layout: Layout) -> list[dict[str, Any]]:
    """Installed versions of a model, newest first, with the live one marked."""
    current = layout.current()
    return [
        {
            "version": path.name,
            "id": manifest.get("id"),
            "installed_at": manifest.get("installed_at"),
            "live": path == current,
            "source": manifest.get("source"),
        }
        for path, manifest in layout.all_versions()
    ]


def rollback(layout: Layout, to: str | None = None) -> str:
    """Switch the live link back to the previous (or the given) intact version."""
    current = layout.current()
    candidates = [(p, m) for p, m in layout.all_versions() if p != current]
    if to:
        candidates = [(p, m) for p, m in candidates if str(m.get("id", "")).startswith(to)]
    elif current is not None:
        now = (read_manifest(current) or {}).get("installed_at", float("inf"))
        older = [(p, m) for p, m in candidates if m.get("installed_at", 0) < now]
        candidates = older or candidates
    for path, _manifest in candidates:
        problems = check_version(path)
        if problems:
            say(f"{layout.name}: skipping {path.name}: {problems[0]['path']} "
                f"{problems[0]['problem']}")
            continue
        switch(layout.live, path)
        before = current.name if current is not None else "nothing"
        return f"{layout.name}: rolled back from {before} to {path.name}"
    wanted = f" matching {to!r}" if to else ""
    raise FetchError(
        f"no intact earlier version{wanted} of {layout.name} to roll back to (versions: "
        f"{', '.join(p.name for p, _ in layout.all_versions()) or 'none'}); raise keep in the "
        "fleet file to keep more"
    )


# --------------------------------------------------------------------------- install


def reuse(layout: Layout, ident: str, keep: int, deep: bool = False) -> str | None:
    """Switch to an intact copy of this version already on disk; None if there is none."""
    version = layout.version(ident)
    manifest = read_manifest(version)
    if manifest is None or manifest.get("id") != ident:
        return None
    problems = check_version(version, deep)
    if problems:
        say(
            f"{layout.name}: the copy on disk of {version.name} is damaged ({problems[0]['path']}: "
            f"{problems[0]['problem']}, {len(problems)} problem(s)); installing it again"
        )
        return None
    if layout.current() == Path(os.path.realpath(version)):
        prune(layout, keep)
        return f"{layout.name}: {version.name} is installed and intact"
    switch(layout.live, version)
    prune(layout, keep)
    return f"{layout.name}: switched to the verified copy already on disk ({version.name})"


def finish_install(
    layout: Layout, staged: Path, ident: str, keep: int, manifest: dict[str, Any]
) -> str:
    """Write the manifest, move the version into place, switch the live link, prune."""
    manifest.update(format=MANIFEST_FORMAT, name=layout.name, id=ident,
                    installed_at=time.time())
    write_manifest(staged, manifest)
    version = layout.version(ident)
    place(staged, version)
    _fsync_dir(layout.versions)
    previous = layout.current()
    switch(layout.live, version)
    removed = prune(layout, keep)
    files = manifest["files"]
    total = sum(int(f.get("size", 0)) for f in files.values())
    summary = (
        f"{layout.name}: installed {version.name} ({len(files)} files, {human_bytes(total)})"
    )
    if previous is not None and previous != version:
        summary += f"; previous {previous.name} kept for rollback"
    if removed:
        summary += f"; removed {', '.join(removed)}"
    return summary


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
    url: str,
    sha256: str,
    keep: int,
    unpack_it: bool,
    name_in_version: str,
    *,
    retries: int,
    retry_wait: float,
    progress_every: float,
    deep: bool = False,
) -> str:
    """Download (resumable), verify, unpack or place, and switch; return a summary."""
    found = reuse(layout, sha256, keep, deep)
    if found:
        return found
    partial = layout.staging / f"{layout.name}-{sha256[:16]}.partial"
    download = Download(
        layout.name, url, partial, sha256,
        retries=retries, retry_wait=retry_wait, progress_every=progress_every,
        need_extra=(lambda total: total) if unpack_it else (lambda total: 0),
        durable=DURABLE and not unpack_it,
    )
    size = download.run()
    return _install_verified(layout, partial, sha256, keep, unpack_it, name_in_version,
                             {"kind": "url", "url": url}, size, progress_every,
                             cleanup=download.discard)


def _install_verified(
    layout: Layout,
    verified: Path,
    sha256: str,
    keep: int,
    unpack_it: bool,
    name_in_version: str,
    source: dict[str, Any],
    size: int,
    progress_every: float,
    cleanup: Callable[[], None],
) -> str:
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
            cleanup()
            return finish_install(layout, root, sha256, keep, manifest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    work = _staging_dir(layout, sha256, "d")
    work.mkdir(mode=0o755)
    try:
        target = work / name_in_version
        os.rename(verified, target)
        cleanup()
        os.chmod(target, 0o644)
        st = os.stat(target)
        manifest.update(
            files={name_in_version: {"size": st.st_size, "sha256": sha256,
                                     "mtime_ns": st.st_mtime_ns}},
            links={},
        )
        return finish_install(layout, work, sha256, keep, manifest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def install_file(
    layout: Layout,
    path: Path,
    sha256: str,
    keep: int,
    unpack_it: bool,
    name_in_version: str,
    progress_every: float,
    deep: bool = False,
) -> str:
    """Install a file already on this host (pushed from the control machine)."""
    found = reuse(layout, sha256, keep, deep)
    if found:
        path.unlink(missing_ok=True)
        return found
    if not path.is_file():
        raise FetchError(f"{path} is missing: the upload of {layout.name} did not arrive")
    digest = hashlib.sha256()
    size = path.stat().st_size
    source = {"kind": "file", "file": name_in_version}

    def mismatch() -> FetchError:
        path.unlink(missing_ok=True)
        return FetchError(
            f"checksum mismatch for the uploaded {layout.name}: expected sha256 {sha256}, got "
            f"{digest.hexdigest()} ({size} bytes); the local file is not the one the fleet file "
            "names. The previous model keeps serving"
        )

    if not unpack_it:
        hash_file(path, [digest])
        if digest.hexdigest() != sha256:
            raise mismatch()
        return _install_verified(layout, path, sha256, keep, False, name_in_version, source,
                                 size, progress_every, cleanup=lambda: None)
    # One read: the archive is hashed while it is unpacked into staging; nothing goes live
    # unless the digest matches.
    root, files, links, work = _unpack_into_version(layout, path, sha256, progress_every, digest)
    try:
        if digest.hexdigest() != sha256:
            raise mismatch()
        path.unlink(missing_ok=True)
        manifest = {"source": source, "sha256": sha256, "size": size, "files": files,
                    "links": links}
        return finish_install(layout, root, sha256, keep, manifest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def git_blob_sha1(size: int) -> Any:
    """A sha1 digest primed like git's blob ids (``blob <size>\\0`` + content).

    >>> d = git_blob_sha1(0); d.hexdigest()
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
    """
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"blob {size}\0".encode())
    return digest


def install_hf(
    layout: Layout,
    repo: str,
    revision: str,
    keep: int,
    endpoint: str | None,
    token: str | None,
    deep: bool = False,
) -> str:
    """Download a Hugging Face repo at a pinned commit; verify every file against the hub.

    huggingface_hub fetches (and resumes) the files into staging; then each file is hashed
    once: LFS files must match the hub's sha256, the others git's blob id, before the
    version goes live.
    """
    found = reuse(layout, revision, keep, deep)
    if found:
        return found
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own lines instead
    try:
        import huggingface_hub
    except ImportError:
        raise FetchError(
            f"huggingface_hub is not installed for {sys.executable}; run the installer with "
            "the vLLM venv's python (the deploy does)"
        ) from None
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    try:
        entries = [
            entry for entry in api.list_repo_tree(repo, revision=revision, recursive=True)
            if entry.__class__.__name__ == "RepoFile"
        ]
    except Exception as err:
        raise FetchError(
            f"cannot list {repo} at {revision} on {endpoint or 'the Hugging Face hub'}: {err}. "
            "Check the repo, the revision, the token and the endpoint; the previous model "
            "keeps serving"
        ) from None
    total = sum(int(entry.size or 0) for entry in entries)
    free = free_bytes(layout.staging)
    if total > free:
        raise FetchError(
            f"not enough free space in {layout.models_dir} for {layout.name}: need "
            f"{human_bytes(total)}, {human_bytes(free)} free; free space, then deploy again"
        )
    work = layout.staging / f"{layout.name}-{revision[:16]}.hf"
    say(f"{layout.name}: {len(entries)} files, {human_bytes(total)} from {repo}@{revision[:12]}")
    try:
        huggingface_hub.snapshot_download(
            repo, revision=revision, local_dir=work, endpoint=endpoint, token=token
        )
    except Exception as err:
        raise FetchError(
            f"download of {repo}@{revision} failed: {err}. What arrived is kept in {work} and "
            "resumed by the next deploy; the previous model keeps serving"
        ) from None
    shutil.rmtree(work / ".cache", ignore_errors=True)
    files: dict[str, dict[str, Any]] = {}
    for entry in entries:
        path = work / entry.path
        sha256 = hashlib.sha256()
        lfs = getattr(entry, "lfs", None)
        expected_sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else
                           getattr(lfs, "sha256", None))
        digests = [sha256]
        blob = None
        if not expected_sha256:
            blob = git_blob_sha1(path.stat().st_size if path.exists() else 0)
            digests.append(blob)
        try:
            size = hash_file(path, digests)
        except OSError as err:
            raise FetchError(f"{repo}@{revision}: {entry.path} did not arrive ({err})") from None
        wrong = (expected_sha256 and sha256.hexdigest() != expected_sha256) or (
            blob is not None and blob.hexdigest() != entry.blob_id
        )
        if wrong:
            path.unlink(missing_ok=True)
            raise FetchError(
                f"{repo}@{revision}: {entry.path} does not match the hub's hash (corrupt or "
                "interrupted download); it was deleted and the next deploy fetches it again. "
                "The previous model keeps serving"
            )
        os.chmod(path, 0o644)
        files[entry.path] = {"size": size, "sha256": sha256.hexdigest(),
                             "mtime_ns": path.stat().st_mtime_ns}
    for dirpath, dirnames, _ in os.walk(work):
        for dirname in dirnames:
            os.chmod(os.path.join(dirpath, dirname), 0o755)
    os.chmod(work, 0o755)
    manifest = {
        "source": {"kind": "hf", "repo": repo, "endpoint": endpoint},
        "revision": revision,
        "sha256": None,
        "size": total,
        "files": files,
        "links": {},
    }
    try:
        return finish_install(layout, work, revision, keep, manifest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- list, remove


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def installed(models_dir: Path) -> list[dict[str, Any]]:
    """Every model with a version under ``models_dir``: name, live version, versions, bytes.

    A model is named by its versions' manifests, so names that share a prefix
    (``llama``, ``llama-70b``) never mix.
    """
    versions_dir = models_dir / ".versions"
    by_name: dict[str, list[Path]] = {}
    if versions_dir.is_dir():
        for path in sorted(versions_dir.iterdir()):
            if path.is_symlink() or not path.is_dir():
                continue
            name = (read_manifest(path) or {}).get("name")
            if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name):
                by_name.setdefault(name, []).append(path)
    result = []
    for name, paths in sorted(by_name.items()):
        current = Layout(models_dir, name).current()
        result.append({
            "name": name,
            "live": current.name if current is not None else None,
            "versions": len(paths),
            "bytes": sum(_tree_bytes(p) for p in paths),
        })
    return result


def users_of(layout: Layout, units_dir: Path) -> list[str]:
    """The vLLM units under ``units_dir`` whose text names this model's live path."""
    needle = str(layout.live)
    users = []
    for unit in sorted(units_dir.glob("vllm-*.service")):
        with contextlib.suppress(OSError):
            text = unit.read_text(errors="replace")
            if re.search(re.escape(needle) + r"(?![A-Za-z0-9._-])", text):
                users.append(unit.name)
    return users


def remove(layout: Layout, units_dir: Path) -> str:
    """Remove a model: its live link, every version and any unfinished download of it.

    Refused while a vLLM unit still names it: remove or change that server first.
    """
    users = users_of(layout, units_dir)
    if users:
        raise FetchError(f"still used by {', '.join(users)}: take the server out of the fleet "
                         "file and deploy (which removes its unit) before removing the model")
    paths = [p for p, _ in layout.all_versions()]
    total = sum(_tree_bytes(p) for p in paths)
    if layout.live.is_symlink():
        layout.live.unlink()
    for path in paths:
        shutil.rmtree(path)
    staged = re.compile(re.escape(layout.name) + r"-[0-9a-f]{16}\..*")
    if layout.staging.is_dir():
        for entry in layout.staging.iterdir():
            if staged.fullmatch(entry.name) or entry.name == f"{layout.name}.lock":
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
    if not paths:
        return f"{layout.name}: not installed; nothing to remove"
    return (f"{layout.name}: removed {len(paths)} version{'s' if len(paths) != 1 else ''} "
            f"({human_bytes(total)})")


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Install, check and roll back models on this host (vllm-fleet)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="every installed model, as JSON")
    listing.add_argument("--models-dir", type=Path, required=True)
    for command in ("install", "check", "rollback", "versions", "remove"):
        sp = sub.add_parser(command)
        sp.add_argument("--name", required=True)
        sp.add_argument("--models-dir", type=Path, required=True)
        if command == "remove":
            sp.add_argument("--units-dir", type=Path, default=Path("/etc/systemd/system"),
                            help="where the vLLM units that may still use it live")
        if command == "install":
            source = sp.add_mutually_exclusive_group(required=True)
            source.add_argument("--url")
            source.add_argument("--file", type=Path)
            source.add_argument("--hf")
            sp.add_argument("--sha256")
            sp.add_argument("--revision")
            sp.add_argument("--endpoint")
            sp.add_argument("--token-file", type=Path)
            sp.add_argument("--token-stdin", action="store_true",
                            help="read the Hugging Face token from the first line of stdin")
            sp.add_argument("--keep", type=int, default=1, help="older versions to keep")
            sp.add_argument("--unpack", choices=["auto", "yes", "no"], default="auto")
            sp.add_argument("--filename", help="name of a single file inside the version")
            sp.add_argument("--retries", type=int, default=6)
            sp.add_argument("--retry-wait", type=float, default=2.0)
            sp.add_argument("--progress-every", type=float, default=10.0)
            sp.add_argument("--deep", action="store_true",
                            help="re-hash a copy already on disk before reusing it")
            sp.add_argument("--no-fsync", action="store_true",
                            help="do not flush files to disk before switching (faster; a power "
                            "cut right after may leave a torn version for the next check)")
        if command == "check":
            sp.add_argument("--deep", action="store_true", help="re-hash every file")
            sp.add_argument("--json", action="store_true")
        if command == "rollback":
            sp.add_argument("--to", help="version id prefix to switch to")
    return parser


def _install(args: argparse.Namespace, layout: Layout) -> str:
    if args.hf:
        if not args.revision or not re.fullmatch(r"[0-9a-f]{40}", args.revision):
            raise FetchError("--revision must be a 40-hex commit")
        token = None
        if args.token_stdin:
            token = sys.stdin.readline().strip() or None
        elif args.token_file is not None:
            try:
                token = args.token_file.read_text().strip() or None
            finally:
                args.token_file.unlink(missing_ok=True)
        return install_hf(layout, args.hf, args.revision, args.keep, args.endpoint, token,
                          args.deep)
    sha256 = (args.sha256 or "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise FetchError("--sha256 must be 64 hex digits")
    source = args.url or str(args.file)
    unpack_it = is_archive(source) if args.unpack == "auto" else args.unpack == "yes"
    name_in_version = args.filename or file_name(source)
    if args.file is not None:
        return install_file(layout, args.file, sha256, args.keep, unpack_it, name_in_version,
                            args.progress_every, args.deep)
    return install_url(
        layout, args.url, sha256, args.keep, unpack_it, name_in_version,
        retries=args.retries, retry_wait=args.retry_wait, progress_every=args.progress_every,
        deep=args.deep,
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: 0 done, 1 failed (message on stderr), 3 drift found by check."""
    args = _parser().parse_args(argv)
    os.umask(0o022)
    if args.command == "list":
        print(json.dumps(installed(args.models_dir)))
        return 0
    if not re.fullmatch(NAME_PATTERN, args.name):
        print(f"invalid model name {args.name!r}", file=sys.stderr)
        return 2
    layout = Layout(args.models_dir, args.name)
    global DURABLE
    DURABLE = not getattr(args, "no_fsync", False)
    try:
        if args.command == "check":
            report = check(layout, args.deep)
            if args.json:
                print(json.dumps(report))
                return 0
            for problem in report["problems"]:
                say(f"{args.name}: {problem['path']}: {problem['problem']}")
            if report["ok"]:
                say(f"{args.name}: {report['version']} intact "
                    f"({'deep: every file re-hashed' if args.deep else 'quick: sizes, mtimes'})")
                return 0
            say(f"{args.name}: {'not installed' if not report['installed'] else 'DRIFT'}")
            return EXIT_DRIFT
        if args.command == "versions":
            print(json.dumps(versions(layout) if layout.versions.is_dir() else []))
            return 0
        layout.prepare()
        with layout.locked():
            if args.command == "rollback":
                say(rollback(layout, args.to))
            elif args.command == "remove":
                say(remove(layout, args.units_dir))
            else:
                say(_install(args, layout))
    except FetchError as err:
        print(f"model {args.name}: {err}", file=sys.stderr, flush=True)
        return 1
    except OSError as err:
        print(f"model {args.name}: {err}; the previous model keeps serving", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
