"""Network addresses of the fleet file: what one is, which are loopback, which are one machine.

Every host, bind and head address of the fleet file is read here, once, by the same rules:

- **IPv4**: dotted decimal, four numbers 0–255, no leading zero (glibc's ``inet_aton``, which
  ssh, curl and ``getaddrinfo`` use, reads ``021`` as octal 17 and ``0x15`` as hex, and takes
  ``10.1`` as 10.0.0.1), so a string whose last label is a number is an IPv4 address or
  nothing;
- **IPv6**: what :mod:`ipaddress` reads, with at most a zone id that is an interface name
  (``fe80::1%eth0``): Python's ``ipaddress`` lets the zone id hold spaces, ``;`` and ``+``,
  which a unit's command line would split into commands;
- **host names**: RFC 1123 (letters, digits and inner hyphens, labels of at most 63
  characters, 253 in all, an optional trailing dot), so nothing begins with ``-`` and none
  can be read as an option.

Loopback is all of 127.0.0.0/8, ``::1`` (and its IPv4-mapped form) and ``localhost``; the same
machine may be spelt ``::ffff:10.0.1.21`` and ``10.0.1.21``, or ``GPU-01.example.com.`` and
``gpu-01.example.com``: :func:`machine_key` folds them.

Example:
    >>> check_address("10.0.1.21", what="an address"), is_loopback("127.0.1.1")
    ('10.0.1.21', True)
    >>> machine_key("::ffff:10.0.1.21") == machine_key("10.0.1.21")
    True
    >>> check_address("10.0.1.021", what="an address")
    Traceback (most recent call last):
    ...
    ValueError: '10.0.1.021' has a number with a leading zero, which glibc (ssh, curl, getaddrinfo) reads as octal: 10.0.1.17; write 10.0.1.21 (or 10.0.1.17 if that is the machine meant)
"""  # noqa: E501

from __future__ import annotations

import ipaddress
import re
import socket

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: A zone id as Linux names interfaces (IFNAMSIZ − 1 = 15 characters) or numbers them.
ZONE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
#: A label glibc reads as a number (decimal, octal or hex): the last one makes an IPv4 address.
_NUMERIC = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
#: Names every Linux host resolves to its own loopback (Debian's /etc/hosts has the ip6- ones).
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
#: The address this tool reaches a service of the same host at when it listens everywhere.
LOCAL = "127.0.0.1"
#: The IPv6 loopback: where a service bound to ``::`` is reached on its own host.
LOCAL6 = "::1"
_EXAMPLES = "an IP address or host name, as in 10.0.1.21, fe80::1%eth0 or gpu-01.example.com"


def _name(value: str) -> str:
    """A host name as compared: lower case, without the trailing dot."""
    return value.lower().removesuffix(".")


def parse_ip(value: str) -> IPAddress | None:
    """The IP address ``value`` spells, None when it is a host name; ValueError, saying what
    to write, when it looks like an IP address but is not a safe one.

    Example:
        >>> parse_ip("fe80::1%eth0"), parse_ip("gpu-01")
        (IPv6Address('fe80::1%eth0'), None)
        >>> parse_ip("10.0.0.256")
        Traceback (most recent call last):
        ...
        ValueError: '10.0.0.256' is not an IPv4 address: each of its four numbers is 0–255
    """
    if value.startswith("[") or value.endswith("]"):
        raise ValueError(f"{value!r}: write the address without brackets (as in fe80::1)")
    if ":" in value:
        return _ipv6(value)
    labels = value.removesuffix(".").split(".")
    if not _NUMERIC.fullmatch(labels[-1]):
        return None
    return _ipv4(value, labels)


def _ipv6(value: str) -> ipaddress.IPv6Address:
    address, percent, zone = value.partition("%")
    if percent and not ZONE.fullmatch(zone):
        raise ValueError(
            f"{value!r}: the zone id after % must be an interface name (letters, digits, _ . -, "
            "at most 15, beginning with a letter or digit, as in fe80::1%eth0)"
        )
    try:
        parsed = ipaddress.IPv6Address(address)
    except ValueError as error:
        detail = str(error).split(" in ", 1)[0]
        raise ValueError(f"{value!r} is not an IPv6 address ({detail})") from None
    return ipaddress.IPv6Address(value) if percent else parsed


def _ipv4(value: str, labels: list[str]) -> ipaddress.IPv4Address:
    try:
        glibc: str | None = socket.inet_ntoa(socket.inet_aton(value))
    except (OSError, ValueError):
        glibc = None
    reads = f" (glibc, which ssh and curl use, reads it as {glibc})" if glibc else ""
    if value.endswith("."):
        raise ValueError(f"{value!r}: write the IPv4 address without the trailing dot")
    if any(label.lower().startswith("0x") for label in labels):
        raise ValueError(f"{value!r} has a hex number{reads}; write four decimal numbers")
    if len(labels) != 4:
        raise ValueError(
            f"{value!r} is not an IPv4 address: it has {_count(len(labels))}, not four{reads}; "
            "write all four (as in 10.0.1.21)"
        )
    if not all(label.isascii() and label.isdigit() for label in labels):
        raise ValueError(
            f"{value!r} is not an IPv4 address (four numbers 0–255) nor a host name (its last "
            "label is a number)"
        )
    if any(int(label) > 255 for label in labels):
        raise ValueError(f"{value!r} is not an IPv4 address: each of its four numbers is 0–255")
    if any(len(label) > 1 and label.startswith("0") for label in labels):
        fixed = ".".join(str(int(label)) for label in labels)
        read = f": {glibc}" if glibc else ""
        also = f" (or {glibc} if that is the machine meant)" if glibc and glibc != fixed else ""
        raise ValueError(
            f"{value!r} has a number with a leading zero, which glibc (ssh, curl, getaddrinfo) "
            f"reads as octal{read}; write {fixed}{also}"
        )
    return ipaddress.IPv4Address(value)


