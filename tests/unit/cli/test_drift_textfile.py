"""``fleet drift --textfile``: the drift count as the node exporter's textfile collector reads
it, checked by Debian's ``promtool check metrics``, named as the ``FleetDriftFound`` rule reads
it, written whole by the very shell command that runs on the hosts (here, on this machine).
Writing it over ssh onto a sandbox host, scraped by a real Prometheus: tests/e2e/
test_monitoring_e2e.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cli.drift.compare import DRIFT, ERROR, NA, OK, Row
from cli.drift.textfile import SERIES, exposition, publish, write_command
from fleet.catalog.alerts import defaults
from fleet.hostplan.monitoring import alert_rules

ROWS = [
    Row("a", "unit vllm-x.service", "present", "missing", DRIFT),
    Row("a", "sysctl vm.swappiness", "10", "60", DRIFT),
    Row("a", "driver", "580", "580", OK),
    Row("a", "gpu health", "—", "—", NA),
    Row("a", "models", "?", "?", ERROR),
    Row("b", "driver", "580", "570", DRIFT),
]


def test_counts_only_the_hosts_own_drift_rows() -> None:
    text = exposition([row for row in ROWS if row.host == "a"], checked_at=1800000000.7)
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples == ["vllm_fleet_drift_findings 2", "vllm_fleet_drift_errors 1",
                       "vllm_fleet_drift_checked_timestamp_seconds 1800000000"]  # fmt: skip


def test_the_textfile_passes_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing (apt-get install prometheus, as scripts/install.sh)")
    result = subprocess.run([promtool, "check", "metrics"], input=exposition(ROWS, 1.0),
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_fleet_drift_found_rule_reads_this_series() -> None:
    rules = alert_rules(defaults())
    expr = next(rule["expr"] for rule in rules if rule["alert"] == "FleetDriftFound")
    assert expr == f"{SERIES[0][0]} > 0"


def test_the_write_command_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "vllm_fleet_drift.prom"
    for text in (exposition(ROWS[:2], 1.0), exposition(ROWS[2:3], 2.0)):
        result = subprocess.run(["sh", "-c", write_command(str(target))], input=text,
                                capture_output=True, text=True, check=False)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert target.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm_fleet_drift.prom"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_only_monitored_checked_hosts_get_one(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("""\
version: 1
hosts:
  a: {address: 10.0.0.1, vllm: {version: "0.32.0", variant: cpu}}
  b: {address: 10.0.0.2, vllm: {version: "0.32.0", variant: cpu}}
""")
    assert publish(str(fleet), ROWS) == {"a": "not monitored: no textfile written",
                                         "b": "not monitored: no textfile written"}  # fmt: skip
    fleet.write_text(fleet.read_text() + "monitoring: {host: a}\n")
    unchecked = [Row("a", "host", "reachable", "ssh: timed out", ERROR)]
    assert publish(str(fleet), unchecked, only="a") == {"a": "not checked: its last textfile stays"}
