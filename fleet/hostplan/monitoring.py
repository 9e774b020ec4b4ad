"""What monitoring puts on hosts: the exporters' and Prometheus' drop-ins, the GPU feeder's
unit, ``prometheus.yml``, its alert rules and ``alertmanager.yml`` (YAML files are
``yaml.safe_dump``ed, never templated).

The scrape targets and thresholds are :mod:`fleet.planner.monitoring`'s; the section's rules
:mod:`fleet.checks.monitoring`'s.

Example:
    >>> from fleet.spec.models import Fleet
    >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
    ...     "a": {"address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
    >>> monitoring_plan(fleet, "a").prometheus.service.unit
    'prometheus.service'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import yaml

from fleet.catalog.alerts import ALERTS, Alert
from fleet.catalog.paths import (
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
    PROMETHEUS_TLS_DIR,
    TEXTFILE_DIR,
    UNIT_DIR,
    gpu_device,
    program_command,
    scrape_ca_path,
)
from fleet.hostplan import emit
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.templating import render
from fleet.hostplan.tls import trusted_text
from fleet.hostplan.types import (
    GpuMetricsUnit,
    MonitoringPlan,
    PrometheusPlan,
    ScrapeCa,
    ServiceDropin,
)
from fleet.planner.monitoring import (
    Exporters,
    ScrapeTarget,
    host_exporters,
    monitoring_section,
    scrape_targets,
    thresholds,
)
from fleet.spec.addresses import bracket, local_address
from fleet.spec.models import Fleet, Monitoring, SecretRef

#: Jobs in the order they appear in prometheus.yml.
JOBS = ("node", "dcgm", "vllm", "vllm-router")


def prometheus_config(fleet: Fleet) -> str:
    """The Prometheus configuration the fleet's Prometheus host runs, as YAML text.

    Each target is a static config of its own, so that its labels are exactly its own; the
    rules file sits beside the configuration (a relative name, so that a staged configuration
    is checked with its staged rules).

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> config = yaml.safe_load(prometheus_config(fleet))
        >>> config["rule_files"], [job["job_name"] for job in config["scrape_configs"]]
        (['fleet-rules.yml'], ['prometheus', 'node'])
    """
    monitoring = monitoring_section(fleet)
    interval = f"{monitoring.prometheus.scrape_interval_s}s"
    self_address = (
        f"{bracket(local_address(monitoring.prometheus.bind))}:{monitoring.prometheus.port}"
    )
    jobs = [
        {
            "job_name": "prometheus",
            "static_configs": [{"targets": [self_address], "labels": {"host": monitoring.host}}],
        }
    ]
    targets = scrape_targets(fleet)
    for job in JOBS:
        mine = [target for target in targets if target.job == job and target.scheme == "http"]
        if mine:
            jobs.append(
                {
                    "job_name": job,
                    "metrics_path": mine[0].metrics_path,
                    "static_configs": [
                        {"targets": [target.address], "labels": dict(target.labels)}
                        for target in mine
                    ],
                }
            )
        jobs += [_https_job(target) for target in targets
                 if target.job == job and target.scheme == "https"]
    config: dict = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [PROMETHEUS_RULES_NAME],
        "scrape_configs": jobs,
    }
    if monitoring.alertmanager is not None:
        address = local_address(monitoring.alertmanager.bind)
        config["alerting"] = {
            "alertmanagers": [
                {
                    "static_configs": [
                        {"targets": [f"{bracket(address)}:{monitoring.alertmanager.port}"]}
                    ]
                }
            ]
        }
    return _header("prometheus.yml") + yaml.safe_dump(config, sort_keys=False)


def _https_job(target: ScrapeTarget) -> dict:
    """The scrape job of one TLS server: https trusting its own CA file, the certificate checked
    for ``server_name`` where the address is not a name it covers. Its ``job`` label is the
    plain job's (``vllm``), so rules and dashboards see one job; the job's name
    (``vllm/HOST/SERVER``; ``/`` is in no host or server name) keeps it apart on Prometheus's
    targets page.

    Example:
        >>> from fleet.planner.monitoring import ScrapeTarget
        >>> _https_job(ScrapeTarget("vllm", "127.0.0.1:8443", {"host": "a", "server": "s"},
        ...            scheme="https", cafile="/ca.pem", tls_name="gpu-1.lan"))["tls_config"]
        {'ca_file': '/ca.pem', 'server_name': 'gpu-1.lan'}
    """
    tls: dict = {"ca_file": target.cafile}
    if target.tls_name:
        tls["server_name"] = target.tls_name
    return {
        "job_name": f"{target.job}/{target.labels['host']}/{target.labels['server']}",
        "scheme": "https",
        "metrics_path": target.metrics_path,
        "tls_config": tls,
        "static_configs": [
            {"targets": [target.address], "labels": {"job": target.job, **target.labels}}
        ],
    }


def scrape_cas(fleet: Fleet, secrets: Callable[[SecretRef], str]) -> tuple[ScrapeCa, ...]:
    """The CA file of each TLS server's scrape, as the Prometheus host gets it: the PEM its
    probes trust too (:func:`fleet.hostplan.tls.trusted_text`), read by reference.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> tls = {"certificate": {"file": "/c.pem"}, "key": {"file": "/k.pem"}}
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a"}, "hosts": {
        ...     "a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"},
        ...           "servers": {"s": {"model": "m", "port": 8443, "tls": tls}}}}})
        >>> [(ca.server, ca.path, ca.text) for ca in scrape_cas(fleet, lambda ref: ref.file)]
        [('a/s', '/etc/prometheus/vllm-fleet/tls/s@a.ca.pem', '/c.pem')]
    """
    return tuple(
        ScrapeCa(f"{host_name}/{name}", scrape_ca_path(host_name, name),
                 trusted_text(server.tls, secrets))
        for host_name, host in fleet.hosts.items()
        for name, server in host.servers.items()
        if server.tls is not None
    )


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


def _header(name: str) -> str:
    return f"# Managed by vllm-fleet ({name}, rendered from the fleet file): edits are replaced.\n"


#: The GPU series the textfile collector writes (hostside/gpu_metrics.py), and what DCGM's
#: exporter calls them (recording rules map DCGM's onto ours, so one set of alerts serves both).
GPU_METRICS = {
    "vllm_fleet_gpu_utilization_percent": "DCGM_FI_DEV_GPU_UTIL",
    "vllm_fleet_gpu_memory_used_bytes": "DCGM_FI_DEV_FB_USED * 1048576",
    "vllm_fleet_gpu_memory_total_bytes": "(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 1048576",
    "vllm_fleet_gpu_temperature_celsius": "DCGM_FI_DEV_GPU_TEMP",
    "vllm_fleet_gpu_power_watts": "DCGM_FI_DEV_POWER_USAGE",
}


def _duration(seconds: int) -> str:
    """A ``for:`` duration as Prometheus writes it.

    Example:
        >>> _duration(120), _duration(90), _duration(0)
        ('2m', '90s', '0m')
    """
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def alert_rules(
    values: dict[str, float],
    waits: dict[str, int] | None = None,
    alerts: Mapping[str, Alert] = ALERTS,
) -> list[dict]:
    """The alerting rules of the catalogue (:data:`fleet.catalog.alerts.ALERTS`), with ``values``
    (:func:`thresholds`) filled in, and each alert's ``for`` from ``waits`` (seconds, by alert
    name: ``monitoring.alert_for_s``) where given.

    Example:
        >>> from fleet.catalog.alerts import defaults
        >>> rules = alert_rules(defaults())
        >>> [rule["expr"] for rule in rules if rule["alert"] == "VllmPreemptions"]
        ['increase(vllm:num_preemptions_total[5m]) > 0']
    """
    out = []
    for name, alert in alerts.items():
        wait = _duration(waits[name]) if waits and name in waits else alert.wait
        rule: dict = {"alert": name, "expr": alert.expression(values)}
        if wait != "0m":
            rule["for"] = wait
        rule["labels"] = {"severity": alert.severity}
        rule["annotations"] = {"summary": alert.summary}
        out.append(rule)
    return out


def recording_rules() -> list[dict]:
    """DCGM exporter series recorded under the textfile collector's names."""
    return [{"record": ours, "expr": dcgm} for ours, dcgm in GPU_METRICS.items()]


