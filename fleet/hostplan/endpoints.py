"""What an endpoint puts on hosts: its router's unit, and the rollout a deploy applies to each
replica (with its canary gate).

vllm-router 0.1.17 does not check a client's key itself: it passes the ``Authorization`` header
on, and each replica (vLLM's ``--api-key``) checks it. So the endpoint's key is its replicas'
key, and the router never gets it (nothing secret in its unit or command line). Each replica's
address is :mod:`fleet.planner.endpoints`'; the endpoint's rules :mod:`fleet.checks.endpoints`'.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
    >>> [r.endpoint for r in router_units(fleet, "gpu-a", secrets=lambda ref: "k")]
    ['chat']
    >>> replica_rollout(fleet, "gpu-b", "chat-b").worker_url
    'http://10.0.0.12:8001'
"""

from __future__ import annotations

from collections.abc import Callable

from fleet.catalog.paths import ROUTER_VENV_DIR, router_env_path, router_unit_name, router_unit_path
from fleet.catalog.releases import render_needs_scale_out
from fleet.hostplan import emit
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.templating import render
from fleet.hostplan.types import ReplicaCanary, ReplicaRollout, RouterUnit
from fleet.planner.endpoints import local_url, served_name, worker_url
from fleet.spec.models import Fleet, SecretRef

#: Seconds the router waits for a worker to be healthy when it is added back (the rollout adds
#: a replica only once it answered a completion, so this is a bound, not a wait).
WORKER_STARTUP_TIMEOUT = 120


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


def replica_flags(fleet: Fleet, host_name: str, server_name: str) -> list[str]:
    """vLLM flags a server gets because a router sends it requests: ``--enable-scale-out`` on a
    release that serves the render endpoints only with it
    (:data:`fleet.catalog.releases.SCALE_OUT_FLAG_FROM`). vllm-router's ``cache_aware`` policy
    (the default) asks a replica to render each request before sending it; without the flag
    the replica answers 403 every time and the router routes without the prompt's tokens.
    Every replica gets it, whatever the router's policy: the policy is the router's setting,
    and changing it restarts the router only. The endpoints it adds are behind the replica's
    key like ``/v1/completions``. A server whose ``args`` set ``enable-scale-out`` keeps its
    own choice.

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-replica-count.yaml")
        >>> replica_flags(fleet, "gpu-b", "chat-2"), replica_flags(fleet, "gpu-a", "batch")
        (['--enable-scale-out'], [])
    """
    host = fleet.hosts[host_name]
    server = host.servers.get(server_name)
    if server is None or "enable-scale-out" in server.args:
        return []
    if not render_needs_scale_out(host.vllm.version):
        return []
    ref = f"{host_name}/{server_name}"
    behind_router = any(ref in endpoint.replicas for endpoint in fleet.endpoints.values())
    return ["--enable-scale-out"] if behind_router else []


def render_router_unit(fleet: Fleet, name: str) -> str:
    """The systemd unit text of an endpoint's router."""
    endpoint = fleet.endpoints[name]
    router = endpoint.router
    served = served_name(fleet, endpoint)
    return render(
        "vllm-router.service.j2",
        note=emit.comment(f"Endpoint {name}: {served} on {router.bind}:{router.port}, "
                          f"{len(endpoint.replicas)} replicas"),
        description=emit.text(f"vllm-router of endpoint {name} ({served}, port {router.port})"),
        exec_start=emit.command(router_command(fleet, name)),
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
            env_text=emit.env_file(
                {"VLLM_API_KEY": secrets(router.api_key)} if router.api_key else {},
                note=f"Managed by vllm-fleet: the key of endpoint {name}, for checks through "
                "its router (mode 0600; the router does not read it).",
            ).text,
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
