"""Monitoring from the fleet file: where Prometheus is, what each host exports, what Prometheus
scrapes, and how much disk its TSDB needs.

The fleet's ``monitoring`` section names the host that runs Prometheus (Debian's package) and
what every host exports (the node exporter everywhere; GPU metrics from NVIDIA's DCGM exporter
where the site runs one, else ``nvidia-smi`` queries fed to the node exporter's textfile
collector). This module decides, from the fleet file alone, the scrape targets with their
labels (host, server, model, gpu), the thresholds of the alert rules (the catalogue
:mod:`fleet.catalog.alerts`, overridable in the fleet file) and the TSDB's size; the section's
rules are :mod:`fleet.checks.monitoring`'s, the files and drop-ins a host gets
:mod:`fleet.hostplan.monitoring`'s.

Example:
    >>> from fleet.spec.models import Fleet
    >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"},
    ...     "hosts": {"a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0",
    ...     "variant": "cpu"}, "servers": {"chat": {"model": "m", "port": 8000}}}}})
    >>> prometheus_url(fleet)
    'http://127.0.0.1:9090'
    >>> [(t.job, t.address, t.labels["host"]) for t in scrape_targets(fleet)]
    [('node', '127.0.0.1:9100', 'a'), ('vllm', '127.0.0.1:8000', 'a')]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.catalog.alerts import ALERTS, Alert, defaults
from fleet.catalog.paths import scrape_ca_path
from fleet.planner.endpoints import replica_parts
from fleet.planner.reach import client_name
from fleet.spec.addresses import bracket, is_any, is_loopback, local_address
from fleet.spec.models import Fleet, HostExporters, Monitoring

LOOPBACK = "127.0.0.1"


def monitoring_host(fleet: Fleet) -> str | None:
    """The name of the host that runs Prometheus; None when the fleet has no monitoring.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> monitoring_host(Fleet.model_validate({"version": 1, "hosts": {}})) is None
        True
    """
    return fleet.monitoring.host if fleet.monitoring else None


def prometheus_url(fleet: Fleet) -> str | None:
    """The base URL of the fleet's Prometheus (its HTTP API is ``URL/api/v1/...``); None when
    the fleet has no monitoring (or names a host it does not have).

    Sandbox hosts share this machine's network: the URL is on loopback. A Prometheus bound to
    an address of its own host is reached there; one bound to loopback on a remote host (the
    default: its API has no authentication) answers only on that host, so the URL is the one
    to use there, over SSH to :func:`monitoring_host`.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"m": {"address": "10.0.0.5",
        ...     "vllm": {"version": "0.32.0", "variant": "cpu"}}}, "monitoring": {"host": "m",
        ...     "prometheus": {"port": 18600, "bind": "0.0.0.0"}}})
        >>> prometheus_url(fleet)
        'http://10.0.0.5:18600'
    """
    monitoring = fleet.monitoring
    if monitoring is None or monitoring.host not in fleet.hosts:
        return None
    host = fleet.hosts[monitoring.host]
    bind = monitoring.prometheus.bind
    if host.is_sandbox or is_loopback(bind):
        address = local_address(bind)
    elif is_any(bind):
        address = host.address
    else:
        address = bind
    return f"http://{bracket(address)}:{monitoring.prometheus.port}"


def prometheus_is_remote_only(fleet: Fleet) -> bool:
    """True when :func:`prometheus_url` answers only on the monitoring host itself (a real host
    with Prometheus bound to loopback): query it over SSH there.
    """
    monitoring = fleet.monitoring
    if monitoring is None or monitoring.host not in fleet.hosts:
        return False
    return not fleet.hosts[monitoring.host].is_sandbox and is_loopback(monitoring.prometheus.bind)


def monitoring_section(fleet: Fleet) -> Monitoring:
    """The fleet's ``monitoring`` section (a ValueError when it has none)."""
    if fleet.monitoring is None:
        raise ValueError("the fleet has no monitoring section")
    return fleet.monitoring


@dataclass(frozen=True)
class Exporters:
    """What one host exports, with the monitoring section's defaults applied.

    + node_port: the node exporter's port; node_bind: the address it listens on
    + gpu: ``dcgm``, ``textfile`` or ``none`` (``auto`` decided); dcgm_port: the DCGM exporter's
    """

    node_port: int
    node_bind: str
    gpu: str
    dcgm_port: int


