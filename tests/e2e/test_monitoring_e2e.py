"""Monitoring for real: Debian's Prometheus and node exporter on the shared vLLM host, scraping
a real CPU vLLM server, deployed from the fleet file's ``monitoring`` section.

One deploy brings up server ``mon-a``, the node exporter and Prometheus (with Alertmanager),
all in the monitoring port block (Prometheus and the exporter moved off 9090/9100); a query
through Prometheus's HTTP API returns the server's ``vllm:`` series with the fleet's labels.
A second fleet file replaces ``mon-a`` by ``mon-b`` (bound to 127.0.0.2, scraped there): after
its deploy ``mon-b`` is a target and
``mon-a`` is not, and deploying it again changes nothing. A broken configuration is refused by
the checked installer on the host and the live one keeps working; the TSDB survives a restart;
a last deploy without ``monitoring`` removes it from the host (the modules after this one
deploy fleet files without it onto the same host).
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from cli.inventory import connection_data
from cli.status import prometheus
from fleet.catalog.paths import PROMETHEUS_CONFIG, PROMETHEUS_DIR, remote_program
from fleet.load import load_fleet
from fleet.planner.monitoring import prometheus_url
from tests.support import e2e
from tests.support.wait import wait_until

pytestmark = pytest.mark.e2e

HOST = e2e.VLLM_HOST
PROMETHEUS_PORT, NODE_PORT, ALERTMANAGER_PORT, PORT_A, PORT_B = e2e.MONITORING_PORTS[:5]

SERVER = """\
      {name}:
        model: tiny-llama
        port: {port}
        host: {bind}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
"""
#: Where each server listens: ``mon-b`` on another loopback address than 127.0.0.1, so that
#: its scrape target is where it really listens (issue 23).
BINDS = {"mon-a": "127.0.0.1", "mon-b": "127.0.0.2"}
MONITORING = f"""\
monitoring:
  host: {HOST}
  prometheus: {{port: {PROMETHEUS_PORT}, scrape_interval_s: 2, retention_days: 2}}
  alertmanager: {{port: {ALERTMANAGER_PORT}}}
  node_exporter_port: {NODE_PORT}
  thresholds: {{kv_cache_usage_percent: 90}}
  alert_for_s: {{VllmServerDown: 2, ExporterDown: 2}}
"""


def fleet_text(servers: dict[str, int], monitored: bool = True) -> str:
    body = "".join(SERVER.format(name=name, port=port, bind=BINDS[name])
                   for name, port in servers.items())  # fmt: skip
    return f"""\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-llama:
    url: "{e2e.TESTMODEL_URL}"
    sha256: "{e2e.TESTMODEL_SHA}"
hosts:
  {HOST}:
    address: sandbox
    servers:
{body}{MONITORING if monitored else ""}"""


def deployed(folder: Path, servers: dict[str, int], monitored: bool = True) -> tuple[Path, str]:
    fleet = folder / "fleet.yaml"
    fleet.write_text(fleet_text(servers, monitored))
    start = time.monotonic()
    result = e2e.deploy(fleet)
    print(f"deploy {sorted(servers)} monitored={monitored}: {time.monotonic() - start:.0f} s")
    assert result.returncode == 0, e2e.output(result)[-6000:]
    return fleet, e2e.output(result)


def api(url: str, path: str, **query: str) -> dict:
    """One call of Prometheus's HTTP API; its ``data``."""
    address = f"{url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(address, timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return body["data"]


def targets(url: str) -> dict[tuple[str, str], str]:
    """The active targets: (job, server or host) → health."""
    active = api(url, "targets", state="active")["activeTargets"]
    return {(t["labels"]["job"], t["labels"].get("server", t["labels"]["host"])): t["health"]
            for t in active}  # fmt: skip


def eventually(check, timeout: float = 60):
    """``check()``'s first truthy answer within ``timeout`` seconds (its last answer fails)."""
    return wait_until(check, timeout, interval=1)


@pytest.fixture(scope="module")
def first_fleet(vllm_host, testmodel_server, tmp_path_factory) -> Path:
    """The fleet file with ``mon-a`` and monitoring, deployed."""
    fleet, output = deployed(tmp_path_factory.mktemp("mon-1"), {"mon-a": PORT_A})
    FIRST_OUTPUT.append(output)
    return fleet


#: The first deploy's output.
FIRST_OUTPUT: list[str] = []


@pytest.fixture(scope="module")
def first(first_fleet) -> str:
    """Prometheus's URL of the first fleet."""
    url = prometheus_url(load_fleet(first_fleet))
    assert url == f"http://127.0.0.1:{PROMETHEUS_PORT}"
    return url


