"""The rules ``fleet check`` holds the fleet's endpoints to (replicas behind a vllm-router).

Replicas exist, belong to one endpoint, serve one model under one name, are reachable by the
router, share the router's key (vllm-router passes the client's key on, each replica checks
it); a canary needs a second replica. Each replica's address is :mod:`fleet.planner.endpoints`'.

Example:
    >>> from fleet.load import load_fleet
    >>> list(check_endpoints(load_fleet("tests/data/valid/endpoint-two-replicas.yaml")))
    []
"""

from __future__ import annotations

from collections.abc import Iterator

from fleet.planner.endpoints import replica_parts, replica_server
from fleet.planner.numa import THREADS_BIND
from fleet.read.problems import Finding, suggest
from fleet.spec.addresses import is_any, is_loopback
from fleet.spec.models import Endpoint, Fleet, Server, Variant
from fleet.spec.wording import listing


def check_endpoints(fleet: Fleet) -> Iterator[Finding]:
    """Every cross-field problem of the fleet's endpoints, in file order.

    Replicas exist, belong to one endpoint, serve one model under one name, are reachable by
    the router (a replica bound to loopback on another host is not), share the router's key;
    the router's host exists (that its ports are free there is :mod:`fleet.checks.ledger`'s).
    """
    owner: dict[str, str] = {}
    for name, endpoint in fleet.endpoints.items():
        yield from _check_endpoint(fleet, name, endpoint, owner)
        yield from _check_canary(name, endpoint)


def _check_endpoint(
    fleet: Fleet, name: str, endpoint: Endpoint, owner: dict[str, str]
) -> Iterator[Finding]:
    base = ("endpoints", name)
    router = endpoint.router
    if router.host not in fleet.hosts:
        yield (
            (*base, "router", "host"),
            f"no host {router.host!r} in the fleet",
            suggest(router.host, list(fleet.hosts)) or "name one of the hosts: section",
        )
    first: tuple[str, Server] | None = None
    for index, ref in enumerate(endpoint.replicas):
        path = (*base, "replicas", index)
        host_name, server_name = replica_parts(ref)
        if host_name not in fleet.hosts:
            yield (
                path,
                f"no host {host_name!r} in the fleet",
                suggest(host_name, list(fleet.hosts)) or "write HOST/SERVER",
            )
            continue
        server = replica_server(fleet, ref)
        if server is None:
            servers = list(fleet.hosts[host_name].servers)
            yield (
                path,
                f"host {host_name!r} has no server {server_name!r}",
                suggest(server_name, servers) or f"its servers: {listing(servers) or 'none'}",
            )
            continue
        if ref in owner:
            yield (
                path,
                f"{ref} is already a replica of endpoint {owner[ref]!r}",
                "a server belongs to one endpoint: list it once",
            )
            continue
        owner[ref] = name
        if server.worker_hosts:
            yield (
                path,
                f"{ref} spans hosts (worker_hosts): this version does not put such a "
                "server behind a router",
                "serve it on one host to make it a replica",
            )
        if first is None:
            first = (ref, server)
        else:
            first_ref, first_server = first
            if server.model != first_server.model:
                yield (
                    path,
                    f"{ref} serves model {server.model!r}, but {first_ref} serves "
                    f"{first_server.model!r}",
                    "the replicas of an endpoint serve one model: give them the same model",
                )
            elif server.served_name != first_server.served_name:
                yield (
                    path,
                    f"{ref} is served as {server.served_name!r}, but {first_ref} as "
                    f"{first_server.served_name!r}",
                    "clients ask the router for one name: give every replica the same "
                    "served_model_name",
                )
        if server.tls is not None:
            host_name, server_name = replica_parts(ref)
            placed = ref in endpoint.placed
            yield (
                (*path[:3], "server", "tls") if placed else
                ("hosts", host_name, "servers", server_name, "tls"),
                f"{ref} is a replica of endpoint {name} and serves TLS: its router (vllm-router) "
                "and the rollout's canary, on the router's host, have no way yet to trust its "
                "certificate",
                "leave tls out on the replicas (the router is the endpoint's front door), or "
                "serve this server on its own, outside the endpoint",
            )
        if router.host in fleet.hosts:
            yield from _check_reachable(fleet, path, router.host, ref, server)
        if first is not None and first[0] != ref and server.api_key != first[1].api_key:
            yield (
                path,
                f"{ref} does not have the api_key of {first[0]}",
                "each replica checks the client's key: give every replica the same "
                "api_key reference",
            )
    if first is not None and first[1].api_key != router.api_key:
        where = (*base, "router", "api_key") if router.api_key else (*base, "router")
        yield (
            where,
            f"the replicas {'check an api_key' if first[1].api_key else 'have no api_key'}"
            f", the router {'names another' if router.api_key and first[1].api_key else 'names one' if router.api_key else 'names none'}",  # noqa: E501
            "vllm-router passes the client's key on and the replicas check it: set "
            "router.api_key to the replicas' api_key reference (for fleet complete, "
            "fleet bench and the deploy's checks through the router)",
        )


