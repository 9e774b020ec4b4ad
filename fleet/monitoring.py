"""Monitoring from the fleet file: where Prometheus is, what it scrapes, and its alert rules.

The fleet's ``monitoring`` section names the host that runs Prometheus (Debian's package) and
what every host exports (the node exporter everywhere; GPU metrics from NVIDIA's DCGM exporter
where the site runs one, else ``nvidia-smi`` queries fed to the node exporter's textfile
collector). This module decides everything about it and touches no host: the scrape targets
with their labels (host, server, model, gpu), the rendered ``prometheus.yml``, the alert rules
with their thresholds (defaults from the field report, overridable in the fleet file), and
the checks ``fleet check`` runs on the section.

Example:
    >>> from fleet.spec import Fleet
    >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"},
    ...     "hosts": {"a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0",
    ...     "variant": "cpu"}, "servers": {"chat": {"model": "m", "port": 8000}}}}})
    >>> prometheus_url(fleet)
    'http://127.0.0.1:9090'
    >>> [(t.job, t.address, t.labels["host"]) for t in scrape_targets(fleet)]
    [('node', '127.0.0.1:9100', 'a'), ('vllm', '127.0.0.1:8000', 'a')]
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import yaml

from fleet.endpoints import replica_parts
from fleet.hostplan import GpuMetricsUnit, MonitoringPlan, PrometheusPlan, ServiceDropin
from fleet.paths import (
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_DATA,
    ALERTMANAGER_DROPIN,
    GPU_METRICS_UNIT,
    GPU_TEXTFILE,
    NODE_EXPORTER_DROPIN,
    NVIDIA_DEVICES,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DATA,
    PROMETHEUS_DIR,
    PROMETHEUS_DROPIN,
    PROMETHEUS_RULES_NAME,
    PROMETHEUS_STAGING,
    TEXTFILE_DIR,
    UNIT_DIR,
    gpu_device,
    program_command,
)
from fleet.problems import Finding, suggest
from fleet.quoting import systemd_quote
from fleet.spec import Fleet, Host, HostExporters, Monitoring
from fleet.templating import template

# --------------------------------------------------------------------------------------------
# Where Prometheus is (the interface of `fleet status`)
# --------------------------------------------------------------------------------------------

LOOPBACK = "127.0.0.1"


def monitoring_host(fleet: Fleet) -> str | None:
    """The name of the host that runs Prometheus; None when the fleet has no monitoring.

    Example:
        >>> from fleet.spec import Fleet
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
        >>> from fleet.spec import Fleet
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
    if host.is_sandbox or _loopback(bind):
        address = LOOPBACK
    elif _any_address(bind):
        address = host.address
    else:
        address = bind
    return f"http://{_bracket(address)}:{monitoring.prometheus.port}"


def prometheus_is_remote_only(fleet: Fleet) -> bool:
    """True when :func:`prometheus_url` answers only on the monitoring host itself (a real host
    with Prometheus bound to loopback): query it over SSH there.
    """
    monitoring = fleet.monitoring
    if monitoring is None or monitoring.host not in fleet.hosts:
        return False
    return not fleet.hosts[monitoring.host].is_sandbox and _loopback(monitoring.prometheus.bind)


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _any_address(address: str) -> bool:
    return ipaddress.ip_address(address).is_unspecified


def _bracket(address: str) -> str:
    """An address for ``host:port``: IPv6 literals in brackets."""
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address


# --------------------------------------------------------------------------------------------
# Exporters and scrape targets
# --------------------------------------------------------------------------------------------


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
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a",
        ...     "exporters": {"b": {"node_exporter_port": 18601}}}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"}},
        ...     "b": {"address": "10.0.0.6", "vllm": {"version": "0.32.0", "variant": "cu130"},
        ...           "gpus": {"count": 1}}}})
        >>> host_exporters(fleet, "b")
        Exporters(node_port=18601, node_bind='0.0.0.0', gpu='textfile', dcgm_port=9400)
    """
    monitoring = _section(fleet)
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
    """

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"


