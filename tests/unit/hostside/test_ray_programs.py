"""The Ray launcher's host programs: the node IP from the declared interface
(``ray_node.py``), and the bounded wait until ``ray status`` shows every member
(``ray_joined.py``), against a real one-node Ray cluster where the ``ray`` package is installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostside import ray_joined, ray_node


def test_the_node_ip_is_the_declared_interfaces_address() -> None:
    words = ray_node.command(["--interface", "lo", "--", "ray", "start", "--block"])
    assert words == ["ray", "start", "--block", "--node-ip-address", "127.0.0.1"]


def test_an_interface_without_an_address_fails_naming_it() -> None:
    with pytest.raises(SystemExit, match="interface nosuch0 has no IPv4 address"):
        ray_node.command(["--interface", "nosuch0", "--", "ray", "start"])


def test_without_an_interface_or_address_ray_chooses() -> None:
    assert ray_node.command(["--", "ray", "start"]) == ["ray", "start"]


def test_a_cluster_without_a_members_node_or_its_gpus_names_what_it_lacks() -> None:
    status = " 0.0/8.0 GPU\n 0.0/1.0 fleet_member_head\n 0B/2.0GiB memory\n"
    assert ray_joined.missing(status, ["head"], 8) == []
    assert ray_joined.missing(status, ["head", "w"], 16) == ["w", "16 GPUs (the cluster has 8)"]
    assert ray_joined.missing("No cluster status.", ["head"], 0) == ["head"]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A real Ray head (one node, member resource ``fleet_member_here``), stopped afterwards."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray is None:
        pytest.skip("the ray package is not installed in this venv (pip install ray==2.48.0)")
    gcs, manager, objects, low = _free_ports(4)
    temp = tmp_path_factory.mktemp("ray")
    process = subprocess.Popen(
        [ray, "start", "--block", "--head", "--port", str(gcs), "--include-dashboard=false",
         "--node-manager-port", str(manager), "--object-manager-port", str(objects),
         "--min-worker-port", str(low), "--max-worker-port", str(low + 20), "--num-cpus", "1",
         "--num-gpus", "0", "--resources", '{"fleet_member_here":1}', "--temp-dir", str(temp),
         "--disable-usage-stats", "--node-ip-address", "127.0.0.1"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        yield ray, f"127.0.0.1:{gcs}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def test_the_wait_ends_once_every_member_has_joined(ray_head, capsys) -> None:
    ray, address = ray_head
    start = time.monotonic()
    assert ray_joined.main(["--ray", ray, "--address", address, "--member", "here",
                            "--timeout", "90", "--interval", "1"]) == 0
    assert "every member's Ray node has joined" in capsys.readouterr().out
    assert time.monotonic() - start < 90


def test_the_wait_is_bounded_and_names_the_member_that_did_not_join(ray_head, capsys) -> None:
    ray, address = ray_head
    assert ray_joined.main(["--ray", ray, "--address", address, "--member", "here",
                            "--timeout", "90", "--interval", "1"]) == 0  # the cluster is up
    capsys.readouterr()
    start = time.monotonic()
    code = ray_joined.main(["--ray", ray, "--address", address, "--member", "here",
                            "--member", "gone-host", "--timeout", "3", "--interval", "1"])
    assert code == 2 and time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert f"the Ray node of gone-host did not join the Ray head at {address} within 3s" in err
    assert "here" not in err.split("did not join")[0]


def test_the_wait_fails_at_once_when_ray_is_gone(capsys) -> None:
    # a dead ray start (the unit's main process): no 120 s wait on a cluster that never comes
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    start = time.monotonic()
    code = ray_joined.main(["--ray", "/bin/false", "--address", "127.0.0.1:1", "--member", "a",
                            "--pid", str(gone.pid), "--timeout", "60", "--interval", "0.1"])
    assert code == 1 and time.monotonic() - start < 10
    assert f"Ray (pid {gone.pid}) exited before every member's node had joined" in (
        capsys.readouterr().err)
