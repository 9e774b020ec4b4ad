"""Which kernel parameters this host can change (a container's /proc/sys is read-only).

Example:
    >>> SysctlWritable().process(["vm.swappiness no", "net.core.somaxconn yes"])
    {'vm.swappiness': False, 'net.core.somaxconn': True}
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand


class SysctlWritable(FactBase):
    """For each key, whether its /proc/sys file is writable here.

    .. code:: python

        {"vm.swappiness": False, "net.core.somaxconn": True}
    """

    default = dict

    def command(self, keys: list[str]) -> StringCommand:
        parts: list[object] = []
        for key in keys:
            path = "/proc/sys/" + key.replace(".", "/")
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
