"""Files the fleet file names on the control machine: each host's ssh identity (``ssh.key``) and
each local model (``models.NAME.file``), examined before any host is touched.

An identity file must be what ssh will use: a regular file of at most 64 KiB that starts as a
private key does (OpenSSH or PEM), not the public half (``ssh-ed25519 AAAA…``), and not open
to others: ssh ignores such a key ("WARNING: UNPROTECTED PRIVATE KEY FILE! … This private key
will be ignored."), so that is an error here too. A missing identity file is a warning (ssh
itself only warns, "Identity file … not accessible"; a fleet file is often checked where its
keys are not). A local model file must exist: it is pushed from here.

Nothing here reads more than a key's first line, or opens anything but a regular file.

Example:
    >>> identity_problem("/etc")
    ("'/etc' is a directory, not an ssh private key", 'give the private key file itself, e.g. ~/.ssh/id_ed25519')
    >>> model_file_problem("/nonexistent/m.tar.gz")[0]
    "'/nonexistent/m.tar.gz' does not exist on this machine"
"""  # noqa: E501

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from fleet.read.problems import Finding
from fleet.spec.fields import kernel_tree
from fleet.spec.models import Fleet

#: The largest identity file read (an RSA 16384-bit private key in OpenSSH form is ~13 KiB).
MAX_KEY_BYTES = 64 << 10
#: How a private key's file begins: OpenSSH's own form, and the PEM forms ssh also reads.
PRIVATE_HEADERS = (
    b"-----BEGIN OPENSSH PRIVATE KEY-----",
    b"-----BEGIN RSA PRIVATE KEY-----",
    b"-----BEGIN EC PRIVATE KEY-----",
    b"-----BEGIN DSA PRIVATE KEY-----",
    b"-----BEGIN PRIVATE KEY-----",
    b"-----BEGIN ENCRYPTED PRIVATE KEY-----",
)
#: How a public key begins (an authorized_keys line, RFC 4716, or a PEM public key).
PUBLIC_STARTS = (b"ssh-", b"ecdsa-sha2-", b"sk-ssh-", b"sk-ecdsa-", b"-----BEGIN SSH2 PUBLIC KEY",
                 b"---- BEGIN SSH2 PUBLIC KEY", b"-----BEGIN PUBLIC KEY-----",
                 b"-----BEGIN RSA PUBLIC KEY-----")
Problem = tuple[str, str | None]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _exists(written: str) -> bool:
    """Whether a path as written (``~`` expanded) names something here; errors count as yes
    (so :func:`_examine` says what they are)."""
    try:
        return Path(written).expanduser().exists()
    except (OSError, RuntimeError, ValueError):
        return True


def _examine(written: str, what: str, fix: str) -> tuple[os.stat_result | None, Problem | None]:
    """stat a path as written (``~`` expanded, links followed): a regular file, or a problem."""
    try:
        real = Path(written).expanduser().resolve()
        info = real.stat()
    except FileNotFoundError:
        return None, (f"{written!r} does not exist on this machine", fix)
    except (OSError, RuntimeError, ValueError) as err:
        return None, (f"cannot read {written!r}: {err}", fix)
    top = kernel_tree(str(real))
    if top:
        return None, (f"{written!r} is below {top}, not a file of yours: it cannot be {what}",
                      fix)
    if not stat.S_ISREG(info.st_mode):
        return None, (f"{written!r} is {_kind(info.st_mode)}, not {what}", fix)
    if not os.access(real, os.R_OK):
        return None, (f"{written!r} cannot be read by this user (uid {os.getuid()})",
                      "make it readable by the user who runs fleet, or run fleet as its owner")
    return info, None


