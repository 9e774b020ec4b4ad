"""Operations of the fleet's monitoring: a Prometheus configuration put in place only after
``promtool check config`` passed, and the monitoring parts a fleet file no longer has retired.

Example:
    from operations import monitoring
    monitoring.prometheus_config_installed(name="Install prometheus.yml", files={...}, ...)
"""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Sha256File

from fleet.catalog.paths import (
    ALERTMANAGER_DROPIN,
    GPU_METRICS_UNIT,
    GPU_TEXTFILE,
    NODE_EXPORTER_DROPIN,
    PROMETHEUS_DIR,
    PROMETHEUS_DROPIN,
    PROMETHEUS_STAGING,
    UNIT_DIR,
)

#: The parts of monitoring vllm-fleet installs on a host: (marker file it writes, Debian
#: package it installs or None, unit, files to delete besides the marker).
PARTS: dict[str, tuple[str, str | None, str, tuple[str, ...]]] = {
    "prometheus": (PROMETHEUS_DROPIN, "prometheus", "prometheus.service",
                   (PROMETHEUS_DIR, PROMETHEUS_STAGING)),
    "alertmanager": (ALERTMANAGER_DROPIN, "prometheus-alertmanager",
                     "prometheus-alertmanager.service", ()),
    "node-exporter": (NODE_EXPORTER_DROPIN, "prometheus-node-exporter",
                      "prometheus-node-exporter.service", ()),
    "gpu-metrics": (f"{UNIT_DIR}/{GPU_METRICS_UNIT}", None, GPU_METRICS_UNIT, (GPU_TEXTFILE,)),
}  # fmt: skip


def sha256(text: str) -> str:
    """The SHA256 of a text as a file holds it."""
    return hashlib.sha256(text.encode()).hexdigest()


@operation()
def prometheus_config_installed(
    files: dict[str, str],
    live_dir: str,
    staging_dir: str,
    script: str,
    promtool: str,
    amtool: str | None = None,
):
    """Stage the configuration files, check them with promtool, and only then install them.

    + files: file name → text, the configuration first (its rules files beside it)
    + live_dir: where Prometheus reads them; staging_dir: where they wait for the check
    + script: the host-side prometheus_config.py; promtool: the installed promtool
    + amtool: check with this amtool instead (``amtool check-config``: Alertmanager's files)

    Compares with the live files (not the staged ones), so a configuration that promtool
    refused is staged and checked again at every deploy until it passes, and never installed.

    **Example:**

    .. code:: python

        prometheus_config_installed(files={"prometheus.yml": config, "fleet-rules.yml": rules},
            live_dir="/etc/prometheus/vllm-fleet",
            staging_dir="/var/lib/vllm-fleet/prometheus-staged",
            script="/usr/local/lib/vllm-fleet/hostside/prometheus_config.py",
            promtool="/usr/bin/promtool")
    """
    differ = [
        name for name, text in files.items()
        if host.get_fact(Sha256File, path=f"{live_dir}/{name}") != sha256(text)
    ]  # fmt: skip
    if not differ:
        host.noop(f"{', '.join(files)} in {live_dir} are as rendered")
        return
    yield StringCommand("install", "-d", "-m", "700", QuoteString(staging_dir))
    for name, text in files.items():
        yield FileUploadCommand(StringIO(text), f"{staging_dir}/{name}")
    yield StringCommand(
        "python3", QuoteString(script), "--staged", QuoteString(staging_dir),
        "--live", QuoteString(live_dir), "--promtool", QuoteString(promtool),
        *(["--amtool", QuoteString(amtool)] if amtool else []),
        "--files", *[QuoteString(name) for name in files],
    )  # fmt: skip


@operation()
def monitoring_retired(keep: list[str]):
    """Remove the monitoring parts vllm-fleet installed here that the fleet file no longer
    gives this host: their units stopped, the Debian packages removed (their data kept, as
    ``apt-get remove`` does), vllm-fleet's drop-ins, units and configuration deleted.

    + keep: the parts of :data:`PARTS` this host keeps

    A part counts as vllm-fleet's only when its marker (the drop-in or unit vllm-fleet writes)
    exists: a Prometheus installed by hand is never touched.

    **Example:**

    .. code:: python

        monitoring_retired(keep=["node-exporter"])   # Prometheus moved to another host
    """
    gone = [part for part in PARTS if part not in keep
            and host.get_fact(File, path=PARTS[part][0])]  # fmt: skip
    if not gone:
        host.noop("no monitoring parts beyond those the fleet file gives this host")
        return
    for part in gone:
        marker, package, unit, extra = PARTS[part]
        logger.warning(f"{host.print_prefix}{part} is no longer in the fleet file: removing it")
        yield StringCommand("systemctl", "disable", "--now", QuoteString(unit),
                            "2>/dev/null", "||", "true")  # fmt: skip
        if package is not None:
            yield StringCommand("apt-mark", "unhold", QuoteString(package), ">/dev/null",
                                "2>&1", "||", "true")  # fmt: skip
            yield StringCommand(
                "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "-q",
                QuoteString(package),
            )  # fmt: skip
        yield StringCommand("rm", "-rf", QuoteString(marker), *[QuoteString(p) for p in extra])
        if marker.endswith(".conf"):  # a drop-in: its folder goes too, when nothing else is in it
            folder = marker.rsplit("/", 1)[0]
            yield StringCommand("rmdir", "--ignore-fail-on-non-empty", QuoteString(folder))
    yield StringCommand("systemctl", "daemon-reload")