def target_address(fleet: Fleet, host_name: str, bind: str, port: int) -> str:
    """``host:port`` of a service of ``host_name`` listening on ``bind``, as the Prometheus host
    reaches it: loopback on the same host (and on sandbox hosts), the host's address when the
    service listens on every interface, else the address it listens on.

    Example:
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"}},
        ...     "b": {"address": "10.0.0.6", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> target_address(fleet, "b", "0.0.0.0", 8000), target_address(fleet, "a", "0.0.0.0", 1)
        ('10.0.0.6:8000', '127.0.0.1:1')
    """
    host = fleet.hosts[host_name]
    if host.is_sandbox or host_name == _section(fleet).host:
        address = LOOPBACK
    else:
        try:
            address = host.address if _any_address(bind) else bind
        except ValueError:  # a name to bind: the host resolves it
            address = bind
    return f"{_bracket(address)}:{port}"


def server_targets(fleet: Fleet) -> list[ScrapeTarget]:
    """Every vLLM server's ``/metrics`` (no API key needed: vLLM keeps it open), labelled with
    its host, server name, model and GPUs. Servers that lend GPUs to another host's server
    (Ray workers) have no API of their own; the head server is scraped.
    """
    targets = []
    for host_name, host in fleet.hosts.items():
        for name, server in host.servers.items():
            labels = {"host": host_name, "server": name, "model": server.model}
            if server.gpus:
                labels["gpu"] = ",".join(str(index) for index in server.gpus)
            address = target_address(fleet, host_name, server.host, server.port)
            targets.append(ScrapeTarget("vllm", address, labels))
    return targets


