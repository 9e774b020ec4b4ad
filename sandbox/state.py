"""The state a sandbox host leaves on disk, and what it says: running, stopped or absent.

Each host has a folder under :data:`SANDBOX_DIR` holding ``state.json`` (its sshd port,
declared ports and image, written by :func:`write_state`), ``nspawn.pid`` (the systemd-nspawn
we started) and its overlay. A host is *running* only while that PID is alive and is our
systemd-nspawn for it (checked by command line), so a reused PID is never mistaken for it.
The ports, keys, containers and hosts modules read it here; ``state.json`` is written only
here.

Example:
    >>> check_name("gpu-a")
    >>> check_name("../etc")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sandbox.system.SandboxError: invalid sandbox host name '../etc': use lowercase letters, ...
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.system import SandboxError

#: Per-host state (overlay upper/work dirs, console log, PID file) and the client key pair.
SANDBOX_DIR = Path(os.environ.get("FLEET_SANDBOX_DIR", "/var/lib/vllm-fleet/sandbox"))
_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9._-]{0,46}[a-z0-9])?")


@dataclass
class SandboxHost:
    """The state of one sandbox host.

    + name: host name (also the container's hostname and machine name)
    + state: ``"running"``, ``"stopped"`` (state left behind, process gone) or ``"absent"``
    + ssh_port: sshd port on 127.0.0.1, None when absent
    + pid: PID of the systemd-nspawn process we started, None unless running
    + ports: service ports declared for the host (informational)

    Example:
        SandboxHost("gpu-a", "running", 2222, 4242, [18000])
        # → SandboxHost(name='gpu-a', state='running', ssh_port=2222, pid=4242, ports=[18000])
    """

    name: str
    state: str
    ssh_port: int | None
    pid: int | None
    ports: list[int] = field(default_factory=list)


def check_name(name: str) -> None:
    """Refuse a host name that cannot be a machine name and a folder of its own."""
    if not _NAME_RE.fullmatch(name) or ".." in name:
        raise SandboxError(
            f"invalid sandbox host name {name!r}: use lowercase letters, digits, '-', '.', '_' "
            "(at most 48, starting and ending with a letter or digit)"
        )


def host_dir(name: str) -> Path:
    """The host's folder: state, overlay layers, console log, PID file."""
    return SANDBOX_DIR / name


def read_state(name: str) -> dict | None:
    """The host's ``state.json``, or None when it has none (or a broken one)."""
    try:
        return json.loads((host_dir(name) / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_state(name: str, ssh_port: int, ports: list[int], image: Path) -> None:
    """Record a starting host's sshd port, declared ports and image in its ``state.json``."""
    (host_dir(name) / "state.json").write_text(
        json.dumps({"name": name, "ssh_port": ssh_port, "ports": ports, "image": str(image)})
    )


def read_pid(name: str) -> int | None:
    """The PID of the systemd-nspawn started for the host, or None."""
    try:
        return int((host_dir(name) / "nspawn.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def list_hosts() -> list[str]:
    """Names of the sandbox hosts that have state under :data:`SANDBOX_DIR`, sorted.

    Example:
        list_hosts()
        # → ['gpu-a', 'gpu-b']
    """
    if not SANDBOX_DIR.is_dir():
        return []
    return sorted(p.parent.name for p in SANDBOX_DIR.glob("*/state.json"))


def host_status(name: str) -> SandboxHost:
    """The host's state as its folder and its process say (a valid name is assumed)."""
    if not host_dir(name).is_dir():
        return SandboxHost(name, "absent", None, None, [])
    state = read_state(name) or {}
    pid = read_pid(name)
    running = pid is not None and is_our_nspawn(pid, name)
    return SandboxHost(
        name,
        "running" if running else "stopped",
        state.get("ssh_port"),
        pid if running else None,
        list(state.get("ports", [])),
    )


def is_our_nspawn(pid: int, name: str) -> bool:
    """True if ``pid`` is alive and is the systemd-nspawn we started for ``name``."""
    reap(pid)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    merged = str(host_dir(name) / "merged").encode()
    return (
        bool(argv)
        and os.path.basename(argv[0]) == b"systemd-nspawn"
        and f"--machine={name}".encode() in argv
        and b"--directory=" + merged in argv
    )


def reap(pid: int) -> None:
    """Collect ``pid`` if it is an exited child of this process (else it lingers as a zombie)."""
    proc = CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del CHILDREN[pid]
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


#: Nspawn processes started by this Python process, kept so that they can be reaped.
CHILDREN: dict[int, subprocess.Popen] = {}

