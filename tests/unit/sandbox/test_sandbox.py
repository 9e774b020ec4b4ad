"""Sandbox hosts: real systemd containers reached over real SSH (sandbox.hosts and its parts).

The e2e tests share two hosts started once for the module, in a temporary FLEET_SANDBOX_DIR;
the base image is cached in the default IMAGE_DIR, so only the first run builds it (~35 s).
Run with: ``.venv/bin/python -m pytest -m e2e tests/test_sandbox.py``
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from sandbox import containers, state, system
from sandbox import hosts as sandbox
from sandbox.state import SandboxHost
from sandbox.system import SandboxError

A, B, C = "t-sbx-a", "t-sbx-b", "t-sbx-c"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on now (the kernel's choice, then released)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def ssh(conn: dict, command: str, known_hosts: str | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` on a sandbox host with exactly the data pyinfra gets from connection()."""
    argv = [
        "ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-i", conn["ssh_key"],
        "-o", f"UserKnownHostsFile={known_hosts or conn['ssh_known_hosts_file']}",
        "-o", f"StrictHostKeyChecking={conn['ssh_strict_host_key_checking']}",
        "-p", str(conn["ssh_port"]),
        f"{conn['ssh_user']}@{conn['ssh_hostname']}",
        command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def run_on(name: str, command: str) -> str:
    conn = sandbox.connection(name)
    assert conn is not None, f"{name} is not running"
    res = ssh(conn, command)
    assert res.returncode == 0, f"{command!r} on {name}: {res.stderr}"
    return res.stdout


# ---- without hosts --------------------------------------------------------------------------


def test_missing_tools_name_the_apt_command(monkeypatch):
    monkeypatch.setattr(system.shutil, "which", lambda tool: None)
    with pytest.raises(SandboxError, match="apt-get install systemd-container mmdebstrap"):
        system.require_tools("systemd-nspawn", "mmdebstrap")


def test_not_root_is_refused(monkeypatch):
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="need root"):
        sandbox.up({"t-sbx-x": []})


def test_invalid_name_is_refused():
    with pytest.raises(SandboxError, match="invalid sandbox host name"):
        sandbox.status(["Bad/Name"])


# ---- e2e: two hosts for the whole module ----------------------------------------------------


