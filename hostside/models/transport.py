"""Moving bytes: a reader → hashing → writing pipeline, progress lines, resumable downloads.

One pass over the data: a reader, a hashing thread and a writing thread share a pool of reused
4 MiB buffers (hashlib and ``os.write`` release the GIL). :class:`Download` resumes an
interrupted transfer with an HTTP ``Range`` request (``If-Range`` on the server's validators):
within one run the running digest simply continues; across runs the ``.partial`` file is
re-hashed once, because hashlib cannot save a digest's state (see docs/models.md).

A partial file is named by the digest it must reach, so it may be continued from another source
of the same bytes (a peer that died, then the next peer or the origin: ``adopt``). Such a copy
is *spliced*: when its digest does not match, no one source can be blamed, and the caller
fetches the whole file again from the current source (:class:`ChecksumMismatch` says which case
it is; :mod:`hostside.models.peers` decides).

Example:
    >>> Progress("m", total=None, every=0).line(done=1 << 20, elapsed=1.0)
    'm: 1.00 MiB at 1.00 MiB/s'
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import http.client
import json
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from hostside.models.common import (
    CHUNK,
    DEPTH,
    DiskFull,
    FetchError,
    free_bytes,
    human_bytes,
    human_seconds,
    say,
)

#: HTTP statuses that no retry will fix.
PERMANENT = {400, 401, 403, 404, 405, 410, 451}


class Retryable(Exception):
    """A transient network failure: the download resumes where it stopped."""


class StartOver(Exception):
    """The server cannot continue the partial file: download it from the start."""


class ChecksumMismatch(FetchError):
    """The whole file arrived and its SHA256 is not the pinned one; the download is deleted.

    + spliced: the file joined bytes of more than one source (a partial continued from
      another), so the current source alone is not proven wrong
    """

    def __init__(self, message: str, spliced: bool) -> None:
        super().__init__(message)
        self.spliced = spliced



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
    + headers: sent with every request and never on a redirect (a peer's token)
    + opener: how to open the URL (a peer's: no proxy, no redirect); urllib's default otherwise
    + adopt: continue a partial file that another source of the same digest left
    + carried: the running digest and byte count of a partial this process just wrote (it is
      not re-hashed then)
    + need_length: refuse an answer without a length (a peer's: what it sends is bounded)
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
        headers: Mapping[str, str] | None = None,
        opener: urllib.request.OpenerDirector | None = None,
        adopt: bool = False,
        carried: tuple[Any, int] | None = None,
        need_length: bool = False,
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
        self.headers = dict(headers or {})
        self.opener = opener
        self.adopt = adopt
        self.carried = carried
        self.need_length = need_length
        self.digest: Any = None
        self.written = 0

    def run(self) -> int:
        """Download (resuming what a previous run left), verify; return the size."""
        digest, offset = self._resume()
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
                    if total is None and self.need_length:
                        response.reply.close()
                        raise FetchError(f"{self.url} sent no length: refused")
                    if start != sink.written:
                        say(f"{self.name}: the server sent the whole file; starting over")
                        os.ftruncate(fd, 0)
                        sink.digest = digest = hashlib.sha256()
                        sink.written = 0
                        self.state.pop("spliced", None)
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
            self.digest, self.written = sink.digest, sink.written
        actual = digest.hexdigest()
        if actual != self.sha256:
            spliced = bool(self.state.get("spliced"))
            self.discard()
            if spliced:
                raise ChecksumMismatch(
                    f"the copy continued from {self.state.get('from', 'another source')} with "
                    f"{self.url} does not match sha256 {self.sha256} (got {actual}); one of them "
                    "sent bad bytes and the download was deleted",
                    spliced=True,
                )
            hint = (
                "the server sent no length, so a cut-off transfer shows up only here; "
                if self.total is None
                else ""
            )
            raise ChecksumMismatch(
                f"checksum mismatch for {self.url}: expected sha256 {self.sha256}, got {actual} "
                f"({sink.written} bytes); {hint}the file is corrupt, truncated at the source or "
                "not the one the fleet file names. The download was deleted and the previous "
                "model keeps serving: compare the sha256 in the fleet file with the publisher's, "
                "then deploy again",
                spliced=False,
            )
        return sink.written

    def discard(self) -> None:
        """Forget the partial download and its state."""
        self.partial.unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ steps

    def _resume(self) -> tuple[Any, int]:
        """The running digest and offset to continue from: what a previous run (or, with
        ``adopt``, another source) left, re-hashed once unless this process carried its digest;
        or a fresh start."""
        digest = hashlib.sha256()
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            state = None
        usable = bool(state) and self.partial.is_file() and not self.partial.is_symlink()
        same = usable and state.get("url") == self.url
        if not (same or (usable and self.adopt)):
            self.discard()
            return digest, 0
        size = self.partial.stat().st_size
        if same:
            self.state = state
        else:
            self.state = {"url": self.url, "from": state.get("url")}
            if size:
                self.state["spliced"] = True
                say(f"{self.name}: continuing the {human_bytes(size)} that "
                    f"{state.get('url')} sent, from {self.url}")
            if isinstance(state.get("total"), int):
                self.state["total"] = state["total"]  # the same digest: the same size
        if state.get("spliced") and size:
            self.state["spliced"] = True
            self.state.setdefault("from", state.get("from"))
        if not size:
            self.state.pop("spliced", None)
            return digest, 0
        if self.carried is not None and self.carried[1] == size:
            return self.carried[0].copy(), size
        say(
            f"{self.name}: resuming an interrupted download at "
            f"{human_bytes(size)}; re-hashing what is already here once"
        )
        hash_file(self.partial, [digest])
        return digest, size

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
        for key, value in self.headers.items():
            request.add_unredirected_header(key, value)
        open_url = self.opener.open if self.opener is not None else urllib.request.urlopen
        try:
            reply = open_url(request, timeout=self.timeout)
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
                failed = DiskFull if err.errno == errno.ENOSPC else FetchError
                raise failed(self._write_failed(err, sink.written)) from None
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

