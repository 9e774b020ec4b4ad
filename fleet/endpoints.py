"""Endpoints: replicas of one model behind a vllm-router — their rules and what hosts get.

An endpoint names its replicas (servers of the fleet, ``HOST/SERVER``), its router (a
vllm-router service on one host) and its rollout policy. This module decides everything about
them, without touching a host: the cross-field rules ``fleet check`` reports
(:func:`endpoint_problems`), the address each replica has as the router reaches it, the
router's unit (:func:`router_units`) and the rollout a deploy applies to each replica
(:func:`replica_rollout`).

vllm-router 0.1.17 does not check a client's key itself: it passes the ``Authorization`` header
on, and each replica (vLLM's ``--api-key``) checks it. So the endpoint's key is its replicas'
key, and the router never gets it (nothing secret in its unit or command line).

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
    >>> [r.endpoint for r in router_units(fleet, "gpu-a", secrets=lambda ref: "k")]
    ['chat']
    >>> replica_rollout(fleet, "gpu-b", "chat-b").worker_url
    'http://10.0.0.12:8001'
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator

from fleet.hostplan import ReplicaCanary, ReplicaRollout, RouterUnit
from fleet.numa import THREADS_BIND
from fleet.paths import ROUTER_VENV_DIR, router_env_path, router_unit_name, router_unit_path
from fleet.problems import Finding, suggest
from fleet.quoting import systemd_quote
from fleet.secrets import read_secret
from fleet.spec import Endpoint, Fleet, SecretRef, Server, Variant
from fleet.templating import template
from hostside import envfile

#: Seconds the router waits for a worker to be healthy when it is added back (the rollout adds
#: a replica only once it answered a completion, so this is a bound, not a wait).
WORKER_STARTUP_TIMEOUT = 120
#: Addresses that only the host itself reaches.
LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: Addresses that mean "every interface".
ANY = ("0.0.0.0", "::")


def replica_parts(ref: str) -> tuple[str, str]:
    """``"gpu-01/chat"`` → ``("gpu-01", "chat")``.

    Example:
        >>> replica_parts("gpu-01/chat")
        ('gpu-01', 'chat')
    """
    host, server = ref.split("/", 1)
    return host, server


def _url(address: str, port: int) -> str:
    """``http://ADDRESS:PORT``, with IPv6 addresses in brackets.

    Example:
        >>> _url("::1", 80), _url("10.0.0.1", 80)
        ('http://[::1]:80', 'http://10.0.0.1:80')
    """
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass
    return f"http://{address}:{port}"


def local_url(bind: str, port: int) -> str:
    """A service's address as seen on its own host: loopback when it binds every interface.

    Example:
        >>> local_url("0.0.0.0", 18400), local_url("10.0.0.5", 80)
        ('http://127.0.0.1:18400', 'http://10.0.0.5:80')
    """
    return _url("127.0.0.1" if bind in ANY else bind, port)


def worker_url(fleet: Fleet, router_host: str, ref: str) -> str:
    """A replica's address as its router reaches it.

    On the router's own host (or between sandbox hosts, which share this machine's network) a
    replica bound to loopback or every interface is reached on loopback; on another host, at
    the host's address (every interface) or the address it binds.

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
    if shared:
        return local_url(server.host, server.port)
    return _url(host.address if server.host in ANY else server.host, server.port)


def _replica(fleet: Fleet, ref: str) -> Server | None:
    host_name, server_name = replica_parts(ref)
    host = fleet.hosts.get(host_name)
    return host.servers.get(server_name) if host else None


