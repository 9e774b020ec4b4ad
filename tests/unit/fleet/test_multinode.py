"""Servers across hosts, rendered: the reference deployment of two 8×H200 nodes on every node.

inventory/examples/h200-pair.yaml is written as a user would by hand; here each node's unit is
rendered and its command line read by vLLM 0.32's own parser (``$FLEET_VLLM_PYTHON``, as the
flag tests do), and the units, environments and group plans are held to what the multi-node
launcher needs (docs/multinode.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.hostplan.groups import member_flags
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet, load_text
from fleet.planner.groups import group_members
from tests.support.vllmparse import vllm_parse
from tests.unit.fleet.test_flags import vllm_python

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair.yaml"
HEAD, WORKER = "hgx-h200-01", "hgx-h200-02"


def plans() -> dict[str, Any]:
    fleet = load_fleet(EXAMPLE)
    return {name: host_plan(fleet, name, secrets=lambda ref: "the-key") for name in fleet.hosts}


def member(host: str):
    [entry] = [s for s in plans()[host].servers if s.name == "deepseek"]
    return entry


def exec_start(text: str) -> str:
    [line] = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=")




@pytest.fixture(scope="module")
def parsed() -> dict[str, list[Any]]:
    """Each node's rendered command line through vLLM's own parser, in one vLLM process."""
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vLLM installed (set FLEET_VLLM_PYTHON)")
    lines = {host: exec_start(member(host).unit_text) for host in (HEAD, WORKER)}
    return vllm_parse(python, lines)


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_vllm_accepts_every_nodes_command_line(parsed, host: str) -> None:
    code, message, _ = parsed[host]
    assert code == 0, message


@pytest.mark.parametrize(("host", "rank", "headless"), [(HEAD, 0, False), (WORKER, 1, True)])
def test_vllm_reads_each_nodes_place_in_the_group(parsed, host, rank, headless) -> None:
    args = parsed[host][2]
    assert (args["nnodes"], args["node_rank"], args["headless"]) == (2, rank, headless)
    assert (args["master_addr"], args["master_port"]) == ("10.10.0.1", 29500)


def test_vllm_reads_the_same_model_and_parallelism_on_both_nodes(parsed) -> None:
    keys = ("model", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len",
            "gpu_memory_utilization", "trust_remote_code", "served_model_name")
    head, worker = ({key: parsed[host][2][key] for key in keys} for host in (HEAD, WORKER))
    assert head == worker
    assert (head["tensor_parallel_size"], head["pipeline_parallel_size"]) == (8, 2)


def test_only_the_head_serves_the_api() -> None:
    head, worker = exec_start(member(HEAD).unit_text), exec_start(member(WORKER).unit_text)
    assert "--port 8000" in head and "--host 0.0.0.0" in head
    assert "--port" not in worker.split("-- ", 1)[1] and "--headless" in worker
    assert member(HEAD).role == "head" and member(WORKER).role == "worker"


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_every_member_talks_over_the_declared_interface(host: str) -> None:
    env = member(host).env_text
    assert "NCCL_SOCKET_IFNAME=ens8f0" in env and "GLOO_SOCKET_IFNAME=ens8f0" in env
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in env


def test_the_api_key_stays_on_the_head() -> None:
    assert "VLLM_API_KEY" in member(HEAD).env_text
    assert "VLLM_API_KEY" not in member(WORKER).env_text and not member(WORKER).has_api_key


def test_the_worker_unit_is_hardened_with_the_devices_the_engine_needs() -> None:
    unit = member(WORKER).unit_text
    for line in ("DevicePolicy=closed", "DeviceAllow=/dev/nvidia7 rw",
                 "DeviceAllow=char-infiniband_verbs rw", "LimitMEMLOCK=infinity",
                 "NoNewPrivileges=yes", "ProtectSystem=strict", "Restart=always",
                 "StartLimitIntervalSec=0"):
        assert line in unit.splitlines(), line


def test_the_worker_waits_until_it_has_joined_the_head() -> None:
    unit = member(WORKER).unit_text
    assert ("wait_joined.py --head hgx-h200-01 --connect 10.10.0.1:29500 --pid $MAINPID "
            "--timeout 600") in unit


def test_both_members_carry_one_group_revision() -> None:
    head, worker = member(HEAD).group, member(WORKER).group
    assert head is not None and worker is not None
    assert head.revision == worker.revision
    assert f"group revision {head.revision}" in member(WORKER).unit_text
    assert f"group revision {head.revision}" in member(HEAD).unit_text
    assert (head.members, worker.members) == ((HEAD, WORKER),) * 2


def test_a_change_to_the_server_changes_every_members_revision() -> None:
    text = EXAMPLE.read_text().replace("max-model-len: 32768", "max-model-len: 16384")
    fleet = load_text(text, str(EXAMPLE))
    changed = host_plan(fleet, WORKER, secrets=lambda ref: "k").servers[0].group
    assert changed is not None and changed.revision != member(WORKER).group.revision


def test_the_worker_host_installs_the_groups_model_and_vllm() -> None:
    plan = plans()[WORKER]
    assert [model.name for model in plan.models] == ["deepseek-v3"]
    assert plan.stack.serves


def test_the_group_is_one_replica_with_its_member_list() -> None:
    # the hook rolling upgrades use: one ServerUnit per host, one GroupPlan naming them all
    fleet = load_fleet(EXAMPLE)
    assert [m.host for m in group_members(fleet, HEAD, "deepseek")] == [HEAD, WORKER]
    assert member(HEAD).group.workers == (WORKER,)


DP_FLEET = """\
version: 1
defaults:
  gpus: {count: 8, model: H200}
  os: {nvidia: {driver: "580.65.06"}, cuda: "13.0"}
  vllm: {version: "0.32.0", variant: cu130}
