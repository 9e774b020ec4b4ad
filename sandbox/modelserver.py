"""A small loopback HTTP file server for model archives (standard library only).

The quick start and the tests serve ``testmodel/tiny-llama.tar.gz`` with it, so that the deploy
downloads and verifies a model archive exactly as it would from a real site. It answers GET and
HEAD for regular files below one directory, sends ``Content-Length``, ``Last-Modified``, an
``ETag`` and ``Accept-Ranges: bytes``, and honours single HTTP ``Range`` requests (206, or 416
when unsatisfiable; ``If-Range`` is respected), so interrupted downloads can resume.

The server runs as a detached process (``python -m sandbox.modelserver serve DIR --port N``); its
pid file and log live in the state directory ``$FLEET_SANDBOX_DIR`` (default
``/var/lib/vllm-fleet/sandbox``) as ``modelserver-<port>.pid`` / ``.log``. Linux only (/proc).

Example::

    from sandbox import modelserver
    pid = modelserver.start("testmodel", port=8765)
    modelserver.start("testmodel", port=8765) == pid    # idempotent
    # → True
    # curl -O http://127.0.0.1:8765/tiny-llama.tar.gz
    modelserver.stop(8765)
    # → True

or from a shell: ``python -m sandbox.modelserver start testmodel --port 8765``, ``... status``,
``... stop``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

DEFAULT_PORT = 8765
DEFAULT_HOST = "127.0.0.1"
STATE_ENV = "FLEET_SANDBOX_DIR"
DEFAULT_STATE_DIR = "/var/lib/vllm-fleet/sandbox"
MODULE = "sandbox.modelserver"
_CHUNK = 1 << 16
_RANGE_RE = re.compile(r"bytes\s*=\s*(?P<first>[0-9]*)\s*-\s*(?P<last>[0-9]*)", re.IGNORECASE)


class ModelServerError(RuntimeError):
    """The model server could not be started, stopped or queried."""


class PortInUseError(ModelServerError):
    """The port is held by a process that is not our model server."""


# --------------------------------------------------------------------------- HTTP side


class ArchiveRequestHandler(SimpleHTTPRequestHandler):
    """Serves regular files below ``directory`` with Range support; no directory listings."""

    server_version = "vllm-fleet-modelserver/1"
    _remaining = 0

    def guess_type(self, path: str | os.PathLike[str]) -> str:
        """``.gz``/``.tgz`` as application/gzip (never a Content-Encoding), digests as text."""
        name = os.fspath(path)
        if name.endswith((".gz", ".tgz")):
            return "application/gzip"
        if name.endswith((".sha256", ".sha256sum", ".txt")):
            return "text/plain; charset=utf-8"
        return super().guess_type(name)

    def send_head(self) -> BinaryIO | None:  # type: ignore[override]
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by do_GET/do_HEAD
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        try:
            st = os.fstat(f.fileno())
            size = st.st_size
            etag = f'"{st.st_mtime_ns:x}-{size:x}"'
            last_modified = self.date_time_string(int(st.st_mtime))
            byte_range = self._requested_range(size, etag, last_modified)
            if byte_range == "unsatisfiable":
                f.close()
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                return None
            if byte_range is None:
                self.send_response(HTTPStatus.OK)
                length = size
            else:
                start, end = byte_range
                f.seek(start)
                length = end - start + 1
                self.send_response(HTTPStatus.PARTIAL_CONTENT)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Length", str(length))
            self.send_header("Last-Modified", last_modified)
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
        except Exception:
            f.close()
            raise
        self._remaining = length
        return f

    def _requested_range(
        self, size: int, etag: str, last_modified: str
    ) -> tuple[int, int] | str | None:
        """The single byte range asked for: ``(first, last)``, "unsatisfiable" or None (all).

        Malformed or multi-range headers are ignored (full response), as RFC 9110 allows.
        """
        header = self.headers.get("Range")
        if not header:
            return None
        if_range = self.headers.get("If-Range")
        if if_range and if_range.strip() not in (etag, last_modified):
            return None
        m = _RANGE_RE.fullmatch(header.strip())
        if m is None or (not m["first"] and not m["last"]):
            return None
        if not m["first"]:  # suffix range: the last N bytes
            n = int(m["last"])
            if n == 0 or size == 0:
                return "unsatisfiable"
            return max(0, size - n), size - 1
        first = int(m["first"])
        last = int(m["last"]) if m["last"] else size - 1
        if first >= size:
            return "unsatisfiable"
        if last < first:
            return None
        return first, min(last, size - 1)

    def copyfile(self, source: BinaryIO, outputfile: BinaryIO) -> None:  # type: ignore[override]
        remaining = self._remaining
        try:
            while remaining > 0:
                chunk = source.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                outputfile.write(chunk)
                remaining -= len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.log_message("client went away with %d bytes unsent", remaining)


class ArchiveServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that also binds IPv6 literals."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)


def make_server(directory: str | os.PathLike[str], port: int, host: str) -> ArchiveServer:
    """Bind (but do not run) a server for ``directory``; port 0 picks a free port.

    >>> srv = make_server("/tmp", 0, "127.0.0.1")
    >>> srv.server_address[1] > 0
    True
    >>> srv.server_close()
    """
    handler = functools.partial(ArchiveRequestHandler, directory=os.fspath(directory))
    return ArchiveServer((host, port), handler)  # type: ignore[arg-type]


def serve(
    directory: str | os.PathLike[str], port: int = DEFAULT_PORT, host: str = DEFAULT_HOST
) -> None:
    """Serve ``directory`` in the foreground until SIGTERM/SIGINT."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ModelServerError(f"not a directory: {root}")
    httpd = make_server(root, port, host)

    def _terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    print(f"serving {root} on http://{_url_host(host)}:{port}/ (pid {os.getpid()})", flush=True)
    try:
        httpd.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        httpd.server_close()
        print(f"stopped serving {root} on port {port}", flush=True)


