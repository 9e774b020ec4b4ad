"""``fleet drift --textfile``: each host's drift count, written where its node exporter's
textfile collector reads it, so that Prometheus has ``vllm_fleet_drift_findings`` and the
``FleetDriftFound`` alert fires on a host that drifted from the fleet file.

Only hosts the fleet's ``monitoring`` section covers get the file (the others run no node
exporter); a host that could not be checked gets none (its last file stays, with the time of
that check in ``vllm_fleet_drift_checked_timestamp_seconds``). The file is written whole
(beside its target, then renamed: the collector never reads half of it), over ssh. Run it
from cron (or a systemd timer) on the control machine, e.g. every 15 minutes.

Example:
    >>> from cli.drift.compare import Row
    >>> print(exposition([Row("a", "x", "1", "2", "drift"), Row("a", "y", "1", "1", "ok")],
    ...                  checked_at=1800000000), end="")  # doctest: +ELLIPSIS
    # HELP vllm_fleet_drift_findings Items of this host that differ from the fleet file ...
    # TYPE vllm_fleet_drift_findings gauge
    vllm_fleet_drift_findings 1
    ...
    vllm_fleet_drift_checked_timestamp_seconds 1800000000
"""

from __future__ import annotations

import shlex
import subprocess
import time

from cli import remote
from cli.drift.compare import DRIFT, ERROR, Row
from cli.inventory import connection_data
from fleet.catalog.paths import DRIFT_TEXTFILE
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet
from fleet.read.problems import FleetError

#: Series written: name, help, which rows it counts.
SERIES = (
    ("vllm_fleet_drift_findings",
     "Items of this host that differ from the fleet file (fleet drift).", DRIFT),
    ("vllm_fleet_drift_errors", "Items of this host fleet drift could not read.", ERROR),
)  # fmt: skip


def exposition(rows: list[Row], checked_at: float) -> str:
    """The textfile of one host's rows, in Prometheus's text format."""
    lines = []
    for name, help_text, status in SERIES:
        count = sum(1 for row in rows if row.status == status)
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {count}"]
    lines += [
        "# HELP vllm_fleet_drift_checked_timestamp_seconds When fleet drift last checked it.",
        "# TYPE vllm_fleet_drift_checked_timestamp_seconds gauge",
        f"vllm_fleet_drift_checked_timestamp_seconds {int(checked_at)}",
    ]
    return "\n".join(lines) + "\n"


def write_command(path: str = DRIFT_TEXTFILE) -> str:
    """The shell command that writes stdin to ``path`` whole (temporary file, rename).

    Example:
        >>> write_command("/t/d.prom")
        'umask 022 && cat > /t/.d.prom.new && mv -f /t/.d.prom.new /t/d.prom'
    """
    folder, _, name = path.rpartition("/")
    partial = shlex.quote(f"{folder}/.{name}.new")
    return f"umask 022 && cat > {partial} && mv -f {partial} {shlex.quote(path)}"


def publish(path: str, rows: list[Row], only: str | None = None) -> dict[str, str]:
    """Write each monitored, checked host's textfile; what happened, by host.

    + path: the fleet file; rows: ``fleet drift``'s rows; only: ``--host``
    """
    fleet = load_fleet(path)
    done: dict[str, str] = {}
    now = time.time()
    for name, host in fleet.hosts.items():
        if only and name != only:
            continue
        mine = [row for row in rows if row.host == name]
        if host_plan(fleet, name, secrets=lambda ref: "").monitoring is None:
            done[name] = "not monitored: no textfile written"
            continue
        if not mine or all(row.status == ERROR for row in mine):
            done[name] = "not checked: its last textfile stays"
            continue
        try:
            data = connection_data(name, host, path)
            result = remote.run(data, write_command(), exposition(mine, now), timeout=60)
        except (FleetError, OSError, subprocess.TimeoutExpired) as error:
            done[name] = f"not written: {error}"
            continue
        findings = sum(1 for row in mine if row.status == DRIFT)
        done[name] = (
            f"{DRIFT_TEXTFILE}: vllm_fleet_drift_findings {findings}"
            if result.returncode == 0
            else f"not written: {' '.join(result.stderr.split()) or result.returncode}"
        )
    return done
