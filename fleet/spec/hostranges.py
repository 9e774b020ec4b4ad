"""Host ranges: one block of ``hosts:`` for many hosts, written as Ansible inventories write them.

A key of ``hosts:`` that holds ``[BEGIN:END]`` stands for one host per value, every one with the
block's settings (``defaults`` merged as for any host)::

    hosts:
      gpu-[001:512]:                    # gpu-001, gpu-002, … gpu-512
        address: 10.0.0.1/16            # the first host's; the next hosts count up
        gpus: {count: 8, model: H100}

The range is Ansible's (``ansible.plugins.inventory.expand_hostname_range``): numbers or single
lower-case letters (``[a:f]``), both ends included, an optional step (``[1:9:2]``: 1, 3, … 9), a
missing begin read as 0 (``[:9]``); a begin written with leading zeros is the width of every
number (``[001:512]``: 001 … 512), and then the end has that many digits too. A key may hold
several ranges (``rack[1:4]-gpu[01:32]``, the first varying slowest). Unlike Ansible, a range
that counts down, mixes a letter and a number, or pads only one end is refused, not read as
nothing or as something else.

The block's ``address`` is one of:

- an IP address: the first host's; each next host's is the next address. Written with a prefix
  (``10.0.1.10/24``), the range must stay inside that network and off its network and
  broadcast addresses; without one, inside the address space;
- a host name holding ``{name}`` (quote it when it begins with ``{``): each host's name goes
  there, as in ``"{name}.dc1.example.com"``;
- ``sandbox``: every host a local container.

A block with ``inventory: PATH`` is the group of its key in the site's Ansible inventory
(:func:`inventory_hosts`, read by :mod:`fleet.read.ansible`): one host per host of the group.

Every expanded host is located at the block's lines (:meth:`fleet.read.yamlread.Positions.
copy_under`), so a problem names the host and the line that made it. At most :data:`MAX_HOSTS`
hosts, counted before any is made.

Example:
    >>> expand_name("gpu-[001:003]"), expand_name("rack[a:b]-[1:2]")
    (['gpu-001', 'gpu-002', 'gpu-003'], ['racka-1', 'racka-2', 'rackb-1', 'rackb-2'])
    >>> range_addresses("10.0.0.254/23", ["a", "b", "c"])
    ['10.0.0.254', '10.0.0.255', '10.0.1.0']
    >>> expand_name("gpu-[10:1]")
    Traceback (most recent call last):
    ...
    fleet.spec.hostranges.RangeProblem: [10:1] counts down
"""

from __future__ import annotations

import ipaddress
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from fleet.read.ansible import MAX_INVENTORY_BYTES, InventoryProblem, group_hosts
from fleet.read.problems import Finding, Loc, Problem
from fleet.read.source import MAX_FLEET_BYTES, TextProblem, decode_text, read_bounded
from fleet.spec.addresses import parse_ip
from fleet.spec.fields import secret_path_problem
from fleet.spec.models import NAME_PATTERN

#: CPU seconds that loading costs (:func:`fleet.load.load_text`: validation, merge, every check
#: and the capacity plan), measured by benchmarks/host_ranges.py on this project's 2-core
#: machine, on fleets of 8 × H100 hosts with two servers each: a host made by a range 0.35 ms
#: at 1,000 hosts and 0.37 ms at 10,000 (the block's YAML is read once), the upper end taken;
#: the same fleet written out host by host 1.25-1.34 ms per KiB (0.55-0.59 ms a host: range
#: over written out, 0.63), the lower end taken.
LOAD_S_PER_RANGE_HOST = 0.37e-3
LOAD_S_PER_KIB = 1.25e-3
#: Hosts of a fleet written out host by host that the byte limit holds (some 20,000: 8 MiB
#: at benchmarks/fleet_scale.py's 410 bytes a host; 700 MB of memory for ``fleet check``).
HOSTS_IN_BYTE_LIMIT = 20_000
#: The most hosts a fleet file may hold once its ranges are made, counted before any is:
#: a fleet of ranges may cost no more to load than the largest file the byte limit lets
#: through — that limit is the parse budget's (:data:`fleet.read.source.PARSE_BUDGET_S`,
#: :data:`~fleet.read.source.MAX_FLEET_BYTES`), and its file loads in 8,192 KiB × 1.25 ms =
#: 10 s, the time of 27,700 range hosts — and no more hosts than that file holds written out,
#: whose memory was measured: min(27,700, 20,000) = 20,000.
MAX_HOSTS = min(int(MAX_FLEET_BYTES / 1024 * LOAD_S_PER_KIB / LOAD_S_PER_RANGE_HOST),
                HOSTS_IN_BYTE_LIMIT)
