"""Endpoints: the router's unit and worker list, each replica's rollout, addresses by host."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fleet.checks.endpoints import endpoint_warnings
from fleet.hostplan.endpoints import replica_rollout, router_units
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet, load_text
from fleet.planner.endpoints import client_url, worker_url

ROOT = Path(__file__).resolve().parents[3]
VALID = ROOT / "tests" / "data" / "valid" / "endpoint-two-replicas.yaml"
SECRET = "s3cret-router-key"


def nokey(ref):
    return ""


@pytest.fixture(scope="module")
def fleet():
    return load_fleet(VALID)


def test_the_router_runs_only_on_its_host(fleet) -> None:
    assert [r.unit for r in router_units(fleet, "gpu-a", nokey)] == [
        "vllm-fleet-router-chat.service"
    ]
    assert router_units(fleet, "gpu-b", nokey) == ()


def test_the_router_lists_every_replica_as_it_reaches_it(fleet) -> None:
    (router,) = router_units(fleet, "gpu-a", nokey)
    assert router.worker_urls == ("http://127.0.0.1:8001", "http://10.0.0.12:8001")
    assert "--worker-urls http://127.0.0.1:8001 http://10.0.0.12:8001 " in router.unit_text


def test_the_key_never_reaches_the_router_unit(fleet) -> None:
    plan = host_plan(fleet, "gpu-a", secrets=lambda ref: SECRET)
    (router,) = plan.routers
    assert SECRET not in router.unit_text
    assert "--api-key" not in router.unit_text
    assert SECRET in plan.servers[0].env_text  # the replica checks it


def test_a_worker_added_back_is_checked_every_second_within_a_bound(fleet) -> None:
    """vllm-router's defaults check an added worker every 30 s for up to 600 s: a rollout's
    ``add_worker`` would wait 30 s for a replica that already serves."""
    (router,) = router_units(fleet, "gpu-a", nokey)
    assert " --worker-startup-check-interval 1 --worker-startup-timeout-secs 120 " in (
        router.unit_text
    )


def test_the_router_pins_its_release(fleet) -> None:
    (router,) = router_units(fleet, "gpu-a", nokey)
    assert router.requirement == "vllm-router==0.1.17"
    assert router.venv == "/opt/vllm-fleet/router-venv"


def test_each_replica_knows_its_rollout(fleet) -> None:
    plan = host_plan(fleet, "gpu-b", secrets=lambda ref: "")
    rollout = plan.servers[0].rollout
    assert rollout is not None
    assert (rollout.endpoint, rollout.replica, rollout.router_host) == (
        "chat",
        "gpu-b/chat-b",
        "gpu-a",
    )
    assert rollout.router_url == "http://127.0.0.1:8000"  # as seen on the router's host
    assert (rollout.max_unavailable, rollout.drain_timeout) == (1, 60)


def test_a_server_outside_endpoints_has_no_rollout() -> None:
    fleet = load_fleet(ROOT / "inventory" / "sandbox.yaml")
    assert all(s.rollout is None for s in host_plan(fleet, "sandbox-1", lambda r: "").servers)


SANDBOX = """\
version: 1
defaults: {vllm: {version: "0.32.0", variant: cpu}}
models: {m: {url: "https://x.example/m.tar.gz", sha256: "%s"}}
hosts:
  a: {address: sandbox, servers: {r1: {model: m, port: 18401}}}
  b: {address: sandbox, servers: {r2: {model: m, port: 18402}}}
endpoints:
  m: {replicas: [a/r1, b/r2], router: {host: a, port: 18400, metrics_port: 18403}}