def endpoint_problems(fleet: Fleet) -> Iterator[Finding]:
    """Every cross-field problem of the fleet's endpoints, in file order.

    Replicas exist, belong to one endpoint, serve one model under one name, are reachable by
    the router (a replica bound to loopback on another host is not), share the router's key;
    the router's host exists and its ports are free there.
    """
    owner: dict[str, str] = {}
    for name, endpoint in fleet.endpoints.items():
        yield from _check_endpoint(fleet, name, endpoint, owner)
        yield from _check_canary(name, endpoint)
    yield from _check_router_ports(fleet)


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
        server = _replica(fleet, ref)
        if server is None:
            servers = list(fleet.hosts[host_name].servers)
            yield (
                path,
                f"host {host_name!r} has no server {server_name!r}",
                suggest(server_name, servers) or f"its servers: {', '.join(servers) or 'none'}",
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
    if not shared and server.host in LOOPBACK:
        placed = (*path[:3], "server") if ref in fleet.endpoints[str(path[1])].placed else None
        where = ".".join(map(str, placed)) if placed else f"hosts.{host_name}.servers.{server_name}"
        yield (
            placed or path,
            f"{ref} listens on {server.host} only, and the router runs on {router_host}: it "
            "cannot reach it",
            f"set host: 0.0.0.0 (or the address of {host_name}) on {where}",
        )


def _check_router_ports(fleet: Fleet) -> Iterator[Finding]:
    """A router's ports are free on its host (sandbox hosts share this machine's network)."""
    used: dict[tuple[str, int], str] = {}
    for host_name, host in fleet.hosts.items():
        scope = "sandbox" if host.is_sandbox else host_name
        for server_name, server in host.servers.items():
            used.setdefault((scope, server.port), f"server {host_name}/{server_name}")
    for name, endpoint in fleet.endpoints.items():
        router = endpoint.router
        host = fleet.hosts.get(router.host)
        if host is None:
            continue
        scope = "sandbox" if host.is_sandbox else router.host
        for field, port in (("port", router.port), ("metrics_port", router.metrics_port)):
            key = (scope, port)
            if key in used:
                yield (
                    ("endpoints", name, "router", field),
                    f"port {port} is already used by {used[key]} on {router.host}",
                    "give the router a port of its own on its host",
                )
            else:
                used[key] = f"the router of endpoint {name}"


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
            server = _replica(fleet, ref)
            if host is None or server is None or not host.is_sandbox:
                continue
            if host.vllm.variant is Variant.cpu and server.env.get(THREADS_BIND, "auto") == "auto":
                auto.append((index, ref))
        if len(auto) > 1:
            index, ref = auto[1]
            yield (
                ("endpoints", name, "replicas", index),
                f"replicas {', '.join(r for _, r in auto)} run on sandbox hosts, which share "
                f"this machine's cores, and bind their threads with {THREADS_BIND}=auto: to the "
                "same cores",
                f"give each replica a core of its own (env: {{{THREADS_BIND}: \"0\"}} on one, "
                '"1" on the next)',
            )


def router_command(fleet: Fleet, name: str) -> list[str]:
    """The router's command line (no secret in it: the replicas check the clients' key).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
        >>> " ".join(router_command(fleet, "chat")[1:9])
        '--host 0.0.0.0 --port 8000 --worker-urls http://127.0.0.1:8001 http://10.0.0.12:8001 --policy'
    """  # noqa: E501
    endpoint = fleet.endpoints[name]
    router = endpoint.router
    workers = [worker_url(fleet, router.host, ref) for ref in endpoint.replicas]
    return [
        f"{ROUTER_VENV_DIR}/bin/vllm-router",
        "--host", router.bind,
        "--port", str(router.port),
        "--worker-urls", *workers,
        "--policy", router.policy.value,
        "--prometheus-host", router.bind,
        "--prometheus-port", str(router.metrics_port),
        "--request-timeout-secs", str(router.request_timeout_s),
        "--health-check-interval-secs", str(router.health_check_interval_s),
        # A worker added back (``/add_worker``) is checked every second, not every 30 s (the
        # release's default), and given up after a bound instead of 600 s.
        "--worker-startup-check-interval", "1",
        "--worker-startup-timeout-secs", str(WORKER_STARTUP_TIMEOUT),
        "--log-level", "info",
    ]  # fmt: skip


def served_name(fleet: Fleet, endpoint: Endpoint) -> str:
    """The name clients ask the endpoint for (its first replica's)."""
    server = _replica(fleet, endpoint.replicas[0])
    assert server is not None  # checked by endpoint_problems
    return server.served_name


def render_router_unit(fleet: Fleet, name: str) -> str:
    """The systemd unit text of an endpoint's router."""
    endpoint = fleet.endpoints[name]
    router = endpoint.router
    return template("vllm-router.service.j2").render(
        endpoint=name,
        served_name=served_name(fleet, endpoint),
        bind=router.bind,
        port=router.port,
        workers=endpoint.replicas,
        exec_start=" ".join(systemd_quote(word) for word in router_command(fleet, name)),
    )


def router_units(
    fleet: Fleet, host_name: str, secrets: Callable[[SecretRef], str] = read_secret
) -> tuple[RouterUnit, ...]:
    """The routers that run on ``host_name``, rendered, in file order."""
    units = []
    for name, endpoint in fleet.endpoints.items():
        router = endpoint.router
        if router.host != host_name:
            continue
        units.append(RouterUnit(
            endpoint=name,
            served_name=served_name(fleet, endpoint),
            unit=router_unit_name(name),
            unit_path=router_unit_path(name),
            unit_text=render_router_unit(fleet, name),
            venv=ROUTER_VENV_DIR,
            requirement=f"vllm-router=={router.version}",
            version=router.version,
            bind=router.bind,
            port=router.port,
            url=local_url(router.bind, router.port),
            worker_urls=tuple(worker_url(fleet, host_name, ref) for ref in endpoint.replicas),
            env_path=router_env_path(name),
            env_text=envfile.dumps(
                {"VLLM_API_KEY": secrets(router.api_key)} if router.api_key else {},
                comment=f"Managed by vllm-fleet: the key of endpoint {name}, for checks through "
                "its router (mode 0600; the router does not read it).",
            ),
        ))  # fmt: skip
    return tuple(units)


def replica_rollout(fleet: Fleet, host_name: str, server_name: str) -> ReplicaRollout | None:
    """How a deploy updates this server, if it is a replica of an endpoint (None otherwise)."""
    ref = f"{host_name}/{server_name}"
    for name, endpoint in fleet.endpoints.items():
        if ref in endpoint.replicas:
            router = endpoint.router
            return ReplicaRollout(
                endpoint=name,
                replica=ref,
                router_host=router.host,
                router_url=local_url(router.bind, router.port),
                worker_url=worker_url(fleet, router.host, ref),
                max_unavailable=endpoint.rollout.max_unavailable,
                drain_timeout=endpoint.rollout.drain_timeout_s,
                canary=replica_canary(fleet, name, ref),
            )
    return None


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
    if host.is_sandbox or router.bind in LOOPBACK:
        return router.host, "127.0.0.1", router.port
    return router.host, host.address if router.bind in ANY else router.bind, router.port


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


def replica_canary(fleet: Fleet, name: str, ref: str) -> ReplicaCanary | None:
    """The canary gate a replica's rollout applies if it goes first (None: no canary).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-canary.yaml")
        >>> replica_canary(fleet, "chat", "gpu-a/chat-a").baselines
        (('gpu-b/chat-b', 'http://10.0.0.12:8001'),)
    """
    endpoint = fleet.endpoints[name]
    canary = endpoint.rollout.canary
    if canary is None:
        return None
    router = endpoint.router
    return ReplicaCanary(
        baselines=tuple(
            (other, worker_url(fleet, router.host, other))
            for other in endpoint.replicas
            if other != ref
        ),
        key_file=router_env_path(name) if router.api_key else "",
        requests=canary.requests,
        input_len=canary.input_len,
        output_len=canary.output_len,
        seed=canary.seed,
        ttft_margin=canary.ttft_margin,
        tpot_margin=canary.tpot_margin,
        floor_ms=canary.floor_ms,
    )