#: A key that holds a range: what :func:`expand_name` reads (the JSON schema's pattern too).
RANGE_KEY_PATTERN = r"^[a-z0-9._-]*(\[[a-z0-9]*:[a-z0-9]*(:[0-9]+)?\][a-z0-9._-]*)+$"
#: What an ``address`` with a placeholder may hold: ``{name}`` and nothing else in braces.
PLACEHOLDER = "{name}"
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_BOUNDS = re.compile(r"(?P<begin>[A-Za-z]|[0-9]*):(?P<end>[A-Za-z]|[0-9]*)(?::(?P<step>[0-9]+))?")
_NAME = re.compile(NAME_PATTERN.removeprefix("^").removesuffix("$"))
_WRITE = "write a range as [BEGIN:END], as in gpu-[001:512] or node-[a:f]"


class RangeProblem(ValueError):
    """A range key or a range's address that cannot be expanded: what is wrong, what to write."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Bracket:
    """One ``[BEGIN:END:STEP]`` of a key: its values as they appear in the host names.

    Example:
        >>> Bracket.read("01:10:3").values()
        ['01', '04', '07', '10']
    """

    begin: int
    end: int
    step: int
    width: int  # digits of every number (0: as many as it has); letters: 0
    letters: bool

    @classmethod
    def read(cls, inner: str) -> Bracket:
        """The bracket whose text between ``[`` and ``]`` is ``inner``; RangeProblem if none."""
        shown = f"[{inner}]"
        match = _BOUNDS.fullmatch(inner)
        if not inner:
            raise RangeProblem("an empty range []", _WRITE)
        if match is None:
            fix = re.fullmatch(r"([0-9]+|[a-z])\s*(?:-|\.\.)\s*([0-9]+|[a-z])", inner)
            hint = f"write [{fix[1]}:{fix[2]}] (BEGIN:END, as Ansible)" if fix else _WRITE
            raise RangeProblem(f"{shown} is not a range", hint)
        begin, end, step_text = match["begin"] or "0", match["end"], match["step"]
        if not end:
            raise RangeProblem(f"{shown} has no end", f"write its last value: [{begin}:END]")
        step = int(step_text) if step_text else 1
        if step == 0:
            raise RangeProblem(f"{shown} has a step of 0", "leave the step out for 1, as in "
                               f"[{begin}:{end}]")
        if begin.isdigit() != end.isdigit():
            raise RangeProblem(f"{shown} runs from a {_kind(begin)} to a {_kind(end)}",
                               "a range runs from a number to a number or a letter to a letter")
        if not begin.isdigit():
            if not (begin.islower() and end.islower()):
                low = f"[{begin.lower()}:{end.lower()}]"
                raise RangeProblem(f"{shown} has capital letters, and host names are lower case",
                                   f"write {low}")
            first, last = string.ascii_lowercase.index(begin), string.ascii_lowercase.index(end)
            return cls._checked(shown, first, last, step, 0, True)
        padded = [text for text in (begin, end) if len(text) > 1 and text.startswith("0")]
        width = len(begin) if padded else 0
        if padded and len(begin) != len(end):
            wide = max(len(begin), len(end))
            fixed = f"[{int(begin):0{wide}d}:{int(end):0{wide}d}]"
            raise RangeProblem(
                f"{shown} pads its numbers to different widths ({begin} and {end})",
                f"write both ends with the width every name gets: {fixed} (or no leading zeros)",
            )
        return cls._checked(shown, int(begin), int(end), step, width, False)

    @classmethod
    def _checked(cls, shown: str, begin: int, end: int, step: int, width: int,
                 letters: bool) -> Bracket:
        if begin > end:
            raise RangeProblem(f"{shown} counts down", f"write it from the lower end up: "
                               f"[{shown[1:-1].split(':')[1]}:{shown[1:-1].split(':')[0]}]")
        return cls(begin, end, step, width, letters)

    @property
    def count(self) -> int:
        """How many values: computed, not listed (a huge range is refused before it is made)."""
        return (self.end - self.begin) // self.step + 1

    def values(self) -> list[str]:
        """The values as the names get them: letters, or numbers at the range's width."""
        numbers = range(self.begin, self.end + 1, self.step)
        if self.letters:
            return [string.ascii_lowercase[number] for number in numbers]
        return [str(number).zfill(self.width) for number in numbers]


