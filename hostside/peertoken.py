"""The per-deploy token that peers present to each other: read from a private file, compared in
constant time, never on a command line.

A host that serves blobs to its peers (``hostside/peer_serve.py``) and a host that fetches from
its peers (``fetch_model.py install --peer … --peer-token-file F``) read the same token, one
that the deploy makes for one distribution and removes after it. It travels as
``Authorization: Bearer <token>`` over the fleet's private network; it is never an argument
(``/proc/<pid>/cmdline`` is world-readable), never printed, and the file holding it must not
be open to other users (the rule ``ssh`` applies to private keys).

Example:
    >>> valid_token("Zm9vYmFyLWJhei0xMjM0NTY3OA")
    True
    >>> valid_token("short"), valid_token("has space in it 0123456789")
    (False, False)
    >>> bearer_matches("Bearer Zm9vYmFyLWJhei0xMjM0NTY3OA", "Zm9vYmFyLWJhei0xMjM0NTY3OA")
    True
"""

from __future__ import annotations

import hmac
import os
import re
import stat
import sys
from pathlib import Path

#: What a token may be: RFC 6750's token68 characters, 16 to 512 of them.
TOKEN_PATTERN = r"[A-Za-z0-9._~+/=-]{16,512}"


class TokenError(Exception):
    """A token file that cannot be used, in words a person can act on (never the token)."""


def valid_token(text: str) -> bool:
    """Whether ``text`` is a usable token (the whole string; no newline, no space)."""
    return re.fullmatch(TOKEN_PATTERN, text) is not None


def read_token_file(path: Path) -> str:
    """The token in ``path``: a regular file (not a link), not readable by group or others.

    Raises :class:`TokenError` with what to fix; the message never contains the token.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise TokenError(f"cannot read the peer token file {path}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"the peer token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise TokenError(
                f"the peer token file {path} is open to other users (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): chmod 600 it"
            )
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    return _checked(raw.decode("ascii", errors="replace").strip(), str(path))


def read_token_stdin() -> str:
    """The token on the first line of standard input."""
    return _checked(sys.stdin.readline().strip(), "standard input")


def _checked(text: str, where: str) -> str:
    if not valid_token(text):
        raise TokenError(
            f"the peer token from {where} is not 16 to 512 characters of A-Z a-z 0-9 . _ ~ + / "
            "= -"
        )
    return text


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant-time compare).

    >>> bearer_matches(None, "x" * 16), bearer_matches("Basic " + "x" * 16, "x" * 16)
    (False, False)
    """
    if header is None or not header.startswith("Bearer "):
        return False
    presented = header[len("Bearer "):].strip().encode("utf-8", errors="replace")
    return hmac.compare_digest(presented, token.encode("ascii"))
