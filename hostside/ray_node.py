"""Start a Ray node on the address of the group's declared interface: ``ray start`` with
``--node-ip-address`` set to that interface's IPv4 address (only the host knows it), or to a
given address. Runs as a Ray unit's ``ExecStart``, then becomes ``ray start`` itself (exec), so
the unit's main process is Ray's. Standard library.

Example:
    python3 ray_node.py --interface ens8f0 -- /opt/vllm-fleet/venv/bin/ray start --block --head
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import sys

#: ``SIOCGIFADDR`` (linux/sockios.h): an interface's IPv4 address.
SIOCGIFADDR = 0x8915


def interface_address(interface: str) -> str | None:
    """The IPv4 address of ``interface``; None when it has none (or does not exist).

    Example:
        >>> interface_address("lo")
        '127.0.0.1'
        >>> interface_address("no-such-nic") is None
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", interface.encode()[:15])
        try:
            answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def command(argv: list[str]) -> list[str]:
    """The ``ray start`` command line to run, its node IP added; SystemExit when the interface
    has no address (the unit fails, saying which interface).

    Example:
        >>> command(["--address", "10.0.0.1", "--", "ray", "start"])
        ['ray', 'start', '--node-ip-address', '10.0.0.1']
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interface", help="the group's network interface")
    parser.add_argument("--address", help="the node IP when no interface is declared")
    parser.add_argument("ray", nargs=argparse.REMAINDER, help="-- ray start …")
    args = parser.parse_args(argv)
    words = args.ray[1:] if args.ray[:1] == ["--"] else args.ray
    address = args.address
    if args.interface:
        address = interface_address(args.interface)
        if address is None:
            raise SystemExit(f"the group's interface {args.interface} has no IPv4 address on "
                             "this host: check multinode.interface in the fleet file")
    return [*words, "--node-ip-address", address] if address else words


if __name__ == "__main__":
    words = command(sys.argv[1:])
    print("starting Ray: " + " ".join(words), flush=True)
    os.execv(words[0], words)
