"""How a server is reached (fleet/planner/reach.py): decided once in the plan, and what every
deploy-side probe of its unit, its deploy and its endpoint's rollout is given (issue 23, item 1).

A server bound to a specific address (``10.44.0.11``, another loopback address such as
``127.0.0.2``) listens only there; one bound to ``::`` is reached at ``::1``; one given ``tls``
speaks https, and its probes trust the plan's CA file for the name clients use. Before, every
probe asked ``http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import pytest

from fleet.hostplan.render import WAIT_SCRIPT, host_plan
from fleet.load import FleetError, load_text
from fleet.planner.endpoints import worker_url
from fleet.planner.reach import Reach, probe_address, scheme_of, server_reach
from fleet.spec.models import Server
from tests.support import systemdwords

MODEL = "{m: {url: https://models.example/m.tar.gz, sha256: '" + "ab" * 32 + "'}}"


TLS = "{certificate: {file: /tls/s.crt}, key: {file: /tls/s.key}}"


def fleet_text(bind: str, args: str = "{}", tls: str = "") -> str:
    more = f", tls: {tls}" if tls else ""
    return (f"version: 1\nmodels: {MODEL}\nhosts:\n"
            f"  h: {{address: 10.44.0.11, vllm: {{version: 0.32.0, variant: cpu}},\n"
            f"      servers: {{s: {{model: m, port: 18000, host: '{bind}', args: {args}"
            f"{more}}}}}}}\n")


def wait_argv(bind: str, args: str = "{}", tls: str = "") -> tuple[list[str], str]:
    """The readiness wait's argv in the rendered unit (read by systemd's rules), and the plan's
    URL of the server."""
    [unit] = host_plan(load_text(fleet_text(bind, args, tls)), "h",
                       secrets=lambda ref: "").servers
    [post] = [value for key, value in systemdwords.lines(unit.unit_text)
              if key == "ExecStartPost"]
    [command] = systemdwords.commands(post)
    assert command.prefix == "+"
    return command.argv, unit.url


@pytest.mark.parametrize(("bind", "url"), [
    ("127.0.0.2", "http://127.0.0.2:18000"),
    ("10.44.0.11", "http://10.44.0.11:18000"),
    ("::", "http://[::1]:18000"),
    ("0.0.0.0", "http://127.0.0.1:18000"),
    ("::1", "http://[::1]:18000"),
    ("127.0.0.1", "http://127.0.0.1:18000"),
])
def test_the_readiness_wait_probes_where_the_server_listens(bind: str, url: str) -> None:
    argv, plan_url = wait_argv(bind)
    assert plan_url == url
    assert argv[1:5] == [WAIT_SCRIPT, "--url", url, "--pid"]


def test_a_server_with_tls_is_probed_over_https_and_keeps_its_root_path() -> None:
    argv, url = wait_argv("10.44.0.11", "{root-path: /api}", TLS)
    assert url == "https://10.44.0.11:18000"
    assert argv[2:8] == ["--url", "https://10.44.0.11:18000", "--cafile",
                         "/etc/vllm-fleet/s.tls-ca.pem", "--tls-name", "10.44.0.11"]
    [unit] = host_plan(load_text(fleet_text("10.44.0.11", "{root-path: /api}", TLS)), "h",
                       secrets=lambda ref: "").servers
    # vLLM 0.32 routes /health with and without its root path (FastAPI's app.root_path): the
    # probes keep the plain paths, the root path stays in the description for clients
    assert unit.reach == Reach("https", "10.44.0.11", 18000, "/api",
                               "/etc/vllm-fleet/s.tls-ca.pem", "10.44.0.11")


def test_a_tls_server_on_every_interface_is_checked_for_its_host_address() -> None:
    """The probe connects to loopback but checks the name clients use: the host's address."""
    argv, url = wait_argv("0.0.0.0", tls=TLS)
    assert url == "https://127.0.0.1:18000"
    assert argv[argv.index("--tls-name") + 1] == "10.44.0.11"


def test_tls_makes_it_https_and_the_ssl_flags_are_the_tls_key() -> None:
    tls = {"certificate": {"file": "/c"}, "key": {"file": "/k"}}
    assert [scheme_of(Server(model="m", port=1, tls=t)) for t in (tls, None)] == [
        "https", "http"]
    for flag in ("ssl-certfile", "ssl-keyfile", "ssl-ca-certs", "ssl-cert-reqs"):
        with pytest.raises(ValueError, match="is set by the server's tls key"):
            Server(model="m", port=1, args={flag: "/etc/x.pem"})


def test_every_interface_is_reached_on_the_loopback_of_its_family() -> None:
    assert [probe_address(a) for a in ("0.0.0.0", "::", "0:0::0", "127.0.0.2", "fd00::5",
                                       "gpu-a.lan")] == [
        "127.0.0.1", "::1", "::1", "127.0.0.2", "fd00::5", "gpu-a.lan"]
    assert server_reach(Server(model="m", port=8000, host="fd00::5")).url == "http://[fd00::5]:8000"


ENDPOINT = """version: 1
models: {MODEL}
defaults: {{vllm: {{version: 0.32.0, variant: cpu}}}}
hosts:
  a: {{address: 10.44.0.11, servers: {{r1: {{model: m, port: 18001, host: 127.0.0.2}}}}}}
  b: {{address: 10.44.0.12, servers: {{r2: {{model: m, port: 18001, host: 10.44.0.12}}}}}}
endpoints:
  chat:
    replicas: [a/r1, b/r2]
    router: {{host: a, port: 18400}}
"""


def test_an_endpoint_rolls_each_replica_where_it_listens() -> None:
    """The replica's own probes (roll, canary rollback) and its router use the description."""
    fleet = load_text(ENDPOINT.format(MODEL=MODEL))
    assert worker_url(fleet, "a", "a/r1") == "http://127.0.0.2:18001"
    assert worker_url(fleet, "a", "b/r2") == "http://10.44.0.12:18001"
    for host, url in (("a", "http://127.0.0.2:18001"), ("b", "http://10.44.0.12:18001")):
        [unit] = host_plan(fleet, host, secrets=lambda ref: "").servers
        assert unit.url == url
        assert unit.rollout is not None and unit.rollout.worker_url == url


def test_a_replica_with_tls_is_refused_at_its_tls_key() -> None:
    """Its router (vllm-router) and the canary cannot be told to trust its certificate yet."""
    text = ENDPOINT.format(MODEL=MODEL).replace(
        "host: 10.44.0.12}", "host: 10.44.0.12, tls: " + TLS.replace("{", "{{").replace(
            "}", "}}").format() + "}")
    with pytest.raises(FleetError) as caught:
        load_text(text)
    [problem] = caught.value.problems
    assert problem.path == ("hosts", "b", "servers", "r2", "tls")
    assert "serves TLS" in problem.message
