r"""This machine's primitives the sandbox modules share: root and tool checks, file locks, the
mount table, a delete that stops at mounts, commands that fail with their output, and
:class:`SandboxError`, which every sandbox step raises with what to do about it.

Example:
    >>> esc(Path("/srv/a:b"))
    '/srv/a\\:b'
    >>> tail(Path("/nonexistent/console.log"))
    '(no log)'
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


class SandboxError(Exception):
    """A sandbox operation failed; the message says what to do about it."""


_TOOLS = {  # binary -> Debian package that provides it
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ss": "iproute2",
}


def require_root() -> None:
    """Refuse to go on without root (overlay mounts, cgroups, systemd-nspawn)."""
    if os.geteuid() != 0:
        raise SandboxError(
            "sandbox hosts need root (overlay mounts, cgroups, systemd-nspawn); run as root, "
            "e.g. `sudo fleet sandbox up`"
        )


def require_tools(*tools: str) -> None:
    """Refuse missing programs, naming the apt command that installs them."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        packages = " ".join(dict.fromkeys(_TOOLS[t] for t in missing))
        raise SandboxError(
            f"missing {', '.join(missing)}: install with `apt-get install {packages}`"
        )


@contextlib.contextmanager
def lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def mounts() -> list[dict[str, str]]:
    """This mount namespace's mounts: target, fstype, options (from /proc/self/mountinfo)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        out.append({"target": target, "fstype": rest[0], "options": rest[-1]})
    return out


def safe_rmtree(path: Path) -> None:
    """rm -r that refuses to descend into anything mounted below ``path``."""
    prefix = str(path).rstrip("/") + "/"
    mounted = [m["target"] for m in mounts() if (m["target"] + "/").startswith(prefix)]
    if mounted:
        raise SandboxError(
            f"refusing to delete {path}: still mounted there: {', '.join(mounted)}; "
            "unmount them, then retry"
        )
    shutil.rmtree(path, ignore_errors=False)


def esc(path: Path) -> str:
    """A path for systemd-nspawn's --bind (colons escaped)."""
    return str(path).replace("\\", "\\\\").replace(":", "\\:")


def run(argv: list[str]) -> None:
    """Run ``argv``; a failure raises SandboxError with its exit code and output."""
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SandboxError(
            f"`{shlex.join(argv)}` failed (exit {res.returncode}): "
            f"{(res.stderr or res.stdout).strip()}"
        )


def tail(path: Path, lines: int = 20) -> str:
    """The last non-blank ``lines`` of a log, colours stripped; ``(no log)`` if it is missing."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])