def identity_problem(written: str) -> Problem | None:
    """Why ssh cannot use ``written`` as its identity file, and the fix; None when it can
    (or when it is missing: :func:`identity_warning`).

    Example:
        >>> identity_problem("/etc/passwd")[0]
        "'/etc/passwd' is not an ssh private key (it does not begin with -----BEGIN OPENSSH PRIVATE KEY----- or a PEM private key header)"
    """  # noqa: E501
    fix = "give the private key file itself, e.g. ~/.ssh/id_ed25519"
    if not _exists(written):
        return None
    info, problem = _examine(written, "an ssh private key", fix)
    if problem is not None or info is None:
        return problem
    if info.st_size > MAX_KEY_BYTES:
        return (f"{written!r} is {info.st_size} bytes: an ssh private key is a few KiB "
                f"(at most {MAX_KEY_BYTES // 1024} KiB here)", fix)
    try:
        with open(Path(written).expanduser(), "rb") as file:
            head = file.read(64).lstrip()
    except OSError as err:
        return f"cannot read {written!r}: {err}", "make it readable by the user who deploys"
    if head.startswith(PUBLIC_STARTS):
        private = written.removesuffix(".pub")
        return (f"{written!r} is the public half of a key; ssh needs the private one",
                f"write key: {private}" if private != written else fix)
    if head.startswith(b"PuTTY-User-Key-File-"):
        return (f"{written!r} is a PuTTY key, which ssh does not read",
                "convert it: puttygen KEY.ppk -O private-openssh -o ~/.ssh/id_fleet")
    if not head.startswith(PRIVATE_HEADERS):
        return (f"{written!r} is not an ssh private key (it does not begin with "
                "-----BEGIN OPENSSH PRIVATE KEY----- or a PEM private key header)", fix)
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        return (f"permissions {mode:04o} for {written!r} are too open: ssh ignores the key "
                "(\"WARNING: UNPROTECTED PRIVATE KEY FILE! … This private key will be "
                "ignored.\")", f"chmod 600 {written}")
    return None


def identity_warning(written: str) -> Problem | None:
    """A missing identity file (ssh warns and goes on without it), or None.

    Example:
        >>> identity_warning("/nonexistent/id_ed25519")[0]
        "identity file '/nonexistent/id_ed25519' does not exist on this machine"
    """
    if _exists(written):
        return None
    return (f"identity file {written!r} does not exist on this machine",
            "ssh would say \"Identity file … not accessible\" and fail to log in with it; "
            "create it (ssh-keygen -t ed25519 -f PATH) or fix ssh.key")


def model_file_problem(written: str) -> Problem | None:
    """Why a local model file cannot be pushed from here, and the fix; or None.

    Example:
        >>> model_file_problem("/dev/zero")[0]
        "'/dev/zero' is below /dev, not a file of yours: it cannot be a model archive or file"
    """
    fix = "copy the archive to this machine, or fix file: (an absolute path, or ~/…)"
    _, problem = _examine(written, "a model archive or file", fix)
    return problem


def local_file_problems(fleet: Fleet) -> Iterator[Finding]:
    """Each model file and identity file that cannot be used (once per path as written)."""
    for name, model in fleet.models.items():
        if model.file is not None:
            problem = model_file_problem(model.file)
            if problem is not None:
                yield (("models", name, "file"), *problem)
    seen: dict[str, Problem | None] = {}
    for name, host in fleet.hosts.items():
        key = host.ssh.key
        if key is not None:
            if key not in seen:
                seen[key] = identity_problem(key)
            if seen[key] is not None:
                yield (("hosts", name, "ssh", "key"), *seen[key])  # type: ignore[misc]


def local_file_warnings(fleet: Fleet) -> Iterator[Finding]:
    """Each identity file that does not exist here."""
    seen: dict[str, Problem | None] = {}
    for name, host in fleet.hosts.items():
        key = host.ssh.key
        if key is not None:
            if key not in seen:
                seen[key] = identity_warning(key)
            if seen[key] is not None:
                yield (("hosts", name, "ssh", "key"), *seen[key])  # type: ignore[misc]