def host_exporters(fleet: Fleet, name: str) -> Exporters:
    """The exporters of host ``name`` (which must be in a fleet with monitoring).

    The node exporter listens on loopback where Prometheus reaches it there (the Prometheus
    host itself, and sandbox hosts, which share this machine's network), on every interface
    elsewhere.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a",
        ...     "exporters": {"b": {"node_exporter_port": 18601}}}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"}},
        ...     "b": {"address": "10.0.0.6", "vllm": {"version": "0.32.0", "variant": "cu130"},
        ...           "gpus": {"count": 1}}}})
        >>> host_exporters(fleet, "b")
        Exporters(node_port=18601, node_bind='0.0.0.0', gpu='textfile', dcgm_port=9400)
    """
    monitoring = monitoring_section(fleet)
    host = fleet.hosts[name]
    own = monitoring.exporters.get(name, HostExporters())
    gpu = own.gpu_metrics
    if gpu == "auto":
        gpu = "textfile" if host.gpus.count > 0 else "none"
    local = host.is_sandbox or name == monitoring.host
    return Exporters(
        node_port=own.node_exporter_port or monitoring.node_exporter_port,
        node_bind=LOOPBACK if local else "0.0.0.0",
        gpu=gpu,
        dcgm_port=own.dcgm_port,
    )


@dataclass(frozen=True)
class ScrapeTarget:
    """One endpoint Prometheus scrapes, with the labels its series get.

    + job: ``node``, ``dcgm``, ``vllm``, ``vllm-router`` (the scrape job it belongs to)
    + address: ``host:port`` as the Prometheus host reaches it
    + labels: ``host`` always; ``server``, ``model``, ``gpu`` (indices, comma-separated) where
      they apply
    + metrics_path: the path scraped
    + scheme: ``https`` for a server with ``tls`` (else ``http``)
    + cafile: ``https``: the CA file on the Prometheus host it trusts
      (:func:`fleet.catalog.paths.scrape_ca_path`); "" for http
    + tls_name: ``https``: the name the served certificate is checked for when the address is
      not that name (a server of the Prometheus host scraped on loopback); "" otherwise
    """

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"
    scheme: str = "http"
    cafile: str = ""
    tls_name: str = ""


def _target_host(fleet: Fleet, host_name: str, bind: str) -> str:
    """The address (no port, no brackets) of :func:`target_address`."""
    host = fleet.hosts[host_name]
    if host.is_sandbox or host_name == monitoring_section(fleet).host:
        return local_address(bind)
    return host.address if is_any(bind) else bind


def target_address(fleet: Fleet, host_name: str, bind: str, port: int) -> str:
    """``host:port`` of a service of ``host_name`` listening on ``bind``, as the Prometheus host
    reaches it: the address it listens on when that is one address of its host (not loopback,
    not every interface), else loopback on the same host (and on sandbox hosts), the host's
    address elsewhere when it listens on every interface.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"}},
        ...     "b": {"address": "10.0.0.6", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> target_address(fleet, "b", "0.0.0.0", 8000), target_address(fleet, "a", "0.0.0.0", 1)
        ('10.0.0.6:8000', '127.0.0.1:1')
        >>> target_address(fleet, "a", "10.0.0.5", 8009)  # not listening on loopback
        '10.0.0.5:8009'
    """
    return f"{bracket(_target_host(fleet, host_name, bind))}:{port}"


def server_targets(fleet: Fleet) -> list[ScrapeTarget]:
    """Every vLLM server's ``/metrics`` (no API key needed: vLLM keeps it open), labelled with
    its host, server name, model and GPUs. Servers that lend GPUs to another host's server
    (Ray workers) have no API of their own; the head server is scraped.

    A server with ``tls`` is scraped over https, trusting its CA (``tls.ca``, else its
    certificate, pinned) delivered onto the Prometheus host, for the name its certificate must
    cover (:func:`fleet.planner.reach.client_name`): given as ``tls_name`` where the address
    Prometheus connects to is another (its own host's servers, scraped on loopback).

    Example:
        >>> from fleet.spec.models import Fleet
        >>> tls = {"certificate": {"file": "/c.pem"}, "key": {"file": "/k.pem"}}
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"},
        ...           "servers": {"s": {"model": "m", "port": 8443, "host": "0.0.0.0",
        ...                             "tls": tls}}}}})
        >>> [(t.scheme, t.address, t.tls_name) for t in server_targets(fleet)]
        [('https', '127.0.0.1:8443', '10.0.0.5')]
    """
    targets = []
    for host_name, host in fleet.hosts.items():
        for name, server in host.servers.items():
            labels = {"host": host_name, "server": name, "model": server.model}
            if server.gpus:
                labels["gpu"] = ",".join(str(index) for index in server.gpus)
            at = _target_host(fleet, host_name, server.host)
            address = f"{bracket(at)}:{server.port}"
            if server.tls is None:
                targets.append(ScrapeTarget("vllm", address, labels))
                continue
            name_on_certificate = client_name(server, host.address)
            targets.append(ScrapeTarget(
                "vllm", address, labels, scheme="https", cafile=scrape_ca_path(host_name, name),
                tls_name="" if at == name_on_certificate else name_on_certificate))
    return targets


