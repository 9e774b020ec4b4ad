"""A group member's TCP links, read from ``/proc``: who in a unit's process tree is connected
to the head's rendezvous port, and how many members the head's port holds. Standard library.

Example:
    >>> proc_address("0100007F:4A6A")
    ('127.0.0.1', 19050)
    >>> proc_address("0000000000000000FFFF00000100007F:484E")
    ('127.0.0.1', 18510)
"""

from __future__ import annotations

import ipaddress
import os
import socket

#: The TCP state number of an established connection in /proc/net/tcp.
ESTABLISHED = "01"


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            todo.extend(children.get(current, []))
    return found


def socket_inodes(pids: set[int]) -> set[str]:
    """The socket inodes the processes hold open."""
    inodes = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def proc_address(text: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6} (hex, host byte order words) as (ip, port).

    Example:
        >>> proc_address("0100007F:4A6A")
        ('127.0.0.1', 19050)
    """
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address), int(port, 16)


def _established(inodes: set[str]) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """(local, remote) of every established TCP connection among ``inodes``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as lines:
                rows = lines.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED or fields[9] not in inodes:
                continue
            local, remote = proc_address(fields[1]), proc_address(fields[2])
            found.append((local, remote))
    return found


def connected(inodes: set[str], targets: set[tuple[str, int]]) -> bool:
    """Whether one of ``inodes`` is an established connection to one of ``targets``."""
    return any(remote in targets for _, remote in _established(inodes))


def accepted(inodes: set[str], port: int) -> int:
    """How many established connections among ``inodes`` were accepted on local ``port``."""
    return sum(1 for local, _ in _established(inodes) if local[1] == port)


def joined(pid: int, head: str, port: int) -> bool:
    """Whether the process tree of ``pid`` is connected to the head's ``port``."""
    targets = resolve(head, port)
    return bool(targets) and connected(socket_inodes(descendants(pid)), targets)


def resolve(host: str, port: int) -> set[tuple[str, int]]:
    """Every address ``host`` resolves to, with ``port``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    found = set()
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        found.add((str(address), port))
    return found


