"""Serve this host's verified blobs to its peers, read-only, for the duration of a distribution.

A host that holds a model's verified archive (``<models-dir>/.blobs/<sha256>``, kept by
``fetch_model.py install --keep-blob``: :mod:`hostside.models.blobs`) serves it over HTTP to the
hosts that still need it, which verify every byte against the fleet file's SHA256 before their
own atomic switch, exactly as from the origin. What it serves, and to whom:

- only ``GET`` and ``HEAD`` of ``/blobs/<64 hex>`` for a regular file of that name (opened with
  ``O_NOFOLLOW``); no listing, no other path, no query: anything else is 404;
- one ``Range`` (``bytes=a-b``, ``a-``, ``-n``): 206 with ``Content-Range``, 416 with
  ``Content-Range: bytes */size`` beyond the end; ``ETag`` is the digest (``If-Range`` honoured);
- only to ``Authorization: Bearer <token>`` (401 without, 403 for a wrong one, compared in
  constant time), the token read from a private file or standard input, never an argument;
- only on the address it is given (``0.0.0.0`` and ``::`` refused unless
  ``--allow-any-address``), never a host name;
- at most ``--max-transfers`` bodies at a time (beyond: 503 with ``Retry-After``), at most
  ``--max-rate`` bytes/s each when given, a connection idle for 30 s closed;
- until ``--idle-exit`` seconds pass with nothing asked, or ``--deadline`` seconds after it
  started (whatever is in flight then is cut: the receivers fall back to another source).

It prints one line once listening (its URL, with the port chosen when ``--port 0``) and one per
request on stderr (client, request line, status; never a header). Standard library only.

Usage::

    peer_serve.py --models-dir DIR --address 10.0.0.21 --port 7070 --token-file F \\
        [--max-transfers 4] [--max-rate BYTES] [--idle-exit 600] [--deadline 3600]

Example:
    >>> requested_range("bytes=10-19", 100), requested_range("bytes=-5", 100)
    ((10, 19), (95, 99))
    >>> requested_range("bytes=100-", 100), requested_range("bytes=1-2,5-6", 100)
    ('unsatisfiable', None)
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import socket
import stat
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside.models.blobs import BLOB_NAME, blobs_dir
from hostside.peertoken import TokenError, bearer_matches, read_token_file, read_token_stdin

#: Seconds a connection may stay silent (a stalled receiver frees its transfer slot then).
CONNECTION_TIMEOUT = 30.0
#: Connections open at once beyond which new ones are closed unanswered.
MAX_CONNECTIONS = 64
#: Bytes handed to sendfile at a time.
CHUNK = 1 << 20

_RANGE = re.compile(r"bytes=(?P<first>\d*)-(?P<last>\d*)")


def requested_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """The one byte range asked for: ``(first, last)``, ``"unsatisfiable"``, or None (all).

    A malformed or multi-range header is ignored (the whole file), as RFC 9110 allows.

    >>> requested_range(None, 10), requested_range("bytes=0-999", 10)
    (None, (0, 9))
    >>> requested_range("bytes=-0", 10), requested_range("bytes=5-2", 10)
    ('unsatisfiable', None)
    """
    if not header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None or (not match["first"] and not match["last"]):
        return None
    if not match["first"]:
        count = int(match["last"])
        if count == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - count), size - 1
    first = int(match["first"])
    last = int(match["last"]) if match["last"] else size - 1
    if first >= size:
        return "unsatisfiable"
    if last < first:
        return None
    return first, min(last, size - 1)


class PeerServer(ThreadingHTTPServer):
    """The listening socket, its token, its bounds and its clock of activity."""

    daemon_threads = True
    request_queue_size = 16

    def __init__(self, address: str, port: int, folder: Path, token: str, max_transfers: int,
                 max_rate: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        super().__init__((address, port), BlobHandler)
        self.folder = folder
        self.token = token
        self.transfers = threading.BoundedSemaphore(max_transfers)
        self.max_rate = max_rate
        self.lock = threading.Lock()
        self.connections = 0
        self.last_activity = time.monotonic()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Close a connection beyond :data:`MAX_CONNECTIONS` unanswered; serve the others."""
        with self.lock:
            if self.connections >= MAX_CONNECTIONS:
                self.shutdown_request(request)
                return
            self.connections += 1
            self.last_activity = time.monotonic()
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection; count it out whatever happens."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.connections -= 1
                self.last_activity = time.monotonic()


