"""Quoting for systemd command lines (``ExecStart=``).

Every value of the fleet file that reaches a unit's command line goes through
:func:`systemd_quote`; environment-file values go through :func:`hostside.envfile.quote`, the
writer whose reader the host-side programs share.

Example:
    >>> systemd_quote("a b")
    '"a b"'
"""

from __future__ import annotations

import re

_SAFE = re.compile(r"^[A-Za-z0-9_./:=,+@-]+$")


def systemd_quote(word: str) -> str:
    """Quote one word for an ExecStart= line (systemd's rules, not the shell's).

    Example:
        >>> systemd_quote('{"a": 1}')
        '"{\\\\"a\\\\": 1}"'
        >>> systemd_quote("50%")
        '"50%%"'
    """
    word = word.replace("%", "%%").replace("$", "$$")
    if _SAFE.match(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