@pytest.fixture(scope="module")
def sandbox_dir(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("sandbox hosts need root")
    path = tmp_path_factory.mktemp("sandbox")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(state, "SANDBOX_DIR", path)
        mp.setenv("FLEET_SANDBOX_DIR", str(path))
        yield path
        sandbox.down(state.list_hosts())


@pytest.fixture(scope="module")
def declared(sandbox_dir) -> dict[str, list[int]]:
    a1, a2, b1 = free_ports(3)
    return {A: [a1, a2], B: [b1]}


@pytest.fixture(scope="module")
def hosts(declared) -> dict[str, SandboxHost]:
    try:
        yield {h.name: h for h in sandbox.up(declared)}
    finally:
        sandbox.down(list(declared))


@pytest.fixture(scope="module")
def pip_on_a(hosts) -> str:
    """Host A with pip installed through apt, as a deploy would."""
    run_on(
        A,
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq --no-install-recommends python3-pip >/dev/null",
    )
    return A


@pytest.mark.e2e
def test_both_hosts_run_with_distinct_ssh_ports(hosts, declared):
    assert [h.state for h in hosts.values()] == ["running", "running"]
    assert hosts[A].ssh_port != hosts[B].ssh_port
    assert {n: h.ports for n, h in hosts.items()} == declared
    assert sandbox.status([A, B]) == list(hosts.values())


@pytest.mark.e2e
@pytest.mark.parametrize("name", [A, B])
def test_ssh_with_strict_known_hosts_reaches_booted_systemd(hosts, name):
    conn = sandbox.connection(name)
    assert conn["ssh_strict_host_key_checking"] == "yes"
    assert Path(conn["ssh_key"]).stat().st_mode & 0o077 == 0
    res = ssh(conn, "hostname; systemctl is-system-running")
    assert res.returncode in (0, 1), res.stderr  # 1: degraded
    assert res.stdout.split()[0] == name
    assert res.stdout.split()[1] in ("running", "degraded")


@pytest.mark.e2e
def test_unknown_host_key_is_refused(hosts, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    res = ssh(sandbox.connection(A), "true", known_hosts=str(empty))
    assert res.returncode == 255
    assert "Host key verification failed" in res.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("name", [A, B])
def test_container_is_detected(hosts, name):
    assert run_on(name, "systemd-detect-virt --container").strip() == "systemd-nspawn"


@pytest.mark.e2e
def test_each_host_has_its_own_cgroup(hosts):
    cgroups = {n: Path(f"/proc/{h.pid}/cgroup").read_text() for n, h in hosts.items()}
    assert cgroups[A] != cgroups[B]
    for name, text in cgroups.items():
        assert f"0::/{containers.CGROUP_PREFIX}{name}/" in text
        assert f"name=systemd:/{containers.CGROUP_PREFIX}{name}/" in text


@pytest.mark.e2e
def test_pyinfra_connects_with_connection_data(hosts, tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        f"sandbox = [({A!r}, {sandbox.connection(A)!r}), ({B!r}, {sandbox.connection(B)!r})]\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(inventory), "exec", "--", "hostname"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"[{A}] {A}" in res.stdout + res.stderr
    assert f"[{B}] {B}" in res.stdout + res.stderr


@pytest.mark.e2e
def test_pip_config_is_inherited_from_the_host(pip_on_a):
    host = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout.splitlines()
    expected = [line for line in host if line.startswith("global.")]
    assert any(line.startswith("global.find-links=") for line in expected)
    inside = run_on(pip_on_a, "pip config list").splitlines()
    assert set(expected) <= set(inside)


@pytest.mark.e2e
def test_pip_download_works_inside(pip_on_a):
    out = run_on(pip_on_a, "cd /tmp && pip download --no-deps -d /tmp/x six 2>&1")
    assert "Saved" in out or "already" in out, out
    assert "six-" in run_on(pip_on_a, "ls /tmp/x")


@pytest.mark.e2e
def test_https_through_the_machines_ca_works_inside(hosts):
    code = run_on(B, "curl -sS -o /dev/null -w '%{http_code}' https://pypi.org/simple/six/")
    assert code == "200"


@pytest.mark.e2e
def test_up_again_is_a_noop(hosts, declared):
    again = {h.name: h for h in sandbox.up(declared)}
    assert again == hosts


@pytest.mark.e2e
def test_taken_port_is_refused_with_its_owner(hosts):
    (port,) = free_ports(1)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with pytest.raises(SandboxError, match=rf"port {port} for sandbox host {C} is taken by"):
            sandbox.up({C: [port]})
    assert sandbox.status([C])[0].state == "absent"


@pytest.mark.e2e
def test_port_declared_by_another_sandbox_is_refused(hosts, declared):
    port = declared[B][0]
    with pytest.raises(SandboxError, match=f"already declared by sandbox host {B}"):
        sandbox.up({C: [port]})
    assert sandbox.status([C])[0].state == "absent"


@pytest.mark.e2e
def test_stale_host_is_restarted_fresh(hosts):
    (first,) = sandbox.up({C: []})
    run_on(C, "touch /root/marker")
    os.kill(first.pid, signal.SIGKILL)  # the nspawn we started: simulate a crash
    deadline = time.monotonic() + 10
    while sandbox.status([C])[0].state != "stopped" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox.status([C])[0].state == "stopped"
    (second,) = sandbox.up({C: []})
    assert second.state == "running"
    assert second.pid != first.pid
    assert run_on(C, "ls /root/marker 2>/dev/null || echo fresh").strip() == "fresh"
    sandbox.down([C])


@pytest.mark.e2e
def test_down_stops_everything_and_is_idempotent(hosts, sandbox_dir):
    gone = sandbox.down([A, B])
    assert [(h.name, h.state, h.pid) for h in gone] == [(A, "absent", None), (B, "absent", None)]
    for name, host in hosts.items():
        cmdline = Path(f"/proc/{host.pid}/cmdline")
        assert not cmdline.exists() or b"systemd-nspawn" not in cmdline.read_bytes()
        assert not (sandbox_dir / name).exists()
        assert not Path(f"/sys/fs/cgroup/unified/{containers.CGROUP_PREFIX}{name}").exists()
        assert not Path(f"/sys/fs/cgroup/systemd/{containers.CGROUP_PREFIX}{name}").exists()
        assert sandbox.connection(name) is None
    assert str(sandbox_dir) not in Path("/proc/self/mountinfo").read_text()
    assert [h.state for h in sandbox.down([A, B])] == ["absent", "absent"]
