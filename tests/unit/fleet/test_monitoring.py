"""The monitoring section: Prometheus's address, its scrape targets and labels, its rendered
configuration and alert rules, proved with Debian's real ``promtool`` (check config, check
rules, and ``promtool test rules`` on synthetic series: every alert fires for a bad series and
stays quiet for the good one beside it).

promtool comes with Debian's ``prometheus`` package (scripts/install.sh installs it); these
tests skip without it on a developer's machine, and fail without it in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleet.catalog.alerts import ALERTS
from fleet.catalog.paths import PROMETHEUS_RULES_NAME
from fleet.checks.ledger import ledger_problems
from fleet.hostplan.monitoring import alert_rules, prometheus_argv, prometheus_config, rules_text
from fleet.load import load_fleet
from fleet.planner.monitoring import (
    host_exporters,
    prometheus_is_remote_only,
    prometheus_url,
    scrape_targets,
    thresholds,
)
from fleet.spec.models import Fleet

DATA = Path(__file__).resolve().parents[2] / "data" / "monitoring"
CPU = {"version": "0.32.0", "variant": "cpu"}
GPU = {"version": "0.32.0", "variant": "cu130"}
NVIDIA = {"nvidia": {"driver": "580"}}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/install.sh installs Debian's prometheus")
        pytest.skip("promtool is missing (apt-get install prometheus, as scripts/install.sh)")
    return found


def fleet_of(monitoring: dict, hosts: dict) -> Fleet:
    return Fleet.model_validate({"version": 1, "monitoring": monitoring, "hosts": hosts})


def two_hosts(**servers) -> Fleet:
    """A Prometheus host and a GPU host serving ``servers``."""
    return fleet_of(
        {"host": "mon", "exporters": {"gpu": {"node_exporter_port": 9101}}},
        {
            "mon": {"address": "10.0.0.10", "vllm": CPU},
            "gpu": {"address": "10.0.0.11", "vllm": GPU, "os": NVIDIA, "gpus": {"count": 2},
                    "servers": servers},
        },
    )  # fmt: skip


# --- where Prometheus is ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "bind", "url", "remote_only"),
    [
        ("sandbox", "127.0.0.1", "http://127.0.0.1:18600", False),
        ("10.0.0.5", "127.0.0.1", "http://127.0.0.1:18600", True),
        ("10.0.0.5", "0.0.0.0", "http://10.0.0.5:18600", False),
        ("10.0.0.5", "10.0.0.5", "http://10.0.0.5:18600", False),
        ("10.0.0.5", "::", "http://10.0.0.5:18600", False),
        ("fd00::5", "fd00::5", "http://[fd00::5]:18600", False),
    ],
)
def test_prometheus_url(address, bind, url, remote_only):
    fleet = fleet_of({"host": "m", "prometheus": {"port": 18600, "bind": bind}},
                     {"m": {"address": address, "vllm": CPU}})  # fmt: skip
    assert prometheus_url(fleet) == url
    assert prometheus_is_remote_only(fleet) is remote_only


def test_no_monitoring_has_no_url():
    fleet = Fleet.model_validate({"version": 1, "hosts": {"m": {"address": "x", "vllm": CPU}}})
    assert prometheus_url(fleet) is None


# --- targets and labels ---------------------------------------------------------------------


def test_servers_are_targets_with_host_server_model_gpu_labels():
    fleet = two_hosts(chat={"model": "m", "port": 8000, "host": "0.0.0.0", "gpus": [0, 1]})
    vllm = [t for t in scrape_targets(fleet) if t.job == "vllm"]
    assert [(t.address, t.labels) for t in vllm] == [
        ("10.0.0.11:8000", {"host": "gpu", "server": "chat", "model": "m", "gpu": "0,1"})
    ]


def test_every_host_has_a_node_exporter_on_its_own_port():
    fleet = two_hosts()
    nodes = {t.labels["host"]: t.address for t in scrape_targets(fleet) if t.job == "node"}
    assert nodes == {"mon": "127.0.0.1:9100", "gpu": "10.0.0.11:9101"}
    assert host_exporters(fleet, "gpu").node_bind == "0.0.0.0"
    assert host_exporters(fleet, "mon").node_bind == "127.0.0.1"
    assert host_exporters(fleet, "gpu").gpu == "textfile"
    assert host_exporters(fleet, "mon").gpu == "none"


def test_dcgm_where_declared():
    fleet = fleet_of(
        {"host": "g", "exporters": {"g": {"gpu_metrics": "dcgm", "dcgm_port": 9401}}},
        {"g": {"address": "10.0.0.1", "vllm": GPU, "os": NVIDIA, "gpus": {"count": 1}}},
    )
    assert [(t.job, t.address) for t in scrape_targets(fleet)] == [
        ("node", "127.0.0.1:9100"), ("dcgm", "127.0.0.1:9401")
    ]  # fmt: skip
    assert "vllm-fleet-dcgm" in rules_text(fleet)


def scraped(fleet: Fleet) -> dict[str, list[dict]]:
    config = yaml.safe_load(prometheus_config(fleet))
    return {job["job_name"]: job["static_configs"] for job in config["scrape_configs"]}


def test_a_server_added_is_scraped_and_one_removed_is_not():
    before = scraped(two_hosts(chat={"model": "m", "port": 8000, "host": "0.0.0.0"}))
    after = scraped(two_hosts(
        chat={"model": "m", "port": 8000, "host": "0.0.0.0"},
        guard={"model": "g", "port": 8001, "host": "0.0.0.0"},
    ))  # fmt: skip
    assert [c["labels"]["server"] for c in before["vllm"]] == ["chat"]
    assert [c["labels"]["server"] for c in after["vllm"]] == ["chat", "guard"]
    assert "vllm" not in scraped(two_hosts())


def with_endpoint(router: dict) -> Fleet:
    """Two replicas of one model behind a router on the GPU host."""
    fleet = two_hosts(
        chat={"model": "m", "port": 8000, "host": "0.0.0.0", "served_model_name": "chat"},
        chat2={"model": "m", "port": 8001, "host": "0.0.0.0", "served_model_name": "chat"},
    )
    data = fleet.model_dump(mode="json", exclude_unset=True)
    return Fleet.model_validate({**data, "endpoints": {"chat": {
        "replicas": ["gpu/chat", "gpu/chat2"], "router": {"host": "gpu", **router}}}})


def test_an_endpoints_router_is_scraped_with_its_labels(promtool, tmp_path):
    fleet = with_endpoint({"port": 9000, "bind": "0.0.0.0", "metrics_port": 9002})
    assert scraped(fleet)["vllm-router"] == [
        {"targets": ["10.0.0.11:9002"], "labels": {"host": "gpu", "endpoint": "chat", "model": "m"}}
    ]
    result = subprocess.run([promtool, "check", "config", str(written(tmp_path, fleet))],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm-router" not in scraped(two_hosts())


def test_a_router_port_clashing_with_an_exporter_is_refused():
    fleet = with_endpoint({"port": 9000, "bind": "0.0.0.0", "metrics_port": 9101})
    findings = list(ledger_problems(fleet))
    assert [(path, text) for path, text, _ in findings] == [(
        ("monitoring", "exporters", "gpu", "node_exporter_port"),
        "port 9101 on gpu is claimed twice: by the metrics port of endpoint chat's router "
        "(endpoints.chat.router.metrics_port) and by the node exporter of gpu",
    )]  # fmt: skip


def test_alertmanager_is_named_in_the_configuration():
    fleet = fleet_of({"host": "m", "alertmanager": {"port": 18602}},
                     {"m": {"address": "sandbox", "vllm": CPU}})  # fmt: skip
    config = yaml.safe_load(prometheus_config(fleet))
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:18602"
    ]


def test_retention_reaches_the_command_line():
    fleet = fleet_of({"host": "m", "prometheus": {"retention_days": 30, "retention_gib": 4}},
                     {"m": {"address": "sandbox", "vllm": CPU}})  # fmt: skip
    argv = prometheus_argv(fleet.monitoring)
    assert "--storage.tsdb.retention.time=30d" in argv
    assert "--storage.tsdb.retention.size=4096MB" in argv


# --- promtool: configuration and rules --------------------------------------------------------


def written(folder: Path, fleet: Fleet) -> Path:
    """The fleet's prometheus.yml and rules file in ``folder``, as on the Prometheus host."""
    (folder / "prometheus.yml").write_text(prometheus_config(fleet))
    (folder / PROMETHEUS_RULES_NAME).write_text(rules_text(fleet))
    return folder / "prometheus.yml"


