"""The kernel parameters `fleet check` knows (``fleet/checks/sysctl_names.txt``) and what each takes.

A name the list lacks is a warning with a "did you mean" (a kernel built with other options
has other names; the deploy refuses a key the host's own ``/proc/sys`` lacks). A known numeric
key refuses a value that is not a number (``vm.swappiness: on``), located, with the fix.

Example:
    >>> kind("vm.swappiness"), kind("net.ipv4.conf.eth0.rp_filter"), kind("kernel.core_pattern")
    ('int', 'int', 'text')
    >>> kind("vm.swapiness") is None, closest("vm.swapiness")
    (True, "did you mean 'vm.swappiness'?")
    >>> numeric_problem("vm.swappiness", "lots")
    ("vm.swappiness takes a number, not 'lots'", 'write a whole number, as cat /proc/sys/vm/swappiness prints one (0x… for hexadecimal)')
"""  # noqa: E501

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from fleet.read.problems import Finding, suggest
from fleet.spec.models import Fleet

NAMES_FILE = Path(__file__).with_name("sysctl_names.txt")
#: Where the names come from, for messages (the list's header says it in full).
KNOWN_FROM = "Linux 6.18 or its documentation"
#: The interface part of per-interface keys, written ``*`` in the list.
_INTERFACE = re.compile(r"(net\.ipv[46]\.(?:conf|neigh))\.[^.]+\.(.+)")
#: How the kernel reads an integer (``proc_dointvec`` and its kin: base 0, so 0x… too).
_INTEGER = re.compile(r"[-+]?(?:0[xX][0-9A-Fa-f]+|[0-9]+)")
#: Words that people write for a switch, and the number the kernel wants instead.
_SWITCH = {"on": 1, "yes": 1, "true": 1, "enable": 1, "enabled": 1,
           "off": 0, "no": 0, "false": 0, "disable": 0, "disabled": 0}


@cache
def names() -> dict[str, str]:
    """Every known name → ``int``, ``ints`` or ``text``.

    Example:
        >>> names()["net.ipv4.tcp_rmem"]
        'ints'
    """
    out = {}
    for line in NAMES_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind_ = line.split()
            out[name] = kind_
    return out


def _pattern(key: str) -> str:
    """``key`` as the list writes it: the interface of a per-interface key as ``*``."""
    return _INTERFACE.sub(r"\1.*.\2", key)


def kind(key: str) -> str | None:
    """What ``key`` takes (``int``, ``ints``, ``text``), or None for a name the list lacks.

    A glob as systemd-sysctl reads it (``net.ipv4.conf.*.rp_filter``) is known when it
    matches a known name; it takes numbers only if every name it matches does.

    Example:
        >>> kind("net.ipv6.conf.all.disable_ipv6"), kind("net.ipv4.tcp_*mem")
        ('int', 'ints')
    """
    known = names()
    found = known.get(_pattern(key))
    if found is not None or "*" not in key:
        return found
    kinds = {k for name, k in known.items() if fnmatch.fnmatchcase(name, key)}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "text"


def closest(key: str) -> str | None:
    """A "did you mean" for an unknown key, among the names of its first part.

    Example:
        >>> closest("net.core.somaxcon")
        "did you mean 'net.core.somaxconn'?"
    """
    pattern = _pattern(key)
    family = [name for name in names() if name.split(".")[0] == pattern.split(".")[0]]
    hint = suggest(pattern, family)
    if hint is None:  # a typo in the first part (mv.swappiness): by the last part
        last = pattern.rsplit(".", 1)[-1]
        tails = {name.rsplit(".", 1)[-1]: name for name in names()}
        close = difflib.get_close_matches(last, list(tails), n=1, cutoff=0.8)
        hint = f"did you mean {tails[close[0]]!r}?" if close else None
    if hint is not None and pattern != key:
        interface = key.split(".")[3]
        hint = hint.replace(".*.", f".{interface}.")
    return hint


def numeric_problem(key: str, value: int | str) -> tuple[str, str] | None:
    """Why ``value`` cannot be ``key``'s (a numeric key given words), and the fix; or None.

    Example:
        >>> numeric_problem("net.ipv4.tcp_rmem", "4096 87380 6291456") is None
        True
        >>> numeric_problem("vm.swappiness", "0x10") is None
        True
        >>> numeric_problem("net.ipv4.ip_forward", "on")[1]
        'write net.ipv4.ip_forward: 1 (the kernel reads a switch as 1 for on, 0 for off)'
    """
    wanted = kind(key)
    if wanted not in ("int", "ints") or isinstance(value, int):
        return None
    words = value.split()
    if words and all(_INTEGER.fullmatch(word) for word in words):
        if wanted == "ints" or len(words) == 1:
            return None
        return (f"{key} takes one number, not {len(words)}",
                f"write {key}: {words[0]} (one whole number)")
    message = f"{key} takes {'a number' if wanted == 'int' else 'numbers'}, not {value!r}"
    if value.lower() in _SWITCH:
        return message, (f"write {key}: {_SWITCH[value.lower()]} (the kernel reads a switch "
                         "as 1 for on, 0 for off)")
    if wanted == "ints":
        return message, (f'write whole numbers separated by spaces, in quotes ({key}: '
                         '"4096 87380 6291456")')
    return message, (f"write a whole number, as cat /proc/sys/{key.replace('.', '/')} prints "
                     "one (0x… for hexadecimal)")


def sysctl_problems(fleet: Fleet) -> Iterator[Finding]:
    """A word for a numeric kernel parameter, at its key (in defaults when it comes from there).

    Example:
        >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"a": {"address": "sandbox",
        ...     "vllm": {"version": "0.32.0", "variant": "cpu"},
        ...     "os": {"sysctl": {"vm.swappiness": "on"}}}}})
        >>> [(path[-1], hint) for path, _, hint in sysctl_problems(fleet)]
        [('vm.swappiness', 'write vm.swappiness: 1 (the kernel reads a switch as 1 for on, 0 for off)')]
    """  # noqa: E501
    for name, host in fleet.hosts.items():
        for key, value in host.os.sysctl.items():
            problem = numeric_problem(key, value)
            if problem is not None:
                yield (("hosts", name, "os", "sysctl", key), *problem)


def sysctl_warnings(fleet: Fleet) -> Iterator[Finding]:
    """A kernel parameter this tool does not know (a typo, or a kernel built with more).

    Example:
        >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"a": {"address": "sandbox",
        ...     "vllm": {"version": "0.32.0", "variant": "cpu"},
        ...     "os": {"sysctl": {"vm.swapiness": 1}}}}})
        >>> [message for _, message, _ in sysctl_warnings(fleet)]
        ["vm.swapiness is not a kernel parameter of Linux 6.18 or its documentation; did you mean 'vm.swappiness'?"]
    """  # noqa: E501
    for name, host in fleet.hosts.items():
        for key in host.os.sysctl:
            if kind(key) is None:
                guess = closest(key)
                yield (("hosts", name, "os", "sysctl", key),
                       f"{key} is not a kernel parameter of {KNOWN_FROM}"
                       + (f"; {guess}" if guess else ""),
                       "the deploy refuses a key that the host's kernel lacks (no "
                       f"/proc/sys/{key.replace('.', '/')}); check its spelling")