# --------------------------------------------------------------------------- process side


@dataclass(frozen=True)
class Status:
    """What ``status()`` knows about the server on one port."""

    port: int
    running: bool
    pid: int | None = None
    directory: str | None = None
    host: str | None = None
    pid_file: str = ""
    log_file: str = ""

    @property
    def url(self) -> str | None:
        """Base URL while running, e.g. ``http://127.0.0.1:8765/``."""
        if not self.running or self.host is None:
            return None
        return f"http://{_url_host(self.host)}:{self.port}/"


def state_dir() -> Path:
    """The state directory: ``$FLEET_SANDBOX_DIR`` or /var/lib/vllm-fleet/sandbox."""
    return Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR)


def pid_file(port: int = DEFAULT_PORT) -> Path:
    """``<state dir>/modelserver-<port>.pid``."""
    return state_dir() / f"modelserver-{port}.pid"


def log_file(port: int = DEFAULT_PORT) -> Path:
    """``<state dir>/modelserver-<port>.log`` (appended to by every start)."""
    return state_dir() / f"modelserver-{port}.log"


def start(
    directory: str | os.PathLike[str],
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    timeout: float = 10.0,
) -> int:
    """Serve ``directory`` on ``host:port`` from a detached process; return its pid.

    Idempotent: if our server already serves the same directory on this port, its pid comes
    back unchanged. Returns only once the port accepts connections.

    Raises PortInUseError if another process holds the port, ModelServerError if our server on
    this port serves a different directory or the new one fails to come up.

    start("testmodel", port=8765)
    # → 12345
    """
    root = Path(directory).resolve()
    if not root.is_dir():
        raise ModelServerError(f"not a directory: {root}")
    _check_port_number(port)
    with _locked(port):
        current = status(port)
        if current.running:
            if current.directory != str(root) or current.host != host:
                raise ModelServerError(
                    f"port {port}: model server pid {current.pid} already serves "
                    f"{current.directory} on {current.host}; stop it first "
                    f"(python -m {MODULE} stop --port {port})"
                )
            return current.pid  # type: ignore[return-value]
        pid_file(port).unlink(missing_ok=True)  # stale, or not ours
        _check_port_free(host, port)
        pid = _spawn_detached(root, port, host)
        _write_pid(port, pid)
        try:
            _wait_listening(pid, host, port, timeout)
        except ModelServerError:
            _terminate(pid)
            pid_file(port).unlink(missing_ok=True)
            raise
        return pid


def stop(port: int = DEFAULT_PORT, timeout: float = 10.0) -> bool:
    """Stop the server on ``port`` by the pid in its pid file; True if one was stopped.

    A pid whose command line is not our server's (stale pid file, reused pid) is never
    signalled; the stale pid file is removed. Idempotent.

    stop(8765)
    # → True
    """
    _check_port_number(port)
    with _locked(port):
        current = status(port)
        stopped = False
        if current.running and current.pid is not None:
            stopped = _terminate(current.pid, timeout)
            if not stopped:
                raise ModelServerError(f"model server pid {current.pid} did not exit")
        pid_file(port).unlink(missing_ok=True)
        return stopped


def status(port: int = DEFAULT_PORT) -> Status:
    """Whether our server runs on ``port``, with its pid, directory and host.

    status(8765).running
    # → False
    """
    pf, lf = str(pid_file(port)), str(log_file(port))
    pid = _read_pid(pid_file(port))
    args = _our_server_args(pid, port) if pid is not None and _alive(pid) else None
    if args is None:
        return Status(port=port, running=False, pid_file=pf, log_file=lf)
    return Status(
        port=port, running=True, pid=pid, directory=args[0], host=args[1], pid_file=pf, log_file=lf
    )


