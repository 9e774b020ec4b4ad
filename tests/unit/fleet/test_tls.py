"""A server's TLS (issue 23): the certificate and key by reference, checked at ``fleet check``
with a located error, delivered by ``LoadCredential=`` to the unit alone, trusted by the probes.

Every certificate here is made by a test CA (``tests/support/testca.py``) in ``tmp_path``.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from fleet.hostplan.render import host_plan
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.tls import examine, fingerprint
from fleet.load import FleetError, load_text
from fleet.read.problems import Problem
from fleet.spec.models import PemRef
from tests.support.renderparse import parse_unit
from tests.support.testca import TestCA, cert_pem, key_pem, other_keys

FLEET = """\
version: 1
models:
  m: {url: "https://models.example/m.tar.gz", sha256: "SHA256"}
hosts:
  box:
    address: "ADDRESS"
    vllm: {version: "0.32.0", variant: cpu}
    servers:
      chat:
        model: m
        port: 8443
        host: "BIND"
        tls:
          certificate: {file: CERT}
          key: {file: KEY}
EXTRA""".replace("SHA256", "ab" * 32)


def fleet_text(cert: Path, key: Path, address: str = "gpu-1.example", bind: str = "0.0.0.0",
               extra: str = "") -> str:
    return (FLEET.replace("ADDRESS", address).replace("BIND", bind).replace("CERT", str(cert))
            .replace("KEY", str(key)).replace("EXTRA", extra))


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(FleetError) as caught:
        load_text(text, "fleet.yaml")
    return caught.value.problems


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


def test_a_correct_certificate_is_accepted_and_warns_of_nothing(ca: TestCA,
                                                                 tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    warnings: list[Problem] = []
    fleet = load_text(fleet_text(files.certificate, files.key), "fleet.yaml", warnings=warnings)
    assert fleet.hosts["box"].servers["chat"].tls is not None
    assert warnings == []


@pytest.mark.parametrize("kind", ["rsa", "ec", "ed25519"])
def test_every_key_kind_openssl_serves_is_accepted(ca: TestCA, tmp_path: Path, kind: str) -> None:
    files = ca.server_files(tmp_path, ["10.0.0.5"], key=other_keys()[kind])
    load_text(fleet_text(files.certificate, files.key, bind="10.0.0.5"), "fleet.yaml")


def test_a_wildcard_name_covers_one_label(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["*.example"])
    load_text(fleet_text(files.certificate, files.key), "fleet.yaml")
    problems = problems_of(fleet_text(files.certificate, files.key, address="a.b.example"))
    assert "do not cover a.b.example" in problems[0].message


def test_a_combined_file_and_a_chain_are_accepted(ca: TestCA, tmp_path: Path) -> None:
    """A key file that also holds the certificate, a certificate file followed by the CA."""
    cert, key = ca.issue(["gpu-1.example"])
    both = tmp_path / "both.pem"
    both.write_text(cert_pem(cert) + cert_pem(ca.cert) + key_pem(key))
    both.chmod(0o600)
    load_text(fleet_text(both, both), "fleet.yaml")


def located(problems: list[Problem], field: str) -> Problem:
    [problem] = [p for p in problems if p.path[-2] == field]
    assert problem.line is not None and problem.file == "fleet.yaml"
    return problem


def test_an_expired_certificate_is_refused_at_its_line(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"], days=-1, start_days=-30)
    problem = located(problems_of(fleet_text(files.certificate, files.key)), "certificate")
    assert problem.line == 14
    assert "expired on" in problem.message and "renew" in (problem.hint or "")


def test_a_certificate_not_yet_valid_is_refused(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"], start_days=3, days=30)
    assert "not valid before" in located(
        problems_of(fleet_text(files.certificate, files.key)), "certificate").message


def test_a_certificate_that_expires_soon_is_a_warning(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"], days=3)
    warnings: list[Problem] = []
    load_text(fleet_text(files.certificate, files.key), "fleet.yaml", warnings=warnings)
    assert [w.path[-2] for w in warnings] == ["certificate"]
    assert "expires on" in warnings[0].message


def test_a_key_of_another_pair_is_refused_at_the_key(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    other = ca.server_files(tmp_path, ["gpu-1.example"], prefix="other")
    problem = located(problems_of(fleet_text(files.certificate, other.key)), "key")
    assert problem.line == 15
    assert "does not match the certificate" in problem.message


@pytest.mark.parametrize(("bind", "address", "names", "shown"), [
    ("0.0.0.0", "gpu-1.example", ["gpu-2.example"], "gpu-1.example"),
    ("10.0.0.5", "gpu-1.example", ["gpu-1.example"], "10.0.0.5"),
    ("0.0.0.0", "10.0.0.6", ["10.0.0.5"], "10.0.0.6"),
    ("::", "fd00::7", ["fd00::8", "gpu-1.example"], "fd00::7"),
])
def test_names_that_miss_the_address_clients_use_are_refused(
        ca: TestCA, tmp_path: Path, bind: str, address: str, names: list[str], shown: str) -> None:
    files = ca.server_files(tmp_path, names)
    problem = located(problems_of(fleet_text(files.certificate, files.key, address, bind)),
                      "certificate")
    assert f"do not cover {shown}, the address clients use" in problem.message
    assert shown in (problem.hint or "")


def test_a_certificate_without_subject_alt_name_is_refused(ca: TestCA, tmp_path: Path) -> None:
    """Python's ssl (the probes) and current clients match subjectAltName only, not the CN."""
    files = ca.server_files(tmp_path, [])
    assert "no subjectAltName" in located(
        problems_of(fleet_text(files.certificate, files.key)), "certificate").message


