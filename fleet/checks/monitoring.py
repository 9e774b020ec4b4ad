"""The rules ``fleet check`` holds the ``monitoring`` section to: hosts it names exist, its
thresholds are alerts of the catalogue and in range, every scrape target is reachable from the
Prometheus host, and the retention fits the declared disk.

What is scraped and how much disk it takes are :mod:`fleet.planner.monitoring`'s.

Example:
    >>> from fleet.spec.models import Fleet
    >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "mon"},
    ...     "hosts": {"mom": {"address": "sandbox",
    ...                       "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
    >>> [(path, message) for path, message, _ in check_monitoring(fleet)]
    [(('monitoring', 'host'), "host 'mon' is not in hosts")]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from fleet.catalog.alerts import ALERTS, MAX_ALERT_FOR_S, Alert, defaults, thresholds_of
from fleet.catalog.alerts import number as _num
from fleet.planner.monitoring import BYTES_PER_SAMPLE, estimated_gib, estimated_series
from fleet.read.problems import Finding, suggest
from fleet.spec.addresses import is_loopback
from fleet.spec.models import ClientCertificates, Fleet, Host, Monitoring

#: The most of the disk a size-limited retention may take: the WAL and the head block come on
#: top of the limit (Prometheus's docs).
SIZE_SHARE = 0.8


def check_monitoring(fleet: Fleet) -> Iterator[Finding]:
    """Every problem of the fleet's ``monitoring`` section, located.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "mon"},
        ...     "hosts": {"mom": {"address": "sandbox",
        ...                       "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> [(path, message) for path, message, _ in check_monitoring(fleet)]
        [(('monitoring', 'host'), "host 'mon' is not in hosts")]
    """
    monitoring = fleet.monitoring
    if monitoring is None:
        return
    base = ("monitoring",)
    if monitoring.host not in fleet.hosts:
        yield (
            (*base, "host"),
            f"host {monitoring.host!r} is not in hosts",
            suggest(monitoring.host, fleet.hosts) or "name the host that runs Prometheus",
        )
        return
    for name in monitoring.exporters:
        if name not in fleet.hosts:
            yield (
                (*base, "exporters", name),
                f"host {name!r} is not in hosts",
                suggest(name, fleet.hosts) or "give exporter settings for hosts of the fleet",
            )
    yield from check_thresholds(monitoring)
    for name, host in fleet.hosts.items():
        own = monitoring.exporters.get(name)
        if own and own.gpu_metrics in ("dcgm", "textfile") and host.gpus.count == 0:
            yield (
                (*base, "exporters", name, "gpu_metrics"),
                f"{own.gpu_metrics} GPU metrics on a host that declares no GPUs",
                "declare the host's gpus, or write gpu_metrics: none",
            )
    yield from _check_reachable(fleet, monitoring)
    yield from _check_retention(fleet, monitoring)
    yield from _check_tls(fleet, monitoring)


def _check_tls(fleet: Fleet, monitoring: Monitoring) -> Iterator[Finding]:
    """Prometheus scrapes a TLS server over https with no client certificate: a server that
    requires one (``client_certificates: required``, ``--ssl-cert-reqs 2``) would refuse it and
    be alerted on as down. ``optional`` is scraped: vLLM checks a certificate only when one is
    presented.

    Example:
        >>> from fleet.spec.models import ClientCertificates, Fleet, ServerTls
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"},
        ...           "servers": {"s": {"model": "m", "port": 8443}}}}})
        >>> fleet.hosts["a"].servers["s"].tls = ServerTls.model_construct(  # the spec refuses it
        ...     client_ca={"file": "/c.pem"}, client_certificates=ClientCertificates.required)
        >>> [(path, fix) for path, _, fix in _check_tls(fleet, fleet.monitoring)]
        [(('hosts', 'a', 'servers', 's', 'tls', 'client_certificates'), 'write client_certificates: optional (Prometheus presents no certificate; clients that do are checked against client_ca), or leave monitoring out')]
    """  # noqa: E501
    for host_name, host in fleet.hosts.items():
        for name, server in host.servers.items():
            if server.tls is not None and server.tls.client_mode is ClientCertificates.required:
                yield (
                    ("hosts", host_name, "servers", name, "tls", "client_certificates"),
                    f"server {name} requires a client certificate, and Prometheus on "
                    f"{monitoring.host} scrapes its /metrics with none: it would be refused and "
                    "alerted on as down",
                    "write client_certificates: optional (Prometheus presents no certificate; "
                    "clients that do are checked against client_ca), or leave monitoring out",
                )


def check_thresholds(
    monitoring: Monitoring, alerts: Mapping[str, Alert] = ALERTS
) -> Iterator[Finding]:
    """``monitoring.thresholds`` and ``monitoring.alert_for_s`` name alerts of the catalogue
    (:data:`fleet.catalog.alerts.ALERTS`) and stay in their ranges.

    Example:
        >>> from fleet.spec.models import Monitoring
        >>> [message for _, message, _ in check_thresholds(Monitoring(host="a",
        ...     thresholds={"gpu_memory_percent": 150}))]
        ['150 is out of range for gpu_memory_percent (vllm_fleet_gpu_memory_used_bytes)']
    """
    known = thresholds_of(alerts)
    for name, value in monitoring.thresholds.items():
        path = ("monitoring", "thresholds", name)
        entry = known.get(name)
        if entry is None:
            yield (
                path,
                f"no alert has a threshold named {name!r}",
                suggest(name, known) or f"thresholds are: {', '.join(known)}",
            )
        elif not (math.isfinite(value) and entry.low <= value <= entry.high):
            yield (
                path,
                f"{_num(value)} is out of range for {name} ({entry.metric})",
                f"give {_num(entry.low)}–{_num(entry.high)} {entry.unit} "
                f"(default {_num(entry.default)})",
            )
    for name, seconds in monitoring.alert_for_s.items():
        path = ("monitoring", "alert_for_s", name)
        if name not in alerts:
            yield (
                path,
                f"no alert is named {name!r}",
                suggest(name, alerts) or f"alerts are: {', '.join(alerts)}",
            )
        elif not 0 <= seconds <= MAX_ALERT_FOR_S:
            yield (path, f"{seconds} s is out of range", f"give 0–{MAX_ALERT_FOR_S} seconds")
    values = {**defaults(alerts), **monitoring.thresholds}
    warn, crit = (
        values["gpu_temperature_warning_celsius"],
        values["gpu_temperature_critical_celsius"],
    )
    if warn > crit:
        yield (
            ("monitoring", "thresholds", "gpu_temperature_warning_celsius"),
            f"the warning temperature {_num(warn)} °C is above the critical {_num(crit)} °C",
            "keep the warning below the critical threshold",
        )


def _control_machine(host: Host) -> bool:
    """A host on the control machine's network: a sandbox, or one reached at loopback (the
    control machine itself), where another such host's loopback address is that machine."""
    return host.is_sandbox or is_loopback(host.address)


