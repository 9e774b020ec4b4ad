"""Replicas by count: the planner places an endpoint's ``count`` copies of one server.

An endpoint may list its replicas (``HOST/SERVER``) or give a count and the server each replica
runs; :func:`expand` turns the count into servers of the fleet before anything else reads it,
so ``fleet check``, ``fleet plan``, the render, the deploy, drift and verify see ordinary
servers named ``ENDPOINT-1``, ``ENDPOINT-2``, … How they are placed:

- **spread first**: each replica goes to the candidate host (``hosts``, else every host of the
  fleet, in file order) holding the fewest replicas of the endpoint so far: one replica per
  host before any host gets a second, so losing a host loses as few as possible;
- **fit**: on a GPU host, :func:`fleet.planner.placement.place_fleet` chooses its GPUs as it does
for
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

from fleet.planner.fit import plan_server
from fleet.planner.placement import place_fleet
from fleet.read.problems import Finding, Loc, suggest
from fleet.spec.models import Fleet, ReplicaSet, Server, Variant
from fleet.spec.wording import listing

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
    scope = [host]
    if fleet.hosts[host].is_sandbox:
        scope = [h for h, spec in fleet.hosts.items() if h == host or spec.is_sandbox]
    used = {s.port for h in scope for s in fleet.hosts[h].servers.values()}
    used |= {p for e in fleet.endpoints.values() if e.router.host in scope
             for p in (e.router.port, e.router.metrics_port) if p}  # fmt: skip
    return next((p for p in range(start, 65536) if p not in used), None)


def _with_server(fleet: Fleet, host: str, name: str, server: Server) -> Fleet:
    """A copy of ``fleet`` with ``server`` added to ``host``'s servers (the input untouched)."""
    hosts = dict(fleet.hosts)
    hosts[host] = hosts[host].model_copy(update={"servers": {**hosts[host].servers, name: server}})
    return fleet.model_copy(update={"hosts": hosts})


def linked_hosts(fleet: Fleet) -> dict[str, list[str]]:
    """Per host that a group spans (a server with ``worker_hosts``), every host whose GPUs
    placement weighs together with its own (the group's members, and theirs), in file order;
    every other host places on its own.

    Example:
        >>> from fleet.load import load_fleet
        >>> linked_hosts(load_fleet("inventory/examples/h200-pair.yaml"))["hgx-h200-02"]
        ['hgx-h200-01', 'hgx-h200-02']
    """
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.get(name, name) != name:
            name = parent[name]
        return name

    for head, host in fleet.hosts.items():
        for server in host.servers.values():
            for worker in server.worker_hosts:
                a, b = root(head), root(worker)
                if a != b:
                    parent[b] = a
    members: dict[str, list[str]] = {}
    touched = set(parent) | set(parent.values())
    for name in fleet.hosts:
        if name in touched:
            members.setdefault(root(name), []).append(name)
    return {name: members[root(name)] for name in touched if name in fleet.hosts}


def _local(fleet: Fleet, host: str, linked: dict[str, list[str]]) -> Fleet:
    """The part of ``fleet`` that placement on ``host`` depends on: that host, and the hosts
    its groups link it to (GPU rooms are per host; only a group spans hosts)."""
    names = linked.get(host, [host])
    return fleet.model_copy(update={"hosts": {n: fleet.hosts[n] for n in names}})


def _try(fleet: Fleet, host: str, name: str, server: Server,
         linked: dict[str, list[str]]) -> tuple[Server | None, str]:
    """``server`` placed on ``host`` (its GPUs chosen) and planned there, or None and why not:
    no GPU has room, or the server's memory plan does not fit on that host's GPUs."""
    if fleet.hosts[host].vllm.variant == Variant.cpu:
        return server, "a cpu host, no replica of the endpoint on it yet"
    placement = place_fleet(_with_server(_local(fleet, host, linked), host, name, server))
    for choice in placement.choices:
        if (choice.host, choice.server) == (host, name):
            placed = server.model_copy(update={"gpus": list(choice.gpus)})
            plan = plan_server(fleet, host, name, placed)
            if plan.fits is False:
                return None, f"does not fit its GPUs: {plan.reason}"
            return placed, choice.reason
    for refusal in placement.refused:
        if (refusal.host, refusal.server) == (host, name):
            return None, refusal.message
    return None, "the planner did not place it"


def _gpu(fleet: Fleet, host: str) -> bool:
    return fleet.hosts[host].vllm.variant is not Variant.cpu


def _listed_findings(fleet: Fleet, base: Loc, rs: ReplicaSet) -> list[Finding]:
    """What is wrong with ``replicas.hosts`` as written: empty, a host named twice or not in
    the fleet, or hosts of both a GPU build and the cpu build."""
    if "hosts" in rs.model_fields_set and not rs.hosts:
        return [((*base, "hosts"), "hosts: [] names no host for the replicas",
                 "leave hosts out to place them on every host that can run the server, or "
                 "name the hosts: hosts: [gpu-a, gpu-b]")]
    findings: list[Finding] = []
    first: dict[str, int] = {}
    for index, host in enumerate(rs.hosts):
        if host in first:
            findings.append(((*base, "hosts", index), f"{host!r} is listed twice (also at "
                             f"hosts.{first[host]})", "list each host once: replicas spread "
                             "over the hosts listed, and a host with room takes a second one "
                             "when count is larger than the hosts"))  # fmt: skip
            continue
        first[host] = index
        if host not in fleet.hosts:
            findings.append(((*base, "hosts", index), f"no host {host!r} in the fleet",
                             suggest(host, fleet.hosts) or "name hosts of the hosts: section"))
    if findings:
        return findings
    builds = {_gpu(fleet, h) for h in rs.hosts}
    if len(builds) > 1:
        head = rs.hosts[0]
        index, odd = next((i, h) for i, h in enumerate(rs.hosts) if _gpu(fleet, h) !=
                          _gpu(fleet, head))  # fmt: skip
        kind = {True: "a GPU build", False: "the cpu build"}
        findings.append(((*base, "hosts", index), f"{odd} runs {kind[_gpu(fleet, odd)]} of vLLM "
                         f"({fleet.hosts[odd].vllm.variant.value}), {head} "
                         f"{kind[_gpu(fleet, head)]} ({fleet.hosts[head].vllm.variant.value}): "
                         "the replicas behind one router run one kind of build",
                         "list hosts of one kind (all GPU hosts, or all cpu hosts)"))
    return findings


