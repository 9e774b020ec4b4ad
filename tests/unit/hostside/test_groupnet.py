"""A group member's links, read from /proc on this machine: a real child process connected to a
real listening socket stands in for a worker joined to its head's rendezvous port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostside import groupnet

ROOT = Path(__file__).resolve().parents[3]
WAIT_JOINED = ROOT / "hostside" / "wait_joined.py"
CLIENT = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
time.sleep(60)
"""


@pytest.fixture
def head() -> Iterator[socket.socket]:
    """A listening socket on a free loopback port (the head's rendezvous port)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def start_member(port: int) -> subprocess.Popen:
    """A process under a parent (as vLLM's workers are) that connects to ``port``."""
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{CLIENT!r}, '{port}'])"],
        stdout=subprocess.PIPE, text=True,
    )
    assert parent.stdout is not None and parent.stdout.readline().strip() == "connected"
    return parent


def stop(process: subprocess.Popen) -> None:
    for pid in groupnet.descendants(process.pid) - {process.pid}:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    process.kill()
    process.wait()


def test_a_descendant_connected_to_the_head_counts_as_joined(head: socket.socket) -> None:
    port = head.getsockname()[1]
    member = start_member(port)
    try:
        assert groupnet.joined(member.pid, "127.0.0.1", port)
        assert not groupnet.joined(member.pid, "127.0.0.1", port + 1 if port < 65535 else 1)
        conn, _ = head.accept()
        assert groupnet.accepted(groupnet.socket_inodes({os.getpid()}), port) == 1
        conn.close()
    finally:
        stop(member)


def test_wait_joined_exits_0_once_joined(head: socket.socket) -> None:
    port = head.getsockname()[1]
    member = start_member(port)
    try:
        result = subprocess.run(
            [sys.executable, str(WAIT_JOINED), "--head", "box", "--connect", f"127.0.0.1:{port}",
             "--pid", str(member.pid), "--timeout", "10"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "joined the head box" in result.stdout
    finally:
        stop(member)


def test_wait_joined_names_the_head_when_the_member_never_joins(head: socket.socket) -> None:
    port = head.getsockname()[1]
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        result = subprocess.run(
            [sys.executable, str(WAIT_JOINED), "--head", "hgx-01", "--connect",
             f"127.0.0.1:{port}", "--pid", str(idle.pid), "--timeout", "2"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 2
        assert f"did not join the head hgx-01 at 127.0.0.1:{port} within 2s" in result.stderr
    finally:
        idle.kill()
        idle.wait()


def test_wait_joined_fails_at_once_when_the_member_is_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    result = subprocess.run(
        [sys.executable, str(WAIT_JOINED), "--head", "h", "--connect", "127.0.0.1:1",
         "--pid", str(gone.pid), "--timeout", "30"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1 and "exited before it joined" in result.stderr