class BlobHandler(BaseHTTPRequestHandler):
    """``GET``/``HEAD /blobs/<sha256>`` for a holder of the token; nothing else."""

    server: PeerServer
    server_version = "vllm-fleet-peer/1"
    timeout = CONNECTION_TIMEOUT

    def version_string(self) -> str:
        """The ``Server`` header: the program, not Python's version."""
        return self.server_version

    def do_GET(self) -> None:
        """Send a blob (or the range of it asked for)."""
        self._serve(body=True)

    def do_HEAD(self) -> None:
        """Send a blob's headers."""
        self._serve(body=False)

    def log_message(self, format: str, *args: Any) -> None:
        """One line per request on stderr: client and what BaseHTTPRequestHandler says (the
        request line and status; no header, so never the token)."""
        sys.stderr.write(f"peer_serve: {self.client_address[0]} {format % args}\n")

    def _refuse(self, code: int, text: str, headers: dict[str, str] | None = None) -> None:
        body = (text + "\n").encode()
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        headers = self.headers.get_all("Authorization") or []
        if len(headers) != 1 or not headers[0].startswith("Bearer "):
            self._refuse(401, "a peer token is required",
                         {"WWW-Authenticate": 'Bearer realm="vllm-fleet-peer"'})
            return False
        if not bearer_matches(headers[0], self.server.token):
            self._refuse(403, "wrong peer token")
            return False
        return True

    def _serve(self, body: bool) -> None:
        if not self._authorized():
            return
        match = re.fullmatch(r"/blobs/(" + BLOB_NAME + ")", self.path)
        if match is None:
            self._refuse(404, "no such blob")
            return
        try:
            fd = os.open(self.server.folder / match[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            self._refuse(404, "no such blob")
            return
        with open(fd, "rb", buffering=0) as blob:
            st = os.fstat(blob.fileno())
            if not stat.S_ISREG(st.st_mode):
                self._refuse(404, "no such blob")
                return
            self._send(blob, st.st_size, f'"{match[1]}"', body)

    def _send(self, blob: Any, size: int, etag: str, body: bool) -> None:
        if_range = self.headers.get("If-Range")
        asked = None if if_range and if_range.strip() != etag else self.headers.get("Range")
        byte_range = requested_range(asked, size)
        if byte_range == "unsatisfiable":
            self._refuse(416, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
            return
        if body and not self.server.transfers.acquire(blocking=False):
            self._refuse(503, "busy: serving as many peers as allowed", {"Retry-After": "2"})
            return
        try:
            first, last = byte_range if isinstance(byte_range, tuple) else (0, size - 1)
            self.send_response(206 if isinstance(byte_range, tuple) else 200)
            if isinstance(byte_range, tuple):
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(last - first + 1))
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.flush()
                self._copy(blob, first, last - first + 1)
        except (OSError, ValueError):
            self.close_connection = True  # the receiver went away or stalled: its problem
        finally:
            if body:
                self.server.transfers.release()

    def _copy(self, blob: Any, offset: int, count: int) -> None:
        rate = self.server.max_rate
        started = time.monotonic()
        sent = 0
        step = CHUNK if not rate else max(16 << 10, min(CHUNK, rate // 8))
        while sent < count:
            done = self.connection.sendfile(blob, offset + sent, min(step, count - sent))
            if not done:
                return  # the file shrank under us: the receiver's digest will tell
            sent += done
            with self.server.lock:
                self.server.last_activity = time.monotonic()
            if rate:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Serve this host's verified model blobs to its peers (vllm-fleet)."
    )
    parser.add_argument("--models-dir", type=Path, required=True,
                        help="the models folder; its .blobs/ is served")
    parser.add_argument("--address", required=True,
                        help="the one IP address to listen on (the fleet's private network)")
    parser.add_argument("--port", type=int, required=True, help="0: any free port")
    token = parser.add_mutually_exclusive_group(required=True)
    token.add_argument("--token-file", type=Path, help="a file (mode 0600) holding the token")
    token.add_argument("--token-stdin", action="store_true",
                       help="read the token from the first line of standard input")
    parser.add_argument("--max-transfers", type=int, default=4,
                        help="bodies sent at once; more are answered 503")
    parser.add_argument("--max-rate", type=int, default=0,
                        help="bytes per second per transfer at most (0: no limit)")
    parser.add_argument("--idle-exit", type=float, default=600.0,
                        help="stop after this many seconds with nothing asked")
    parser.add_argument("--deadline", type=float, default=3600.0,
                        help="stop this many seconds after starting, whatever is in flight")
    parser.add_argument("--allow-any-address", action="store_true",
                        help="allow 0.0.0.0 or :: (every interface); refused otherwise")
    return parser


def checked_address(address: str, allow_any: bool) -> str:
    """The address to bind, or ValueError saying why not.

    >>> checked_address("10.0.0.21", False), checked_address("fd00::5", False)
    ('10.0.0.21', 'fd00::5')
    >>> checked_address("0.0.0.0", False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: refusing to listen on every interface (0.0.0.0): ... or --allow-any-address
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"--address must be one IP address, not {address!r}") from None
    if "%" in address:
        raise ValueError(f"--address must not carry a zone id: {address!r}")
    if ip.is_unspecified and not allow_any:
        raise ValueError(
            f"refusing to listen on every interface ({address}): give the private address "
            "peers reach this host at, or --allow-any-address"
        )
    return str(ip)


def _watch(server: PeerServer, idle: float, deadline: float, said: list[str]) -> None:
    started = time.monotonic()
    while True:
        time.sleep(min(0.2, idle / 4, deadline / 4))
        now = time.monotonic()
        if now - started >= deadline:
            said.append(f"the deadline of {deadline:g} s passed")
            break
        with server.lock:
            quiet = server.connections == 0 and now - server.last_activity >= idle
        if quiet:
            said.append(f"nothing was asked for {idle:g} s")
            break
    server.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: 0 after the idle or absolute deadline, 1 cannot serve, 2 usage."""
    args = _parser().parse_args(argv)
    try:
        address = checked_address(args.address, args.allow_any_address)
    except ValueError as err:
        print(f"peer_serve: {err}", file=sys.stderr)
        return 2
    for name in ("max_transfers", "idle_exit", "deadline"):
        if getattr(args, name) <= 0:
            print(f"peer_serve: --{name.replace('_', '-')} must be above 0", file=sys.stderr)
            return 2
    try:
        token = read_token_stdin() if args.token_stdin else read_token_file(args.token_file)
    except TokenError as err:
        print(f"peer_serve: {err}", file=sys.stderr)
        return 1
    folder = blobs_dir(args.models_dir)
    if not folder.is_dir():
        print(f"peer_serve: no blobs are kept in {folder}: nothing to serve", file=sys.stderr)
        return 1
    try:
        server = PeerServer(address, args.port, folder, token, args.max_transfers,
                            args.max_rate)
    except OSError as err:
        print(f"peer_serve: cannot listen on {address} port {args.port}: {err.strerror}",
              file=sys.stderr)
        return 1
    port = server.server_address[1]
    shown = f"[{address}]" if ":" in address else address
    count = sum(1 for p in folder.iterdir() if re.fullmatch(BLOB_NAME, p.name))
    print(f"peer_serve: serving {count} blob{'s' if count != 1 else ''} at "
          f"http://{shown}:{port}/blobs/ (at most {args.max_transfers} transfers; stops after "
          f"{args.idle_exit:g} s idle or {args.deadline:g} s)", flush=True)
    said: list[str] = []
    watcher = threading.Thread(target=_watch, args=(server, args.idle_exit, args.deadline, said),
                               daemon=True)
    watcher.start()
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    print(f"peer_serve: stopped: {said[0] if said else 'interrupted'}", flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        sys.exit(main())
