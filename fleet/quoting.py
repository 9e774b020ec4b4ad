"""One quoting function per target syntax: systemd command lines, EnvironmentFile values.

Every value of the fleet file that reaches a rendered file goes through one of these.

Example:
    >>> systemd_quote("a b"), env_quote("a b")
    ('"a b"', '"a b"')
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


def env_quote(value: str) -> str:
    """Quote one value for an EnvironmentFile= line.

    Example:
        >>> env_quote("a b")
        '"a b"'
    """
    if "\n" in value or "\r" in value:
        raise ValueError("environment values cannot contain newlines")
    if _SAFE.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
