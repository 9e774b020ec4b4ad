"""The host programs that probe a server speak TLS to it as its plan says (issue 23, TLS): a real
HTTPS server on 127.0.0.1 with a certificate of a test CA (made here with ``cryptography``) for
the name clients use (``gpu-1.example``, not the loopback address the probe connects to).

The probes trust the plan's CA file alone (the CA, or the deployed certificate itself) and check
the name; a certificate of another CA, or for another name, is not trusted; the system's CA
store is never used.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import urllib.error
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from hostside import check_ready, local_command, request, tlsprobe, wait_healthy
from tests.support.hostprograms import PROBE_KEY as KEY
from tests.support.hostprograms import run_program as run
from tests.support.testca import ServerFiles, TestCA
from tests.unit.hostside.test_probe_address import _Handler

NAME = "gpu-1.example"


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


@pytest.fixture
def files(ca: TestCA, tmp_path: Path) -> ServerFiles:
    return ca.server_files(tmp_path, [NAME, "10.0.0.5"])


@pytest.fixture
def server(files: ServerFiles) -> Iterator[str]:
    """The base URL of an HTTPS server on 127.0.0.1 serving ``files``' certificate."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.certificate, files.key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_health_wait_trusts_the_ca_for_the_name(server: str, files: ServerFiles) -> None:
    done = run("wait_healthy", "--url", server, "--cafile", str(files.ca), "--tls-name", NAME,
               "--pid", str(os.getpid()), "--timeout", "10")
    assert done.returncode == 0, done.stderr


def test_the_deployed_certificate_itself_is_trusted(server: str, files: ServerFiles) -> None:
    """Without tls.ca the probes trust the certificate file (OpenSSL's partial chain)."""
    assert wait_healthy.healthy(server, str(files.certificate), NAME)


@pytest.mark.parametrize("name", [NAME, "10.0.0.5"])
def test_any_name_of_the_certificate_is_checked_over_loopback(server: str, files: ServerFiles,
                                                               name: str) -> None:
    assert wait_healthy.healthy(server, str(files.ca), name)


def test_another_name_is_not_trusted(server: str, files: ServerFiles) -> None:
    assert not wait_healthy.healthy(server, str(files.ca), "gpu-2.example")
    with pytest.raises(urllib.error.URLError) as caught:
        tlsprobe.urlopen(f"{server}/health", 5, str(files.ca), "gpu-2.example")
    assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)
    assert "gpu-2.example" in str(caught.value.reason)


def test_another_ca_is_not_trusted(server: str, tmp_path: Path) -> None:
    other = TestCA("another CA").server_files(tmp_path, [NAME], prefix="other")
    assert not wait_healthy.healthy(server, str(other.ca), NAME)
    assert not wait_healthy.healthy(server, str(other.certificate), NAME)


def test_without_a_cafile_the_test_ca_is_not_trusted(server: str) -> None:
    """The plain probe (system store) does not know the test CA: the CA file is what trusts."""
    assert not wait_healthy.healthy(server)


def test_readiness_completes_over_tls(server: str, files: ServerFiles, env: str) -> None:
    done = run("check_ready", "--url", server, "--model", "m", "--env-file", env,
               "--cafile", str(files.ca), "--tls-name", NAME, "--timeout", "10")
    assert done.returncode == 0, done.stderr
    assert check_ready.complete(server, "m", KEY, str(files.ca), NAME)["usage"] == {
        "completion_tokens": 2}


def test_the_request_program_takes_the_trust_from_its_payload(server: str, files: ServerFiles,
                                                              env: str) -> None:
    payload = {"url": server, "path": "/health", "body": None, "auth": False, "env_file": env,
               "cafile": str(files.ca), "tls_name": NAME}
    done = subprocess.run(local_command("request", python="python3"), input=json.dumps(payload),
                          capture_output=True, text=True, check=False, cwd="/", timeout=60,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == 200


def test_the_request_program_refuses_a_name_the_certificate_lacks(server: str,
                                                                  files: ServerFiles,
                                                                  env: str) -> None:
    payload = {"url": server, "path": "/health", "body": None, "auth": False, "env_file": env,
               "cafile": str(files.ca), "tls_name": "gpu-9.example"}
    with pytest.raises(urllib.error.URLError) as caught:
        request.request(payload, 5)
    assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)


def test_the_request_program_names_the_served_certificate(server: str, files: ServerFiles,
                                                          env: str) -> None:
    """What fleet verify compares with the deployed certificate's fingerprint."""
    from cryptography.hazmat.primitives import hashes

    payload = {"url": server, "certificate": True, "cafile": str(files.ca), "tls_name": NAME}
    done = subprocess.run(local_command("request", python="python3"), input=json.dumps(payload),
                          capture_output=True, text=True, check=False, cwd="/", timeout=60,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"certificate": files.cert.fingerprint(
        hashes.SHA256()).hex()}
