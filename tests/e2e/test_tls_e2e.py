"""A server with TLS for real: the CPU vLLM on the shared sandbox host serving https only.

A test CA made here signs a certificate for 127.0.0.1 (where the server listens and its probes
reach it). The fleet file names the certificate, key and CA by reference (``tls:``); the deploy
delivers them root-owned 0600 beside the environment file and hands them to the unit alone
with ``LoadCredential=``; the readiness wait and completion speak https trusting that CA. Then:
plain http is refused, ``fleet verify`` finds the served certificate is the deployed one,
``fleet complete`` and ``fleet status`` reach it, the key is in no unit, process list, journal
or deploy output, a second deploy changes nothing, and a new certificate and key roll the
server (restarted once, the new certificate served).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.support import e2e
from tests.support.e2e import changes, on_host, output
from tests.support.testca import ServerFiles, TestCA

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


def test_a_second_deploy_changes_nothing(deployed) -> None:
    fleet, _, _ = deployed
    pid = main_pid()
    again = e2e.deploy(fleet, ENV)
    assert again.returncode == 0, output(again)[-4000:]
    assert changes(output(again)) == 0, output(again)[-4000:]
    assert main_pid() == pid


def test_a_new_certificate_rolls_the_server(deployed, ca, tmp_path: Path) -> None:
    """Rotation is a configuration change: the server restarts once and serves the new one."""
    files = ca.server_files(tmp_path, NAMES, prefix="second")
    pid = main_pid()
    rolled = e2e.deploy(write_fleet(tmp_path / "fleet.yaml", files), ENV)
    assert rolled.returncode == 0, output(rolled)[-5000:]
    assert main_pid() != pid
    assert served_fingerprint() == fingerprint(files)
    assert key_body(files) not in output(rolled)