def router_targets(fleet: Fleet) -> list[ScrapeTarget]:
    """Every endpoint's router's ``/metrics`` (job ``vllm-router``, its ``metrics_port`` on its
    bind address), labelled with its host, the endpoint and the endpoint's model.

    Example:
        >>> from fleet.spec import Fleet
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


def _section(fleet: Fleet) -> Monitoring:
    if fleet.monitoring is None:
        raise ValueError("the fleet has no monitoring section")
    return fleet.monitoring


# --------------------------------------------------------------------------------------------
# prometheus.yml
# --------------------------------------------------------------------------------------------

#: Jobs in the order they appear in prometheus.yml.
JOBS = ("node", "dcgm", "vllm", "vllm-router")


def prometheus_config(fleet: Fleet) -> str:
    """The Prometheus configuration the fleet's Prometheus host runs, as YAML text.

    Each target is a static config of its own, so that its labels are exactly its own; the
    rules file sits beside the configuration (a relative name, so that a staged configuration
    is checked with its staged rules).

    Example:
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> config = yaml.safe_load(prometheus_config(fleet))
        >>> config["rule_files"], [job["job_name"] for job in config["scrape_configs"]]
        (['fleet-rules.yml'], ['prometheus', 'node'])
    """
    monitoring = _section(fleet)
    interval = f"{monitoring.prometheus.scrape_interval_s}s"
    self_address = (
        f"{_bracket(_local_address(monitoring.prometheus.bind))}:{monitoring.prometheus.port}"
    )
    jobs = [
        {
            "job_name": "prometheus",
            "static_configs": [{"targets": [self_address], "labels": {"host": monitoring.host}}],
        }
    ]
    targets = scrape_targets(fleet)
    for job in JOBS:
        mine = [target for target in targets if target.job == job]
        if not mine:
            continue
        jobs.append(
            {
                "job_name": job,
                "metrics_path": mine[0].metrics_path,
                "static_configs": [
                    {"targets": [target.address], "labels": dict(target.labels)} for target in mine
                ],
            }
        )
    config: dict = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [PROMETHEUS_RULES_NAME],
        "scrape_configs": jobs,
    }
    if monitoring.alertmanager is not None:
        address = _local_address(monitoring.alertmanager.bind)
        config["alerting"] = {
            "alertmanagers": [
                {
                    "static_configs": [
                        {"targets": [f"{_bracket(address)}:{monitoring.alertmanager.port}"]}
                    ]
                }
            ]
        }
    return _header("prometheus.yml") + yaml.safe_dump(config, sort_keys=False)


def alertmanager_config() -> str:
    """Alertmanager's configuration: alerts grouped by name and host, kept in its UI and API
    (one receiver without integrations; a site adds its own e-mail or chat receivers).
    """
    config = {
        "route": {
            "receiver": "fleet",
            "group_by": ["alertname", "host"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
        },
        "receivers": [{"name": "fleet"}],
    }
    return _header("alertmanager.yml") + yaml.safe_dump(config, sort_keys=False)


def _local_address(bind: str) -> str:
    """How a service on the same host is reached: loopback when it listens everywhere."""
    return LOOPBACK if _any_address(bind) or _loopback(bind) else bind


def _header(name: str) -> str:
    return f"# Managed by vllm-fleet ({name}, rendered from the fleet file): edits are replaced.\n"


# --------------------------------------------------------------------------------------------
# Alert rules and their thresholds
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """An alert threshold the fleet file may override.

    + default: its value unless the fleet file gives one; low, high: the range accepted
    + unit: what the number counts; metric: the series it is compared with
    + source: where the default comes from
    """

    default: float
    low: float
    high: float
    unit: str
    metric: str
    source: str


#: The 4×4090 D field report's table of healthy ranges (issue 14).
FIELD_REPORT = "field report (4×4090 D)"

#: Every threshold, by the name the fleet file's ``monitoring.thresholds`` uses.
THRESHOLDS: dict[str, Threshold] = {
    "gpu_utilization_low_percent": Threshold(
        30,
        0,
        100,
        "%",
        "vllm_fleet_gpu_utilization_percent",
        f"{FIELD_REPORT}: below 30 % under load, the bottleneck is elsewhere",
    ),
    "gpu_utilization_healthy_percent": Threshold(
        60,
        0,
        100,
        "%",
        "vllm_fleet_gpu_utilization_percent",
        f"{FIELD_REPORT}: healthy 60–95 % (power at TDP only under full load)",
    ),
    "gpu_memory_percent": Threshold(
        95,
        1,
        100,
        "%",
        "vllm_fleet_gpu_memory_used_bytes",
        f"{FIELD_REPORT}: above 95 % an OOM can come at any time",
    ),
    "gpu_temperature_warning_celsius": Threshold(
        80,
        30,
        120,
        "°C",
        "vllm_fleet_gpu_temperature_celsius",
        f"{FIELD_REPORT}: healthy below 80 °C",
    ),
    "gpu_temperature_critical_celsius": Threshold(
        85,
        30,
        120,
        "°C",
        "vllm_fleet_gpu_temperature_celsius",
        f"{FIELD_REPORT}: above 85 °C the card throttles",
    ),
    "gpu_power_limit_percent": Threshold(
        98,
        50,
        100,
        "% of the power limit",
        "vllm_fleet_gpu_power_watts",
        f"{FIELD_REPORT}: at TDP only under full load",
    ),
    "queue_waiting_requests": Threshold(
        0,
        0,
        100000,
        "requests",
        "vllm:num_requests_waiting",
        f"{FIELD_REPORT}: queue mostly 0; waiting > 0 for long: not enough throughput",
    ),
    "preemptions": Threshold(
        0,
        0,
        100000,
        "preemptions in 5 min",
        "vllm:num_preemptions_total",
        f"{FIELD_REPORT}: preemptions 0; > 0: not enough KV cache memory",
    ),
    "kv_cache_usage_percent": Threshold(
        95,
        1,
        100,
        "%",
        "vllm:kv_cache_usage_perc",
        "vllm-fleet: a KV cache this full is one step from preemptions",
    ),
    "restarts_per_15m": Threshold(
        3,
        1,
        1000,
        "starts in 15 min",
        "process_start_time_seconds",
        "vllm-fleet: the units restart always (RestartSec 5 s); 3 starts in 15 min is a loop",
    ),
    "drift_findings": Threshold(
        0,
        0,
        100000,
        "findings",
        "vllm_fleet_drift_findings",
        "vllm-fleet: fleet drift finds nothing on a host as deployed",
    ),
}


def thresholds(fleet: Fleet) -> dict[str, float]:
    """Every threshold's value: the fleet file's where it gives one, else the default."""
    given = fleet.monitoring.thresholds if fleet.monitoring else {}
    return {name: given.get(name, entry.default) for name, entry in THRESHOLDS.items()}


#: The GPU series the textfile collector writes (hostside/gpu_metrics.py), and what DCGM's
#: exporter calls them (recording rules map DCGM's onto ours, so one set of alerts serves both).
GPU_METRICS = {
    "vllm_fleet_gpu_utilization_percent": "DCGM_FI_DEV_GPU_UTIL",
    "vllm_fleet_gpu_memory_used_bytes": "DCGM_FI_DEV_FB_USED * 1048576",
    "vllm_fleet_gpu_memory_total_bytes": "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 1048576",
    "vllm_fleet_gpu_temperature_celsius": "DCGM_FI_DEV_GPU_TEMP",
    "vllm_fleet_gpu_power_watts": "DCGM_FI_DEV_POWER_USAGE",
}


def _num(value: float) -> str:
    """A threshold as PromQL writes it: ``95``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