def _check_reachable(fleet: Fleet, monitoring: Monitoring) -> Iterator[Finding]:
    """No scrape target of another real host is a loopback address: Prometheus would scrape
    its own machine under that host's label (a host reached at a loopback address, unless
    Prometheus is on the control machine's network too; a server or a router listening on
    loopback there)."""
    for name, host in fleet.hosts.items():
        if host.is_sandbox or name == monitoring.host:
            continue
        if is_loopback(host.address) and not _control_machine(fleet.hosts[monitoring.host]):
            yield (
                ("hosts", name, "address"),
                f"Prometheus on {monitoring.host} would scrape {name} at {host.address}, a "
                f"loopback address: its own machine, not {name}",
                f"give {name} the address the other hosts reach it at, or run Prometheus "
                f"on {name}",
            )
            continue
        for server_name, server in host.servers.items():
            if is_loopback(server.host):
                yield (
                    ("hosts", name, "servers", server_name, "host"),
                    f"Prometheus on {monitoring.host} cannot scrape a server that listens "
                    f"on {server.host} of {name} (a loopback address: it would scrape its own "
                    "machine)",
                    f"listen on 0.0.0.0 (or the host's address), or run Prometheus on {name}",
                )
    for endpoint_name, endpoint in fleet.endpoints.items():
        router = endpoint.router
        host = fleet.hosts.get(router.host)
        if host is None or host.is_sandbox or router.host == monitoring.host:
            continue
        if is_loopback(router.bind) and not is_loopback(host.address):
            yield (
                ("endpoints", endpoint_name, "router", "bind"),
                f"Prometheus on {monitoring.host} cannot scrape the metrics of router "
                f"{endpoint_name}: it listens on {router.bind} of {router.host} (a loopback "
                "address: it would scrape its own machine)",
                f"set bind: 0.0.0.0 (or the address of {router.host}) on "
                f"endpoints.{endpoint_name}.router, or run Prometheus on {router.host}",
            )


def _check_retention(fleet: Fleet, monitoring: Monitoring) -> Iterator[Finding]:
    """A retention the declared disk cannot hold (nothing is known of the disk before the
    deploy but what the fleet file declares, so without disk_gib nothing is checked)."""
    server = monitoring.prometheus
    if server.disk_gib is None:
        return
    path = ("monitoring", "prometheus")
    if server.retention_gib is not None:
        if server.retention_gib > SIZE_SHARE * server.disk_gib:
            yield (
                (*path, "retention_gib"),
                f"retention_gib {_num(server.retention_gib)} does not fit disk_gib "
                f"{_num(server.disk_gib)}: the WAL and head block come on top, so at most "
                f"{SIZE_SHARE:.0%} ({SIZE_SHARE * server.disk_gib:.1f} GiB)",
                f"lower retention_gib to {SIZE_SHARE * server.disk_gib:.1f} or less",
            )
        return
    need = estimated_gib(fleet)
    if need > server.disk_gib:
        days = max(1, int(server.disk_gib / need * server.retention_days))
        yield (
            (*path, "retention_days"),
            f"{server.retention_days} days of ~{estimated_series(fleet)} series every "
            f"{server.scrape_interval_s} s need ~{need:.1f} GiB ({BYTES_PER_SAMPLE} bytes a "
            f"sample), more than disk_gib {_num(server.disk_gib)}",
            f"keep {days} days or fewer, or cap the size with retention_gib",
        )