def rules_text(fleet: Fleet, alerts: Mapping[str, Alert] = ALERTS) -> str:
    """The rules file the fleet's Prometheus loads (fleet-rules.yml), as YAML text: the
    catalogue's alerts (:data:`fleet.catalog.alerts.ALERTS`) with the fleet file's thresholds.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "monitoring": {"host": "a",
        ...     "thresholds": {"gpu_memory_percent": 90}}, "hosts": {}})
        >>> "> 90" in rules_text(fleet)
        True
    """
    waits = fleet.monitoring.alert_for_s if fleet.monitoring else {}
    rules = alert_rules(thresholds(fleet, alerts), waits, alerts)
    groups = [{"name": "vllm-fleet", "rules": rules}]
    if any(host_exporters(fleet, name).gpu == "dcgm" for name in fleet.hosts):
        groups.insert(0, {"name": "vllm-fleet-dcgm", "rules": recording_rules()})
    return _header(PROMETHEUS_RULES_NAME) + yaml.safe_dump(
        {"groups": groups}, sort_keys=False, allow_unicode=True, width=1000
    )


def prometheus_argv(monitoring: Monitoring) -> list[str]:
    """Prometheus's command line.

    Example:
        >>> from fleet.spec.models import Monitoring
        >>> prometheus_argv(Monitoring(host="a", prometheus={"retention_gib": 2.5}))[-1]
        '--storage.tsdb.retention.size=2560MB'
    """
    server = monitoring.prometheus
    argv = [
        "/usr/bin/prometheus",
        f"--config.file={PROMETHEUS_CONFIG}",
        f"--storage.tsdb.path={PROMETHEUS_DATA}",
        f"--web.listen-address={bracket(server.bind)}:{server.port}",
        f"--storage.tsdb.retention.time={server.retention_days}d",
    ]
    if server.retention_gib is not None:
        argv.append(f"--storage.tsdb.retention.size={math.ceil(server.retention_gib * 1024)}MB")
    return argv


