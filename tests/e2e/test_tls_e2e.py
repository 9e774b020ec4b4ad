"""A server with TLS for real: the CPU vLLM on the shared sandbox host serving https only.

A test CA made here signs a certificate for 127.0.0.1 (where the server listens and its probes
reach it). The fleet file names the certificate, key and CA by reference (``tls:``); the deploy
delivers them root-owned 0600 beside the environment file and hands them to the unit alone
with ``LoadCredential=``; the readiness wait and completion speak https trusting that CA. Then:
plain http is refused, ``fleet verify`` finds the served certificate is the deployed one,
``fleet complete`` and ``fleet status`` reach it, ``fleet bench`` measures it over https
(directly and through an SSH forward) and refuses a certificate the fleet file's CA did not sign,
the key is in no unit, process list, journal or deploy output (``pyinfra -vv`` included), a
second deploy changes nothing, Prometheus deployed beside it scrapes it over https trusting its
CA, and a new certificate and key roll the server (restarted once, the new certificate served).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.support import e2e
from tests.support.e2e import changes, on_host, output
from tests.support.testca import ServerFiles, TestCA
from tests.support.wait import wait_until

pytestmark = pytest.mark.e2e

HOST = e2e.VLLM_HOST
PORT = e2e.TLS_PORT
UNIT = "vllm-secure.service"
API_KEY = "tls-e2e-key-8d2c41"
ENV = {"FLEET_TLS_E2E_KEY": API_KEY}
NAMES = ["127.0.0.1", "localhost"]

SERVER = """\
      secure:
        model: tiny-llama
        port: {port}
        served_model_name: tiny-tls
        api_key: {{env: FLEET_TLS_E2E_KEY}}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
        tls:
          certificate: {{file: {certificate}}}
          key: {{file: {key}}}
          ca: {{file: {ca}}}
"""


def write_fleet(path: Path, files: ServerFiles) -> Path:
    path.write_text(e2e.fleet_header(HOST) + SERVER.format(
        port=PORT, certificate=files.certificate, key=files.key, ca=files.ca))
    return path


def fingerprint(files: ServerFiles) -> str:
    return hashlib.sha256(files.cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def served_fingerprint() -> str:
    """SHA-256 of the certificate the server serves now (read on the host, not verified)."""
    return on_host(
        "python3 -c \"import hashlib, ssl; print(hashlib.sha256(ssl.PEM_cert_to_DER_cert("
        f"ssl.get_server_certificate(('127.0.0.1', {PORT})))).hexdigest())\""
    ).stdout.strip()


def main_pid() -> str:
    return on_host(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()


def key_body(files: ServerFiles) -> str:
    """The base64 body of the key's PEM: what must appear nowhere but its own files."""
    lines = files.key.read_text().splitlines()
    return "".join(line for line in lines if not line.startswith("-----"))[:48]


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA("vllm-fleet e2e CA")


