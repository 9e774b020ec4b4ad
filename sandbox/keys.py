"""SSH to sandbox hosts: one client key pair and one ``known_hosts`` file (seeded from the
image's host keys, strict checking on) under :data:`sandbox.state.SANDBOX_DIR` serve all hosts.

Example:
    >>> ssh_argv(2222, "hostname")[-3:]
    ['2222', 'root@127.0.0.1', 'hostname']
    >>> client_key().name, known_hosts().parent == client_key().parent
    ('id_ed25519', True)
"""

from __future__ import annotations

from pathlib import Path

from sandbox import state, system


def client_key() -> Path:
    """The client's private key, which every sandbox host's root accepts (``.pub`` beside it)."""
    return state.SANDBOX_DIR / "id_ed25519"


def known_hosts() -> Path:
    """The known_hosts file that names every sandbox host's keys at its sshd port."""
    return state.SANDBOX_DIR / "known_hosts"


def ensure_client_key() -> None:
    """Create the client key pair all sandbox hosts trust, once; keep it 0600."""
    key = client_key()
    if not key.exists():
        system.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-fleet-sandbox",
                    "-f", str(key)])  # fmt: skip
    key.chmod(0o600)


def write_known_hosts() -> None:
    """One line per sandbox host and host key type, written atomically."""
    lines = []
    for name in state.list_hosts():
        recorded = state.read_state(name) or {}
        image, port = recorded.get("image"), recorded.get("ssh_port")
        if not image or not port:
            continue
        for pub in sorted(Path(image).glob("etc/ssh/ssh_host_*_key.pub")):
            keytype, blob = pub.read_text().split()[:2]
            lines.append(f"[127.0.0.1]:{port} {keytype} {blob}\n")
    tmp = state.SANDBOX_DIR / ".known_hosts.tmp"
    tmp.write_text("".join(lines))
    tmp.replace(known_hosts())


def ssh_argv(port: int, command: str) -> list[str]:
    """The ``ssh`` command line that runs ``command`` as root on the sshd at ``port``."""
    return [
        "ssh", "-F", "none",
        "-i", str(client_key()),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known_hosts()}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10",
        "-o", "LogLevel=ERROR",
        "-p", str(port),
        "root@127.0.0.1",
        command,
    ]  # fmt: skip