def status(fleet: Path, *args: str) -> tuple[int, dict]:
    """``fleet status FLEET --json``: its exit status and report."""
    result = e2e.fleet_cli(fleet, "status", str(fleet), "--json", *args, timeout=120)
    assert result.stdout.startswith("{"), e2e.output(result)[-3000:]
    return result.returncode, json.loads(result.stdout)


def parts(report: dict) -> dict[str, tuple[str, str]]:
    """Monitoring part → (health, source) of the report's rows on the shared host."""
    return {r["part"]: (r["health"], r["source"]) for r in report["monitoring"]
            if r["host"] == HOST}  # fmt: skip


def alerts(url: str, name: str) -> list[dict]:
    """The alerts named ``name`` that Prometheus holds now (pending or firing)."""
    return [a for a in api(url, "alerts")["alerts"] if a["labels"]["alertname"] == name]


def test_prometheus_scrapes_the_server_and_the_node_exporter(first):
    found = eventually(lambda: (t := targets(first)).get(("vllm", "mon-a")) == "up"
                       and t.get(("node", HOST)) == "up" and t)  # fmt: skip
    assert set(found) == {("prometheus", HOST), ("node", HOST), ("vllm", "mon-a")}


def test_a_query_returns_the_servers_vllm_series_with_the_fleets_labels(first):
    result = eventually(
        lambda: api(first, "query", query='vllm:num_requests_running{server="mon-a"}')["result"]
    )
    labels = result[0]["metric"]
    assert labels["host"] == HOST
    assert labels["server"] == "mon-a"
    assert labels["model"] == "tiny-llama"
    assert labels["job"] == "vllm"
    assert labels["instance"] == f"127.0.0.1:{PORT_A}"


def test_node_exporter_listens_on_the_fleets_port_not_9100(first):
    listening = e2e.on_host("ss -Hltnp").stdout
    assert f"127.0.0.1:{NODE_PORT} " in listening and "prometheus-node" in listening
    assert f"127.0.0.1:{PROMETHEUS_PORT} " in listening
    assert ":9100 " not in listening and ":9090 " not in listening


