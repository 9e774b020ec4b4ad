"""Which kernel parameters this host has (/proc/sys), and which it can change (a container's
/proc/sys is read-only).

Example:
    >>> SysctlWritable().process(["vm.swappiness no", "net.core.somaxconn yes"])
    {'vm.swappiness': False, 'net.core.somaxconn': True}
    >>> SysctlMissing().process(["vm.swapiness"])
    ['vm.swapiness']
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase, QuoteString, StringCommand

#: What a glob key may hold to be written unquoted: words the shell reads only as a path and `*`.
_SHELL_WORD = re.compile(r"[A-Za-z0-9_.*-]+")


def proc_path(key: str) -> str:
    """The /proc/sys file of a kernel parameter: its dots as slashes.

    Example:
        >>> proc_path("net.ipv4.conf.all.rp_filter")
        '/proc/sys/net/ipv4/conf/all/rp_filter'
    """
    return "/proc/sys/" + key.replace(".", "/")


class SysctlMissing(FactBase):
    """The given keys that this host's kernel does not have (no file below /proc/sys); a glob
    (``net.ipv4.conf.*.rp_filter``, as systemd-sysctl reads it) is missing when it matches none.

    .. code:: python

        ["vm.swapiness"]
    """

    default = list

    def command(self, keys: list[str]) -> StringCommand:
        parts: list[object] = []
        for key in keys:
            if "*" in key:
                # A glob must stay unquoted to expand: only letters, digits, . _ - and *.
                if not _SHELL_WORD.fullmatch(key):
                    raise ValueError(f"{key!r} is not a sysctl key")
                parts += [f"set -- {proc_path(key)}; test -e \"$1\" || echo", QuoteString(key),
                          ";"]
            else:
                parts += ["test -e", QuoteString(proc_path(key)), "|| echo", QuoteString(key),
                          ";"]
        return StringCommand(*parts) if parts else StringCommand("true")

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class SysctlWritable(FactBase):
    """For each key, whether its /proc/sys file is writable here.

    .. code:: python

        {"vm.swappiness": False, "net.core.somaxconn": True}
    """

    default = dict

    def command(self, keys: list[str]) -> StringCommand:
        parts: list[object] = []
        for key in keys:
            path = proc_path(key)
            parts += ["if test -w", QuoteString(path), "; then echo", QuoteString(key), "yes;",
                      "else echo", QuoteString(key), "no; fi;"]
        return StringCommand(*parts) if parts else StringCommand("true")

    def process(self, output: list[str]) -> dict[str, bool]:
        result = {}
        for line in output:
            key, _, answer = line.strip().rpartition(" ")
            if key:
                result[key] = answer == "yes"
        return result