def _kind(text: str) -> str:
    return "number" if text.isdigit() else "letter"


def is_range(key: str) -> bool:
    """Whether a key of ``hosts:`` is meant as a range (it holds a bracket).

    Example:
        >>> is_range("gpu-[1:4]"), is_range("gpu-1")
        (True, False)
    """
    return "[" in key or "]" in key


def _parts(key: str) -> list[str | Bracket]:
    """The key as text between brackets: fixed text and :class:`Bracket` values."""
    parts: list[str | Bracket] = []
    at = 0
    for match in _BRACKET.finditer(key):
        parts.append(key[at : match.start()])
        parts.append(Bracket.read(match[1]))
        at = match.end()
    parts.append(key[at:])
    for text in parts:
        if isinstance(text, str) and ("[" in text or "]" in text):
            unmatched = "'['" if "[" in text else "']'"
            raise RangeProblem(f"a {unmatched} without its pair in {key!r}", _WRITE)
    return parts


def range_count(key: str) -> int:
    """How many hosts ``key`` stands for, counted without making them.

    Example:
        >>> range_count("rack[1:4]-gpu[01:32]")
        128
    """
    count = 1
    for part in _parts(key):
        if isinstance(part, Bracket):
            count *= part.count
    return count


def expand_name(key: str) -> list[str]:
    """The host names ``key`` stands for, in order (the first range varying slowest); each
    must be a host name (:data:`fleet.spec.models.NAME_PATTERN`), else RangeProblem.

    Example:
        >>> expand_name("n[8:12:2]")
        ['n8', 'n10', 'n12']
        >>> expand_name("GPU-[1:2]")
        Traceback (most recent call last):
        ...
        fleet.spec.hostranges.RangeProblem: GPU-[1:2] makes the name 'GPU-1', which is not a host name
    """  # noqa: E501
    parts = _parts(key)
    choices = [[part] if isinstance(part, str) else part.values() for part in parts]
    names = ["".join(chosen) for chosen in product(*choices)]
    for name in names:
        if not _NAME.fullmatch(name):
            raise RangeProblem(
                f"{key} makes the name {name!r}, which is not a host name",
                "a host name is lower-case letters, digits, '.', '_' and '-', at most 63, "
                "beginning with a letter or digit",
            )
    return names


def range_addresses(address: str, names: list[str]) -> list[str]:
    """Each host's address, from the range block's ``address`` (see the module's docstring).

    Example:
        >>> range_addresses("{name}.dc1.example.com", ["gpu-1", "gpu-2"])
        ['gpu-1.dc1.example.com', 'gpu-2.dc1.example.com']
        >>> range_addresses("10.0.1.250/24", ["a"] * 6)
        Traceback (most recent call last):
        ...
        fleet.spec.hostranges.RangeProblem: 6 hosts from 10.0.1.250 run past 10.0.1.254, the last address of 10.0.1.0/24 before its broadcast address
    """  # noqa: E501
    if address == "sandbox":
        return [address] * len(names)
    if "{" in address or "}" in address:
        if address.replace(PLACEHOLDER, "").count("{") or address.replace(PLACEHOLDER, "").count(
            "}"
        ) or PLACEHOLDER not in address:
            raise RangeProblem(f"{address!r} holds braces other than {PLACEHOLDER}",
                               f"write {PLACEHOLDER} where each host's name goes")
        return [address.replace(PLACEHOLDER, name) for name in names]
    start, slash, prefix = address.partition("/")
    try:
        ip = parse_ip(start)
    except ValueError as error:
        raise RangeProblem(str(error)) from None
    if ip is None:
        if slash:
            raise RangeProblem(f"{address!r}: a prefix length follows an IP address only")
        raise RangeProblem(
            f"every host of the range would get the one address {address!r}",
            f'write {PLACEHOLDER} where each host\'s name goes (as in "{PLACEHOLDER}.'
            f'{address}"), or the first host\'s IP address',
        )
    return _counted(ip, prefix if slash else None, len(names))