@pytest.mark.parametrize(
    "path", ["tests/data/valid/monitoring-prometheus.yaml", "inventory/sandbox.yaml"]
)
def test_rendered_configuration_passes_promtool(promtool, tmp_path, path):
    fleet = load_fleet(Path(__file__).resolve().parents[3] / path)
    if fleet.monitoring is None:
        data = fleet.model_dump()
        fleet = Fleet.model_validate({**data, "monitoring": {"host": next(iter(fleet.hosts))}})
    config = written(tmp_path, fleet)
    result = subprocess.run([promtool, "check", "config", str(config)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_refuses_a_broken_configuration(promtool, tmp_path):
    """The check the deploy runs before a configuration replaces the live one has teeth."""
    (tmp_path / "prometheus.yml").write_text("scrape_configs:\n  - job_name: x\n    bogus: 1\n")
    result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode != 0


def promtool_test(
    promtool: str, folder: Path, fleet: Fleet, test: str
) -> subprocess.CompletedProcess:
    written(folder, fleet)
    shutil.copy(DATA / test, folder / test)
    return subprocess.run([promtool, "test", "rules", str(folder / test)],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_rules_pass_promtool_check(promtool, tmp_path):
    written(tmp_path, two_hosts())
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / PROMETHEUS_RULES_NAME)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_every_alert_fires_when_it_should_and_not_otherwise(promtool, tmp_path):
    result = promtool_test(promtool, tmp_path, two_hosts(), "rules-test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    tests = yaml.safe_load((DATA / "rules-test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    names = {rule["alert"] for rule in alert_rules(thresholds(two_hosts()))}
    fires = {case["alertname"] for case in cases if case["exp_alerts"]}
    assert fires == names
    # quiet: a good series beside the bad one (the expected list is exact), or none at all
    for test in tests:
        for case in test["alert_rule_test"]:
            if case["exp_alerts"]:
                series = [s["series"] for s in test["input_series"]]
                assert any("good" in s or 'gpu="1"' in s or "idle" in s for s in series), case


def test_a_threshold_from_the_fleet_file_changes_when_an_alert_fires(promtool, tmp_path):
    """With kv_cache_usage_percent 98 the 97 % cache of the test series no longer fires."""
    fleet = fleet_of({"host": "mon", "thresholds": {"kv_cache_usage_percent": 98}},
                     {"mon": {"address": "10.0.0.10", "vllm": CPU}})  # fmt: skip
    result = promtool_test(promtool, tmp_path, fleet, "rules-test.yml")
    assert result.returncode != 0
    assert "VllmKvCacheHigh" in result.stdout + result.stderr
    assert "VllmPreemptions" not in result.stdout + result.stderr


def test_dcgm_series_reach_the_gpu_alerts(promtool, tmp_path):
    fleet = fleet_of(
        {"host": "g", "exporters": {"g": {"gpu_metrics": "dcgm"}}},
        {"g": {"address": "10.0.0.1", "vllm": GPU, "os": NVIDIA, "gpus": {"count": 2}}},
    )
    result = promtool_test(promtool, tmp_path, fleet, "dcgm-test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_name_vllm_032_metrics():
    """The vllm: series the rules read are ones vLLM 0.32 defines (its v1 metrics logger)."""
    rules = " ".join(rule["expr"] for rule in alert_rules(thresholds(two_hosts())))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:request_success_total"):  # fmt: skip
        assert name in rules
    python = os.environ.get("FLEET_VLLM_PYTHON")
    if not python:
        return
    code = "import importlib.util; print(importlib.util.find_spec('vllm').origin)"
    origin = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    loggers = Path(origin.stdout.strip()).parent / "v1" / "metrics" / "loggers.py"
    source = loggers.read_text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions", "vllm:request_success"):
        assert f'"{name}"' in source, name  # fmt: skip


def test_alert_for_s_from_the_fleet_file_changes_when_an_alert_fires(promtool, tmp_path):
    """``alert_for_s: {VllmServerDown: 0}``: the server down at 1 min already fires (the test
    file expects it quiet then, after the default 1 min it fires)."""
    fleet = fleet_of({"host": "mon", "alert_for_s": {"VllmServerDown": 0, "ExporterDown": 5}},
                     {"mon": {"address": "10.0.0.10", "vllm": CPU}})  # fmt: skip
    rules = {rule["alert"]: rule for rule in alert_rules(thresholds(fleet), {"ExporterDown": 5})}
    assert rules["ExporterDown"]["for"] == "5s" and rules["VllmServerDown"]["for"] == "1m"
    result = promtool_test(promtool, tmp_path, fleet, "rules-test.yml")
    assert result.returncode != 0
    assert "VllmServerDown" in result.stdout + result.stderr
    assert "VllmKvCacheHigh" not in result.stdout + result.stderr