#: The alerting rules' names, in the order of the rules file.
ALERTS = (
    "VllmServerDown", "VllmReadinessLost", "VllmRestartsLooping", "VllmQueueWaiting",
    "VllmPreemptions", "VllmKvCacheHigh", "ExporterDown", "FleetDriftFound", "GpuMemoryHigh",
    "GpuTemperatureHigh", "GpuTemperatureCritical", "GpuUnderused", "GpuPowerAtLimit",
)  # fmt: skip
#: The longest ``monitoring.alert_for_s`` accepted (a day).
MAX_ALERT_FOR_S = 86400


def _duration(seconds: int) -> str:
    """A ``for:`` duration as Prometheus writes it.

    Example:
        >>> _duration(120), _duration(90), _duration(0)
        ('2m', '90s', '0m')
    """
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def alert_rules(values: dict[str, float], waits: dict[str, int] | None = None) -> list[dict]:
    """The alerting rules, with ``values`` (:func:`thresholds`) filled in, and each alert's
    ``for`` from ``waits`` (seconds, by alert name: ``monitoring.alert_for_s``) where given.

    Example:
        >>> rules = alert_rules({name: t.default for name, t in THRESHOLDS.items()})
        >>> [rule["expr"] for rule in rules if rule["alert"] == "VllmPreemptions"]
        ['increase(vllm:num_preemptions_total[5m]) > 0']
    """
    v = {name: _num(value) for name, value in values.items()}
    gpu_busy_host = "on (host) (sum by (host) (vllm:num_requests_running) > 0)"
    rules = [
        (
            "VllmServerDown",
            'up{job="vllm"} == 0',
            "1m",
            "critical",
            "vLLM server {{ $labels.server }} on {{ $labels.host }} does not answer /metrics",
        ),
        (
            "VllmReadinessLost",
            "sum by (host, server) (vllm:num_requests_running + vllm:num_requests_waiting) > 0 "
            "unless on (host, server) "
            "sum by (host, server) (increase(vllm:request_success_total[5m])) > 0",
            "5m",
            "critical",
            "{{ $labels.server }} on {{ $labels.host }} has requests but finished none in 5 min",
        ),
        (
            "VllmRestartsLooping",
            f'changes(process_start_time_seconds{{job="vllm"}}[15m]) >= {v["restarts_per_15m"]}',
            "0m",
            "critical",
            "{{ $labels.server }} on {{ $labels.host }} restarted {{ $value }} times in 15 min",
        ),
        (
            "VllmQueueWaiting",
            f"vllm:num_requests_waiting > {v['queue_waiting_requests']}",
            "5m",
            "warning",
            "{{ $labels.server }} on {{ $labels.host }}: {{ $value }} requests waiting for 5 min "
            "(not enough throughput)",
        ),
        (
            "VllmPreemptions",
            f"increase(vllm:num_preemptions_total[5m]) > {v['preemptions']}",
            "0m",
            "warning",
            "{{ $labels.server }} on {{ $labels.host }} preempted requests (not enough KV cache)",
        ),
        (
            "VllmKvCacheHigh",
            f"vllm:kv_cache_usage_perc * 100 > {v['kv_cache_usage_percent']}",
            "5m",
            "warning",
            "{{ $labels.server }} on {{ $labels.host }}: KV cache {{ $value | humanize }} % full",
        ),
        (
            "ExporterDown",
            'up{job=~"node|dcgm|vllm-router"} == 0',
            "2m",
            "warning",
            "{{ $labels.job }} on {{ $labels.host }} does not answer",
        ),
        (
            "FleetDriftFound",
            f"vllm_fleet_drift_findings > {v['drift_findings']}",
            "0m",
            "warning",
            "fleet drift found {{ $value }} differences on {{ $labels.host }}",
        ),
        (
            "GpuMemoryHigh",
            "100 * vllm_fleet_gpu_memory_used_bytes / vllm_fleet_gpu_memory_total_bytes "
            f"> {v['gpu_memory_percent']}",
            "5m",
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.host }}: memory {{ $value | humanize }} % used",
        ),
        (
            "GpuTemperatureHigh",
            f"vllm_fleet_gpu_temperature_celsius > {v['gpu_temperature_warning_celsius']}",
            "5m",
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} at {{ $value }} °C",
        ),
        (
            "GpuTemperatureCritical",
            f"vllm_fleet_gpu_temperature_celsius > {v['gpu_temperature_critical_celsius']}",
            "1m",
            "critical",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} at {{ $value }} °C: it throttles",
        ),
        (
            "GpuUnderused",
            f"avg_over_time(vllm_fleet_gpu_utilization_percent[10m]) "
            f"< {v['gpu_utilization_low_percent']} and {gpu_busy_host}",
            "10m",
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} {{ $value }} % busy while serving: the "
            "bottleneck is elsewhere",
        ),
        (
            "GpuPowerAtLimit",
            "100 * vllm_fleet_gpu_power_watts / vllm_fleet_gpu_power_limit_watts "
            f">= {v['gpu_power_limit_percent']} and on (host, gpu) "
            f"vllm_fleet_gpu_utilization_percent < {v['gpu_utilization_healthy_percent']}",
            "10m",
            "warning",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} at its power limit without full load",
        ),
    ]
    out = []
    for alert, expr, wait, severity, summary in rules:
        if waits and alert in waits:
            wait = _duration(waits[alert])
        rule: dict = {"alert": alert, "expr": expr}
        if wait != "0m":
            rule["for"] = wait
        rule["labels"] = {"severity": severity}
        rule["annotations"] = {"summary": summary}
        out.append(rule)
    return out


