"""One ledger of host resources: everything the fleet puts on a host, claimed once by a named owner.

Per host, every unit name, file and directory path, socket path, listening port (and port range)
and GPU that the fleet's servers, groups, routers and monitoring put there is a :class:`Claim`.
The claims come from the functions the host plan is built from (:mod:`fleet.catalog.paths`,
:mod:`fleet.planner.groups` for each member's ports, Ray's included,
:mod:`fleet.planner.monitoring` for the exporters), so the ledger cannot disagree with what is
written.
:func:`ledger_problems` then holds the claims to their rules, each a located finding that names
both owners and the fix:

- a unit, file or directory claimed twice (names compared case-folded, ``-`` and ``_`` alike);
- a directory handed to a unit (StateDirectory, CacheDirectory, RuntimeDirectory, Ray's
  ``--temp-dir``) that holds, or lies inside, another owner's path;
- a port claimed twice on a host, or inside another owner's port range (sandbox hosts share
  this machine's network: one set of ports for all of them);
- a port below 1024 for a unit whose ``CapabilityBoundingSet=`` is empty;
- a socket path over the 107 bytes an ``AF_UNIX`` address holds;
- GPUs shared by servers (and group members) whose memory fractions sum to 1 or more.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/examples/h200-pair-ray.yaml")
    >>> [(c.kind, c.value) for c in host_claims(fleet)["hgx-h200-02"] if c.kind == "unit"]
    [('unit', 'vllm-fleet-cpu-governor.service'), ('unit', 'vllm-deepseek.service')]
    >>> list(ledger_problems(fleet))
    []
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import NamedTuple

from fleet.catalog.paths import (
    ALERTMANAGER_DROPIN,
    GOVERNOR_UNIT,
    GPU_METRICS_UNIT,
    MODELS_DIR,
    NODE_EXPORTER_DROPIN,
    PREVIOUS_DIR,
    PROMETHEUS_DIR,
    PROMETHEUS_DROPIN,
    PROMETHEUS_TLS_DIR,
    STARTUPS_DIR,
    TLS_PARTS,
    cache_dir,
    env_path,
    model_path,
    previous_paths,
    ray_runtime_dir,
    ray_unit_name,
    router_env_path,
    router_unit_name,
    runtime_path,
    scrape_ca_path,
    startup_record,
    state_home,
    tls_path,
    tls_previous_path,
    unit_name,
)
from fleet.planner.fit import utilization
from fleet.planner.groups import member_ray_ports, ports, settings
from fleet.planner.monitoring import host_exporters
from fleet.read.problems import Finding, Loc
from fleet.spec.models import Fleet, Launcher, Server, Variant

#: The most bytes of an ``AF_UNIX`` socket path (``sun_path`` is 108 bytes with its NUL).
AF_UNIX_MAX = 107
#: vLLM 0.32's IPC sockets: ``ipc://{VLLM_RPC_BASE_PATH}/{uuid4()}``
#: (``vllm/utils/network_utils.py`` ``get_open_zmq_ipc_path``); the unit's runtime folder is
#: its ``VLLM_RPC_BASE_PATH``.
VLLM_IPC_NAME = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
#: Ray's session folder below its ``--temp-dir``: ``session_%Y-%m-%d_%H-%M-%S_%f_<pid>``, the pid
#: at most 7 digits (Linux's ``pid_max`` is at most 4194304); its sockets ``sockets/plasma_store``
#: and ``sockets/raylet`` (Ray ``_private/node.py`` ``_prepare_socket_file``, which refuses a path
#: over 107 bytes: "AF_UNIX path length cannot exceed 107 bytes").
RAY_SESSION = "session_2026-01-01_00-00-00_000000_4194304"
#: The longer of the two (``sockets/raylet`` is shorter).
RAY_SOCKET = "sockets/plasma_store"
#: Ray's Client server: ``ray start --head`` opens it on 10001 whenever ``grpc`` imports (Ray's
#: ``scripts.py``: ``if has_ray_client and ray_client_server_port is None: … = 10001``); the
#: fleet starts no dashboard (``--include-dashboard=false``).
RAY_CLIENT_PORT = 10001
#: The party of vllm-fleet's own resources (what a finding never asks to rename).
TOOL = "vllm-fleet"
#: Where a unit without capabilities may listen: ports below 1024 need CAP_NET_BIND_SERVICE.
FIRST_UNPRIVILEGED_PORT = 1024
#: vLLM flags that, written in a server's ``args``, make it listen on a port besides its API port
#: (vLLM 0.32's parser): the Rust frontend's gRPC services, the data-parallel RPC port, and the
#: supervisor's health port of multi-port external load balancing, which that mode opens on
#: 9256 unless the port is given (the switch that turns the mode on, for the default).
ARG_PORTS = {"grpc-port": None, "data-parallel-rpc-port": None,
             "data-parallel-supervisor-port": "data-parallel-multi-port-external-lb"}
SUPERVISOR_PORT = 9256


def normalise(name: str) -> str:
    """A name or path as the ledger compares it: case-folded, ``_`` read as ``-``.

    Example:
        >>> normalise("vllm-Chat_A.service") == normalise("vllm-chat-a.service")
        True
    """
    return name.casefold().replace("_", "-")


class Claim(NamedTuple):
    """One resource of one host, claimed by a named owner at a field of the fleet file.

    + kind: ``unit`` (a systemd unit name), ``file``, ``directory``, ``socket``, ``port`` (a
      range when ``high`` is set) or ``gpu``
    + value: the name, path, port or GPU index; owner: who claims it, in words; path: the
      field of the fleet file that makes the claim; party: the server, group, endpoint or part
      of vllm-fleet the owner belongs to (one finding per two parties; default: the owner)
    + handed: a directory handed to the unit (nothing of another owner may be inside it)
    + privileged: a port the owner may bind below 1024 (its unit keeps the capability)
    + share: the GPU memory fraction a GPU claim takes; part: what makes a socket path long
    + fixed: a port the fleet file cannot move; default: one it does not write (a default):
      both are held first, so that a finding names the port that was written

    Example:
        >>> Claim("port", 10002, "group a/big's Ray workers", (), high=10999).shown
        'ports 10002–10999'
    """

    kind: str
    value: str | int
    owner: str
    path: Loc
    party: str = ""
    high: int | None = None
    handed: bool = False
    privileged: bool = False
    share: float = 0.0
    part: str = ""
    fixed: bool = False
    default: bool = False

    @property
    def who(self) -> str:
        """The party: :attr:`party`, else the owner."""
        return self.party or self.owner

    @property
    def shown(self) -> str:
        """The resource in words: ``port 8000``, ``unit vllm-chat.service``, …"""
        if self.kind == "port" and self.high is not None:
            return f"ports {self.value}–{self.high}"
        return f"{self.kind} {self.value}"

    @property
    def where(self) -> str:
        """The claiming field, dotted (``(the tool)`` for vllm-fleet's own resources)."""
        return ".".join(str(part) for part in self.path) or "vllm-fleet itself"


def _server_claims(fleet: Fleet, host_name: str, name: str, server: Server) -> list[Claim]:
    """A server's own unit, files, directories, sockets, API port and GPUs on its host."""
    host = fleet.hosts[host_name]
    base: Loc = ("hosts", host_name, "servers", name)
    owner = f"server {host_name}/{name}"
    found = [Claim("unit", unit_name(name), owner, base), *_files(name, owner, base),
             Claim("port", server.port, owner, (*base, "port")), *_arg_ports(server, owner, base)]
    if host.vllm.variant is not Variant.cpu:
        share = utilization(host, server)
        found += [Claim("gpu", index, owner, (*base, "args"), share=share)
                  for index in dict.fromkeys(server.gpus)]
    if server.worker_hosts:
        found += _head_claims(fleet, host_name, name, server)
    if server.tls is not None:  # what the deploy writes for it (fleet.hostplan.tls)
        found += [Claim("file", path(name, part), owner, (*base, "tls"))
                  for part in TLS_PARTS for path in (tls_path, tls_previous_path)]
    return found


def _arg_ports(server: Server, owner: str, base: Loc) -> list[Claim]:
    """The ports a server's ``args`` open besides its API port (:data:`ARG_PORTS`).

    Example:
        >>> server = Server(model="m", port=8000, args={"grpc-port": 8001})
        >>> [(c.value, c.where) for c in _arg_ports(server, "server a/b", ("s",))]
        [(8001, 's.args.grpc-port')]
    """
    found = []
    for key, switch in ARG_PORTS.items():
        if server.worker_hosts and key == "data-parallel-rpc-port":
            continue  # a group's: multinode.dp_rpc_port, refused in args (multinode's rule)
        written = server.args.get(key)
        if written is None and switch is not None and server.args.get(switch) is True:
            found.append(Claim("port", SUPERVISOR_PORT, f"the --{key} of {owner} (its default, "
                               f"with --{switch})", (*base, "args", switch), party=owner,
                               default=True))
        if written is None or isinstance(written, bool):
            continue
        try:  # vLLM reads it with int(); the flag check refuses what int() does not read
            port = int(str(written).strip())
        except ValueError:
            continue
        if 0 < port < 65536:
            found.append(Claim("port", port, f"the --{key} of {owner}", (*base, "args", key),
                               party=owner))
    return found


def _files(name: str, owner: str, base: Loc, vllm: bool = True) -> list[Claim]:
    """The files and handed directories every unit of server ``name`` has (head or member)."""
    found = [Claim("file", env_path(name), owner, base),
             *(Claim("file", path, owner, base) for path in previous_paths(name)),
             Claim("file", startup_record(name), owner, base),
             *(Claim("directory", path, owner, base, handed=True)
               for path in (state_home(name), cache_dir(name), runtime_path(name)))]
    if vllm:
        found.append(Claim("socket", f"{runtime_path(name)}/{VLLM_IPC_NAME}",
                           f"the vLLM IPC socket path of {owner}", base, party=owner, part=name))
    return found


def _ray_node(fleet: Fleet, head: str, name: str, server: Server, rank: int,
              owner: str, base: Loc) -> list[Claim]:
    """One member's Ray node: its temp folder and sockets, node/object manager, worker ports."""
    node = member_ray_ports(fleet, head, server, rank)
    multinode = (*base, "multinode")
    temp = f"/run/{ray_runtime_dir(name)}"
    written = settings(server).model_fields_set
    return [
        Claim("directory", temp, f"{owner} (Ray's --temp-dir)", base, party=owner, handed=True),
        Claim("socket", f"{temp}/{RAY_SESSION}/{RAY_SOCKET}", f"the Ray socket path of {owner}",
              base, party=owner, part=name),
        Claim("port", node.node_manager, f"the Ray node manager of {owner}",
              (*multinode, "ray_node_manager_port"), party=owner,
              default="ray_node_manager_port" not in written),
        Claim("port", node.object_manager, f"the Ray object manager of {owner}",
              (*multinode, "ray_object_manager_port"), party=owner,
              default="ray_object_manager_port" not in written),
        Claim("port", node.min_worker, f"the Ray worker port range of {owner}",
              (*multinode, "ray_min_worker_port"), party=owner, high=node.max_worker,
              default=not {"ray_min_worker_port", "ray_max_worker_port"} & written),
    ]


def _head_claims(fleet: Fleet, host_name: str, name: str, server: Server) -> list[Claim]:
    """What the head of a group across hosts adds on its host: the group's ports, and over Ray
    the Ray head unit, its GCS, Client server and node."""
    base: Loc = ("hosts", host_name, "servers", name)
    group = settings(server)
    owner = f"group {host_name}/{name}"
    if group.launcher is not Launcher.ray:
        return [Claim("port", port, f"the {key.replace('_', ' ')} of {owner}",
                      (*base, "multinode", key), party=owner,
                      default=key not in group.model_fields_set)
                for key, port in ports(server, "head").items()]
    head = f"{owner} (Ray head)"
    return [
        Claim("unit", ray_unit_name(name), head, base),
        *(Claim("file", path, head, base) for path in previous_paths(f"{name}-ray")[:1]),
        Claim("port", group.ray_port, f"the Ray GCS of {head}", (*base, "multinode", "ray_port"),
              party=head, default="ray_port" not in group.model_fields_set),
        Claim("port", RAY_CLIENT_PORT, f"the Ray Client server of {head}, which Ray opens on "
              f"{RAY_CLIENT_PORT}",
              (*base, "multinode", "launcher"), party=head, fixed=True),
        *_ray_node(fleet, host_name, name, server, 0, head, base),
    ]


def _member_claims(fleet: Fleet, head: str, name: str, rank: int) -> list[Claim]:
    """A group's worker on its host: the member unit (vLLM headless, or a Ray node), its files,
    directories, sockets, ports and the server's GPUs there."""
    server = fleet.hosts[head].servers[name]
    member = server.worker_hosts[rank - 1]
    base: Loc = ("hosts", head, "servers", name)
    owner = f"group {head}/{name} (worker {member})"
    at = (*base, "worker_hosts", rank - 1)
    ray = settings(server).launcher is Launcher.ray
    found = [Claim("unit", unit_name(name), owner, at), *_files(name, owner, at, vllm=not ray)]
    if ray:
        found += _ray_node(fleet, head, name, server, rank, owner, base)
    if fleet.hosts[member].vllm.variant is not Variant.cpu:
        share = utilization(fleet.hosts[head], server)
        found += [Claim("gpu", index, owner, (*base, "args"), share=share)
                  for index in dict.fromkeys(server.gpus)]
    return found


def _monitoring_claims(fleet: Fleet, host_name: str) -> list[Claim]:
    """The exporters every host runs, and Prometheus and Alertmanager on the monitoring host."""
    monitoring = fleet.monitoring
    if monitoring is None or monitoring.host not in fleet.hosts:
        return []
    exporters = host_exporters(fleet, host_name)
    own = monitoring.exporters.get(host_name)
    node_path: Loc = (("monitoring", "exporters", host_name, "node_exporter_port")
                      if own and own.node_exporter_port else ("monitoring", "node_exporter_port"))
    owner = f"the node exporter of {host_name}"
    written = bool(own and own.node_exporter_port) or (
        "node_exporter_port" in monitoring.model_fields_set)
    found = [Claim("port", exporters.node_port, owner, node_path, default=not written),
             Claim("file", NODE_EXPORTER_DROPIN, owner, node_path)]
    if exporters.gpu == "textfile":
        found.append(Claim("unit", GPU_METRICS_UNIT, f"the GPU metrics feeder of {host_name}",
                           ("monitoring",)))
    if exporters.gpu == "dcgm":  # the site's DCGM exporter: its own unit, its own capabilities
        found.append(Claim("port", exporters.dcgm_port, f"the DCGM exporter of {host_name}",
                           ("monitoring", "exporters", host_name, "dcgm_port"), privileged=True,
                           default=not own or "dcgm_port" not in own.model_fields_set))
    if host_name == monitoring.host:
        base: Loc = ("monitoring", "prometheus", "port")
        given = "port" in monitoring.prometheus.model_fields_set
        found += [Claim("port", monitoring.prometheus.port, "Prometheus", base, default=not given),
                  Claim("file", PROMETHEUS_DROPIN, "Prometheus", base),
                  Claim("directory", PROMETHEUS_DIR, "Prometheus", base),
                  Claim("directory", PROMETHEUS_TLS_DIR, "Prometheus", base)]
        # the CA each TLS server's https scrape trusts (fleet.hostplan.monitoring.scrape_cas)
        found += [Claim("file", scrape_ca_path(other, name), "Prometheus",
                        ("hosts", other, "servers", name, "tls"))
                  for other, host in fleet.hosts.items()
                  for name, server in host.servers.items() if server.tls is not None]
        if monitoring.alertmanager is not None:
            path: Loc = ("monitoring", "alertmanager", "port")
            given = "port" in monitoring.alertmanager.model_fields_set
            found += [Claim("port", monitoring.alertmanager.port, "Alertmanager", path,
                            default=not given),
                      Claim("file", ALERTMANAGER_DROPIN, "Alertmanager", path)]
    return found


def _tool_claims(fleet: Fleet, host_name: str) -> list[Claim]:
    """vllm-fleet's own resources on every host (claimed first: a name that reaches one of them
    is the one to change)."""
    host = fleet.hosts[host_name]
    found = [Claim("directory", MODELS_DIR, "the verified model store", (), party=TOOL),
             Claim("directory", PREVIOUS_DIR, "the saved copies of the last working units", (),
                   party=TOOL),
             Claim("directory", STARTUPS_DIR, "the startup records", (), party=TOOL)]
    if host.os.cpu_governor is not None:
        found.append(Claim("unit", GOVERNOR_UNIT, "vllm-fleet's CPU governor",
                           ("hosts", host_name, "os", "cpu_governor"), party=TOOL))
    if not host.is_sandbox:  # a sandbox host's sshd port is the sandbox tool's
        found.append(Claim("port", host.ssh.port, f"the SSH server of {host_name}",
                           ("hosts", host_name, "ssh", "port"), privileged=True, fixed=True))
    return found


def _router_claims(fleet: Fleet, host_name: str) -> list[Claim]:
    """The routers of the endpoints that run on ``host_name``: unit, key file, two ports."""
    found = []
    for endpoint_name, endpoint in fleet.endpoints.items():
        if endpoint.router.host != host_name:
            continue
        base: Loc = ("endpoints", endpoint_name, "router")
        owner = f"endpoint {endpoint_name}'s router"
        found += [Claim("unit", router_unit_name(endpoint_name), owner, (*base, "host")),
                  Claim("file", router_env_path(endpoint_name), owner, (*base, "host")),
                  Claim("port", endpoint.router.port, owner, (*base, "port")),
                  Claim("port", endpoint.router.metrics_port, f"the metrics port of {owner}",
                        (*base, "metrics_port"), party=owner,
                        default="metrics_port" not in endpoint.router.model_fields_set)]
    return found


def host_claims(fleet: Fleet) -> dict[str, list[Claim]]:
    """Every host's claims (:func:`each_host_claims`), by host."""
    return dict(each_host_claims(fleet))


def each_host_claims(fleet: Fleet) -> Iterator[tuple[str, list[Claim]]]:
    """Each host's claims in turn, in the order they are held: vllm-fleet's own, the models it
    serves, its servers (a group's head with its server), the groups it joins as a worker,
    routers, monitoring (one host at a time: a large fleet's claims are never all held)."""
    joined: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for head, host in fleet.hosts.items():
        for name, server in host.servers.items():
            for rank, member in enumerate(server.worker_hosts, start=1):
                if member in fleet.hosts and member != head:
                    joined[member].append((head, name, rank))
    for host_name, host in fleet.hosts.items():
        found = _tool_claims(fleet, host_name)
        models = dict.fromkeys(server.model for server in host.servers.values())
        models.update(dict.fromkeys(fleet.hosts[head].servers[name].model
                                    for head, name, _ in joined[host_name]))
        found += [Claim("directory", model_path(model), f"model {model} (the verified model "
                        "store)", ("models", model)) for model in models if model in fleet.models]
        for name, server in host.servers.items():
            found += _server_claims(fleet, host_name, name, server)
        for head, name, rank in joined[host_name]:
            found += _member_claims(fleet, head, name, rank)
        found += _router_claims(fleet, host_name)
        found += _monitoring_claims(fleet, host_name)
        yield host_name, found


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------


def _twice(host: str, first: Claim, second: Claim, shared: bool = False) -> str:
    """The message of a resource claimed twice, naming both owners.

    Example:
        >>> a = Claim("unit", "vllm-med-ray.service", "group a/med (Ray head)", ("x",))
        >>> _twice("a", a, Claim("unit", "vllm-med_ray.service", "server a/med_ray", ("y",)))
        ... # doctest: +NORMALIZE_WHITESPACE
        "unit vllm-med-ray.service on a is claimed twice: by group a/med (Ray head) (x) and by
         server a/med_ray as vllm-med_ray.service (names are compared case-folded, with '-' and
         '_' alike)"
    """
    if first.high is not None or second.high is not None:
        verb = ("overlap" if first.high is not None and second.high is not None
                else "lies in" if second.high is None else "take in")
        text = (f"{second.shown} of {second.owner} on {host} {verb} {first.shown} of "
                f"{first.owner} ({first.where})")
    else:
        text = (f"{first.shown} on {host} is claimed twice: by {first.owner} ({first.where}) "
                f"and by {second.owner}")
    if first.value != second.value and first.high is None and second.high is None:
        text += f" as {second.value} (names are compared case-folded, with '-' and '_' alike)"
    if shared:
        text += " (sandbox hosts share this machine's network)"
    return text


def _subject(claim: Claim) -> str | None:
    """What a person renames to free a resource: a server (a group's is its head server) or an
    endpoint; None for what has no name of the fleet file's (vllm-fleet's own, monitoring).

    Example:
        >>> _subject(Claim("unit", "vllm-big.service", "group a/big (worker b)", ("hosts",)))
        'server a/big'
    """
    if not claim.path or claim.path[0] == "monitoring" or claim.who == TOOL:
        return None
    words = claim.who.split(" (")[0].split("'s ")[0]
    return "server " + words.removeprefix("group ") if words.startswith("group ") else words


def _rename(second: Claim, first: Claim) -> str:
    """The fix of a name claimed twice: rename the second owner (or the first)."""
    names = [name for name in dict.fromkeys((_subject(second), _subject(first))) if name]
    if not names:
        return "rename the server"
    return "rename " + " or ".join(names)


class _Pairs:
    """The pairs of parties already reported on a host: one finding per two parties."""

    def __init__(self) -> None:
        self.seen: set[frozenset[str]] = set()

    def first(self, one: Claim, other: Claim) -> bool:
        """Whether ``one`` and ``other``'s parties are reported for the first time."""
        pair = frozenset((one.who, other.who))
        if pair in self.seen:
            return False
        self.seen.add(pair)
        return True


def _named_twice(host: str, claims: list[Claim], pairs: _Pairs) -> Iterator[Finding]:
    """Units, files and directories: one owner each (after :func:`normalise`)."""
    seen: dict[tuple[str, str], Claim] = {}
    for claim in claims:
        if claim.kind not in ("unit", "file", "directory"):
            continue
        key = ("unit" if claim.kind == "unit" else "path", normalise(str(claim.value)))
        first = seen.setdefault(key, claim)
        if first.who != claim.who and pairs.first(first, claim):
            yield (claim.path, _twice(host, first, claim),
                   f"{_rename(claim, first)}: each unit and file of a host has one owner")


def _inside(host: str, claims: list[Claim], pairs: _Pairs) -> Iterator[Finding]:
    """A directory handed to a unit holds nothing of another owner, nor lies inside another's
    (each handed folder looked up among the host's paths sorted, and its parents: linear)."""
    index: dict[str, list[Claim]] = defaultdict(list)
    for claim in claims:
        if claim.kind in ("file", "directory"):
            index[normalise(str(claim.value)).rstrip("/") + "/"].append(claim)
    keys = sorted(index)
    for root, held in index.items():
        for folder in (c for c in held if c.handed):
            parts = root.split("/")[:-1]
            above = ["/".join(parts[:end]) + "/" for end in range(2, len(parts))]
            start = bisect_left(keys, root) + 1
            below = []
            for key in islice(keys, start, None):
                if not key.startswith(root):
                    break
                below.append(key)
            for place in (*above, *below):
                for other in index.get(place, ()):
                    if other.who == folder.who or not pairs.first(folder, other):
                        continue
                    outer, inner = (folder, other) if place in below else (other, folder)
                    yield (folder.path,
                           f"{inner.shown} on {host} ({inner.owner}) lies inside {outer.shown} "
                           f"({outer.owner}); {folder.owner}'s unit is handed its directory to "
                           "write", f"{_rename(folder, other)}: a unit's own directories hold "
                           "nothing else")


def _ports(scope: str, claims: list[tuple[str, Claim]]) -> Iterator[tuple[Finding, Loc]]:
    """One owner per port of a host (of all sandbox hosts together), ranges included; each
    finding with the field of the first claim (a group's field clashing with one other field
    on each member is one finding)."""
    seen: dict[int, tuple[str, Claim]] = {}
    ranges: list[tuple[str, Claim]] = []
    pairs = _Pairs()
    for host, claim in sorted(claims, key=lambda item: (not item[1].fixed, not item[1].default)):
        low = int(claim.value)
        high = claim.high if claim.high is not None else low
        clashes = [(h, c) for h, c in ranges if int(c.value) <= high and low <= (c.high or 0)]
        if claim.high is None and low in seen:
            clashes.append(seen[low])
        elif claim.high is not None:
            clashes += [held for port, held in seen.items() if low <= port <= high]
        for first_host, first in clashes[:1]:
            if pairs.first(first, claim):
                shared = scope == "sandbox" and first_host != host
                yield (claim.path, _twice(host, first, claim, shared),
                       _move(claim, first, scope)), first.path
        if clashes:
            continue
        if claim.high is None:
            seen[low] = (host, claim)
        else:
            ranges.append((host, claim))


def _move(second: Claim, first: Claim, scope: str) -> str:
    """The fix of a port claimed twice: choose another for the field that claims it second.

    Example:
        >>> _move(Claim("port", 8001, "server a/b", ("hosts", "a", "servers", "b", "port")),
        ...       Claim("port", 8001, "server a/c", ()), "a")
        'choose another port for server a/b (every port of a host has one owner)'
    """
    where = ("every port of the sandbox hosts, which share this machine's network, has one owner"
             if scope == "sandbox" else "every port of a host has one owner")
    if second.fixed:
        return f"{second.owner} cannot move: change {first.where} ({where})"
    field = str(second.path[-1])
    if second.high is not None:
        field = "ray_min_worker_port…ray_max_worker_port"
    if field == "port":
        field = "port for " + second.owner
    return f"choose another {field} ({where})"


def _privileged(host: str, claims: list[Claim]) -> Iterator[Finding]:
    """A port below 1024 needs CAP_NET_BIND_SERVICE, which the fleet's units do not keep."""
    for claim in claims:
        if claim.kind == "port" and not claim.privileged and int(claim.value) < 1024:
            yield (claim.path,
                   f"port {claim.value} on {host} is below {FIRST_UNPRIVILEGED_PORT}: binding it "
                   f"needs a capability that {claim.owner} does not have (its unit runs with an "
                   "empty CapabilityBoundingSet=)",
                   f"choose a port ≥ {FIRST_UNPRIVILEGED_PORT}, or put a proxy that may bind "
                   f"{claim.value} in front of it")


def _sockets(host: str, claims: list[Claim]) -> Iterator[Finding]:
    """Every socket path fits an AF_UNIX address (107 bytes), naming the part that makes it long."""
    for claim in claims:
        size = len(str(claim.value).encode())
        if claim.kind != "socket" or size <= AF_UNIX_MAX:
            continue
        part = len(claim.part.encode())
        yield (claim.path,
               f"{claim.owner} on {host} would be {claim.value} ({size} bytes), over the "
               f"{AF_UNIX_MAX} bytes an AF_UNIX socket path holds: the server name "
               f"{claim.part!r} ({part} characters) makes it long",
               f"use a server name of at most {max(part - (size - AF_UNIX_MAX), 1)} characters")


def _gpus(host_name: str, claims: list[Claim]) -> Iterator[Finding]:
    """Servers (and group members) sharing a GPU take less than all of its memory together."""
    users: dict[int, list[Claim]] = defaultdict(list)
    for claim in claims:
        if claim.kind == "gpu":
            users[int(claim.value)].append(claim)
    for index, sharers in sorted(users.items()):
        total = sum(claim.share for claim in sharers)
        if len(sharers) > 1 and total >= 1:
            listing = " + ".join(f"{_gpu_label(host_name, c)} {c.share:g}" for c in sharers)
            yield (sharers[-1].path,
                   f"servers sharing GPU {index} take {listing} = {total:.2f} of its memory "
                   "(gpu-memory-utilization is a fraction of the GPU's total, per server)",
                   "lower gpu-memory-utilization so that they sum below 1 with headroom")


def _gpu_label(host_name: str, claim: Claim) -> str:
    """A GPU user in the listing: a server of the host by its name, a group member in full."""
    return claim.owner.removeprefix(f"server {host_name}/")


def ledger_problems(fleet: Fleet) -> Iterator[Finding]:
    """Every resource claimed twice, or against its rule, in host order (``fleet check``)."""
    sandbox = {name for name, host in fleet.hosts.items() if host.is_sandbox}
    yield from claim_problems(each_host_claims(fleet), sandbox)


def claim_problems(claims: Iterable[tuple[str, list[Claim]]],
                   sandbox: set[str]) -> Iterator[Finding]:
    """The rules over each host's claims (``sandbox``: the hosts that share this machine's
    network, whose ports are held together).

    Example:
        >>> home = Claim("directory", "/var/lib/vllm-fleet/models", "server a/x", ("h",),
        ...              handed=True)
        >>> [m for _, m, _ in claim_problems([("a", [Claim("directory",
        ...     "/var/lib/vllm-fleet/models", "the verified model store", ()), home])], set())]
        ['directory /var/lib/vllm-fleet/models on a is claimed twice: by the verified model store (vllm-fleet itself) and by server a/x']
    """  # noqa: E501
    shared: list[tuple[str, Claim]] = []
    said: set[tuple[Loc, object]] = set()  # a group's field, found on each member: once

    def once(findings: Iterable[tuple[Finding, object]]) -> Iterator[Finding]:
        for finding, first in findings:
            if (finding[0], first) not in said:
                said.add((finding[0], first))
                yield finding

    for host_name, found in claims:
        pairs = _Pairs()
        yield from once((finding, finding[2]) for finding in chain(
            _named_twice(host_name, found, pairs), _inside(host_name, found, pairs),
            _privileged(host_name, found), _sockets(host_name, found)))
        yield from _gpus(host_name, found)
        held = [(host_name, c) for c in found if c.kind == "port"]
        if host_name in sandbox:
            shared += held
        else:
            yield from once(_ports(host_name, held))
    yield from once(_ports("sandbox", shared))