# --------------------------------------------------------------------------- helpers


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _connect_host(host: str) -> str:
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)


def _check_port_number(port: int) -> None:
    if not 1 <= int(port) <= 65535:
        raise ModelServerError(f"invalid port {port}")


@contextlib.contextmanager
def _locked(port: int) -> Iterator[None]:
    """Serialise start/stop for one port across processes."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"modelserver-{port}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write_pid(port: int, pid: int) -> None:
    path = pid_file(port)
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _our_server_args(pid: int, port: int) -> tuple[str, str] | None:
    """``(directory, host)`` if ``pid`` runs ``-m sandbox.modelserver serve DIR --port <port>``."""
    argv = _cmdline(pid)
    if not argv or MODULE not in argv:
        return None
    rest = argv[argv.index(MODULE) + 1 :]
    if len(rest) < 2 or rest[0] != "serve" or "--detach" in rest:
        return None
    opts = dict(zip(rest[2::2], rest[3::2], strict=False))
    if opts.get("--port", str(DEFAULT_PORT)) != str(port):
        return None
    return rest[1], opts.get("--host", DEFAULT_HOST)


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on {host} is in use by another process, not by a model "
                    f"server started from {state_dir()}; pick another port "
                    f"(find the owner with: ss -ltnp 'sport = :{port}')"
                ) from exc
            raise ModelServerError(f"cannot bind {host}:{port}: {exc}") from exc


def _spawn_detached(root: Path, port: int, host: str) -> int:
    """Start the server via a short-lived launcher, so it is nobody's child (no zombies)."""
    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        MODULE,
        "serve",
        str(root),
        "--port",
        str(port),
        "--host",
        host,
        "--detach",
    ]
    out = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise ModelServerError(f"launcher failed ({out.returncode}): {out.stderr.strip()}")
    try:
        return int(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise ModelServerError(f"launcher printed no pid: {out.stdout!r}") from exc


def _launch(root: Path, port: int, host: str) -> int:
    """Launcher side of ``_spawn_detached``: start ``serve`` in a new session, return its pid."""
    log = log_file(port)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", MODULE, "serve", str(root), "--port", str(port), "--host", host]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def _wait_listening(pid: int, host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    target = (_connect_host(host), port)
    while time.monotonic() < deadline:
        if not _alive(pid):
            raise ModelServerError(
                f"model server exited during startup; log {log_file(port)}:\n{_log_tail(port)}"
            )
        try:
            with socket.create_connection(target, timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ModelServerError(
        f"model server pid {pid} not listening on {host}:{port} "
        f"after {timeout:.0f}s; log {log_file(port)}"
    )


def _log_tail(port: int, lines: int = 20) -> str:
    try:
        return "\n".join(log_file(port).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _terminate(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM, wait, then SIGKILL. True once the process is gone."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap, should it be our own child
            if not _alive(pid):
                return True
            time.sleep(0.05)
    return not _alive(pid)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """``python -m sandbox.modelserver start|stop|status|serve``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Loopback HTTP file server for model archives (Range requests supported). "
        f"State (pid file, log) in ${STATE_ENV} (default {DEFAULT_STATE_DIR}).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("start", "serve DIRECTORY from a detached process"),
        ("serve", "serve DIRECTORY in the foreground"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("directory", type=Path)
        sp.add_argument("--port", type=int, default=DEFAULT_PORT)
        sp.add_argument("--host", default=DEFAULT_HOST)
        if name == "serve":
            sp.add_argument("--detach", action="store_true", help=argparse.SUPPRESS)
    for name, text in (
        ("stop", "stop the server on PORT"),
        ("status", "show the server on PORT (exit 3 if not running)"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)

    try:
        if args.command == "serve":
            root = args.directory.resolve()
            if args.detach:
                print(_launch(root, args.port, args.host))
            else:
                serve(root, args.port, args.host)
            return 0
        if args.command == "start":
            pid = start(args.directory, args.port, args.host)
            st = status(args.port)
            print(f"model server pid {pid} serving {st.directory} at {st.url} (log {st.log_file})")
            return 0
        if args.command == "stop":
            print("stopped" if stop(args.port) else f"no model server on port {args.port}")
            return 0
        st = status(args.port)
        if st.running:
            print(f"running: pid {st.pid}, {st.directory} at {st.url}")
            return 0
        print(f"not running on port {args.port}")
        return 3
    except ModelServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