def _counted(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, prefix: str | None,
             count: int) -> list[str]:
    """``count`` addresses from ``ip`` up: inside the network ``/prefix`` and off its network
    and broadcast addresses when a prefix is given, else inside the address space."""
    bare = ipaddress.ip_address(str(ip).split("%")[0])
    if prefix is None:
        first, last = bare, ipaddress.ip_address(int(bare) | ((1 << bare.max_prefixlen) - 1))
        where = "the address space"
    else:
        try:
            network = ipaddress.ip_network(f"{bare}/{prefix}", strict=False)
        except ValueError:
            raise RangeProblem(f"/{prefix} is not a prefix length of {bare}",
                               "write one as in 10.0.1.10/24, or leave it out") from None
        inner = 1 if network.num_addresses > 2 else 0  # a /31 or /32 has no broadcast address
        first, last = network.network_address + inner, network.broadcast_address - inner
        where = f"{network}" + (" before its broadcast address" if inner else "")
        if bare < first:
            raise RangeProblem(f"{bare} is the network address of {network}, not a host's",
                               f"start at {first}")
    if int(bare) + count - 1 > int(last):
        highest = int(last) - count + 1
        raise RangeProblem(
            f"{count} hosts from {bare} run past {last}, the last address of {where}",
            f"start at {ipaddress.ip_address(highest)} at most, or split the range"
            if highest >= int(first) else "split the range over networks",
        )
    zone = f"%{ip.scope_id}" if getattr(ip, "scope_id", None) else ""
    return [f"{bare + offset}{zone}" for offset in range(count)]


@dataclass
class Expanded:
    """The ``hosts:`` mapping with every range made into hosts.

    ``hosts``: name → block (a range's hosts share the block's nested values, read only);
    ``made_by``: a range's host → its key; ``findings``: what could not be expanded, at the key
    or its address.
    """

    hosts: dict[str, Any] = field(default_factory=dict)
    made_by: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    #: Problems located in another file (an inventory's lines).
    elsewhere: list[Problem] = field(default_factory=list)
    #: The keys that name a group of an Ansible inventory.
    groups: set[str] = field(default_factory=set)


def expand_hosts(hosts: dict[str, Any], lines: dict[str, int] | None = None,
                 folder: Path | None = None) -> Expanded:
    """Every range key of ``hosts`` made into its hosts, in place, in the file's order; and
    every block with ``inventory:`` into the hosts of its group in that Ansible inventory
    (:func:`inventory_hosts`; the path relative to ``folder``, the fleet file's).

    ``lines``: each key's line, to say where a name was made first. A name made twice (two
    ranges overlapping, a range and a plain host), more than :data:`MAX_HOSTS` hosts, a key or
    address that does not expand: a finding each, and nothing of that block made.

    Example:
        >>> out = expand_hosts({"a-[1:2]": {"address": "10.0.0.1"}, "b": {"address": "x"}})
        >>> out.hosts
        {'a-1': {'address': '10.0.0.1'}, 'a-2': {'address': '10.0.0.2'}, 'b': {'address': 'x'}}
        >>> expand_hosts({"a-[1:2]": {}, "a-2": {}}).findings
        [(('hosts', 'a-2'), 'a-2 is also made by the range a-[1:2]', 'give each host one entry: \
narrow the range, or drop this block')]
    """
    lines = lines or {}
    out = Expanded()
    groups = {key: inventory_hosts(key, block, folder or Path("."), out)
              for key, block in hosts.items() if is_inventory_block(block)}
    out.groups = set(groups)
    if out.findings or out.elsewhere:
        return out
    counts = {key: _safe_count(key) for key in hosts if isinstance(key, str) and is_range(key)}
    counts.update({key: len(made) for key, made in groups.items()})
    total = sum(counts.values()) + len(hosts) - len(counts)
    if total > MAX_HOSTS:
        key = max(counts, key=lambda k: counts[k])
        out.findings.append((
            ("hosts", key),
            f"{key} makes {counts[key]:,} hosts"
            + (f", and the fleet file {total:,} in all" if total != counts[key] else "")
            + f": more than the {MAX_HOSTS:,} a fleet file may hold",
            "split the fleet into files of one site or rack each",
        ))
        return out
    source: dict[str, str] = {}  # a name → the key that made it
    for key, block in hosts.items():
        if key in groups:
            made = groups[key]
        elif isinstance(key, str) and is_range(key):
            made = _expand_block(key, block, out)
        else:
            _claim(out, source, [key], key, lines)
            out.hosts[key] = block
            continue
        _claim(out, source, list(made), key, lines)
        for name, host in made.items():
            out.hosts[name] = host
            out.made_by[name] = key
    return out


