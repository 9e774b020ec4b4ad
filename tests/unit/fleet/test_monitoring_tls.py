"""Prometheus scrapes TLS servers over https: each such server a job of its own (labelled
``job="vllm"``, as the alerts and ``fleet status`` query it), trusting the server's CA delivered
onto the Prometheus host, checking the name its certificate covers where the scrape address is
loopback. Proved on the rendered configuration, with Debian's ``promtool check config``, and by
a real Prometheus scraping a TLS server here (both skip without Debian's prometheus package).
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from fleet.checks.ledger import host_claims, ledger_problems
from fleet.checks.monitoring import check_monitoring
from fleet.hostplan.monitoring import monitoring_plan, prometheus_config
from fleet.load import load_fleet
from fleet.planner.monitoring import server_targets
from fleet.spec.models import Fleet
from tests.support.fakeserver import FakeServer
from tests.support.testca import TestCA, cert_pem

CPU = {"version": "0.32.0", "variant": "cpu"}
TLS = {"certificate": {"file": "/tls/s.pem"}, "key": {"file": "/tls/s.key"}}
VALID = Path(__file__).resolve().parents[2] / "data" / "valid" / "monitoring-tls-server.yaml"


def fleet_of(
    servers_mon: dict,
    servers_gpu: dict,
    mon_address: str = "10.0.0.10",
    gpu_address: str = "10.0.0.11",
) -> Fleet:
    return Fleet.model_validate(
        {
            "version": 1,
            "monitoring": {"host": "mon"},
            "hosts": {
                "mon": {"address": mon_address, "vllm": CPU, "servers": servers_mon},
                "gpu": {"address": gpu_address, "vllm": CPU, "servers": servers_gpu},
            },
        }
    )


def server(port: int = 8443, host: str = "0.0.0.0", **tls: object) -> dict:
    return {"model": "m", "port": port, "host": host, "tls": {**TLS, **tls}}


def jobs(fleet: Fleet) -> dict[str, dict]:
    config = yaml.safe_load(prometheus_config(fleet))
    return {job["job_name"]: job for job in config["scrape_configs"]}


# --- the scrape targets ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "bind", "address", "tls_name"),
    [
        ("gpu", "0.0.0.0", "10.0.0.11:8443", ""),  # the host's address: on the certificate
        ("gpu", "10.0.0.11", "10.0.0.11:8443", ""),
        ("mon", "0.0.0.0", "127.0.0.1:8443", "10.0.0.10"),  # loopback: the name is checked
        ("mon", "::", "[::1]:8443", "10.0.0.10"),
        ("mon", "10.0.0.10", "10.0.0.10:8443", ""),
    ],
)
def test_a_tls_server_is_an_https_target_checked_for_its_certificates_name(
        where, bind, address, tls_name):  # fmt: skip
    servers = {"s": server(host=bind)}
    fleet = fleet_of(servers if where == "mon" else {}, servers if where == "gpu" else {})
    [target] = server_targets(fleet)
    assert (target.scheme, target.address, target.tls_name, target.cafile) == (
        "https",
        address,
        tls_name,
        f"/etc/prometheus/vllm-fleet/tls/s@{where}.ca.pem",
    )


def test_a_host_name_address_is_the_server_name_of_a_loopback_scrape():
    fleet = fleet_of({"s": server()}, {}, mon_address="mon.lan.example")
    job = jobs(fleet)["vllm/mon/s"]
    assert job["tls_config"] == {
        "ca_file": "/etc/prometheus/vllm-fleet/tls/s@mon.ca.pem",
        "server_name": "mon.lan.example",
    }


# --- the rendered configuration -------------------------------------------------------------


def test_plain_and_tls_servers_keep_one_job_label_and_their_labels():
    fleet = fleet_of(
        {}, {"plain": {"model": "m", "port": 8000, "host": "0.0.0.0"}, "secure": server()}
    )
    found = jobs(fleet)
    assert [c["labels"]["server"] for c in found["vllm"]["static_configs"]] == ["plain"]
    assert "scheme" not in found["vllm"] and "tls_config" not in found["vllm"]
    secure = found["vllm/gpu/secure"]
    assert secure["scheme"] == "https"
    assert secure["tls_config"] == {"ca_file": "/etc/prometheus/vllm-fleet/tls/secure@gpu.ca.pem"}
    assert secure["static_configs"] == [
        {
            "targets": ["10.0.0.11:8443"],
            "labels": {"job": "vllm", "host": "gpu", "server": "secure", "model": "m"},
        }
    ]


def test_the_ca_files_hold_the_servers_ca_or_its_certificate_and_go_to_prometheus_alone():
    fleet = fleet_of({}, {"pinned": server(), "signed": server(port=8444, ca={"env": "LAN_CA"})})
    texts = {"/tls/s.pem": "CERTIFICATE", "/tls/s.key": "KEY", "LAN_CA": "LAN CA"}
    plan = monitoring_plan(fleet, "mon", secrets=lambda ref: texts[ref.file or ref.env])
    assert plan is not None and plan.prometheus is not None
    assert [(ca.server, ca.path, ca.text) for ca in plan.prometheus.ca_files] == [
        ("gpu/pinned", "/etc/prometheus/vllm-fleet/tls/pinned@gpu.ca.pem", "CERTIFICATE"),
        ("gpu/signed", "/etc/prometheus/vllm-fleet/tls/signed@gpu.ca.pem", "LAN CA"),
    ]
    assert "LAN CA" not in repr(plan.prometheus.ca_files)
    gpu = monitoring_plan(fleet, "gpu", secrets=lambda ref: texts[ref.file or ref.env])
    assert gpu is not None and gpu.prometheus is None


def test_the_ledger_gives_each_ca_file_to_prometheus():
    fleet = fleet_of({}, {"s": server()})
    claims = [(c.kind, c.value, c.owner) for c in host_claims(fleet)["mon"]]
    assert ("file", "/etc/prometheus/vllm-fleet/tls/s@gpu.ca.pem", "Prometheus") in claims
    assert ("directory", "/etc/prometheus/vllm-fleet/tls", "Prometheus") in claims
    assert list(ledger_problems(fleet)) == []


def test_the_valid_example_loads_and_renders_two_https_jobs():
    fleet = load_fleet(str(VALID))
    found = jobs(fleet)
    assert found["vllm/box/secure"]["tls_config"]["server_name"] == "10.0.0.1"
    assert "server_name" not in found["vllm/gpu/mutual"]["tls_config"]  # optional mTLS: scraped
    assert "vllm" not in found


def test_optional_client_certificates_are_scraped_and_required_ones_refused():
    fleet = fleet_of(
        {}, {"s": server(client_ca={"file": "/tls/c.pem"}, client_certificates="optional")}
    )
    assert list(check_monitoring(fleet)) == []
    # required is refused by the spec already (tests/data/invalid/tls-client-required.yaml);
    # the monitoring rule stands behind it (its doctest builds the refused value directly)


# --- promtool and a real Prometheus ---------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is missing (apt-get install prometheus, as scripts/install.sh)")
    return found


def with_ca_files_in(config_text: str, folder: Path, text: str) -> Path:
    """The rendered configuration with each CA file written below ``folder`` (same name)."""
    config = yaml.safe_load(config_text)
    for job in config["scrape_configs"]:
        if "tls_config" in job:
            path = folder / Path(job["tls_config"]["ca_file"]).name
            path.write_text(text)
            job["tls_config"]["ca_file"] = str(path)
    config.pop("rule_files")
    written = folder / "prometheus.yml"
    written.write_text(yaml.safe_dump(config, sort_keys=False))
    return written


@pytest.mark.parametrize("mon_address", ["10.0.0.10", "fd00::10", "mon.lan.example"])
def test_promtool_accepts_the_rendered_https_jobs(promtool, tmp_path, mon_address):
    fleet = fleet_of(
        {"s": server(), "v6": server(port=8444, host="::")},
        {"s": server(), "t": server(port=8444, host="10.0.0.11")},
        mon_address=mon_address,
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(fleet))
    (tmp_path / "fleet-rules.yml").write_text("groups: []\n")
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ca = TestCA()
    written = with_ca_files_in(config.read_text(), tmp_path, cert_pem(ca.cert))
    result = subprocess.run(
        [promtool, "check", "config", str(written)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="Debian's prometheus package is not installed"
)
def test_a_real_prometheus_scrapes_a_tls_server_as_job_vllm(tmp_path):
    """The server on the Prometheus host binds every interface; its certificate names the host's
    address (10.9.9.9) only, and Prometheus connects to loopback: server_name makes it pass. A
    second server's CA file holds another CA: it is down with a certificate error."""
    ca, other = TestCA(), TestCA("another CA")
    files = ca.server_files(tmp_path, ["10.9.9.9"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.certificate, files.key)
    port = free_port()
    with FakeServer(tls=context) as good, FakeServer(tls=context) as wrong:
        tls = {
            "certificate": {"file": str(files.certificate)},
            "key": {"file": str(files.key)},
            "ca": {"file": str(files.ca)},
        }
        fleet = Fleet.model_validate(
            {
                "version": 1,
                "monitoring": {"host": "a", "prometheus": {"port": port, "scrape_interval_s": 1}},
                "hosts": {
                    "a": {
                        "address": "10.9.9.9",
                        "vllm": CPU,
                        "servers": {
                            "good": {
                                "model": "m",
                                "port": good.port,
                                "host": "0.0.0.0",
                                "tls": tls,
                            },
                            "wrong": {
                                "model": "m",
                                "port": wrong.port,
                                "host": "0.0.0.0",
                                "tls": tls,
                            },
                        },
                    }
                },
            }
        )
        config = yaml.safe_load(prometheus_config(fleet))
        config["scrape_configs"] = [
            j for j in config["scrape_configs"] if j["job_name"].startswith("vllm/")
        ]
        config.pop("rule_files")
        for job in config["scrape_configs"]:
            pem = files.ca if job["job_name"] == "vllm/a/good" else tmp_path / "other.pem"
            job["tls_config"]["ca_file"] = str(pem)
        (tmp_path / "other.pem").write_text(cert_pem(other.cert))
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            health: dict[str, tuple[str, str, str]] = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(health) < 2:
                time.sleep(0.5)
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/api/v1/targets", timeout=2
                    ) as reply:
                        targets = json.load(reply)["data"]["activeTargets"]
                except OSError:
                    continue
                health = {
                    t["labels"]["server"]: (t["labels"]["job"], t["health"], t["lastError"])
                    for t in targets
                    if t["health"] != "unknown"
                }
        finally:
            process.terminate()
            process.wait(10)
    assert health["good"] == ("vllm", "up", "")
    job, state, error = health["wrong"]
    assert (job, state) == ("vllm", "down") and "certificate" in error, error
