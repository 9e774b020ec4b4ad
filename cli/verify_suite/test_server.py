"""End-to-end checks of a deployed vLLM server, run by ``fleet verify`` against any fleet.

Each test is one behaviour a user relies on; HTTP checks run on the host itself (servers bind
to loopback by default), with the API key read there from the server's environment file.
"""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest
from conftest import Target

from cli.remote import REQUEST_COMMAND


def http(target: Target, path: str, body: dict | None = None, auth: bool = True) -> dict:
    """An HTTP request to the server, made on its host; returns {status, body}."""
    payload = {
        "url": target.server.url,
        "port": target.server.port,
        "path": path,
        "body": body,
        "auth": auth,
        "env_file": target.server.env_path,
        **target.server.reach.trust,
    }
    command = f"printf %s {shlex.quote(json.dumps(payload))} | {REQUEST_COMMAND}"
    result = target.host.run(command)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def serves_api(target: Target) -> None:
    """Skip an API test on a group worker: it joins the head headless, the head serves."""
    if target.server.role == "worker":
        pytest.skip(f"a group worker has no API: {target.server.group.head} serves the group")


def test_unit_is_active(target: Target) -> None:
    assert target.host.service(target.server.unit).is_running


def test_unit_is_enabled(target: Target) -> None:
    assert target.host.service(target.server.unit).is_enabled


def test_unit_file_is_the_rendered_one(target: Target) -> None:
    unit = target.host.file(target.server.unit_path)
    assert unit.content_string == target.server.unit_text


def test_environment_file_is_private(target: Target) -> None:
    env = target.host.file(target.server.env_path)
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)


def test_runs_as_the_service_user(target: Target) -> None:
    pid = target.host.run(f"systemctl show -p MainPID --value {target.server.unit}").stdout
    user = target.host.run(f"ps -o user= -p {int(pid)}").stdout.strip()
    assert user == target.plan.user


def test_port_is_listened_on_by_the_vllm_process(target: Target) -> None:
    serves_api(target)
    port = target.server.port
    bind = target.server.host
    socket = target.host.socket(f"tcp://{bind}:{port}")
    assert socket.is_listening
    main_pid = int(
        target.host.run(f"systemctl show -p MainPID --value {target.server.unit}").stdout
    )
    owners = target.host.run(f"ss -Hltnp 'sport = :{port}'").stdout
    assert f"pid={main_pid}," in owners, owners


def test_tls_files_are_private(target: Target) -> None:
    """A TLS server's files: root's, 0600, as rendered (the unit hands them on by
    LoadCredential=)."""
    if target.server.tls is None:
        pytest.skip("no tls")
    for tls_file in target.server.tls.files:
        found = target.host.file(tls_file.path)
        assert (found.user, found.group, found.mode) == ("root", "root", 0o600), tls_file.path
        # compared by digest: a key's text never reaches an assertion's message
        on_host = hashlib.sha256(found.content_string.strip().encode()).hexdigest()
        deployed = hashlib.sha256(tls_file.text.strip().encode()).hexdigest()
        assert on_host == deployed, f"{tls_file.path} differs from the fleet file's: redeploy"


def test_served_certificate_is_the_deployed_one(target: Target) -> None:
    serves_api(target)
    if target.server.tls is None:
        pytest.skip("no tls")
    payload = {"url": target.server.url, "port": target.server.port, "certificate": True,
               **target.server.reach.trust}
    command = f"printf %s {shlex.quote(json.dumps(payload))} | {REQUEST_COMMAND}"
    result = target.host.run(command)
    assert result.rc == 0, result.stderr
    served = json.loads(result.stdout)["certificate"]
    assert served == target.server.tls.fingerprint, (
        f"{target.server.url} serves a certificate of SHA-256 {served}, the deployed one is "
        f"{target.server.tls.fingerprint}: restart {target.server.unit} (or redeploy)")


def test_health_answers_200(target: Target) -> None:
    serves_api(target)
    assert http(target, "/health", auth=False)["status"] == 200


def test_models_lists_the_served_name(target: Target) -> None:
    serves_api(target)
    reply = http(target, "/v1/models")
    assert reply["status"] == 200, reply
    names = [model["id"] for model in json.loads(reply["body"])["data"]]
    assert target.server.served_name in names


def test_completion_returns_tokens(target: Target) -> None:
    serves_api(target)
    body = {"model": target.server.served_name, "prompt": "Hello", "max_tokens": 8}
    reply = http(target, "/v1/completions", body)
    assert reply["status"] == 200, reply
    data = json.loads(reply["body"])
    assert data["usage"]["completion_tokens"] > 0


def test_installed_vllm_is_the_pinned_one(target: Target) -> None:
    name = target.plan.vllm_name
    python = target.plan.python_bin
    script = f"import importlib.metadata as m; print(m.version({name!r}))"
    version = target.host.check_output(f"{python} -c {shlex.quote(script)}")
    assert version.split("+")[0] == target.plan.vllm_version


def test_api_key_is_required_when_declared(target: Target) -> None:
    serves_api(target)
    if not target.server.has_api_key:
        reply = http(target, "/v1/models", auth=False)
        assert reply["status"] == 200
        return
    reply = http(target, "/v1/models", auth=False)
    assert reply["status"] == 401