def is_inventory_block(block: Any) -> bool:
    """Whether a block of ``hosts:`` stands for a group of an Ansible inventory.

    Example:
        >>> is_inventory_block({"inventory": "site/hosts.ini"}), is_inventory_block({})
        (True, False)
    """
    return isinstance(block, dict) and "inventory" in block


def inventory_hosts(group: str, block: dict[str, Any], folder: Path,
                    out: Expanded) -> dict[str, Any]:
    """The hosts of ``group`` in the Ansible inventory ``block["inventory"]`` names (INI, or
    YAML when it ends in .yml/.yaml), each with the block's settings: its address
    ``ansible_host`` (else its inventory name), ``ansible_port`` and ``ansible_user`` its
    ``ssh`` port and user (a host's own, over the block's, as Ansible's host variables over
    its group's). Problems go to ``out``: at the block, or at the inventory's line.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (Path(d) / "hosts.ini").write_text("[gpus]\\ngpu-[1:2] ansible_port=2222\\n")
        ...     made = inventory_hosts("gpus", {"inventory": "hosts.ini"}, Path(d), Expanded())
        >>> made["gpu-2"]
        {'address': 'gpu-2', 'ssh': {'port': 2222}}
    """
    at = ("hosts", group, "inventory")
    written = block["inventory"]
    if not isinstance(written, str) or not written.strip():
        out.findings.append((at, "inventory names an Ansible inventory file",
                             "write its path, as in inventory: site/hosts.ini"))
        return {}
    if "address" in block:
        out.findings.append((("hosts", group, "address"),
                             "the inventory gives each host its address",
                             "remove address here: ansible_host (or the host's name) is used"))
        return {}
    path = folder / Path(written).expanduser()
    refused = secret_path_problem(str(path.resolve()))  # no device, no machine's credential
    if refused is not None:
        out.findings.append((at, refused.replace("a fleet's secret", "an inventory")
                             .replace("a file holding a secret", "an inventory"),
                             "name the Ansible inventory file (INI or YAML)"))
        return {}
    try:
        text = decode_text(read_bounded(path, MAX_INVENTORY_BYTES))
        found = group_hosts(text, group, yaml_form=path.suffix in (".yml", ".yaml"))
    except OSError as error:
        out.findings.append((at, f"cannot read {path}: {error.strerror or error}", None))
        return {}
    except (TextProblem, InventoryProblem) as problem:
        if problem.line is None:  # the file as a whole: said at the block's inventory
            named = "" if str(path) in problem.message else f" ({path})"
            out.findings.append((at, f"{problem.message}{named}", problem.hint))
        else:
            out.elsewhere.append(Problem(str(path), problem.line, None, (), problem.message,
                                         problem.hint))
        return {}
    settings = {key: value for key, value in block.items() if key != "inventory"}
    count = sum(_safe_count(host.pattern) if is_range(host.pattern) else 1 for host in found)
    if count > MAX_HOSTS:  # counted before any is made, as a range of the fleet file
        out.findings.append((at, f"group {group} of {path} makes {count:,} hosts: more than "
                             f"the {MAX_HOSTS:,} a fleet file may hold",
                             "name a smaller group of the inventory"))
        return {}
    made: dict[str, Any] = {}
    for host in found:
        try:
            names = expand_name(host.pattern) if is_range(host.pattern) else [host.pattern]
            if not _NAME.fullmatch(names[0]):
                raise RangeProblem(f"{host.pattern!r} is not a host name here",
                                   "a fleet host name is lower-case letters, digits, '.', '_' "
                                   "and '-', at most 63")
        except RangeProblem as problem:
            out.elsewhere.append(Problem(str(path), host.line, None, (), problem.message,
                                         problem.hint))
            continue
        for name in names:
            made[name] = _from_inventory(settings, name, host.variables, path, host.line, out)
    return made