def node_exporter_argv(exporters: Exporters) -> list[str]:
    """The node exporter's command line (its textfile folder is Debian's)."""
    return [
        "/usr/bin/prometheus-node-exporter",
        f"--web.listen-address={bracket(exporters.node_bind)}:{exporters.node_port}",
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
        f"--web.listen-address={bracket(manager.bind)}:{manager.port}",
        "--cluster.listen-address=",
    ]


#: Seconds between two nvidia-smi queries of the GPU textfile feeder.
GPU_QUERY_INTERVAL_S = 15


def exec_start(argv: list[str]) -> emit.Command:
    """An ExecStart= value, each word quoted for systemd (:func:`fleet.hostplan.emit.command`)."""
    return emit.command(argv)


def monitoring_plan(
    fleet: Fleet, host_name: str, secrets: Callable[[SecretRef], str] = read_secret
) -> MonitoringPlan | None:
    """What monitoring host ``host_name`` runs; None when the fleet has no monitoring (the
    deploy then retires whatever monitoring vllm-fleet installed there before); ``secrets``
    reads the CA of each TLS server the Prometheus host scrapes.

    Example:
        >>> from fleet.spec.models import Fleet
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
        text=render(
            "prometheus-node-exporter.conf.j2",
            exec_start=exec_start(node_exporter_argv(exporters)),
            textfile_dir=emit.comment(TEXTFILE_DIR),
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
            unit_text=render(
                "vllm-fleet-gpu-metrics.service.j2",
                exec_start=exec_start(argv),
                interval=emit.comment(GPU_QUERY_INTERVAL_S),
                textfile=emit.comment(GPU_TEXTFILE),
                textfile_dir=emit.setting(TEXTFILE_DIR),
                devices=[emit.setting(device) for device in devices],
            ),
            textfile=GPU_TEXTFILE,
        )
    prometheus = None
    if host_name == monitoring.host:
        prometheus = _prometheus_plan(fleet, monitoring, secrets)
    return MonitoringPlan(
        node_exporter=node, textfile_dir=TEXTFILE_DIR, gpu_metrics=gpu, prometheus=prometheus
    )


def _prometheus_plan(
    fleet: Fleet, monitoring: Monitoring, secrets: Callable[[SecretRef], str]
) -> PrometheusPlan:
    server = monitoring.prometheus
    service = ServiceDropin(
        package=f"prometheus={monitoring.versions.prometheus}",
        unit="prometheus.service",
        path=PROMETHEUS_DROPIN,
        text=render(
            "prometheus.conf.j2",
            exec_start=exec_start(prometheus_argv(monitoring)),
            data_dir=emit.setting("/var/lib/prometheus"),
        ),
    )
    manager = None
    if monitoring.alertmanager is not None:
        manager = ServiceDropin(
            package=f"prometheus-alertmanager={monitoring.versions.alertmanager}",
            unit="prometheus-alertmanager.service",
            path=ALERTMANAGER_DROPIN,
            text=render(
                "prometheus-alertmanager.conf.j2",
                exec_start=exec_start(alertmanager_argv(monitoring)),
                data_dir=emit.setting("/var/lib/prometheus"),
            ),
        )
    local = bracket(local_address(server.bind))
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
        ca_dir=PROMETHEUS_TLS_DIR,
        ca_files=scrape_cas(fleet, secrets),
    )


def rendered_files(plan: MonitoringPlan | None) -> list[tuple[str, str]]:
    """``(path, text)`` of every monitoring file a host gets (what ``fleet render`` shows):
    drop-ins, the GPU feeder's unit, prometheus.yml, its rules, alertmanager.yml (the scrapes'
    CA files, read by reference, are :attr:`PrometheusPlan.ca_files`).

    Example:
        >>> from fleet.spec.models import Fleet
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