@pytest.fixture(scope="module")
def deployed(vllm_host, testmodel_server, ca, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tls-e2e")
    files = ca.server_files(root, NAMES, prefix="first")
    fleet = write_fleet(root / "fleet.yaml", files)
    result = e2e.deploy(fleet, ENV)
    return fleet, files, result


def test_the_server_starts_serving_https_only(deployed) -> None:
    _, files, result = deployed
    assert result.returncode == 0, output(result)[-5000:]
    assert on_host(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    assert served_fingerprint() == fingerprint(files)
    plain = on_host(f"curl -sS -m 10 http://127.0.0.1:{PORT}/health")
    assert plain.returncode != 0, plain.stdout  # no plain http on the port
    trusted = on_host(f"cat > /tmp/tls-e2e-ca.pem && curl -sS -m 10 -o /dev/null -w "
                      f"'%{{http_code}}' --cacert /tmp/tls-e2e-ca.pem "
                      f"https://127.0.0.1:{PORT}/health", stdin=files.ca.read_text())
    assert trusted.stdout.strip() == "200", trusted.stdout + trusted.stderr


def test_the_files_are_root_only_and_handed_to_the_unit_alone(deployed) -> None:
    listing = on_host("stat -c '%n %U %a' /etc/vllm-fleet/secure.tls-*.pem").stdout.split("\n")
    rows = [line.split() for line in listing if line]
    assert {Path(name).name for name, _, _ in rows} >= {
        "secure.tls-certificate.pem", "secure.tls-key.pem", "secure.tls-ca.pem"}, rows
    assert all((user, mode) == ("root", "600") for _, user, mode in rows), rows
    unit = on_host(f"systemctl cat {UNIT}").stdout
    assert re.search(r"^LoadCredential=tls-key:/etc/vllm-fleet/secure\.tls-key\.pem$", unit, re.M)
    assert "--ssl-keyfile /run/credentials/vllm-secure.service/tls-key" in unit
    assert "tls-ca" not in unit.split("ExecStart=")[1].split("\n")[0]  # the probes' CA stays out


def test_the_key_is_in_no_unit_process_list_journal_or_output(deployed) -> None:
    _, files, result = deployed
    body = key_body(files)
    unit = on_host(f"systemctl cat {UNIT}").stdout
    processes = on_host("ps -eo args").stdout
    journal = on_host(f"journalctl -u {UNIT} --no-pager -o cat").stdout
    for text in (unit, processes, journal, output(result)):
        assert body not in text
        assert API_KEY not in text


def test_verify_finds_the_deployed_certificate_served(deployed) -> None:
    fleet, _, _ = deployed
    result = e2e.fleet_cli(fleet, "verify", str(fleet), "-q", env=ENV)
    assert result.returncode == 0, output(result)[-4000:]


def test_complete_and_status_reach_it_over_https(deployed) -> None:
    fleet, files, _ = deployed
    completed = e2e.fleet_cli(fleet, "complete", str(fleet), "--prompt", "Hello", env=ENV)
    assert completed.returncode == 0, output(completed)[-3000:]
    assert "answered" in completed.stdout, completed.stdout
    status = e2e.fleet_cli(fleet, "status", str(fleet), env=ENV, timeout=120)
    assert status.returncode == 0, output(status)[-3000:]
    line = next(line for line in status.stdout.splitlines() if f"{HOST}/secure" in line)
    assert "up" in line and "tiny-tls" in line, line
    assert key_body(files) not in output(completed) + output(status)


@pytest.mark.parametrize("tunnel", ["never", "always"])
def test_bench_measures_it_over_https(deployed, tunnel: str, tmp_path: Path) -> None:
    """``fleet bench`` speaks https trusting the fleet file's CA, directly and through an SSH
    port forward (the certificate checked for 127.0.0.1, not the forward's local port); the
    server's /metrics read over https too; the key in no output or result file."""
    fleet, files, _ = deployed
    out = tmp_path / f"bench-{tunnel}"
    result = e2e.fleet_cli(
        fleet, "bench", str(fleet), "--server", f"{HOST}/secure", "--concurrency", "1",
        "--requests", "4", "--warmup", "1", "--input-len", "16", "--output-len", "8",
        "--tunnel", tunnel, "--no-progress", "--out", str(out), env=ENV, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, output(result)[-4000:]
    bench = json.loads((out / "bench.json").read_text())
    url = bench["target"]["url"]
    assert url.startswith("https://127.0.0.1:"), url
    assert (url.rstrip("/").rsplit(":", 1)[1] == str(PORT)) == (tunnel == "never"), url
    step = bench["steps"][0]
    assert step["ok"] == 4 and not step["errors"], step
    assert step["server"], step  # the server's own figures, read over https
    assert any("for the name 127.0.0.1" in note for note in bench["notes"]), bench["notes"]
    written = output(result) + "".join(p.read_text() for p in out.iterdir() if p.suffix in
                                       (".json", ".csv"))  # fmt: skip
    assert API_KEY not in written and key_body(files) not in written


def test_bench_refuses_a_certificate_its_ca_did_not_sign(deployed, tmp_path: Path) -> None:
    """A fleet file whose tls.ca is another CA (its own certificate issued by that CA, so
    fleet check passes) while the host serves the deployed one: the bench stops, naming it."""
    other = TestCA("another e2e CA").server_files(tmp_path, NAMES, prefix="other")
    fleet = write_fleet(tmp_path / "fleet.yaml", other)
    result = e2e.fleet_cli(fleet, "bench", str(fleet), "--server", f"{HOST}/secure",
                           "--requests", "2", "--no-progress", "--out", str(tmp_path / "b"),
                           env=ENV, timeout=120)  # fmt: skip
    assert result.returncode == 1, output(result)[-3000:]
    assert "certificate was refused" in result.stderr, output(result)[-3000:]
    assert API_KEY not in output(result)


def test_a_monitored_fleet_scrapes_it_over_https(deployed, tmp_path: Path) -> None:
    """The same server in a monitored fleet: accepted, and Prometheus's job for it is https
    with the server's CA (delivered beside prometheus.yml), keeping the ``vllm`` job label."""
    _, files, _ = deployed
    fleet = tmp_path / "monitored.yaml"
    fleet.write_text(
        write_fleet(tmp_path / "plain.yaml", files).read_text()
        + f"monitoring:\n  host: {HOST}\n"
    )
    checked = e2e.fleet_cli(fleet, "check", str(fleet), env=ENV)
    assert checked.returncode == 0, output(checked)[-3000:]
    rendered = e2e.fleet_cli(fleet, "render", str(fleet), env=ENV)
    assert rendered.returncode == 0, output(rendered)[-3000:]
    text = rendered.stdout
    assert f"job_name: vllm/{HOST}/secure" in text, text[-4000:]
    job = text.split(f"job_name: vllm/{HOST}/secure", 1)[1][:1500]
    assert "scheme: https" in job and f"/etc/prometheus/vllm-fleet/tls/secure@{HOST}.ca.pem" \
        in job, job  # fmt: skip
    assert "job: vllm" in job, job
    assert key_body(files) not in text and API_KEY not in text


def test_a_second_deploy_changes_nothing_and_shows_no_key(deployed) -> None:
    """Run as ``pyinfra -vv`` (every command and its output shown): still no key."""
    fleet, files, _ = deployed
    pid = main_pid()
    again = e2e.deploy(fleet, ENV, "-vv")
    assert again.returncode == 0, output(again)[-4000:]
    assert changes(output(again)) == 0, output(again)[-4000:]
    assert main_pid() == pid
    assert key_body(files) not in output(again) and API_KEY not in output(again)


#: Prometheus and the node exporter of the monitored deploy (the monitoring block's ports,
#: past those the monitoring module uses).
PROMETHEUS_PORT, NODE_PORT = e2e.MONITORING_PORTS[10:12]
MONITORING = f"""\
monitoring:
  host: {HOST}
  prometheus: {{port: {PROMETHEUS_PORT}, scrape_interval_s: 2, retention_days: 1}}
  node_exporter_port: {NODE_PORT}
"""


def test_prometheus_scrapes_it_over_https_for_real(deployed, tmp_path: Path) -> None:
    """Deployed with monitoring: Prometheus on the host scrapes the server over https, trusting
    its CA (delivered root:prometheus 0640), with the ``vllm`` job label the alerts and
    ``fleet status`` read; deploying it again changes nothing. (The rotation after this module's
    last deploy, without monitoring, takes Prometheus off the host again.)"""
    _, files, _ = deployed
    fleet = tmp_path / "monitored.yaml"
    fleet.write_text(write_fleet(tmp_path / "plain.yaml", files).read_text() + MONITORING)
    result = e2e.deploy(fleet, ENV)
    assert result.returncode == 0, output(result)[-5000:]
    ca_file = f"/etc/prometheus/vllm-fleet/tls/secure@{HOST}.ca.pem"
    owner = on_host(f"stat -c '%U:%G %a' {ca_file}").stdout.strip()
    assert owner == "root:prometheus 640", owner
    assert on_host(f"cat {ca_file}").stdout == files.ca.read_text()

    def secure_target() -> dict | None:
        reply = on_host(f"curl -sf http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/targets"
                        "?state=active").stdout
        active = json.loads(reply or "{}").get("data", {}).get("activeTargets", [])
        found = [t for t in active if t["labels"].get("server") == "secure"]
        return found[0] if found and found[0]["health"] == "up" else None

    target = wait_until(secure_target, 90, interval=1,
                        message="Prometheus never scraped secure over https")
    assert target["labels"]["job"] == "vllm", target
    assert target["scrapeUrl"].startswith(f"https://127.0.0.1:{PORT}/"), target
    again = e2e.deploy(fleet, ENV)
    assert again.returncode == 0, output(again)[-4000:]
    assert changes(output(again)) == 0, output(again)[-4000:]
    for text in (output(result), output(again)):
        assert key_body(files) not in text and API_KEY not in text


def test_a_new_certificate_rolls_the_server(deployed, ca, tmp_path: Path) -> None:
    """Rotation is a configuration change: the server restarts once and serves the new one."""
    files = ca.server_files(tmp_path, NAMES, prefix="second")
    pid = main_pid()
    rolled = e2e.deploy(write_fleet(tmp_path / "fleet.yaml", files), ENV)
    assert rolled.returncode == 0, output(rolled)[-5000:]
    assert main_pid() != pid
    assert served_fingerprint() == fingerprint(files)
    assert key_body(files) not in output(rolled)