def recording_rules() -> list[dict]:
    """DCGM exporter series recorded under the textfile collector's names."""
    return [{"record": ours, "expr": dcgm} for ours, dcgm in GPU_METRICS.items()]


def rules_text(fleet: Fleet) -> str:
    """The rules file the fleet's Prometheus loads (fleet-rules.yml), as YAML text.

    Example:
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a",
        ...     "thresholds": {"gpu_memory_percent": 90}}, "hosts": {}})
        >>> "> 90" in rules_text(fleet)
        True
    """
    waits = fleet.monitoring.alert_for_s if fleet.monitoring else {}
    groups = [{"name": "vllm-fleet", "rules": alert_rules(thresholds(fleet), waits)}]
    if any(host_exporters(fleet, name).gpu == "dcgm" for name in fleet.hosts):
        groups.insert(0, {"name": "vllm-fleet-dcgm", "rules": recording_rules()})
    return _header(PROMETHEUS_RULES_NAME) + yaml.safe_dump(
        {"groups": groups}, sort_keys=False, allow_unicode=True, width=1000
    )


# --------------------------------------------------------------------------------------------
# Command lines of the services (Debian's units, ExecStart replaced by a drop-in)
# --------------------------------------------------------------------------------------------


def prometheus_argv(monitoring: Monitoring) -> list[str]:
    """Prometheus's command line.

    Example:
        >>> from fleet.spec import Monitoring
        >>> prometheus_argv(Monitoring(host="a", prometheus={"retention_gib": 2.5}))[-1]
        '--storage.tsdb.retention.size=2560MB'
    """
    server = monitoring.prometheus
    argv = [
        "/usr/bin/prometheus",
        f"--config.file={PROMETHEUS_CONFIG}",
        f"--storage.tsdb.path={PROMETHEUS_DATA}",
        f"--web.listen-address={_bracket(server.bind)}:{server.port}",
        f"--storage.tsdb.retention.time={server.retention_days}d",
    ]
    if server.retention_gib is not None:
        argv.append(f"--storage.tsdb.retention.size={math.ceil(server.retention_gib * 1024)}MB")
    return argv