def _count(numbers: int) -> str:
    return "one number" if numbers == 1 else f"{numbers} numbers"


def check_address(value: str, *, what: str, bind: bool = False, names: bool = True) -> str:
    """``value`` if it is an address of the kind asked for, else ValueError saying what to
    write: ``bind`` also takes ``0.0.0.0`` and ``::`` (every interface), ``names`` host names.

    Example:
        >>> check_address("0.0.0.0", what="the bind address", bind=True)
        '0.0.0.0'
        >>> check_address("--trust-remote-code", what="the bind address", bind=True)
        Traceback (most recent call last):
        ...
        ValueError: '--trust-remote-code' is not an address to bind: it would be read as an option; write an IP address, 0.0.0.0 for every interface, or a host name
    """  # noqa: E501
    kinds = (
        "an IP address, 0.0.0.0 for every interface, or a host name"
        if bind and names
        else "an IP address, or 0.0.0.0 for every interface"
        if bind
        else _EXAMPLES
    )
    noun = "an address to bind" if bind else "an IP address or host name"
    if value.startswith("-"):
        raise ValueError(f"{value!r} is not {noun}: it would be read as an option; write {kinds}")
    if "@" in value:
        raise ValueError(f"{value!r} is not {noun}: put the user in ssh.user")
    if re.fullmatch(r"[^:]+:[0-9]+", value):
        where = "port" if bind else "ssh.port"
        raise ValueError(f"{value!r} is not {noun}: put the port in {where}")
    ip = parse_ip(value)
    if ip is None:
        labels = value.removesuffix(".").split(".")
        if not names or len(value.removesuffix(".")) > 253 or not all(
            _LABEL.fullmatch(label) for label in labels
        ):
            raise ValueError(
                f"{value!r} is not {noun} (letters, digits and hyphens between dots, as in "
                "gpu-01.example.com, or an IP address)"
                if names
                else f"{value!r} is not {noun}; write {kinds}"
            )
        return value
    if ip.is_unspecified and not bind:
        raise ValueError(
            f"{value!r} means every interface, which only a service listens on: write the "
            "address the other machines reach this one at"
        )
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{value!r} is a multicast or broadcast address, not one machine's")
    return value


def is_loopback(address: str) -> bool:
    """True when ``address`` only reaches the machine it is used on: 127.0.0.0/8, ``::1``
    (also IPv4-mapped), ``localhost`` and the names under it, Debian's ``ip6-localhost``.

    Example:
        >>> [is_loopback(a) for a in ("127.0.1.1", "::1", "::ffff:127.0.0.1", "LocalHost.")]
        [True, True, True, True]
        >>> [is_loopback(a) for a in ("10.0.0.1", "0.0.0.0", "gpu-01")]
        [False, False, False]
    """
    try:
        ip = parse_ip(address)
    except ValueError:
        return False
    if ip is None:
        name = _name(address)
        return name in LOOPBACK_NAMES or name.endswith(".localhost")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_any(address: str) -> bool:
    """True when ``address`` means every interface (``0.0.0.0``, ``::``, however spelt).

    Example:
        >>> is_any("0.0.0.0"), is_any("0:0::0"), is_any("127.0.0.1"), is_any("gpu-01")
        (True, True, False, False)
    """
    try:
        ip = parse_ip(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_unspecified


def local_address(bind: str) -> str:
    """Where a service listening on ``bind`` is reached from its own host: the loopback of its
    family when it listens on every interface (``::`` at ``::1``, which answers whether or not
    the host's ``bindv6only`` lets ``::`` take IPv4 too), else the address it listens on.

    Example:
        >>> local_address("0.0.0.0"), local_address("::"), local_address("::ffff:0.0.0.0")
        ('127.0.0.1', '::1', '127.0.0.1')
        >>> local_address("::1"), local_address("10.0.0.5"), local_address("127.0.0.2")
        ('::1', '10.0.0.5', '127.0.0.2')
    """
    if not is_any(bind):
        return bind
    ip = parse_ip(bind)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return LOCAL6
    return LOCAL


def bracket(address: str) -> str:
    """An address for ``host:port`` and URLs: IPv6 in brackets.

    Example:
        >>> bracket("::1"), bracket("fe80::1%eth0"), bracket("10.0.0.1"), bracket("gpu-01")
        ('[::1]', '[fe80::1%eth0]', '10.0.0.1', 'gpu-01')
    """
    return f"[{address}]" if ":" in address else address


def machine_key(address: str) -> str:
    """One spelling per machine: IPv4-mapped IPv6 as IPv4, IPv6 compressed, names in lower
    case without the trailing dot, every loopback address as ``loopback``.

    Example:
        >>> machine_key("::FFFF:10.0.1.21"), machine_key("GPU-01.Example.com.")
        ('10.0.1.21', 'gpu-01.example.com')
        >>> machine_key("2001:db8:0::1"), machine_key("localhost"), machine_key("127.0.0.1")
        ('2001:db8::1', 'loopback', 'loopback')
    """
    if is_loopback(address):
        return "loopback"
    try:
        ip = parse_ip(address)
    except ValueError:
        return _name(address)
    if ip is None:
        return _name(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip).lower()