def _candidates(fleet: Fleet, rs: ReplicaSet) -> tuple[list[str], dict[str, str]]:
    """The hosts that may take replicas, in file order, and why each other host may not: the
    hosts listed; else every GPU host of the fleet (a fleet with none: every cpu host), so
    that one router never mixes GPU replicas with one on a CPU machine."""
    if rs.hosts:
        return list(rs.hosts), {}
    gpu = [h for h in fleet.hosts if _gpu(fleet, h)]
    if not gpu:
        return list(fleet.hosts), {}
    skipped = {h: "a cpu host: the replicas run on the fleet's GPU hosts (name it in "
               "replicas.hosts, with other cpu hosts only, to run them there)"
               for h in fleet.hosts if not _gpu(fleet, h)}  # fmt: skip
    return gpu, skipped


def why_not_text(why_not: dict[str, str]) -> str:
    """Why hosts took no replica, for one message: hosts with the same reason together, a few
    hosts and reasons named and the rest counted (:func:`fleet.spec.wording.listing`), so that a
    fleet of thousands of hosts still gets one short line.

    Example:
        >>> why_not_text({f"gpu-{i}": "no GPU has room" for i in range(1, 41)} | {"mon": "cpu"})
        'gpu-1, gpu-2, gpu-3, gpu-4, gpu-5 … and 35 more: no GPU has room; mon: cpu'
    """
    hosts: dict[str, list[str]] = {}
    for host, reason in why_not.items():
        hosts.setdefault(reason, []).append(host)
    return listing([f"{listing(names)}: {reason}" for reason, names in hosts.items()], sep="; ")


def _place_set(out: Expanded, name: str, rs: ReplicaSet,
               linked: dict[str, list[str]], names: set[str]) -> None:
    base: Loc = ("endpoints", name, "replicas")
    listed = _listed_findings(out.fleet, base, rs)
    if listed:
        out.findings.extend(listed)
        return
    if len(replica_name(name, rs.count)) > MAX_NAME:
        out.findings.append(((*base, "count"), f"the replicas' names ({replica_name(name, 1)} "
                             f"…) would be longer than {MAX_NAME} characters",
                             "give the endpoint a shorter name"))  # fmt: skip
        return
    for index in range(1, rs.count + 1):
        server_name = replica_name(name, index)
        if server_name in names:
            clash = next(h for h in out.fleet.hosts if server_name in out.fleet.hosts[h].servers)
            out.findings.append(((*base, "count"), f"host {clash!r} already has a "
                                 f"server named {server_name!r}, the name of replica {index}",
                                 "rename that server: ENDPOINT-N names the endpoint's "
                                 "replicas"))  # fmt: skip
            return
    candidates, why_not = _candidates(out.fleet, rs)
    on_host: dict[str, int] = {}
    refs: list[str] = []
    reasons: dict[str, list[str]] = {}
    #: Hosts that could not take a replica: no later replica fits there either (a replica
    #: only ever adds to what a host holds).
    full: set[str] = set()
    for index in range(1, rs.count + 1):
        server_name = replica_name(name, index)
        order = sorted((h for h in candidates if h not in full), key=lambda h: on_host.get(h, 0))
        for host in order:
            already = on_host.get(host, 0)
            if already and not _gpu(out.fleet, host):
                why_not[host] = "a cpu host takes one replica (its cores are shared)"
                full.add(host)
                continue
            port = free_port(out.fleet, host, rs.server.port)
            if port is None:
                why_not[host] = f"no free port from {rs.server.port} up"
                full.add(host)
                continue
            placed, reason = _try(out.fleet, host, server_name,
                                  rs.server.model_copy(update={"port": port}), linked)
            if placed is None:
                why_not[host] = reason
                full.add(host)
                continue
            out.fleet = _with_server(out.fleet, host, server_name, placed)
            names.add(server_name)
            on_host[host] = already + 1
            refs.append(f"{host}/{server_name}")
            server_path: Loc = ("hosts", host, "servers", server_name)
            out.origin[server_path] = (*base, "server")
            reasons[f"{host}/{server_name}"] = [reason] + (
                [f"port {port}: {rs.server.port} is taken there"] if port != rs.server.port else []
            )  # fmt: skip
            break
        else:
            not_fit = why_not_text(why_not)
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
    sets = {n: e.replicas for n, e in fleet.endpoints.items() if isinstance(e.replicas, ReplicaSet)}
    if not sets:
        return out
    linked = linked_hosts(fleet)
    names = {server for host in fleet.hosts.values() for server in host.servers}
    for name, replicas in sets.items():
        _place_set(out, name, replicas, linked, names)
    return out