def router_targets(fleet: Fleet) -> list[ScrapeTarget]:
    """Every endpoint's router's ``/metrics`` (job ``vllm-router``, its ``metrics_port`` on its
    bind address), labelled with its host, the endpoint and the endpoint's model.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> server = {"model": "m", "port": 8000, "host": "0.0.0.0"}
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"},
        ...     "models": {"m": {"hf": "Org/M", "revision": "0123456789" * 4}},
        ...     "hosts": {name: {"address": address, "servers": {"r": server},
        ...                      "vllm": {"version": "0.32.0", "variant": "cpu"}}
        ...               for name, address in (("a", "10.0.0.5"), ("b", "10.0.0.6"))},
        ...     "endpoints": {"chat": {"replicas": ["a/r", "b/r"], "router": {
        ...         "host": "b", "port": 9000, "bind": "0.0.0.0", "metrics_port": 9001}}}})
        >>> [(t.address, t.labels) for t in router_targets(fleet)]
        [('10.0.0.6:9001', {'host': 'b', 'endpoint': 'chat', 'model': 'm'})]
    """
    targets = []
    for name, endpoint in fleet.endpoints.items():
        router = endpoint.router
        host_name, server_name = replica_parts(endpoint.replicas[0])
        model = fleet.hosts[host_name].servers[server_name].model  # one model: fleet check
        targets.append(
            ScrapeTarget(
                "vllm-router",
                target_address(fleet, router.host, router.bind, router.metrics_port),
                {"host": router.host, "endpoint": name, "model": model},
            )
        )
    return targets


def exporter_targets(fleet: Fleet) -> list[ScrapeTarget]:
    """Every host's node exporter (job ``node``; the GPU textfile metrics ride on it) and DCGM
    exporter (job ``dcgm``, where declared)."""
    targets = []
    for host_name in fleet.hosts:
        exporters = host_exporters(fleet, host_name)
        labels = {"host": host_name}
        targets.append(
            ScrapeTarget(
                "node",
                target_address(fleet, host_name, exporters.node_bind, exporters.node_port),
                labels,
            )
        )
        if exporters.gpu == "dcgm":
            targets.append(
                ScrapeTarget(
                    "dcgm", target_address(fleet, host_name, "0.0.0.0", exporters.dcgm_port), labels
                )
            )
    return targets


def scrape_targets(fleet: Fleet) -> list[ScrapeTarget]:
    """Everything the fleet's Prometheus scrapes: exporters, servers, routers (in that order)."""
    return [*exporter_targets(fleet), *server_targets(fleet), *router_targets(fleet)]


def thresholds(fleet: Fleet, alerts: Mapping[str, Alert] = ALERTS) -> dict[str, float]:
    """Every threshold's value: the fleet file's where it gives one, else the default."""
    given = fleet.monitoring.thresholds if fleet.monitoring else {}
    return {name: given.get(name, default) for name, default in defaults(alerts).items()}


#: Series a host's node exporter (1.5, default collectors) exposes, about (measured: ~1000 on
#: a sandbox host; real hosts with many disks, NICs and CPUs have more, so counted high).
NODE_SERIES = 1500
#: Series one vLLM 0.32 server exposes on /metrics, about (measured on the CPU build: ~500;
#: its histograms grow with each served model name and finished reason).
VLLM_SERIES = 800
#: Series one GPU adds (textfile or DCGM).
GPU_SERIES = 20
#: Bytes a sample takes on disk, compressed (Prometheus's docs: 1–2); counted at 2.
BYTES_PER_SAMPLE = 2


def estimated_series(fleet: Fleet) -> int:
    """Series the fleet's Prometheus keeps, roughly: exporters, GPUs and servers counted."""
    series = 0
    for host in fleet.hosts.values():
        series += NODE_SERIES + GPU_SERIES * host.gpus.count + VLLM_SERIES * len(host.servers)
    return series


def estimated_gib(fleet: Fleet) -> float:
    """GiB the TSDB needs to keep ``retention_days`` of the fleet's series."""
    server = monitoring_section(fleet).prometheus
    samples = estimated_series(fleet) / server.scrape_interval_s * server.retention_days * 86400
    return samples * BYTES_PER_SAMPLE / 2**30
