"""End-to-end checks of each endpoint's router, run by ``fleet verify`` against any fleet.

The router's unit, release and port; its health; every replica known to it and healthy; a
completion through it (with the endpoint's key, read on the router's host from its 0600 file).
"""

from __future__ import annotations

import json
import shlex

from conftest import RouterTarget

from cli.remote import REQUEST_COMMAND


def http(target: RouterTarget, path: str, body: dict | None = None, auth: bool = True) -> dict:
    """An HTTP request to the router, made on its host; returns {status, body}."""
    payload = {"url": target.router.url, "port": target.router.port, "path": path, "body": body,
               "auth": auth,
               "env_file": target.router.env_path}  # fmt: skip
    result = target.host.run(f"printf %s {shlex.quote(json.dumps(payload))} | {REQUEST_COMMAND}")
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def test_router_unit_is_active_and_enabled(router_target: RouterTarget) -> None:
    service = router_target.host.service(router_target.router.unit)
    assert service.is_running and service.is_enabled


def test_router_unit_file_is_the_rendered_one(router_target: RouterTarget) -> None:
    unit = router_target.host.file(router_target.router.unit_path)
    assert unit.content_string == router_target.router.unit_text


def test_router_release_is_the_pinned_one(router_target: RouterTarget) -> None:
    router = router_target.router
    script = "import importlib.metadata as m; print(m.version('vllm-router'))"
    have = router_target.host.check_output(f"{router.venv}/bin/python -c {shlex.quote(script)}")
    assert have == router.version


def test_router_port_is_listened_on_by_the_router(router_target: RouterTarget) -> None:
    router = router_target.router
    pid = int(router_target.host.run(f"systemctl show -p MainPID --value {router.unit}").stdout)
    owners = router_target.host.run(f"ss -Hltnp 'sport = :{router.port}'").stdout
    assert f"pid={pid}," in owners, owners


def test_router_does_not_run_as_root(router_target: RouterTarget) -> None:
    unit = router_target.router.unit
    pid = int(router_target.host.run(f"systemctl show -p MainPID --value {unit}").stdout)
    assert router_target.host.run(f"ps -o user= -p {pid}").stdout.strip() != "root"


def test_router_health_answers_200(router_target: RouterTarget) -> None:
    assert http(router_target, "/health", auth=False)["status"] == 200


def test_router_knows_every_replica_healthy(router_target: RouterTarget) -> None:
    reply = http(router_target, "/workers", auth=False)
    assert reply["status"] == 200, reply
    workers = {w["url"]: w["is_healthy"] for w in json.loads(reply["body"])["workers"]}
    assert workers == dict.fromkeys(router_target.router.worker_urls, True)


def test_completion_through_the_router_returns_tokens(router_target: RouterTarget) -> None:
    body = {"model": router_target.router.served_name, "prompt": "Hello", "max_tokens": 8}
    reply = http(router_target, "/v1/completions", body)
    assert reply["status"] == 200, reply
    assert json.loads(reply["body"])["usage"]["completion_tokens"] > 0