def node_exporter_argv(exporters: Exporters) -> list[str]:
    """The node exporter's command line (its textfile folder is Debian's)."""
    return [
        "/usr/bin/prometheus-node-exporter",
        f"--web.listen-address={_bracket(exporters.node_bind)}:{exporters.node_port}",
        f"--collector.textfile.directory={TEXTFILE_DIR}",
    ]


def alertmanager_argv(monitoring: Monitoring) -> list[str]:
    """Alertmanager's command line: one instance, so clustering (port 9094) is off."""
    manager = monitoring.alertmanager
    if manager is None:
        raise ValueError("the monitoring section has no alertmanager")
    return [
        "/usr/bin/prometheus-alertmanager",
        f"--config.file={ALERTMANAGER_CONFIG}",
        f"--storage.path={ALERTMANAGER_DATA}",
        f"--web.listen-address={_bracket(manager.bind)}:{manager.port}",
        "--cluster.listen-address=",
    ]


# --------------------------------------------------------------------------------------------
# fleet check: the monitoring section
# --------------------------------------------------------------------------------------------

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
#: The most of the disk a size-limited retention may take: the WAL and the head block come on
#: top of the limit (Prometheus's docs).
SIZE_SHARE = 0.8


def estimated_series(fleet: Fleet) -> int:
    """Series the fleet's Prometheus keeps, roughly: exporters, GPUs and servers counted."""
    series = 0
    for host in fleet.hosts.values():
        series += NODE_SERIES + GPU_SERIES * host.gpus.count + VLLM_SERIES * len(host.servers)
    return series


def estimated_gib(fleet: Fleet) -> float:
    """GiB the TSDB needs to keep ``retention_days`` of the fleet's series."""
    server = _section(fleet).prometheus
    samples = estimated_series(fleet) / server.scrape_interval_s * server.retention_days * 86400
    return samples * BYTES_PER_SAMPLE / 2**30


def check_monitoring(fleet: Fleet) -> Iterator[Finding]:
    """Every problem of the fleet's ``monitoring`` section, located.

    Example:
        >>> from fleet.spec import Fleet
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
    yield from _check_thresholds(monitoring)
    for name, host in fleet.hosts.items():
        own = monitoring.exporters.get(name)
        if own and own.gpu_metrics in ("dcgm", "textfile") and host.gpus.count == 0:
            yield (
                (*base, "exporters", name, "gpu_metrics"),
                f"{own.gpu_metrics} GPU metrics on a host that declares no GPUs",
                "declare the host's gpus, or write gpu_metrics: none",
            )
    yield from _check_ports(fleet, monitoring)
    yield from _check_reachable(fleet, monitoring)
    yield from _check_retention(fleet, monitoring)


def _check_thresholds(monitoring: Monitoring) -> Iterator[Finding]:
    for name, value in monitoring.thresholds.items():
        path = ("monitoring", "thresholds", name)
        entry = THRESHOLDS.get(name)
        if entry is None:
            yield (
                path,
                f"no alert has a threshold named {name!r}",
                suggest(name, THRESHOLDS) or f"thresholds are: {', '.join(THRESHOLDS)}",
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
        if name not in ALERTS:
            yield (
                path,
                f"no alert is named {name!r}",
                suggest(name, ALERTS) or f"alerts are: {', '.join(ALERTS)}",
            )
        elif not 0 <= seconds <= MAX_ALERT_FOR_S:
            yield (path, f"{seconds} s is out of range", f"give 0–{MAX_ALERT_FOR_S} seconds")
    values = {**{n: t.default for n, t in THRESHOLDS.items()}, **monitoring.thresholds}
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


def _host_ports(fleet: Fleet, monitoring: Monitoring, name: str, host: Host) -> list:
    """(port, what, path) of everything listening on host ``name``."""
    exporters = host_exporters(fleet, name)
    own = ("monitoring", "exporters", name)
    node_path = (
        (*own, "node_exporter_port")
        if name in monitoring.exporters and monitoring.exporters[name].node_exporter_port
        else ("monitoring", "node_exporter_port")
    )
    ports = [
        (
            server.port,
            f"server {name}/{server_name}",
            ("hosts", name, "servers", server_name, "port"),
        )
        for server_name, server in host.servers.items()
    ]
    for endpoint_name, endpoint in fleet.endpoints.items():
        if endpoint.router.host == name:
            path = ("endpoints", endpoint_name, "router")
            ports.append((endpoint.router.port, f"router {endpoint_name}", (*path, "port")))
            ports.append(
                (
                    endpoint.router.metrics_port,
                    f"router {endpoint_name}'s metrics",
                    (*path, "metrics_port"),
                )
            )
    ports.append((exporters.node_port, f"the node exporter of {name}", node_path))
    if exporters.gpu == "dcgm":
        ports.append((exporters.dcgm_port, f"the DCGM exporter of {name}", (*own, "dcgm_port")))
    if name == monitoring.host:
        ports.append(
            (monitoring.prometheus.port, "Prometheus", ("monitoring", "prometheus", "port"))
        )
        if monitoring.alertmanager is not None:
            ports.append(
                (
                    monitoring.alertmanager.port,
                    "Alertmanager",
                    ("monitoring", "alertmanager", "port"),
                )
            )
    return ports


def _check_ports(fleet: Fleet, monitoring: Monitoring) -> Iterator[Finding]:
    """A monitoring port clashes with no server, router or other exporter on its host (on
    sandbox hosts: on any sandbox host, they share one network). Server against server is
    fleet/checks.py's."""
    sandbox: dict[int, str] = {}
    for name, host in fleet.hosts.items():
        seen: dict[int, str] = {}
        for port, what, path in _host_ports(fleet, monitoring, name, host):
            taken = seen.get(port) or (sandbox.get(port) if host.is_sandbox else None)
            if taken and (path[0] == "monitoring" or not taken.startswith("server")):
                yield (
                    path,
                    f"port {port} is already used by {taken}"
                    + (
                        " (sandbox hosts share this machine's network)"
                        if host.is_sandbox and port not in seen
                        else ""
                    ),
                    "give each service of a host its own port",
                )
                continue
            seen.setdefault(port, what)
            if host.is_sandbox:
                sandbox.setdefault(port, what)


