"""A loopback HTTP file server whose faults the tests control (cut-offs, outages, no ranges).

It extends :class:`sandbox.modelserver.ArchiveRequestHandler` (Range, ETag, If-Range) and runs in
a thread of the test process, so a test can make it cut a transfer at a byte offset, go away
for a while and come back on the same port, or ignore ``Range`` headers, and read back which
ranges were asked for.

Example:
    server = FaultServer(directory).start()
    server.faults.cut_at, server.faults.cuts, server.faults.down_for = 1 << 20, 1, 1.0
    urllib.request.urlopen(server.url("model.tar.gz"))   # cut after 1 MiB, down for 1 s
    server.requests[-1]            # → {'path': ..., 'range': None, 'authorization': None}
    server.stop()
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from sandbox.modelserver import ArchiveRequestHandler, ArchiveServer


@dataclass
class Faults:
    """What the server does wrong.

    + cut_at: file offset after which a transfer is cut (the connection closes abruptly)
    + cuts: how many transfers to cut (then it serves normally)
    + down_for: seconds the server is gone (connections refused) after a cut
    + ignore_range: answer every request with the whole file (200), as some servers do
    + rate: bytes per second to send at most (0: as fast as possible)
    """

    cut_at: int | None = None
    cuts: int = 0
    down_for: float = 0.0
    ignore_range: bool = False
    rate: int = 0
    events: list[str] = field(default_factory=list)


class FaultHandler(ArchiveRequestHandler):
    """ArchiveRequestHandler with the faults of ``self.server.faults``."""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read ``requests`` instead."""

    def send_head(self) -> BinaryIO | None:  # type: ignore[override]
        owner: FaultServer = self.server.owner  # type: ignore[attr-defined]
        owner.requests.append({"path": self.path, "range": self.headers.get("Range"),
                               "authorization": self.headers.get("Authorization")})
        if owner.faults.ignore_range and "Range" in self.headers:
            del self.headers["Range"]
        return super().send_head()

    def copyfile(self, source: BinaryIO, outputfile: BinaryIO) -> None:  # type: ignore[override]
        owner: FaultServer = self.server.owner  # type: ignore[attr-defined]
        faults = owner.faults
        position = source.tell()
        remaining = self._remaining
        cut = faults.cut_at is not None and faults.cuts > 0 and position < faults.cut_at
        if cut:
            faults.cuts -= 1
            remaining = min(remaining, faults.cut_at - position)  # type: ignore[operator]
        started = time.monotonic()
        sent = 0
        try:
            while remaining > 0:
                chunk = source.read(min(1 << 16, remaining))
                if not chunk:
                    break
                outputfile.write(chunk)
                remaining -= len(chunk)
                sent += len(chunk)
                if faults.rate:
                    ahead = sent / faults.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            return
        if cut:
            faults.events.append(f"cut at {position + sent}")
            self.close_connection = True
            outputfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            if faults.down_for:
                owner.outage(faults.down_for)


class FaultServer:
    """A :class:`FaultHandler` server on a loopback port, in a thread."""

    def __init__(self, directory: Path, port: int = 0) -> None:
        self.directory = Path(directory)
        self.port = port
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self._httpd: ArchiveServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def url(self, name: str) -> str:
        """The URL of a file of the served directory."""
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self) -> FaultServer:
        """Bind (the same port again after an outage) and serve in a thread."""
        handler = functools.partial(FaultHandler, directory=str(self.directory))
        httpd = ArchiveServer(("127.0.0.1", self.port), handler)
        httpd.owner = self  # type: ignore[attr-defined]
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port."""
        with self._lock:
            httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def outage(self, seconds: float) -> None:
        """Go away now (connections refused) and come back after ``seconds``."""

        def cycle() -> None:
            self.faults.events.append("down")
            self.stop()
            time.sleep(seconds)
            self.start()
            self.faults.events.append("up")

        threading.Thread(target=cycle, daemon=True).start()
