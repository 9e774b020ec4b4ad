"""The fleet's monitoring on a host: Debian's node exporter everywhere (with GPU metrics from
nvidia-smi where the host has no DCGM exporter), Prometheus (and Alertmanager) on the
monitoring host, each a pinned, held package whose unit is changed by a drop-in only.

Every drop-in is written before its package is installed, so that the package's first start
already listens on the fleet's port (never on Debian's default 9090/9100). Prometheus's
configuration replaces the live one only after ``promtool check config`` passed; its TSDB stays
in Debian's /var/lib/prometheus/metrics2 across restarts and upgrades. Monitoring the fleet
file no longer gives a host is removed from it.

Example:
    from deploys.monitoring import monitoring
    monitoring()
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from deploys.plan import current_plan, upload_program
from fleet.hostplan.types import GpuMetricsUnit, PrometheusPlan, ServiceDropin
from operations.monitoring import monitoring_retired, prometheus_config_installed
from operations.nvidia import packages_held

PROMTOOL = "/usr/bin/promtool"
AMTOOL = "/usr/bin/amtool"


@deploy("Monitoring")
def monitoring() -> None:
    """Retire what the fleet file no longer has here, then install and run what it has."""
    plan = current_plan().monitoring
    keep = []
    if plan is not None:
        keep.append("node-exporter")
        if plan.gpu_metrics is not None:
            keep.append("gpu-metrics")
        if plan.prometheus is not None:
            keep.append("prometheus")
            if plan.prometheus.alertmanager is not None:
                keep.append("alertmanager")
    monitoring_retired(name="Remove monitoring the fleet file no longer gives this host", keep=keep)
    if plan is None:
        return
    _packaged_service(plan.node_exporter, "the node exporter")
    if plan.gpu_metrics is not None:
        _gpu_metrics(plan.gpu_metrics)
    if plan.prometheus is not None:
        _prometheus(plan.prometheus)


def _dropin(service: ServiceDropin, what: str) -> OperationMeta:
    dropin = files.put(
        name=f"Write the drop-in of {what} ({service.unit})",
        src=StringIO(service.text),
        dest=service.path,
        user="root", group="root", mode="644", create_remote_dir=True,
    )  # fmt: skip
    systemd.daemon_reload(name=f"Reload systemd for {service.unit}", _if=dropin.did_change)
    return dropin


def _install(service: ServiceDropin, what: str) -> OperationMeta:
    installed = apt.packages(
        name=f"Install {what} ({service.package})",
        packages=[service.package],
        no_recommends=True,
        update=True,
        cache_time=24 * 3600,
    )
    packages_held(name=f"Hold {service.package_name}", packages=[service.package_name])
    return installed


def _packaged_service(
    service: ServiceDropin, what: str, changed: tuple[OperationMeta, ...] = ()
) -> list[OperationMeta]:
    """Drop-in first (the package's first start uses it), then the pinned package; restarted
    when either changed; running and enabled."""
    dropin = _dropin(service, what)
    installed = _install(service, what)
    ops = [dropin, installed, *changed]
    server.shell(
        name=f"Restart {service.unit} (its drop-in or package changed)",
        commands=[f"systemctl reset-failed {service.unit} 2>/dev/null || true",
                  f"systemctl restart {service.unit}"],
        _if=any_changed(*ops),
    )  # fmt: skip
    systemd.service(name=f"Enable and start {service.unit}", service=service.unit,
                    running=True, enabled=True)  # fmt: skip
    return ops


def _gpu_metrics(unit: GpuMetricsUnit) -> None:
    path, program_ops = upload_program("gpu_metrics", "the GPU metrics feeder")
    del path
    unit_op = files.put(
        name=f"Write {unit.unit}",
        src=StringIO(unit.unit_text),
        dest=unit.unit_path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    systemd.daemon_reload(name=f"Reload systemd for {unit.unit}", _if=unit_op.did_change)
    systemd.service(name=f"Restart {unit.unit} (it changed)", service=unit.unit, running=True,
                    restarted=True, _if=any_changed(unit_op, *program_ops))  # fmt: skip
    systemd.service(name=f"Enable and start {unit.unit}", service=unit.unit, running=True,
                    enabled=True)  # fmt: skip


def _prometheus(plan: PrometheusPlan) -> None:
    service = plan.service
    dropin = _dropin(service, "Prometheus")
    installed = _install(service, "Prometheus")
    files.directory(name="Create the folder of the fleet's Prometheus configuration",
                    path=plan.config_dir, user="root", group="root", mode="755")  # fmt: skip
    cas = _scrape_cas(plan)
    script, script_ops = upload_program("prometheus_config", "the checked configuration installer")
    config = prometheus_config_installed(
        name="Install prometheus.yml and its rules (only once promtool check config passed)",
        files={"prometheus.yml": plan.config_text, "fleet-rules.yml": plan.rules_text},
        live_dir=plan.config_dir,
        staging_dir=plan.staging_dir,
        script=script,
        promtool=PROMTOOL,
    )
    restart = server.shell(
        name="Restart Prometheus (its drop-in or package changed; the TSDB stays)",
        commands=[f"systemctl reset-failed {service.unit} 2>/dev/null || true",
                  f"systemctl restart {service.unit}"],
        _if=any_changed(dropin, installed),
    )  # fmt: skip
    server.shell(
        name="Reload Prometheus's configuration",
        commands=[f"systemctl reset-failed {service.unit} 2>/dev/null || true",
                  f"systemctl reload-or-restart {service.unit}"],
        _if=any_changed(config, *cas),
    )  # fmt: skip
    started = systemd.service(name=f"Enable and start {service.unit}", service=service.unit,
                              running=True, enabled=True)  # fmt: skip
    server.shell(
        name="Wait until Prometheus is ready",
        commands=[f"python3 {script} --ready {plan.ready_url} --timeout 120"],
        _if=any_changed(restart, started, config),
    )
    del script_ops
    if plan.alertmanager is not None and plan.alertmanager_config_path is not None:
        _alertmanager(plan, plan.alertmanager, plan.alertmanager_config_path, script)


def _scrape_cas(plan: PrometheusPlan) -> list[OperationMeta]:
    """The CA file of each TLS server's https scrape, readable by the prometheus user (group)
    alone, written once the package made that user; the operations, for ``any_changed``."""
    if not plan.ca_files:
        return []
    files.directory(name="Create the folder of the CAs Prometheus trusts for its https scrapes",
                    path=plan.ca_dir, user="root", group="prometheus", mode="750")  # fmt: skip
    return [
        files.put(
            name=f"Write the CA Prometheus trusts for {ca.server}",
            src=StringIO(ca.text),
            dest=ca.path,
            user="root",
            group="prometheus",
            mode="640",
        )
        for ca in plan.ca_files
    ]


def _alertmanager(plan: PrometheusPlan, service: ServiceDropin, config_path: str,
                  script: str) -> None:  # fmt: skip
    """Drop-in, pinned package (it brings amtool), then its configuration, installed only once
    ``amtool check-config`` passed; restarted when any of them changed."""
    dropin = _dropin(service, "Alertmanager")
    installed = _install(service, "Alertmanager")
    folder, _, name = config_path.rpartition("/")
    config = prometheus_config_installed(
        name="Install alertmanager.yml (only once amtool check-config passed)",
        files={name: plan.alertmanager_config_text or ""},
        live_dir=folder,
        staging_dir=plan.staging_dir,
        script=script,
        promtool=PROMTOOL,
        amtool=AMTOOL,
    )
    server.shell(
        name=f"Restart {service.unit} (its drop-in, package or configuration changed)",
        commands=[f"systemctl reset-failed {service.unit} 2>/dev/null || true",
                  f"systemctl restart {service.unit}"],
        _if=any_changed(dropin, installed, config),
    )  # fmt: skip
    systemd.service(name=f"Enable and start {service.unit}", service=service.unit,
                    running=True, enabled=True)  # fmt: skip
