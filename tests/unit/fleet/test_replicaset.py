"""An endpoint's replicas by count (fleet.replicaset): placed by the planner at load, spread
over hosts first, fitted to GPUs without overcommitting, the same on every load, and every
problem reported at the fleet file's own lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.endpoints import replica_rollout, router_units
from fleet.load import load_text
from fleet.problems import FleetError
from fleet.render import host_plan

ROOT = Path(__file__).resolve().parents[3]
VALID = (ROOT / "tests" / "data" / "valid" / "endpoint-replica-count.yaml").read_text()
QWEN = VALID.split("models:\n", 1)[1].split("hosts:\n", 1)[0]


def fleet_text(hosts: str, replicas: str, router_host: str = "box", head: str = "") -> str:
    return (f"version: 1\n{head}models:\n{QWEN}hosts:\n{hosts}endpoints:\n  chat:\n"
            f"    replicas:\n{replicas}    router: {{host: {router_host}, port: 8000, "
            "bind: 0.0.0.0}\n")  # fmt: skip


GPU_DEFAULTS = ('defaults:\n  os: {nvidia: {driver: "570"}}\n'
                '  vllm: {version: "0.32.0", variant: cu129}\n')  # fmt: skip
SMALL = ("      server: {model: qwen3-8b, port: 8001, host: 0.0.0.0,\n"
         "               args: {max-model-len: 4096, gpu-memory-utilization: 0.45}}\n")  # fmt: skip


def problems(text: str) -> list[str]:
    with pytest.raises(FleetError) as err:
        load_text(text, "f.yaml")
    return [str(p) for p in err.value.problems]


def test_one_replica_per_host_before_any_host_gets_two() -> None:
    hosts = "".join(f"  h{i}:\n    address: 10.0.0.{i}\n    gpus: {{count: 2, model: L40S}}\n"
                    for i in (1, 2, 3))  # fmt: skip
    fleet = load_text(fleet_text(hosts, "      count: 4\n" + SMALL, "h1", GPU_DEFAULTS))
    assert fleet.endpoints["chat"].replicas == ["h1/chat-1", "h2/chat-2", "h3/chat-3",
                                                "h1/chat-4"]  # fmt: skip
    # the second replica on h1 listens on the next port; its GPUs never overcommit
    assert fleet.hosts["h1"].servers["chat-1"].port == 8001
    assert fleet.hosts["h1"].servers["chat-4"].port == 8002
    assert "port 8002: 8001 is taken there" in fleet.endpoints["chat"].placed["h1/chat-4"]


def test_two_small_replicas_share_one_host_as_the_4090d_box_does() -> None:
    hosts = ("  box:\n    address: 10.0.0.21\n"
             "    gpus: {count: 2, model: RTX 4090 D, memory_gib: 24}\n")  # fmt: skip
    small = SMALL.replace("4096", "2048").replace("0.45", "0.9")
    text = fleet_text(hosts, "      count: 2\n" + small, head=GPU_DEFAULTS)
    fleet = load_text(text)
    servers = fleet.hosts["box"].servers
    assert [(n, s.gpus, s.port) for n, s in servers.items()] == [("chat-1", [0], 8001),
                                                                ("chat-2", [1], 8002)]
    assert load_text(text).model_dump() == fleet.model_dump()  # the same on every load


def test_servers_the_file_places_count_first() -> None:
    fleet = load_text(VALID)
    assert fleet.hosts["gpu-a"].servers["batch"].gpus == [0]
    assert fleet.hosts["gpu-a"].servers["chat-1"].gpus == [1]


def test_a_count_that_does_not_fit_says_what_each_host_lacks() -> None:
    found = problems(VALID.replace("      count: 2", "      count: 3"))
    (problem,) = found
    assert problem.startswith("f.yaml:32:14: endpoints.chat.replicas.count: 2 of 3 replicas fit")
    assert "gpu-a: needs 41.43 GiB on one GPU" in problem and "gpu-b: needs" in problem
    assert problem.endswith("lower count, name more hosts (replicas.hosts), or free GPUs on them")


def test_cpu_hosts_take_one_replica_each() -> None:
    hosts = "".join(f"  s{i}: {{address: sandbox, vllm: {{version: \"0.32.0\", variant: cpu}}}}\n"
                    for i in (1, 2))  # fmt: skip
    server = "      server: {model: qwen3-8b, port: 8001}\n"
    fleet = load_text(fleet_text(hosts, "      count: 2\n" + server, "s1"), capacity=False)
    assert fleet.endpoints["chat"].replicas == ["s1/chat-1", "s2/chat-2"]
    # sandbox hosts share this machine's network: the second replica takes the next port
    assert [fleet.hosts[h].servers[n].port for h, n in (("s1", "chat-1"), ("s2", "chat-2"))] == [
        8001, 8002]
    (problem,) = problems(fleet_text(hosts, "      count: 3\n" + server, "s1"))
    assert "2 of 3 replicas fit (s1: a cpu host takes one replica (its cores are shared)" in problem


def test_hosts_limits_where_they_go() -> None:
    text = VALID.replace("      count: 2", "      count: 1\n      hosts: [gpu-b]")
    assert load_text(text).endpoints["chat"].replicas == ["gpu-b/chat-1"]


def test_the_replicas_are_ordinary_servers_downstream() -> None:
    """The router's worker list, each replica's rollout and the host plans see them."""
    fleet = load_text(VALID)
    (router,) = router_units(fleet, "gpu-a", secrets=lambda ref: "k")
    assert router.worker_urls == ("http://127.0.0.1:8001", "http://10.0.1.22:8001")
    assert replica_rollout(fleet, "gpu-b", "chat-2").worker_url == "http://10.0.1.22:8001"
    plan = host_plan(fleet, "gpu-b", secrets=lambda ref: "k")
    assert [s.name for s in plan.servers] == ["chat-2"]
    assert "CUDA_VISIBLE_DEVICES=0" in plan.servers[0].env_text
