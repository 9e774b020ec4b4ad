"""The peer server (hostside/peer_serve.py), run as a host runs it, over real HTTP on loopback.

What a host serves its peers, and what it refuses: its kept blobs whole or by range (206, 416),
nothing to a request without the token (401) or with a wrong one (403), no other path (no
listing, no traversal, no link followed), no method but GET and HEAD; no more transfers at
once than its bound (503 with Retry-After); only on the address it is given, never every
interface unless told; the token never on its command line nor in anything it prints; and it
goes away by itself once idle or past its deadline.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostside import local_command
from tests.support.hostprograms import run_program
from tests.support.peerserver import PeerProcess, token_file
from tests.support.wait import wait_until

TOKEN = "peer-token-0123456789abcdef"


@pytest.fixture
def models(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    (folder / ".blobs").mkdir(parents=True)
    return folder


@pytest.fixture
def blob(models: Path) -> tuple[str, bytes]:
    """One kept blob of 200 kB: its digest and bytes."""
    data = os.urandom(200_000)
    digest = hashlib.sha256(data).hexdigest()
    (models / ".blobs" / digest).write_bytes(data)
    return digest, data


@pytest.fixture
def token(tmp_path: Path) -> Path:
    return token_file(tmp_path, TOKEN)


@pytest.fixture
def peer(models: Path, token: Path, blob: tuple[str, bytes]) -> Iterator[PeerProcess]:
    with PeerProcess(models, token) as server:
        yield server


# --------------------------------------------------------------------------- serving


def test_a_kept_blob_is_served_whole_with_its_digest_as_etag(peer: PeerProcess, blob) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", TOKEN)
    assert response.status == 200
    assert response.body == data
    assert response.getheader("ETag") == f'"{digest}"'
    assert response.getheader("Accept-Ranges") == "bytes"
    assert "serving 1 blob at http://127.0.0.2:" in peer.first_line


@pytest.mark.parametrize(
    "asked,first,last",
    [("bytes=10-19", 10, 19), ("bytes=199990-", 199990, 199999), ("bytes=-7", 199993, 199999),
     ("bytes=0-999999", 0, 199999), ("bytes=123456-123456", 123456, 123456)],
)
def test_a_range_is_answered_206_with_content_range(peer: PeerProcess, blob, asked: str,
                                                    first: int, last: int) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", TOKEN, headers={"Range": asked})
    assert response.status == 206
    assert response.getheader("Content-Range") == f"bytes {first}-{last}/{len(data)}"
    assert response.body == data[first : last + 1]


@pytest.mark.parametrize("asked", ["bytes=200000-", "bytes=999999-1000000", "bytes=-0"])
def test_a_range_beyond_the_end_is_416_with_the_size(peer: PeerProcess, blob, asked) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", TOKEN, headers={"Range": asked})
    assert response.status == 416
    assert response.getheader("Content-Range") == f"bytes */{len(data)}"
    assert data[:16] not in response.body


def test_if_range_with_another_etag_sends_the_whole_blob(peer: PeerProcess, blob) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", TOKEN,
                        headers={"Range": "bytes=10-", "If-Range": '"something-else"'})
    assert response.status == 200 and response.body == data


def test_head_sends_the_headers_alone(peer: PeerProcess, blob) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", TOKEN, method="HEAD")
    assert response.status == 200
    assert response.getheader("Content-Length") == str(len(data))
    assert response.body == b""


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "headers,status",
    [
        ({}, 401),
        ({"Authorization": f"Basic {TOKEN}"}, 401),
        ({"Authorization": "Bearer wrong-token-0123456789"}, 403),
        ({"Authorization": f"Bearer {TOKEN}x"}, 403),
        ({"Authorization": f"Bearer {TOKEN[:-1]}"}, 403),
    ],
    ids=["none", "basic", "wrong", "longer", "shorter"],
)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_without_the_token_not_a_byte_is_served(peer: PeerProcess, blob, headers, status,
                                                method) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", method=method, headers=headers)
    assert response.status == status
    assert response.getheader("Content-Length") != str(len(data))
    assert len(response.body) < 100 and data[:16] not in response.body
    if status == 401:
        assert response.getheader("WWW-Authenticate", "").startswith("Bearer")


@pytest.mark.parametrize(
    "path",
    [
        "/blobs/../../../../etc/passwd", "/blobs/%2e%2e/%2e%2e/etc/passwd", "/../etc/passwd",
        "/blobs/", "/", "/blobs", "/blobs/{digest}/", "/blobs/{digest}?x=1",
        "/blobs/{upper}", "/blobs/{digest}/../{digest}", "/blobs/{missing}", "/blobs/{link}",
        "/blobs/.{digest}.tmp",
    ],
)
def test_only_a_kept_blob_by_its_digest_is_served(peer: PeerProcess, blob, models: Path,
                                                  path: str) -> None:
    digest, data = blob
    link = hashlib.sha256(b"link").hexdigest()
    os.symlink("/etc/passwd", models / ".blobs" / link)
    (models / ".blobs" / f".{digest}.tmp").write_bytes(b"half")
    asked = path.format(digest=digest, upper=digest.upper(), missing="0" * 64, link=link)
    response = peer.get(asked, TOKEN)
    assert response.status == 404
    assert b"root:" not in response.body and data[:16] not in response.body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_only_get_and_head(peer: PeerProcess, blob, models: Path, method: str) -> None:
    digest, data = blob
    response = peer.get(f"/blobs/{digest}", TOKEN, method=method)
    assert response.status >= 400
    assert (models / ".blobs" / digest).read_bytes() == data


# --------------------------------------------------------------------------- bounds


def test_transfers_beyond_the_bound_are_told_to_come_back(models: Path, token: Path) -> None:
    data = os.urandom(48 << 20)  # more than loopback's socket buffers hold
    digest = hashlib.sha256(data).hexdigest()
    (models / ".blobs" / digest).write_bytes(data)
    with PeerProcess(models, token, extra=("--max-transfers", "1")) as peer:
        holder = socket.create_connection((peer.address, peer.port), timeout=10)
        holder.sendall(f"GET /blobs/{digest} HTTP/1.1\r\nHost: p\r\n"
                       f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        assert holder.recv(64).startswith(b"HTTP/1.0 200")  # the one slot is taken, unread
        busy = peer.get(f"/blobs/{digest}", TOKEN, headers={"Range": "bytes=0-9"})
        assert busy.status == 503
        assert busy.getheader("Retry-After") == "2"
        assert peer.get(f"/blobs/{digest}", TOKEN, method="HEAD").status == 200
        holder.close()  # the slot comes back once the server sees the receiver gone
        wait_until(lambda: peer.get(f"/blobs/{digest}", TOKEN,
                                    headers={"Range": "bytes=0-9"}).status == 206,
                   timeout=10, interval=0.1, message="the slot never came back")


def test_it_listens_only_on_the_address_it_is_given(peer: PeerProcess, blob) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", peer.port), timeout=5).close()
    assert peer.get(f"/blobs/{blob[0]}", TOKEN).status == 200


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "peer.example", "fe80::1%eth0"])
def test_every_interface_or_a_name_is_refused(models: Path, token: Path, address: str) -> None:
    result = run_program("peer_serve", "--models-dir", str(models), "--address", address,
                         "--port", "0", "--token-file", str(token))
    assert result.returncode == 2
    assert "--address" in result.stderr or "every interface" in result.stderr


def test_every_interface_only_when_told(models: Path, token: Path, blob) -> None:
    with PeerProcess(models, token, address="0.0.0.0", extra=("--allow-any-address",)) as peer:
        assert "http://0.0.0.0:" in peer.first_line


# --------------------------------------------------------------------------- the token


def test_the_token_is_on_no_command_line_and_in_no_output(peer: PeerProcess, blob) -> None:
    cmdline = Path(f"/proc/{peer.pid}/cmdline").read_bytes()
    assert TOKEN.encode() not in cmdline and b"--token-file" in cmdline
    peer.get(f"/blobs/{blob[0]}", TOKEN)
    peer.get(f"/blobs/{blob[0]}", "wrong-token-0123456789")
    peer.get("/blobs/../x", TOKEN)
    peer.stop()
    assert TOKEN not in peer.output()
    assert '"GET /blobs/../x HTTP/1.1" 404' in peer.output()


def test_a_token_file_open_to_others_is_refused(models: Path, tmp_path: Path, blob) -> None:
    shared = token_file(tmp_path, TOKEN, mode=0o644)
    result = run_program("peer_serve", "--models-dir", str(models), "--address", "127.0.0.2",
                         "--port", "0", "--token-file", str(shared))
    assert result.returncode == 1
    assert "open to other users (mode 0644): chmod 600 it" in result.stderr
    assert TOKEN not in result.stdout + result.stderr


def test_the_token_may_come_on_stdin(models: Path, blob) -> None:
    process = subprocess.Popen(
        local_command("peer_serve", "--models-dir", str(models), "--address", "127.0.0.3",
                      "--port", "0", "--token-stdin", "--idle-exit", "5", python="python3"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd="/", env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(TOKEN + "\n")
        process.stdin.close()
        line = process.stdout.readline()
        port = int(line.split("/blobs/")[0].rsplit(":", 1)[1])
        peer = PeerProcess(models, Path("/nonexistent"), address="127.0.0.3")
        peer.port = port
        assert peer.get(f"/blobs/{blob[0]}", TOKEN).body == blob[1]
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]


# --------------------------------------------------------------------------- going away


def test_it_stops_by_itself_when_idle(models: Path, token: Path, blob) -> None:
    peer = PeerProcess(models, token, extra=("--idle-exit", "0.5")).start()
    try:
        assert peer.get(f"/blobs/{blob[0]}", TOKEN).status == 200
        assert peer.wait(15) == 0
    finally:
        peer.stop()
    assert "stopped: nothing was asked for 0.5 s" in peer.output()


def test_it_stops_at_its_deadline_even_when_asked(models: Path, token: Path, blob) -> None:
    peer = PeerProcess(models, token, extra=("--deadline", "1.5", "--idle-exit", "60")).start()
    try:
        assert peer.get(f"/blobs/{blob[0]}", TOKEN, method="HEAD").status == 200
        assert peer.wait(15) == 0
    finally:
        peer.stop()
    assert "stopped: the deadline of 1.5 s passed" in peer.output()


def test_without_kept_blobs_there_is_nothing_to_serve(tmp_path: Path, token: Path) -> None:
    result = run_program("peer_serve", "--models-dir", str(tmp_path / "none"), "--address",
                         "127.0.0.2", "--port", "0", "--token-file", str(token))
    assert result.returncode == 1 and "no blobs are kept in" in result.stderr