def test_rules_are_loaded_with_the_fleets_threshold(first):
    groups = api(first, "rules")["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert "VllmServerDown" in rules and "GpuTemperatureCritical" in rules
    assert rules["VllmKvCacheHigh"]["query"].endswith("> 90")
    assert all(rule["health"] == "ok" for rule in rules.values())


def test_alertmanager_is_prometheus_alertmanager(first):
    managers = eventually(lambda: api(first, "alertmanagers")["activeAlertmanagers"])
    assert managers[0]["url"] == f"http://127.0.0.1:{ALERTMANAGER_PORT}/api/v2/alerts"


@pytest.mark.parametrize(
    "unit", ["prometheus.service", "prometheus-node-exporter.service",
             "prometheus-alertmanager.service"],
)  # fmt: skip
def test_units_are_hardened(first, unit):
    """``systemd-analyze security`` of each unit with vllm-fleet's drop-in, live (Debian's own:
    prometheus 4.0, node exporter 9.2, alertmanager 9.2; offline with the drop-ins 1.2–1.5:
    docs/monitoring.md)."""
    text = e2e.on_host(f"systemd-analyze security --no-pager {unit} | tail -1").stdout
    exposure = float(text.split("exposure level for")[1].split(":")[1].split()[0])
    print(f"{unit}: {text.strip()}")
    assert exposure <= 2.0, text


def test_a_broken_configuration_never_replaces_the_working_one(first):
    script = remote_program("prometheus_config")
    before = e2e.on_host(f"sha256sum {PROMETHEUS_CONFIG}").stdout
    refused = e2e.on_host(
        f"rm -rf /tmp/broken && mkdir /tmp/broken && cp {PROMETHEUS_DIR}/* /tmp/broken/ && "
        "printf 'scrape_configs:\\n  - job_name: x\\n    scrape_interval: soon\\n' "
        ">> /tmp/broken/prometheus.yml && "
        f"python3 {script} --staged /tmp/broken --live {PROMETHEUS_DIR} "
        "--files prometheus.yml fleet-rules.yml"
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "keeps the working one" in refused.stderr
    assert e2e.on_host(f"sha256sum {PROMETHEUS_CONFIG}").stdout == before
    assert targets(first).get(("vllm", "mon-a")) == "up"


def test_the_tsdb_survives_a_restart(first):
    def samples() -> float:
        result = api(first, "query", query='count_over_time(up{job="node"}[1h])')["result"]
        return float(result[0]["value"][1]) if result else 0

    before = eventually(lambda: samples() >= 3 and samples())
    assert e2e.on_host("systemctl restart prometheus.service").returncode == 0
    e2e.on_host(f"python3 {remote_program('prometheus_config')} --ready "
                f"http://127.0.0.1:{PROMETHEUS_PORT}/-/ready")  # fmt: skip
    assert eventually(lambda: samples() >= before and samples()) >= before


def test_fleet_status_takes_its_figures_from_the_fleets_prometheus(first_fleet, first):
    eventually(lambda: targets(first).get(("vllm", "mon-a")) == "up")
    code, report = status(first_fleet)
    assert code == 0, report
    assert report["prometheus"] == first and "prometheus" not in report["unreachable"]
    [server] = report["servers"]
    assert (server["server"], server["health"], server["source"]) == ("mon-a", "up", "prometheus")
    assert server["running"] == 0 and server["kv_cache_pct"] is not None
    assert parts(report) == {"node": ("up", "prometheus"), "prometheus": ("up", "prometheus"),
                             "alertmanager": ("up", "host")}  # fmt: skip
    screen = e2e.fleet_cli(first_fleet, "status", str(first_fleet), timeout=120)
    print(screen.stdout)  # the screen docs/monitoring.md and the README show
    assert screen.returncode == 0 and f"figures from Prometheus at {first}" in screen.stdout


def test_a_prometheus_on_loopback_of_a_remote_host_is_asked_there_over_ssh(first_fleet, first):
    """The path a real host's Prometheus on 127.0.0.1 takes (the request program, over ssh),
    run against the sandbox host's: the same answers as asked directly."""
    fleet = load_fleet(first_fleet)
    data = connection_data(HOST, fleet.hosts[HOST], str(first_fleet))
    ask = prometheus.over_ssh(data, PROMETHEUS_PORT)
    over_ssh = {(labels["job"], labels["host"]): value
                for labels, value in ask(first, prometheus.MONITORING_UP)}  # fmt: skip
    direct = {(labels["job"], labels["host"]): value
              for labels, value in prometheus.query(first, prometheus.MONITORING_UP)}  # fmt: skip
    assert over_ssh == direct == {("node", HOST): 1.0, ("prometheus", HOST): 1.0}
    assert ask(first, 'vllm:num_requests_running{server="mon-a"}')[0][1] == 0


def test_the_deploy_prints_and_records_the_start_in_phases(first_fleet):
    """The deploy's own line for the start it made; ``fleet status --startup`` shows it from
    the record (and the journal), with every phase the CPU build logs."""
    assert "mon-a: ready in " in FIRST_OUTPUT[0], FIRST_OUTPUT[0][-3000:]
    _, report = status(first_fleet, "--startup")
    last = report["startup"][f"{HOST}/mon-a"][-1]
    assert last["recorded"] and last["ready"] and last["version"] == "0.32.0"
    logged = {name: value for name, value in last["phases"].items()
              if name != "CUDA graph capture"}  # fmt: skip
    assert all(value is not None and value >= 0 for value in logged.values()), last
    print(f"mon-a start: {last}")


def test_fleet_status_says_when_prometheus_does_not_answer_and_asks_the_hosts(first_fleet, first):
    assert e2e.on_host("systemctl stop prometheus.service").returncode == 0
    try:
        code, report = status(first_fleet)
    finally:
        e2e.on_host("systemctl start prometheus.service")
        e2e.on_host(f"python3 {remote_program('prometheus_config')} --ready {first}/-/ready")
    assert code == 2  # Prometheus itself is down
    assert report["unreachable"]["prometheus"].startswith(f"{first}: <urlopen error")
    assert report["unreachable"]["prometheus"].endswith("(figures from the hosts)")
    [server] = report["servers"]
    assert (server["health"], server["source"]) == ("up", "host")
    assert parts(report)["prometheus"] == ("down", "host")
    assert parts(report)["node"] == ("up", "host")


def test_a_stopped_node_exporter_is_down_and_its_alert_fires(first_fleet, first):
    assert e2e.on_host("systemctl stop prometheus-node-exporter.service").returncode == 0
    try:
        firing = eventually(lambda: [a for a in alerts(first, "ExporterDown")
                                     if a["state"] == "firing"], timeout=60)  # fmt: skip
        code, report = status(first_fleet)
    finally:
        e2e.on_host("systemctl start prometheus-node-exporter.service")
    assert firing[0]["labels"]["host"] == HOST and firing[0]["labels"]["job"] == "node"
    assert code == 2 and parts(report)["node"] == ("down", "prometheus")
    node = next(r for r in report["monitoring"] if r["part"] == "node")
    assert node["state"] == "inactive (dead), Prometheus: scrape failed"
    eventually(lambda: targets(first).get(("node", HOST)) == "up")
    eventually(lambda: not alerts(first, "ExporterDown"), timeout=30)


def test_a_stopped_server_is_down_and_its_alert_fires(first_fleet, first):
    """The server stays stopped for the drift test below; the next deploy retires it."""
    assert e2e.on_host("systemctl stop vllm-mon-a.service").returncode == 0
    firing = eventually(lambda: [a for a in alerts(first, "VllmServerDown")
                                 if a["state"] == "firing"], timeout=60)  # fmt: skip
    assert firing[0]["labels"]["server"] == "mon-a" and firing[0]["labels"]["host"] == HOST
    code, report = status(first_fleet)
    [server] = report["servers"]
    assert code == 2 and server["health"] == "down"
    assert server["state"].startswith("inactive") and "Prometheus: scrape failed" in server["state"]


def test_fleet_drift_textfile_fires_fleet_drift_found(first_fleet, first):
    """The stopped server is drift: ``fleet drift --textfile`` writes the count onto the host,
    the node exporter exposes it, and FleetDriftFound fires."""
    result = e2e.fleet_cli(first_fleet, "drift", str(first_fleet), "--json", "--textfile",
                           timeout=300)  # fmt: skip
    rows = json.loads(result.stdout)["rows"]
    found = sum(1 for row in rows if row["host"] == HOST and row["status"] == "drift")
    assert found >= 1 and "vllm-mon-a.service" in json.dumps(rows), rows
    assert f"{HOST}: /var/lib/prometheus/node-exporter/vllm_fleet_drift.prom: " \
           f"vllm_fleet_drift_findings {found}" in result.stderr  # fmt: skip
    query = f'vllm_fleet_drift_findings{{host="{HOST}"}}'
    series = eventually(lambda: api(first, "query", query=query)["result"])
    assert float(series[0]["value"][1]) == found
    firing = eventually(lambda: [a for a in alerts(first, "FleetDriftFound")
                                 if a["state"] == "firing"], timeout=30)  # fmt: skip
    assert firing[0]["labels"]["host"] == HOST


def test_amtool_refuses_a_broken_alertmanager_configuration(first):
    live = "/etc/prometheus/vllm-fleet/alertmanager.yml"
    before = e2e.on_host(f"sha256sum {live}").stdout
    refused = e2e.on_host(
        "rm -rf /tmp/broken-am && mkdir /tmp/broken-am && "
        "printf 'route: {receiver: nobody}\\nreceivers: [{name: fleet}]\\n' "
        "> /tmp/broken-am/alertmanager.yml && "
        f"python3 {remote_program('prometheus_config')} --staged /tmp/broken-am "
        "--live /etc/prometheus/vllm-fleet --amtool /usr/bin/amtool --files alertmanager.yml"
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "amtool refused the new configuration" in refused.stderr
    assert e2e.on_host(f"sha256sum {live}").stdout == before


@pytest.fixture(scope="module")
def second(first, tmp_path_factory) -> tuple[Path, str]:
    """``mon-a`` replaced by ``mon-b`` in the fleet file, deployed."""
    return deployed(tmp_path_factory.mktemp("mon-2"), {"mon-b": PORT_B})


def test_a_server_added_appears_and_one_removed_disappears(first, second):
    found = eventually(lambda: (t := targets(first)).get(("vllm", "mon-b")) == "up" and t)
    assert ("vllm", "mon-a") not in found
    running = api(first, "query", query='vllm:num_requests_running{server="mon-b"}')["result"]
    assert running, running
    # scraped where it listens: 127.0.0.2, not the 127.0.0.1 where nothing answers
    assert {r["metric"]["instance"] for r in running} == {f"127.0.0.2:{PORT_B}"}, running


def test_a_second_deploy_changes_nothing(second):
    fleet, _ = second
    result = e2e.deploy(fleet)
    assert result.returncode == 0, e2e.output(result)[-4000:]
    assert e2e.changes(e2e.output(result)) == 0, e2e.changed_rows(e2e.output(result))


@pytest.mark.parametrize("package", ["prometheus", "prometheus-node-exporter"])
def test_packages_are_pinned_and_held(second, package):
    held = e2e.on_host("apt-mark showhold").stdout.split()
    assert package in held


def test_a_fleet_without_monitoring_removes_it(second, tmp_path_factory):
    deployed(tmp_path_factory.mktemp("mon-3"), {"mon-b": PORT_B}, monitored=False)
    left = e2e.on_host(
        "dpkg-query -W -f '${db:Status-Abbrev}${Package}\\n' prometheus "
        "prometheus-node-exporter prometheus-alertmanager 2>/dev/null | grep '^ii' ; "
        f"ls {PROMETHEUS_DIR} /etc/systemd/system/prometheus*.service.d 2>/dev/null; true"
    ).stdout
    assert left.strip() == ""
    listening = e2e.on_host("ss -Hltn").stdout
    assert f":{PROMETHEUS_PORT} " not in listening and f":{NODE_PORT} " not in listening
