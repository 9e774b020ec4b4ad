"""Endpoints (replicas of one model behind a vllm-router): each replica, and the address its
router and the endpoint's clients reach it at.

An endpoint names its replicas (servers of the fleet, ``HOST/SERVER``), its router (a
vllm-router service on one host) and its rollout policy. The rules ``fleet check`` holds it to
are :mod:`fleet.checks.endpoints`'; the router's unit and each replica's rollout
:mod:`fleet.hostplan.endpoints`'.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
    >>> worker_url(fleet, "gpu-a", "gpu-b/chat-b")
    'http://10.0.0.12:8001'
"""

from __future__ import annotations

from fleet.planner.reach import Reach, server_reach
from fleet.spec.addresses import is_any, is_loopback, local_address
from fleet.spec.models import Endpoint, Fleet, Server


def replica_parts(ref: str) -> tuple[str, str]:
    """``"gpu-01/chat"`` → ``("gpu-01", "chat")``.

    Example:
        >>> replica_parts("gpu-01/chat")
        ('gpu-01', 'chat')
    """
    host, server = ref.split("/", 1)
    return host, server


def local_url(bind: str, port: int) -> str:
    """A plain-HTTP service's address as seen on its own host (a router): loopback of its
    family when it binds every interface (:class:`fleet.planner.reach.Reach`).

    Example:
        >>> local_url("0.0.0.0", 18400), local_url("10.0.0.5", 80), local_url("::", 80)
        ('http://127.0.0.1:18400', 'http://10.0.0.5:80', 'http://[::1]:80')
    """
    return Reach("http", local_address(bind), port).url


def worker_url(fleet: Fleet, router_host: str, ref: str) -> str:
    """A replica's address as its router reaches it.

    On the router's own host (or between sandbox hosts, which share this machine's network) a
    replica is reached as its own probes reach it (:func:`fleet.planner.reach.server_reach`); on
    another host, at the host's address (every interface) or the address it binds; in both, with
    the scheme it speaks.

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
        >>> worker_url(fleet, "gpu-a", "gpu-a/chat-a")
        'http://127.0.0.1:8001'
    """
    host_name, server_name = replica_parts(ref)
    host = fleet.hosts[host_name]
    server = host.servers[server_name]
    shared = host_name == router_host or (host.is_sandbox and fleet.hosts[router_host].is_sandbox)
    reach = server_reach(server)
    if shared:
        return reach.url
    return reach.at(host.address if is_any(server.host) else server.host).url


def replica_server(fleet: Fleet, ref: str) -> Server | None:
    """The server a replica reference (``HOST/SERVER``) names; None when the fleet has no
    such host or server (``fleet check`` says which).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
        >>> replica_server(fleet, "gpu-b/chat-b").port, replica_server(fleet, "gpu-b/x")
        (8001, None)
    """
    host_name, server_name = replica_parts(ref)
    host = fleet.hosts.get(host_name)
    return host.servers.get(server_name) if host else None


def served_name(fleet: Fleet, endpoint: Endpoint) -> str:
    """The name clients ask the endpoint for (its first replica's)."""
    server = replica_server(fleet, endpoint.replicas[0])
    assert server is not None  # checked by check_endpoints
    return server.served_name


def client_url(fleet: Fleet, name: str) -> tuple[str, str, int]:
    """Where a client reaches an endpoint's router: (router host, address, port); the address
    is loopback on the router host when it binds loopback (``fleet`` tunnels to it then).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
        >>> client_url(fleet, "chat")
        ('gpu-a', '10.0.0.11', 8000)
    """
    router = fleet.endpoints[name].router
    host = fleet.hosts[router.host]
    if host.is_sandbox or is_loopback(router.bind):
        return router.host, local_address(router.bind), router.port
    return router.host, host.address if is_any(router.bind) else router.bind, router.port
