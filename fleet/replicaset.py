"""Replicas by count: the planner places an endpoint's ``count`` copies of one server.

An endpoint may list its replicas (``HOST/SERVER``) or give a count and the server each replica
runs; :func:`expand` turns the count into servers of the fleet before anything else reads it,
so ``fleet check``, ``fleet plan``, the render, the deploy, drift and verify see ordinary
servers named ``ENDPOINT-1``, ``ENDPOINT-2``, … How they are placed:

- **spread first**: each replica goes to the candidate host (``hosts``, else every host of the
  fleet, in file order) holding the fewest replicas of the endpoint so far: one replica per
  host before any host gets a second, so losing a host loses as few as possible;
- **fit**: on a GPU host, :func:`fleet.placement.place_fleet` chooses its GPUs as it does for
  any server without ``gpus`` (never overcommitting, servers the file places count first); a
  host where it does not fit is skipped, saying why;
- a ``cpu`` host takes one replica (two CPU vLLMs on one host share its cores);
- each replica listens on ``port``, or the next port up that its host does not use (a second
  replica on one host; sandbox hosts, which share this machine's network).

The placement depends only on the fleet file, so a second deploy places them the same way.
Each replica's problems are reported at the ``server`` it was made from.

Example:
    >>> from fleet.load import load_text
    >>> fleet = load_text(open("tests/data/valid/endpoint-replica-count.yaml").read())
    >>> fleet.endpoints["chat"].replicas
    ['gpu-a/chat-1', 'gpu-b/chat-2']
    >>> fleet.hosts["gpu-b"].servers["chat-2"].gpus
    [0]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.placement import place_fleet
from fleet.problems import Finding, Loc, suggest
from fleet.spec import Fleet, ReplicaSet, Server, Variant

#: The longest server name (the fleet file's name pattern).
MAX_NAME = 63


@dataclass
class Expanded:
    """What :func:`expand` made: the fleet with the replicas as servers (why each went where it
    did is on its endpoint's ``placed``), where each came from (generated path → the path
    written in the file, for located errors), and what could not be placed."""

    fleet: Fleet
    origin: dict[Loc, Loc] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def replica_name(endpoint: str, index: int) -> str:
    """The server name of an endpoint's replica (1-based).

    Example:
        >>> replica_name("chat", 2)
        'chat-2'
    """
    return f"{endpoint}-{index}"


def free_port(fleet: Fleet, host: str, start: int) -> int | None:
    """The first port from ``start`` up that no server of ``host`` uses (of any sandbox host,
    for a sandbox host: they share this machine's network), nor a router there.

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
        >>> free_port(fleet, "gpu-a", 8000), free_port(fleet, "gpu-a", 9000)
        (8002, 9000)
    """
    sandbox = fleet.hosts[host].is_sandbox
    scope = [h for h, spec in fleet.hosts.items() if h == host or (sandbox and spec.is_sandbox)]
    used = {s.port for h in scope for s in fleet.hosts[h].servers.values()}
    used |= {p for e in fleet.endpoints.values() if e.router.host in scope
             for p in (e.router.port, e.router.metrics_port) if p}  # fmt: skip
    return next((p for p in range(start, 65536) if p not in used), None)


def _with_server(fleet: Fleet, host: str, name: str, server: Server) -> Fleet:
    """A copy of ``fleet`` with ``server`` added to ``host``'s servers (the input untouched)."""
    hosts = dict(fleet.hosts)
    hosts[host] = hosts[host].model_copy(update={"servers": {**hosts[host].servers, name: server}})
    return fleet.model_copy(update={"hosts": hosts})


def _try(fleet: Fleet, host: str, name: str, server: Server) -> tuple[Server | None, str]:
    """``server`` placed on ``host`` (its GPUs chosen), or None and why not."""
    if fleet.hosts[host].vllm.variant == Variant.cpu:
        return server, "a cpu host, no replica of the endpoint on it yet"
    placement = place_fleet(_with_server(fleet, host, name, server))
    for choice in placement.choices:
        if (choice.host, choice.server) == (host, name):
            return server.model_copy(update={"gpus": list(choice.gpus)}), choice.reason
    for refusal in placement.refused:
        if (refusal.host, refusal.server) == (host, name):
            return None, refusal.message
    return None, "the planner did not place it"


def _candidates(fleet: Fleet, rs: ReplicaSet) -> list[str]:
    return [h for h in (rs.hosts or list(fleet.hosts)) if h in fleet.hosts]


def _place_set(out: Expanded, name: str, rs: ReplicaSet) -> None:
    base: Loc = ("endpoints", name, "replicas")
    missing = [h for h in rs.hosts if h not in out.fleet.hosts]
    for index, host in enumerate(rs.hosts):
        if host in missing:
            out.findings.append(((*base, "hosts", index), f"no host {host!r} in the fleet",
                                 suggest(host, list(out.fleet.hosts))
                                 or "name hosts of the hosts: section"))  # fmt: skip
    if missing:
        return
    if len(replica_name(name, rs.count)) > MAX_NAME:
        out.findings.append(((*base, "count"), f"the replicas' names ({replica_name(name, 1)} "
                             f"…) would be longer than {MAX_NAME} characters",
                             "give the endpoint a shorter name"))  # fmt: skip
        return
    on_host: dict[str, int] = {}
    refs: list[str] = []
    reasons: dict[str, list[str]] = {}
    why_not: dict[str, str] = {}
    for index in range(1, rs.count + 1):
        server_name = replica_name(name, index)
        clash = [h for h in out.fleet.hosts if server_name in out.fleet.hosts[h].servers]
        if clash:
            out.findings.append(((*base, "count"), f"host {clash[0]!r} already has a "
                                 f"server named {server_name!r}, the name of replica {index}",
                                 "rename that server: ENDPOINT-N names the endpoint's "
                                 "replicas"))  # fmt: skip
            return
        order = sorted(_candidates(out.fleet, rs), key=lambda h: on_host.get(h, 0))
        for host in order:
            already = on_host.get(host, 0)
            if already and out.fleet.hosts[host].vllm.variant == Variant.cpu:
                why_not[host] = "a cpu host takes one replica (its cores are shared)"
                continue
            port = free_port(out.fleet, host, rs.server.port)
            if port is None:
                why_not[host] = f"no free port from {rs.server.port} up"
                continue
            placed, reason = _try(out.fleet, host, server_name,
                                  rs.server.model_copy(update={"port": port}))  # fmt: skip
            if placed is None:
                why_not[host] = reason
                continue
            out.fleet = _with_server(out.fleet, host, server_name, placed)
            on_host[host] = already + 1
            refs.append(f"{host}/{server_name}")
            server_path: Loc = ("hosts", host, "servers", server_name)
            out.origin[server_path] = (*base, "server")
            reasons[f"{host}/{server_name}"] = [reason] + (
                [f"port {port}: {rs.server.port} is taken there"] if port != rs.server.port else []
            )  # fmt: skip
            break
        else:
            not_fit = "; ".join(f"{h}: {w}" for h, w in why_not.items())
            out.findings.append(((*base, "count"), f"{index - 1} of {rs.count} replicas fit "
                                 f"({not_fit})", "lower count, name more hosts (replicas.hosts"
                                 "), or free GPUs on them"))  # fmt: skip
            return
    for index in range(len(refs)):
        out.origin[(*base, index)] = (*base, "count")
    endpoints = dict(out.fleet.endpoints)
    endpoints[name] = endpoints[name].model_copy(update={"replicas": refs})
    endpoints[name]._placed = reasons
    out.fleet = out.fleet.model_copy(update={"endpoints": endpoints})


def expand(fleet: Fleet) -> Expanded:
    """``fleet`` with every endpoint's replica count placed as servers (see the module).

    Example:
        >>> from fleet.load import load_text
        >>> text = open("tests/data/valid/endpoint-replica-count.yaml").read()
        >>> out = expand(load_text(text))   # an expanded fleet expands to itself
        >>> out.findings, out.fleet.endpoints["chat"].replicas
        ([], ['gpu-a/chat-1', 'gpu-b/chat-2'])
    """
    out = Expanded(fleet)
    for name, endpoint in fleet.endpoints.items():
        if isinstance(endpoint.replicas, ReplicaSet):
            _place_set(out, name, endpoint.replicas)
    return out