def _check_reachable(
    fleet: Fleet, path: tuple[str | int, ...], router_host: str, ref: str, server: Server
) -> Iterator[Finding]:
    host_name, server_name = replica_parts(ref)
    host = fleet.hosts[host_name]
    shared = host_name == router_host or (host.is_sandbox and fleet.hosts[router_host].is_sandbox)
    if shared:
        return
    if is_loopback(server.host):
        placed = (*path[:3], "server") if ref in fleet.endpoints[str(path[1])].placed else None
        where = ".".join(map(str, placed)) if placed else f"hosts.{host_name}.servers.{server_name}"
        yield (
            placed or path,
            f"{ref} listens on {server.host} only, and the router runs on "
            f"{router_host}: it cannot reach that loopback address",
            f"set host: 0.0.0.0 (or the address of {host_name}) on {where}",
        )
    elif is_any(server.host) and is_loopback(host.address) and not (
        fleet.hosts[router_host].is_sandbox or is_loopback(fleet.hosts[router_host].address)
    ):  # a sandbox or loopback router host is on the control machine's network: it reaches it
        yield (
            ("hosts", host_name, "address"),
            f"the router on {router_host} would reach {ref} at {host.address}, a loopback "
            f"address: its own machine, not {host_name}",
            f"give {host_name} the address the other hosts reach it at (hosts.{host_name}."
            f"address), or run the router on {host_name}",
        )


def _check_canary(name: str, endpoint: Endpoint) -> Iterator[Finding]:
    """A canary compares the first upgraded replica with one still on the old configuration:
    it needs a second replica, and only one replica out at a time."""
    canary = endpoint.rollout.canary
    if canary is None:
        return
    base = ("endpoints", name, "rollout")
    if len(endpoint.replicas) < 2:
        yield (
            (*base, "canary"),
            f"a canary compares the first upgraded replica with one still on the old "
            f"configuration, and endpoint {name!r} has {len(endpoint.replicas)} replica",
            "add a second replica to replicas:, or remove rollout.canary",
        )
    elif endpoint.rollout.max_unavailable != 1:
        yield (
            (*base, "max_unavailable"),
            f"with a canary the first replica is upgraded alone and measured before any other "
            f"goes out, but max_unavailable is {endpoint.rollout.max_unavailable}",
            "write max_unavailable: 1 (or remove rollout.canary)",
        )


def endpoint_warnings(fleet: Fleet) -> Iterator[Finding]:
    """Replicas on sandbox hosts that leave the CPU build's thread binding at ``auto``.

    Sandbox hosts share this machine's cores: each CPU vLLM left at ``auto`` binds its threads
    to the same cores as the others, so a replica restarting during a rollout starves beside
    one serving the load (measured: a start past 15 minutes on two cores).
    """
    for name, endpoint in fleet.endpoints.items():
        auto = []
        for index, ref in enumerate(endpoint.replicas):
            host_name, _ = replica_parts(ref)
            host = fleet.hosts.get(host_name)
            server = replica_server(fleet, ref)
            if host is None or server is None or not host.is_sandbox:
                continue
            if host.vllm.variant is Variant.cpu and server.env.get(THREADS_BIND, "auto") == "auto":
                auto.append((index, ref))
        if len(auto) > 1:
            index, ref = auto[1]
            yield (
                ("endpoints", name, "replicas", index),
                f"replicas {listing(r for _, r in auto)} run on sandbox hosts, which share "
                f"this machine's cores, and bind their threads with {THREADS_BIND}=auto: to the "
                "same cores",
                f"give each replica a core of its own (env: {{{THREADS_BIND}: \"0\"}} on one, "
                '"1" on the next)',
            )