""" % ("0" * 64)


def test_sandbox_hosts_share_one_network() -> None:
    fleet = load_text(SANDBOX, "sandbox.yaml")
    assert worker_url(fleet, "a", "b/r2") == "http://127.0.0.1:18402"
    assert client_url(fleet, "m") == ("a", "127.0.0.1", 18400)


def test_sandbox_router_port_collides_across_hosts() -> None:
    text = SANDBOX.replace("port: 18400", "port: 18402")
    with pytest.raises(Exception, match="port 18402 on b is claimed twice: by endpoint m's router "
                       r"\(endpoints.m.router.port\) and by server b/r2 \(sandbox hosts share"):
        load_text(text, "sandbox.yaml")


def test_sandbox_replicas_left_at_auto_binding_are_warned_of() -> None:
    """Sandbox hosts share this machine's cores: two CPU replicas at ``auto`` bind the same."""
    (warning,) = list(endpoint_warnings(load_text(SANDBOX, "sandbox.yaml")))
    assert warning[0] == ("endpoints", "m", "replicas", 1)
    assert "a/r1, b/r2" in warning[1] and "same cores" in warning[1]
    bound = SANDBOX.replace("port: 18401}", "port: 18401, env: {VLLM_CPU_OMP_THREADS_BIND: '0'}}")
    bound = bound.replace("port: 18402}", "port: 18402, env: {VLLM_CPU_OMP_THREADS_BIND: '1'}}")
    assert list(endpoint_warnings(load_text(bound, "sandbox.yaml"))) == []


def test_the_router_unit_scores_2_or_less_in_systemd_analyze(fleet, tmp_path) -> None:
    """systemd's own judgement of the rendered unit (offline: the e2e test asks it on a host)."""
    (router,) = router_units(fleet, "gpu-a", nokey)
    path = tmp_path / router.unit
    path.write_text(router.unit_text)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    score = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert score, result.stdout + result.stderr
    assert float(score.group(1)) <= 2.0


def test_a_canary_reaches_the_replicas_rollout_with_the_other_replicas_as_baselines() -> None:
    fleet = load_fleet("tests/data/valid/endpoint-canary.yaml")
    rollout = replica_rollout(fleet, "gpu-b", "chat-b")
    assert rollout is not None and rollout.canary is not None
    # as the router (on gpu-a) reaches it: the canary runs there
    assert rollout.canary.baselines == (("gpu-a/chat-a", "http://127.0.0.1:8001"),)
    assert rollout.canary.key_file == "/etc/vllm-fleet/router-chat.env"
    assert (rollout.canary.requests, rollout.canary.ttft_margin) == (8, 0.25)


def test_no_canary_by_default() -> None:
    fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
    rollout = replica_rollout(fleet, "gpu-b", "chat-b")
    assert rollout is not None and rollout.canary is None


def unit_words(fleet, host: str, server: str) -> list[str]:
    plan = host_plan(fleet, host, lambda r: "")
    unit = next(s for s in plan.servers if s.name == server).unit_text
    return next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split()


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin"])
def test_a_replica_serves_the_render_calls_of_its_router_whatever_the_policy(policy) -> None:
    """vllm-router's cache_aware policy posts ``/v1/*/render`` to a replica before each
    request; vLLM 0.32 answers it only with --enable-scale-out (else 403). Every replica gets the
    flag, so a policy change restarts the router only; a server outside endpoints does not."""
    text = SANDBOX.replace("metrics_port: 18403}", f"metrics_port: 18403, policy: {policy}}}")
    text = text.replace("r2: {model: m, port: 18402}", "r2: {model: m, port: 18402}, "
                        "alone: {model: m, port: 18404}")
    fleet = load_text(text)
    assert "--enable-scale-out" in unit_words(fleet, "a", "r1")
    assert "--enable-scale-out" in unit_words(fleet, "b", "r2")
    assert "--enable-scale-out" not in unit_words(fleet, "b", "alone")


def test_a_replica_keeps_its_own_scale_out_choice_and_older_releases_get_none() -> None:
    own = load_text(SANDBOX.replace("r1: {model: m, port: 18401}",
                                    "r1: {model: m, port: 18401, args: {enable-scale-out: true}}"))
    assert unit_words(own, "a", "r1").count("--enable-scale-out") == 1
    old = load_text(SANDBOX.replace('version: "0.32.0"', 'version: "0.29.0"'))
    assert "--enable-scale-out" not in unit_words(old, "a", "r1")  # 0.29 renders without it