def _check_reachable(fleet: Fleet, monitoring: Monitoring) -> Iterator[Finding]:
    """A server that listens on loopback of another real host cannot be scraped."""
    for name, host in fleet.hosts.items():
        if host.is_sandbox or name == monitoring.host:
            continue
        for server_name, server in host.servers.items():
            try:
                loopback = _loopback(server.host)
            except ValueError:
                continue
            if loopback:
                yield (
                    ("hosts", name, "servers", server_name, "host"),
                    f"Prometheus on {monitoring.host} cannot scrape a server that listens "
                    f"on {server.host} of {name}",
                    f"listen on 0.0.0.0 (or the host's address), or run Prometheus on {name}",
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


# --------------------------------------------------------------------------------------------
# The host plan's monitoring part
# --------------------------------------------------------------------------------------------

#: Seconds between two nvidia-smi queries of the GPU textfile feeder.
GPU_QUERY_INTERVAL_S = 15


def exec_start(argv: list[str]) -> str:
    """An ExecStart= value, each word quoted for systemd."""
    return " ".join(systemd_quote(word) for word in argv)


def monitoring_plan(fleet: Fleet, host_name: str) -> MonitoringPlan | None:
    """What monitoring host ``host_name`` runs; None when the fleet has no monitoring (the
    deploy then retires whatever monitoring vllm-fleet installed there before).

    Example:
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> plan = monitoring_plan(fleet, "a")
        >>> plan.node_exporter.package, plan.prometheus.service.unit, plan.gpu_metrics
        ('prometheus-node-exporter=1.5.0-1+b6', 'prometheus.service', None)
    """
    monitoring = fleet.monitoring
    if monitoring is None:
        return None
    exporters = host_exporters(fleet, host_name)
    versions = monitoring.versions
    node = ServiceDropin(
        package=f"prometheus-node-exporter={versions.node_exporter}",
        unit="prometheus-node-exporter.service",
        path=NODE_EXPORTER_DROPIN,
        text=template("prometheus-node-exporter.conf.j2").render(
            exec_start=exec_start(node_exporter_argv(exporters)), textfile_dir=TEXTFILE_DIR
        ),
    )
    gpu = None
    if exporters.gpu == "textfile":
        host = fleet.hosts[host_name]
        argv = program_command(
            "gpu_metrics",
            "--out",
            GPU_TEXTFILE,
            "--interval",
            str(GPU_QUERY_INTERVAL_S),
            python="/usr/bin/python3",
        )
        devices = [*NVIDIA_DEVICES, *(gpu_device(i) for i in range(host.gpus.count))]
        gpu = GpuMetricsUnit(
            unit=GPU_METRICS_UNIT,
            unit_path=f"{UNIT_DIR}/{GPU_METRICS_UNIT}",
            unit_text=template("vllm-fleet-gpu-metrics.service.j2").render(
                exec_start=exec_start(argv),
                interval=GPU_QUERY_INTERVAL_S,
                textfile=GPU_TEXTFILE,
                textfile_dir=TEXTFILE_DIR,
                devices=devices,
            ),
            textfile=GPU_TEXTFILE,
        )
    prometheus = None
    if host_name == monitoring.host:
        prometheus = _prometheus_plan(fleet, monitoring)
    return MonitoringPlan(
        node_exporter=node, textfile_dir=TEXTFILE_DIR, gpu_metrics=gpu, prometheus=prometheus
    )


def _prometheus_plan(fleet: Fleet, monitoring: Monitoring) -> PrometheusPlan:
    server = monitoring.prometheus
    service = ServiceDropin(
        package=f"prometheus={monitoring.versions.prometheus}",
        unit="prometheus.service",
        path=PROMETHEUS_DROPIN,
        text=template("prometheus.conf.j2").render(
            exec_start=exec_start(prometheus_argv(monitoring)), data_dir="/var/lib/prometheus"
        ),
    )
    manager = None
    if monitoring.alertmanager is not None:
        manager = ServiceDropin(
            package=f"prometheus-alertmanager={monitoring.versions.alertmanager}",
            unit="prometheus-alertmanager.service",
            path=ALERTMANAGER_DROPIN,
            text=template("prometheus-alertmanager.conf.j2").render(
                exec_start=exec_start(alertmanager_argv(monitoring)), data_dir="/var/lib/prometheus"
            ),
        )
    local = _bracket(_local_address(server.bind))
    return PrometheusPlan(
        service=service,
        config_text=prometheus_config(fleet),
        rules_text=rules_text(fleet),
        config_dir=PROMETHEUS_DIR,
        staging_dir=PROMETHEUS_STAGING,
        ready_url=f"http://{local}:{server.port}/-/ready",
        alertmanager=manager,
        alertmanager_config_path=ALERTMANAGER_CONFIG if manager else None,
        alertmanager_config_text=alertmanager_config() if manager else None,
    )


def rendered_files(plan: MonitoringPlan | None) -> list[tuple[str, str]]:
    """``(path, text)`` of every monitoring file a host gets (what ``fleet render`` shows):
    drop-ins, the GPU feeder's unit, prometheus.yml, its rules, alertmanager.yml.

    Example:
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> [path for path, _ in rendered_files(monitoring_plan(fleet, "a"))]
        ... # doctest: +NORMALIZE_WHITESPACE
        ['/etc/systemd/system/prometheus-node-exporter.service.d/50-vllm-fleet.conf',
         '/etc/systemd/system/prometheus.service.d/50-vllm-fleet.conf',
         '/etc/prometheus/vllm-fleet/prometheus.yml', '/etc/prometheus/vllm-fleet/fleet-rules.yml']
    """
    if plan is None:
        return []
    found = [(plan.node_exporter.path, plan.node_exporter.text)]
    if plan.gpu_metrics is not None:
        found.append((plan.gpu_metrics.unit_path, plan.gpu_metrics.unit_text))
    server = plan.prometheus
    if server is not None:
        found += [
            (server.service.path, server.service.text),
            (PROMETHEUS_CONFIG, server.config_text),
            (f"{server.config_dir}/{PROMETHEUS_RULES_NAME}", server.rules_text),
        ]
        if server.alertmanager is not None and server.alertmanager_config_path is not None:
            found += [
                (server.alertmanager.path, server.alertmanager.text),
                (server.alertmanager_config_path, server.alertmanager_config_text or ""),
            ]
    return found
