"""Tests for sandbox.modelserver: a real detached server on a free loopback port."""

from __future__ import annotations

import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandbox import modelserver

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv(modelserver.STATE_ENV, str(d))
    return d


@pytest.fixture
def served(tmp_path: Path, state: Path):
    """A detached server on a free port over a directory holding one 300 kB file."""
    root = tmp_path / "www"
    root.mkdir()
    data = os.urandom(300_000)
    (root / "model.tar.gz").write_bytes(data)
    (root / "sub").mkdir()
    port = free_port()
    pid = modelserver.start(root, port=port)
    try:
        yield {
            "port": port,
            "pid": pid,
            "root": root,
            "data": data,
            "url": f"http://{HOST}:{port}/model.tar.gz",
        }
    finally:
        modelserver.stop(port)


def test_download_matches(served):
    status, headers, body = get(served["url"])
    assert status == 200
    assert body == served["data"]
    assert headers["Content-Length"] == str(len(served["data"]))
    assert headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Type"] == "application/gzip"
    assert "Content-Encoding" not in headers


def test_range_returns_slice(served):
    data, size = served["data"], len(served["data"])
    status, headers, body = get(served["url"], {"Range": "bytes=1000-1999"})
    assert status == 206
    assert body == data[1000:2000]
    assert headers["Content-Range"] == f"bytes 1000-1999/{size}"
    assert headers["Content-Length"] == "1000"

    status, headers, body = get(served["url"], {"Range": "bytes=299000-"})  # resume
    assert (status, body) == (206, data[299000:])
    status, headers, body = get(served["url"], {"Range": "bytes=-10"})  # suffix
    assert (status, body) == (206, data[-10:])
    status, headers, body = get(served["url"], {"Range": "bytes=0-99999999"})  # clipped
    assert (status, body) == (206, data)
    assert headers["Content-Range"] == f"bytes 0-{size - 1}/{size}"


def test_range_edge_cases(served):
    size = len(served["data"])
    status, headers, _ = get(served["url"], {"Range": f"bytes={size}-"})
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{size}"
    # multi-range and malformed ranges: the whole file
    for rng in ("bytes=0-1,5-6", "bytes=abc", "items=0-1", "bytes=5-1"):
        status, _, body = get(served["url"], {"Range": rng})
        assert (status, len(body)) == (200, size), rng
    # If-Range: a matching validator keeps the range, a stale one gets the whole file
    _, headers, _ = get(served["url"])
    status, _, body = get(served["url"], {"Range": "bytes=0-9", "If-Range": headers["ETag"]})
    assert (status, body) == (206, served["data"][:10])
    status, _, body = get(served["url"], {"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert (status, len(body)) == (200, size)


def test_head_and_not_found(served):
    req = urllib.request.Request(served["url"], method="HEAD")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Length"] == str(len(served["data"]))
        assert resp.read() == b""
    base = f"http://{HOST}:{served['port']}"
    assert get(base + "/")[0] == 404  # no directory listings
    assert get(base + "/sub/")[0] == 404
    assert get(base + "/missing.tar.gz")[0] == 404
    assert get(base + "/../../../../etc/passwd")[0] == 404


def test_start_twice_same_pid(served):
    assert modelserver.start(served["root"], port=served["port"]) == served["pid"]
    st = modelserver.status(served["port"])
    assert st.running and st.pid == served["pid"]
    assert st.directory == str(served["root"].resolve())
    assert st.url == f"http://{HOST}:{served['port']}/"
    assert Path(st.pid_file).read_text().strip() == str(served["pid"])
    # the same port for another directory is refused, not silently swapped
    with pytest.raises(modelserver.ModelServerError, match="already serves"):
        modelserver.start(served["root"] / "sub", port=served["port"])


def test_stop_closes_port_and_is_idempotent(served):
    port, pid = served["port"], served["pid"]
    assert port_open(port)
    assert modelserver.stop(port) is True
    assert not port_open(port)
    assert not Path(f"/proc/{pid}").exists() or not modelserver._alive(pid)
    assert not Path(modelserver.status(port).pid_file).exists()
    assert modelserver.stop(port) is False
    assert modelserver.status(port).running is False
    # and it starts again on the same port right away
    assert modelserver.start(served["root"], port=port) != pid


def test_stop_never_signals_a_foreign_pid(state: Path):
    port = free_port()
    state.mkdir(parents=True)
    modelserver.pid_file(port).write_text(f"{os.getpid()}\n")  # a reused pid: ours, pytest's
    assert modelserver.status(port).running is False
    assert modelserver.stop(port) is False  # and we are still alive to assert it
    assert not modelserver.pid_file(port).exists()


def test_port_taken_by_someone_else(tmp_path: Path, state: Path):
    with socket.socket() as other:
        other.bind((HOST, 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(modelserver.PortInUseError, match=f"port {port}"):
            modelserver.start(tmp_path, port=port)
    assert not modelserver.pid_file(port).exists()


def test_start_rejects_missing_directory(tmp_path: Path, state: Path):
    with pytest.raises(modelserver.ModelServerError, match="not a directory"):
        modelserver.start(tmp_path / "nope", port=free_port())


def test_cli_status_exit_codes(served, capsys):
    assert modelserver.main(["status", "--port", str(served["port"])]) == 0
    assert f"pid {served['pid']}" in capsys.readouterr().out
    assert modelserver.main(["stop", "--port", str(served["port"])]) == 0
    assert modelserver.main(["status", "--port", str(served["port"])]) == 3


def test_in_process_server(tmp_path: Path):
    """make_server() also works in-process (port 0), e.g. for fixtures in other tests."""
    (tmp_path / "a.sha256").write_text("x" * 64 + "  a.tar.gz\n")
    srv = modelserver.make_server(tmp_path, 0, HOST)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://{HOST}:{srv.server_address[1]}/a.sha256"
        status, headers, body = get(url, {"Range": "bytes=64-"})
        assert (status, body) == (206, b"  a.tar.gz\n")
        assert headers["Content-Type"].startswith("text/plain")
    finally:
        srv.shutdown()
        srv.server_close()