def _from_inventory(settings: dict[str, Any], name: str, variables: dict[str, str], path: Path,
                    line: int, out: Expanded) -> dict[str, Any]:
    """One inventory host's block: the group block's settings, its address and ssh."""
    host = {"address": variables.get("ansible_host", name), **settings}
    ssh = dict(settings["ssh"]) if isinstance(settings.get("ssh"), dict) else {}
    port = variables.get("ansible_port")
    if port is not None:
        if not port.isdigit():
            out.elsewhere.append(Problem(str(path), line, None, (),
                                         f"ansible_port={port} is not a port number", None))
        else:
            ssh["port"] = int(port)
    if "ansible_user" in variables:
        ssh["user"] = variables["ansible_user"]
    if ssh:
        host["ssh"] = ssh
    return host


def _safe_count(key: str) -> int:
    try:
        return range_count(key)
    except RangeProblem:
        return 1


def _expand_block(key: str, block: Any, out: Expanded) -> dict[str, Any]:
    """One range block's hosts, or none (and a finding)."""
    try:
        names = expand_name(key)
    except RangeProblem as problem:
        out.findings.append((("hosts", key), problem.message, problem.hint))
        return {}
    if not isinstance(block, dict):
        return dict.fromkeys(names, block)  # not a mapping: validation says so at each host
    address = block.get("address")
    if address == {"name": None}:  # address: {name}.x unquoted is a YAML mapping
        out.findings.append((("hosts", key, "address"), "{name} here is read as a YAML mapping",
                             'quote the address: address: "{name}.example.com"'))
        return {}
    if not isinstance(address, str):
        return {name: block for name in names}
    try:
        addresses = range_addresses(address, names)
    except RangeProblem as problem:
        out.findings.append((("hosts", key, "address"), problem.message, problem.hint))
        return {}
    return {name: {**block, "address": each} for name, each in zip(names, addresses, strict=True)}


def _claim(out: Expanded, source: dict[str, str], names: list[str], key: str,
           lines: dict[str, int]) -> None:
    """Record that ``key`` makes ``names``; a finding at ``key`` for each other key that made
    some of them first (one finding, however many names they share)."""
    taken: dict[str, list[str]] = {}
    for name in names:
        if name in source:
            taken.setdefault(source[name], []).append(name)
        else:
            source[name] = key
    for first, shared in taken.items():
        where = f" (line {lines[first]})" if first in lines else ""
        maker = "the inventory group" if first in out.groups else "the range"
        what = "a host of its own" if first in shared else f"made by {maker} {first}"
        fix = ("drop it from the inventory's group or from this block" if out.groups & {first, key}
               else "narrow the range, or drop this block")
        hosts = (shared[0] if len(shared) == 1
                 else f"{shared[0]} … {shared[-1]} ({len(shared)} hosts)")
        verb = "is" if len(shared) == 1 else "are"
        out.findings.append((
            ("hosts", key),
            f"{hosts} {verb} also {what}{where}",
            f"give each host one entry: {fix}",
        ))


