"""An endpoint's replicas by count (fleet.planner.replicaset): placed by the planner at load, spread
over hosts first, fitted to GPUs without overcommitting, the same on every load, and every
problem reported at the fleet file's own lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.hostplan.endpoints import replica_rollout, router_units
from fleet.hostplan.render import host_plan
from fleet.load import load_text
from fleet.read.problems import FleetError

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
    assert "2 of 3 replicas fit (s1, s2: a cpu host takes one replica (its cores are shared)" \
        in problem


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


# --- issue 21: placement that respects what a host is -----------------------------------------

MON = '  mon:\n    address: 10.0.0.9\n    vllm: {version: "0.32.0", variant: cpu}\n'
L40S = "".join(f"  gpu-{c}:\n    address: 10.0.0.{i}\n    gpus: {{count: 1, model: L40S}}\n"
               "    os: {nvidia: {driver: \"580\"}}\n"
               for i, c in ((1, "a"), (2, "b")))  # fmt: skip
CU130 = 'defaults:\n  vllm: {version: "0.32.0", variant: cu130}\n'


def test_a_count_without_hosts_goes_to_gpu_hosts_not_the_cpu_monitoring_host() -> None:
    """The cpu host comes first in the file; before, it got the first of three replicas."""
    fleet = load_text(fleet_text(MON + L40S, "      count: 2\n" + SMALL, "gpu-a", CU130))
    assert fleet.endpoints["chat"].replicas == ["gpu-a/chat-1", "gpu-b/chat-2"]
    assert fleet.hosts["mon"].servers == {}
    (problem,) = problems(fleet_text(MON + L40S, "      count: 5\n" + SMALL, "gpu-a", CU130))
    assert "4 of 5 replicas fit (mon: a cpu host: the replicas run on the fleet's GPU hosts" \
        in problem


def test_cpu_hosts_listed_by_name_take_replicas_in_a_gpu_fleet() -> None:
    server = "      server: {model: qwen3-8b, port: 8001, host: 0.0.0.0}\n"
    mon2 = MON.replace("mon:", "mon2:").replace("10.0.0.9", "10.0.0.8")
    text = fleet_text(MON + mon2 + L40S, "      count: 2\n      hosts: [mon, mon2]\n" + server,
                      "gpu-a", CU130)
    assert load_text(text, capacity=False).endpoints["chat"].replicas == ["mon/chat-1",
                                                                          "mon2/chat-2"]


def test_a_cpu_host_listed_with_gpu_hosts_is_refused_at_its_entry() -> None:
    text = fleet_text(MON + L40S, "      count: 2\n      hosts: [gpu-a, gpu-b, mon]\n" + SMALL,
                      "gpu-a", CU130)
    (problem,) = problems(text)
    assert "endpoints.chat.replicas.hosts.2: mon runs the cpu build of vLLM (cpu), gpu-a a " \
        "GPU build (cu130)" in problem
    assert problem.endswith("list hosts of one kind (all GPU hosts, or all cpu hosts)")


@pytest.mark.parametrize(("hosts", "path", "words"), [
    ("[]", "endpoints.chat.replicas.hosts:", "hosts: [] names no host for the replicas"),
    ("[gpu-a, gpu-a]", "endpoints.chat.replicas.hosts.1:", "'gpu-a' is listed twice (also at "
     "hosts.0)"),
    ("[gpu-a, gpu-b, gpu-b]", "endpoints.chat.replicas.hosts.2:", "'gpu-b' is listed twice"),
])  # fmt: skip
def test_empty_and_repeated_hosts_are_refused_with_the_fix(hosts: str, path: str,
                                                            words: str) -> None:
    text = fleet_text(L40S, f"      count: 2\n      hosts: {hosts}\n" + SMALL, "gpu-a", CU130)
    (problem,) = problems(text)
    assert path in problem and words in problem


def test_hosts_left_out_still_means_every_host_that_can_run_it() -> None:
    fleet = load_text(fleet_text(L40S, "      count: 2\n" + SMALL, "gpu-a", CU130))
    assert fleet.endpoints["chat"].replicas == ["gpu-a/chat-1", "gpu-b/chat-2"]


def test_a_host_whose_gpus_cannot_hold_the_model_is_skipped() -> None:
    """The 4090 comes first; the 32B model's 61 GiB fit only the H100 (before: placed on the
    4090, then the whole fleet refused as "does not fit")."""
    fleet = load_text((ROOT / "tests/data/valid/scale-replica-skips-small-gpus.yaml").read_text())
    assert fleet.endpoints["chat"].replicas == ["gpu-h100/chat-1"]
    text = (ROOT / "tests/data/valid/scale-replica-skips-small-gpus.yaml").read_text()
    (problem,) = problems(text.replace("      count: 1\n", "      count: 2\n"))
    assert "1 of 2 replicas fit (ws-4090: does not fit its GPUs: weights 61.03 GiB" in problem


def test_a_group_on_a_worker_host_counts_before_a_replica_there() -> None:
    """Placement looks at one host and the hosts its groups link it to: the worker's GPUs
    0-3 are the group's, so the replica gets GPU 4."""
    text = (ROOT / "inventory/examples/h200-pair.yaml").read_text()
    text = text.replace("gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n        worker_hosts",
                        "gpus: [0, 1, 2, 3]\n        worker_hosts")
    text = text.replace("tensor-parallel-size: 8", "tensor-parallel-size: 4")
    text = text.replace("weights_gib: 641.3", "weights_gib: 300")
    text += ("endpoints:\n  chat:\n    replicas:\n      count: 1\n      hosts: [hgx-h200-02]\n"
             "      server: {model: deepseek-v3, port: 8100, host: 0.0.0.0,\n"
             "               args: {max-model-len: 4096, gpu-memory-utilization: 0.9,\n"
             "                      tensor-parallel-size: 4, trust-remote-code: true}}\n"
             "    router: {host: hgx-h200-01, port: 9000, bind: 0.0.0.0}\n")  # fmt: skip
    fleet = load_text(text, capacity=False)
    assert fleet.hosts["hgx-h200-02"].servers["chat-1"].gpus == [4, 5, 6, 7]


def test_a_long_list_of_hosts_in_a_message_is_capped() -> None:
    """Forty full hosts: the message names five and counts the rest (before: all forty, one
    line of 10 KB; at 1,000 hosts, 64 KB)."""
    busy = "    servers:\n      busy: {model: qwen3-8b, port: 8100, gpus: [0]}\n"
    hosts = "".join(f"  h{i:02d}:\n    address: 10.0.2.{i}\n    gpus: {{count: 1, model: L40S}}\n"
                    f'    os: {{nvidia: {{driver: "580"}}}}\n{busy}' for i in range(1, 41))
    (problem,) = problems(fleet_text(hosts, "      count: 1\n" + SMALL, "h01", CU130))
    assert "0 of 1 replicas fit (h01, h02, h03, h04, h05 … and 35 more: needs" in problem
    assert "h06" not in problem and len(problem) < 600
