"""One quoting function per target syntax: systemd command lines (``ExecStart=``), sysctl.d
lines, ssh_config values; environment-file values go through :func:`hostside.envfile.quote`, the
writer whose reader the host-side programs share.

Every value of the fleet file that reaches a rendered file goes through one of these, and each
refuses (ValueError) what its syntax cannot carry, even though :mod:`fleet.fields` has refused
it already: a second wall, so that a value that slips past a check still cannot start a new
line, directive or option.

Example:
    >>> systemd_quote("a b")
    '"a b"'
"""

from __future__ import annotations

import re

from fleet.fields import SYSCTL_KEY, SYSCTL_VALUE, refuse_control

_SAFE = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_SSH_VALUE = re.compile(r"[A-Za-z0-9_./:@~+-]+")


def systemd_quote(word: str) -> str:
    """Quote one word for an ExecStart= line (systemd's rules, not the shell's).

    Example:
        >>> systemd_quote('{"a": 1}')
        '"{\\\\"a\\\\": 1}"'
        >>> systemd_quote("50%")
        '"50%%"'
        >>> systemd_quote("x\\nUser=root")
        Traceback (most recent call last):
        ...
        ValueError: a command-line word cannot hold U+000A (a line break) (at position 2): it would end the line it is written on; write it on one line
    """  # noqa: E501
    refuse_control(word.replace("\t", " "), "a command-line word")  # a tab is fine in quotes
    word = word.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sysctl_line(key: str, value: int | str) -> str:
    """One ``key = value`` line of a sysctl.d drop-in.

    Example:
        >>> sysctl_line("net.core.somaxconn", 65535)
        'net.core.somaxconn = 65535'
        >>> sysctl_line("kernel.core_pattern", "|/tmp/x")
        Traceback (most recent call last):
        ...
        ValueError: sysctl value '|/tmp/x' of kernel.core_pattern: sysctl.d takes numbers or words of letters, digits and space . _ : , + - here
    """  # noqa: E501
    text = str(value)
    if not SYSCTL_KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not a sysctl key")
    if not SYSCTL_VALUE.fullmatch(text):
        raise ValueError(
            f"sysctl value {text!r} of {key}: sysctl.d takes numbers or words of letters, digits "
            "and space . _ : , + - here"
        )
    return f"{key} = {text}"


def ssh_config_value(value: str | int) -> str:
    """One value of an ssh_config directive (a host name, user, port or path).

    ssh_config has no escape for a line break, and a space or quote would change how the line
    splits: such values are refused rather than quoted.

    Example:
        >>> ssh_config_value("10.0.0.1"), ssh_config_value(2222)
        ('10.0.0.1', '2222')
        >>> ssh_config_value("x\\nProxyCommand id")
        Traceback (most recent call last):
        ...
        ValueError: an ssh_config value cannot hold U+000A (a line break) (at position 2): it would end the line it is written on; write it on one line
    """  # noqa: E501
    text = refuse_control(str(value), "an ssh_config value")
    if not _SSH_VALUE.fullmatch(text):
        raise ValueError(f"{text!r} cannot be written into an ssh_config safely")
    return text