def fold(problems: list[Problem], made_by: dict[str, str]) -> list[Problem]:
    """One problem for a range block's fault, not one per host: problems that differ only in
    which host of one range they name become the first, saying how many more hosts share it.

    Example:
        >>> p = [Problem("f", 3, 5, ("hosts", n, "gpus"), "bad") for n in ("a-1", "a-2")]
        >>> [str(x) for x in fold(p, {"a-1": "a-[1:2]", "a-2": "a-[1:2]"})]
        ['f:3:5: hosts.a-1.gpus: bad (and on 1 more host of a-[1:2])']
    """
    groups: dict[tuple[Any, ...], list[Problem]] = {}  # in the order first seen
    out: list[Problem | tuple[Any, ...]] = []
    for problem in problems:
        host = _host_of(problem.path)
        key = made_by.get(host) if host is not None else None
        if host is None or key is None:
            out.append(problem)  # not a range's host: kept as it is
            continue
        # The fault as the block has it: its path at the key, the host's name in the message
        # as the key ("port 80 on gpu-7" and "port 80 on gpu-8" are one fault).
        message = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", key, problem.message)
        group = (problem.line, problem.column, ("hosts", key, *problem.path[2:]), message,
                 problem.severity)
        if group not in groups:
            groups[group] = []
            out.append(group)
        groups[group].append(problem)
    folded = [item if isinstance(item, Problem) else _folded(groups[item], made_by)
              for item in out]
    return _capped(folded, made_by)


#: Problems shown at one field of a range block when they differ from host to host (each
#: host's address taken by another block's host): the rest are counted in one more.
MAX_SHOWN = 3


def _capped(problems: list[Problem], made_by: dict[str, str]) -> list[Problem]:
    """At most :data:`MAX_SHOWN` problems at one field of a range block, and one that counts
    the rest (512 hosts whose addresses another range also gives are one fault to fix).

    Example:
        >>> made = {f"b-{n}": "b-[1:9]" for n in range(1, 10)}
        >>> p = [Problem("f", 8, 14, ("hosts", f"b-{n}", "address"), f"{n} taken")
        ...      for n in range(1, 10)]
        >>> [str(x) for x in _capped(p, made)][-1]
        'f:8:14: hosts.b-[1:9].address: and 6 more problems like these on other hosts of b-[1:9]'
    """
    seen: dict[tuple[Any, ...], int] = {}
    out: list[Problem] = []
    dropped: dict[tuple[Any, ...], tuple[Problem, int]] = {}
    for problem in problems:
        host = _host_of(problem.path)
        key = made_by.get(host) if host is not None else None
        if key is None:
            out.append(problem)
            continue
        where = (problem.line, problem.column, ("hosts", key, *problem.path[2:]),
                 problem.severity)
        seen[where] = seen.get(where, 0) + 1
        if seen[where] <= MAX_SHOWN:
            out.append(problem)
        else:
            first, count = dropped.get(where, (problem, 0))
            dropped[where] = (first, count + 1)
    for (line, column, path, severity), (first, count) in dropped.items():
        more = "more problem like these" if count == 1 else "more problems like these"
        out.append(Problem(first.file, line, column, path,
                           f"and {count} {more} on other hosts of {path[1]}", None, severity))
    return out


def _folded(problems: list[Problem], made_by: dict[str, str]) -> Problem:
    """The first of one fault's problems, saying on how many more hosts of its range it is."""
    first = problems[0]
    if len(problems) == 1:
        return first
    more = len(problems) - 1
    key = made_by[str(first.path[1])]
    return Problem(first.file, first.line, first.column, first.path,
                   f"{first.message} (and on {more} more host{'s' * (more > 1)} of {key})",
                   first.hint, first.severity)


def _host_of(path: Loc) -> str | None:
    return str(path[1]) if len(path) >= 2 and path[0] == "hosts" else None


def range_keys(hosts: Any) -> Iterator[str]:
    """The range keys of a ``hosts:`` mapping (none when it is not a mapping).

    Example:
        >>> list(range_keys({"a-[1:2]": {}, "b": {}}))
        ['a-[1:2]']
    """
    if isinstance(hosts, dict):
        yield from (key for key in hosts if isinstance(key, str) and is_range(key))