models:
  m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}
hosts:
  a:
    address: 10.0.0.1
    servers:
      moe:
        model: m
        port: 8000
        gpus: [0, 1, 2, 3, 4, 5, 6, 7]
        worker_hosts: [b]
        multinode: {dp_rpc_port: 13345}
        args: {data-parallel-size: 16, enable-expert-parallel: true}
  b:
    address: 10.0.0.2
"""


def test_data_parallel_across_hosts_gives_each_node_its_share_of_ranks() -> None:
    fleet = load_text(DP_FLEET, "dp.yaml")
    assert member_flags(fleet, "a", "moe", 0) == [
        "--data-parallel-size-local", "8", "--data-parallel-address", "10.0.0.1",
        "--data-parallel-rpc-port", "13345"]
    assert member_flags(fleet, "a", "moe", 1) == [
        "--data-parallel-size-local", "8", "--data-parallel-address", "10.0.0.1",
        "--data-parallel-rpc-port", "13345", "--data-parallel-start-rank", "8", "--headless"]


RAY_EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"


def test_over_ray_the_head_runs_vllm_with_the_ray_backend_and_the_worker_only_ray() -> None:
    # the Ray units in detail: tests/unit/fleet/test_ray.py
    fleet = load_fleet(RAY_EXAMPLE)
    head, worker = (host_plan(fleet, host, secrets=lambda ref: "k").servers[0]
                    for host in (HEAD, WORKER))
    assert "--distributed-executor-backend ray" in exec_start(head.unit_text)
    assert "/bin/ray start --block --address 10.10.0.1:6379 " in exec_start(worker.unit_text)
    assert "vllm.entrypoints" not in exec_start(worker.unit_text)


CPU_FLEET = """\
version: 1
defaults: {vllm: {version: "0.32.0", variant: cpu}}
models: {m: {url: "http://m.example/m.tar.gz", sha256: "SHA"}}
hosts:
  a:
    address: 10.0.0.1
    servers:
      s:
        model: m
        port: 8000
        worker_hosts: [b]
        args: {tensor-parallel-size: 2ARGS}
  b:
    address: 10.0.0.2
""".replace("SHA", "0" * 64)


@pytest.mark.parametrize("eager", [True, False])
def test_an_eager_cpu_group_runs_no_torch_compile_on_any_member(eager: bool) -> None:
    # vLLM compiles one TP helper whatever enforce-eager says: without g++ the first completion
    # fails on the CPU build (InvalidCxxCompiler, measured on sandbox hosts)
    text = CPU_FLEET.replace("ARGS", ", enforce-eager: true" if eager else "")
    fleet = load_text(text, "cpu.yaml")
    for host in ("a", "b"):
        env = host_plan(fleet, host, secrets=lambda ref: "k").servers[0].env_text
        assert ("TORCH_COMPILE_DISABLE=1" in env) is eager


def test_a_gpu_group_keeps_torch_compile() -> None:
    assert "TORCH_COMPILE_DISABLE" not in member(HEAD).env_text
    assert "TORCH_COMPILE_DISABLE" not in member(WORKER).env_text
