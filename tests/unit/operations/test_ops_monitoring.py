"""The monitoring operations with fake facts: the configuration installed only through the
promtool-checked installer, compared with the live files; the parts a fleet file no longer has
retired, and only those vllm-fleet installed (tests/e2e/test_monitoring_e2e.py runs both on a
real host).
"""

from __future__ import annotations

import hashlib

from fleet.catalog.paths import NODE_EXPORTER_DROPIN, PROMETHEUS_DROPIN
from operations import monitoring as ops
from tests.support.opharness import run_op

FILES = {"prometheus.yml": "global: {}\n", "fleet-rules.yml": "groups: []\n"}
ARGS = {
    "files": FILES,
    "live_dir": "/etc/prometheus/vllm-fleet",
    "staging_dir": "/var/lib/vllm-fleet/prometheus-staged",
    "script": "/usr/local/lib/vllm-fleet/hostside/prometheus_config.py",
    "promtool": "/usr/bin/promtool",
}


def live(texts: dict[str, str]):
    """A Sha256File fact answering for the live folder's files."""
    return lambda path: next(
        (hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()
         if path.endswith(f"/{name}")), None,
    )  # fmt: skip


def test_nothing_to_do_when_the_live_configuration_is_the_rendered_one():
    commands, noops = run_op(ops.prometheus_config_installed, {"Sha256File": live(FILES)}, **ARGS)
    assert commands == []
    assert noops == [
        "prometheus.yml, fleet-rules.yml in /etc/prometheus/vllm-fleet are as rendered"
    ]


def test_a_changed_rules_file_goes_through_the_checked_installer():
    old = {**FILES, "fleet-rules.yml": "groups: [old]\n"}
    facts = {"Sha256File": live(old), "File": lambda path: None, "Directory": lambda path: None}
    commands, _ = run_op(ops.prometheus_config_installed, facts, **ARGS)
    text = [str(c) for c in commands]
    assert text[0] == "install -d -m 700 /var/lib/vllm-fleet/prometheus-staged"
    assert text[-1] == (
        "python3 /usr/local/lib/vllm-fleet/hostside/prometheus_config.py --staged "
        "/var/lib/vllm-fleet/prometheus-staged --live /etc/prometheus/vllm-fleet --promtool "
        "/usr/bin/promtool --files prometheus.yml fleet-rules.yml"
    )
    # nothing writes the live folder but the installer
    assert not any("/etc/prometheus/vllm-fleet" in c for c in text[1:-1])


def test_retires_only_what_vllm_fleet_installed_and_the_fleet_dropped():
    present = {PROMETHEUS_DROPIN, NODE_EXPORTER_DROPIN}
    facts = {"File": lambda path: {"mode": 644} if path in present else None}
    commands, _ = run_op(ops.monitoring_retired, facts, keep=["node-exporter"])
    assert commands == [
        "systemctl disable --now prometheus.service 2>/dev/null || true",
        "apt-mark unhold prometheus >/dev/null 2>&1 || true",
        "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q prometheus",
        f"rm -rf {PROMETHEUS_DROPIN} /etc/prometheus/vllm-fleet "
        "/var/lib/vllm-fleet/prometheus-staged",
        "rmdir --ignore-fail-on-non-empty /etc/systemd/system/prometheus.service.d",
        "systemctl daemon-reload",
    ]


def test_a_prometheus_installed_by_hand_is_not_touched():
    commands, noops = run_op(ops.monitoring_retired, {"File": lambda path: None}, keep=[])
    assert commands == []
    assert noops == ["no monitoring parts beyond those the fleet file gives this host"]