def test_an_encrypted_key_is_refused(ca: TestCA, tmp_path: Path) -> None:
    cert, key = ca.issue(["gpu-1.example"])
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    files.certificate.write_text(cert_pem(cert))
    files.key.write_text(key_pem(key, password=b"pw"))
    assert "encrypted" in located(problems_of(fleet_text(files.certificate, files.key)),
                                  "key").message


@pytest.mark.parametrize(("field", "text", "message"), [
    ("certificate", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
     "holds no PEM certificate"),
    ("certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
     "not a readable X.509 certificate"),
    ("key", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
     "holds no PEM private key"),
])
def test_files_that_are_not_what_they_should_be_are_refused(
        ca: TestCA, tmp_path: Path, field: str, text: str, message: str) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    (files.certificate if field == "certificate" else files.key).write_text(text)
    assert message in located(problems_of(fleet_text(files.certificate, files.key)),
                              field).message


def test_a_file_that_is_not_pem_is_refused_at_the_reference(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    files.key.write_text("just a token\n")
    problem = located(problems_of(fleet_text(files.certificate, files.key)), "key")
    assert "is not PEM" in problem.message


def test_the_ca_must_have_signed_the_certificate(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    other = TestCA("another CA").server_files(tmp_path, ["x"], prefix="other")
    extra = f"          ca: {{file: {files.ca}}}\n"
    load_text(fleet_text(files.certificate, files.key, extra=extra), "fleet.yaml")
    extra = f"          ca: {{file: {other.ca}}}\n"
    assert "does not chain to tls.ca" in located(
        problems_of(fleet_text(files.certificate, files.key, extra=extra)), "certificate").message


def test_no_message_holds_the_key(ca: TestCA, tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    other = ca.server_files(tmp_path, ["elsewhere.example"], prefix="other")
    key_body = other.key.read_text().splitlines()[1]
    problems = problems_of(fleet_text(files.certificate, other.key))
    assert problems and all(key_body not in str(p) for p in problems)


def test_mutual_tls_without_a_client_ca_and_required_are_refused(ca: TestCA,
                                                                   tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    extra = "          client_certificates: optional\n"
    problems = problems_of(fleet_text(files.certificate, files.key, extra=extra))
    assert "needs client_ca" in problems[0].message
    extra = f"          client_ca: {{file: {files.ca}}}\n          client_certificates: required\n"
    problems = problems_of(fleet_text(files.certificate, files.key, extra=extra))
    assert "present no client certificate" in problems[0].message


def test_examine_is_pure_and_takes_the_time(ca: TestCA) -> None:
    cert, key = ca.issue(["gpu-1.example"], days=10)
    texts = {"certificate": cert_pem(cert), "key": key_pem(key)}
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=20)
    errors, _ = examine(texts, "gpu-1.example", later)
    assert [e[0] for e in errors] == ["certificate"] and "expired" in errors[0][1]


def test_a_pem_reference_reads_a_private_key_a_secret_does_not(ca: TestCA,
                                                                tmp_path: Path) -> None:
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    assert read_secret(PemRef(file=str(files.key))).startswith("-----BEGIN PRIVATE KEY-----")
    from fleet.spec.models import SecretRef
    with pytest.raises(ValueError, match="private key"):
        read_secret(SecretRef(file=str(files.key)))


def plan_of(ca: TestCA, tmp_path: Path, extra: str = ""):
    files = ca.server_files(tmp_path, ["gpu-1.example"])
    fleet = load_text(fleet_text(files.certificate, files.key, extra=extra), "fleet.yaml")
    return files, host_plan(fleet, "box")


def test_the_unit_hands_the_files_to_the_server_alone(ca: TestCA, tmp_path: Path) -> None:
    clients = TestCA("clients").server_files(tmp_path, ["c"], prefix="client").ca
    files, plan = plan_of(ca, tmp_path, f"          client_ca: {{file: {clients}}}\n")
    [server] = plan.servers
    unit = parse_unit(server.unit_text)
    assert unit.values("LoadCredential", "Service") == [
        "tls-certificate:/etc/vllm-fleet/chat.tls-certificate.pem",
        "tls-key:/etc/vllm-fleet/chat.tls-key.pem",
        "tls-client-ca:/etc/vllm-fleet/chat.tls-client-ca.pem"]
    start = server.unit_text.split("\nExecStart=", 1)[1].split("\n", 1)[0]
    assert ("--ssl-certfile /run/credentials/vllm-chat.service/tls-certificate --ssl-keyfile "
            "/run/credentials/vllm-chat.service/tls-key --ssl-ca-certs "
            "/run/credentials/vllm-chat.service/tls-client-ca --ssl-cert-reqs 1") in start
    wait = server.unit_text.split("\nExecStartPost=", 1)[1].split("\n", 1)[0]
    assert ("--url https://127.0.0.1:8443 --cafile /etc/vllm-fleet/chat.tls-ca.pem "
            "--tls-name gpu-1.example") in wait
    assert {f.part: (f.path, f.text) for f in server.tls.files}["key"] == (
        "/etc/vllm-fleet/chat.tls-key.pem", files.key.read_text())
    assert server.tls.fingerprint == files.cert.fingerprint(
        __import__("cryptography.hazmat.primitives.hashes", fromlist=["SHA256"]).SHA256()).hex()


def test_the_probes_trust_the_ca_when_given_else_the_certificate(ca: TestCA,
                                                                  tmp_path: Path) -> None:
    files, plan = plan_of(ca, tmp_path)
    trusted = {f.part: f.text for f in plan.servers[0].tls.files}["ca"]
    assert trusted == files.certificate.read_text()
    files, plan = plan_of(ca, tmp_path, "          ca: {file: CA}\n".replace(
        "CA", str(tmp_path / "server.ca.crt")))
    assert {f.part: f.text for f in plan.servers[0].tls.files}["ca"] == cert_pem(ca.cert)


def test_the_key_is_in_no_unit_and_no_repr(ca: TestCA, tmp_path: Path) -> None:
    files, plan = plan_of(ca, tmp_path)
    body = files.key.read_text().splitlines()[1]
    [server] = plan.servers
    assert body not in server.unit_text and body not in (server.env_text or "")
    assert body not in repr(plan)


def test_fingerprint_reads_the_first_certificate(ca: TestCA) -> None:
    cert, _ = ca.issue(["a"])
    from cryptography.hazmat.primitives import hashes
    assert fingerprint(cert_pem(cert) + cert_pem(ca.cert)) == cert.fingerprint(
        hashes.SHA256()).hex()


@pytest.mark.parametrize("form", ["TraditionalOpenSSL", "PKCS8"])
def test_a_key_in_either_pem_form_openssl_reads_is_accepted(ca: TestCA, tmp_path: Path,
                                                            form: str) -> None:
    """``BEGIN RSA PRIVATE KEY`` (PKCS#1) as well as ``BEGIN PRIVATE KEY`` (PKCS#8)."""
    from cryptography.hazmat.primitives import serialization

    key = other_keys()["rsa"]
    files = ca.server_files(tmp_path, ["gpu-1.example"], key=key)
    files.key.write_bytes(key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, getattr(serialization.PrivateFormat, form),
        serialization.NoEncryption()))
    load_text(fleet_text(files.certificate, files.key), "fleet.yaml")


def test_an_openssh_key_is_refused(ca: TestCA, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = other_keys()["ed25519"]
    files = ca.server_files(tmp_path, ["gpu-1.example"], key=key)
    files.key.write_bytes(key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()))
    assert "OpenSSH key" in located(problems_of(fleet_text(files.certificate, files.key)),
                                    "key").message
