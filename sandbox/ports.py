"""Ports of sandbox hosts, which share this machine's network: each host's sshd port on
127.0.0.1 (from :data:`SSH_PORT_FIRST` up) and the service ports it declares, which must be free
and declared by no other sandbox host; a taken port is refused naming its owner.

Example:
    check_ports({"gpu-a": [18000]})    # raises SandboxError if 18000 is taken, naming who has it
    pick_ssh_port(taken={2222})
    # → 2223
"""

from __future__ import annotations

import re
import socket
import subprocess

from sandbox import state
from sandbox.system import SandboxError

SSH_PORT_FIRST = 2222
SSH_PORT_LAST = 2999


def in_use_by_sandboxes(exclude: set[str]) -> dict[int, str]:
    """Ports (ssh and declared) of every sandbox host with state, except ``exclude``."""
    used: dict[int, str] = {}
    for other in state.list_hosts():
        if other in exclude:
            continue
        recorded = state.read_state(other) or {}
        for port in [recorded.get("ssh_port"), *recorded.get("ports", [])]:
            if port:
                used[int(port)] = other
    return used


def check_ports(hosts: dict[str, list[int]]) -> None:
    """Refuse declared ports that collide with each other, other sandboxes, or live sockets."""
    owners = in_use_by_sandboxes(set(hosts))
    for name, ports in hosts.items():
        for port in ports:
            if not 1 <= port <= 65535:
                raise SandboxError(f"port {port} for sandbox host {name} is not a valid port")
            if port in owners:
                raise SandboxError(
                    f"port {port} for sandbox host {name} is already declared by sandbox host "
                    f"{owners[port]} (sandbox hosts share this machine's network); pick another"
                )
            owners[port] = name
            if not port_free(port):
                raise SandboxError(
                    f"port {port} for sandbox host {name} is taken by {port_owner(port)}; "
                    "stop that process or declare another port"
                )


def port_free(port: int) -> bool:
    """True if ``port`` can be bound on every address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def port_owner(port: int) -> str:
    """Who listens on ``port``, from ``ss -ltnp``: e.g. ``python3 (pid 4242)``."""
    out = subprocess.run(
        ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True
    ).stdout
    found = re.findall(r'\("([^"]+)",pid=(\d+)', out)
    if not found:
        return "another process (ss shows no owner; maybe another network namespace)"
    return ", ".join(f"{cmd} (pid {pid})" for cmd, pid in dict.fromkeys(found))


def pick_ssh_port(taken: set[int]) -> int:
    """The first free sshd port from :data:`SSH_PORT_FIRST` that is not ``taken``."""
    for port in range(SSH_PORT_FIRST, SSH_PORT_LAST + 1):
        if port not in taken and port_free(port):
            return port
    raise SandboxError(
        f"no free sshd port between {SSH_PORT_FIRST} and {SSH_PORT_LAST}; "
        "run `fleet sandbox down` for hosts you no longer need"
    )

