"""The Ray launcher, rendered: inventory/examples/h200-pair-ray.yaml on both members.

The head gets a Ray head unit and its vLLM unit (``--distributed-executor-backend ray``, read by
vLLM 0.32's own parser as the native example's command lines are), the worker a Ray worker
unit; every ``ray start`` command line is read by Ray's own command-line parser (the ``ray``
package, where installed); Ray is pinned per vLLM release and installed on both members.
"""

from __future__ import annotations

import importlib
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from fleet.catalog.ray import ray_pin, ray_requirement
from fleet.checks.groups import CPU_RAY_ERROR
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet, load_text, merge_defaults, parse_yaml
from fleet.read.problems import FleetError
from fleet.spec.models import Fleet
from tests.support.vllmparse import vllm_parse
from tests.unit.fleet.test_flags import vllm_python
from tests.unit.fleet.test_multinode import exec_start

ROOT = Path(__file__).resolve().parents[3]
RAY_EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"
NATIVE_EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair.yaml"
HEAD, WORKER = "hgx-h200-01", "hgx-h200-02"


def plan(host: str, example: Path = RAY_EXAMPLE):
    return host_plan(load_fleet(example), host, secrets=lambda ref: "the-key")


def server(host: str):
    [entry] = plan(host).servers
    return entry


def directives(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def ray_words(line: str) -> list[str]:
    """The ``ray start …`` words of a Ray unit's ExecStart (after ray_node.py's ``--``)."""
    words = shlex.split(line)
    assert words[1].endswith("/hostside/ray_node.py"), words
    return words[words.index("--") + 1:]


# --- Ray per vLLM release --------------------------------------------------------------------


def test_vllm_032_runs_on_the_ray_its_ci_pins_with_compiled_graph() -> None:
    # vllm 0.32.0's wheel does not depend on Ray; its executor needs ray>=2.43.0 with cgraph,
    # its CI lock (requirements/test/cuda.txt) pins ray==2.48.0
    assert ray_pin("0.32.0") == ("2.43.0", "2.48.0")
    assert ray_requirement("0.32.0", "cu130") == "ray[cgraph]==2.48.0"
    assert ray_pin("0.11.0") is None


def test_both_members_install_the_pinned_ray_and_native_groups_none() -> None:
    assert plan(HEAD).ray_package == plan(WORKER).ray_package == "ray[cgraph]==2.48.0"
    assert plan(HEAD, NATIVE_EXAMPLE).ray_package is None
    assert plan(WORKER, NATIVE_EXAMPLE).ray_package is None


def test_the_fleet_file_may_name_another_ray() -> None:
    text = RAY_EXAMPLE.read_text().replace("ray_port: 6379}",
                                           'ray_port: 6379, ray_version: "2.50.1"}')
    fleet = load_text(text, "ray.yaml")
    for host in (HEAD, WORKER):
        assert host_plan(fleet, host, secrets=lambda ref: "k").ray_package == "ray[cgraph]==2.50.1"
    before, after = (host_plan(f, HEAD, secrets=lambda ref: "k").servers[0].group.revision
                     for f in (load_fleet(RAY_EXAMPLE), fleet))
    assert before != after  # another Ray restarts the whole group


def test_a_ray_version_that_is_not_a_release_is_a_located_error() -> None:
    text = RAY_EXAMPLE.read_text().replace("ray_port: 6379}",
                                           'ray_port: 6379, ray_version: "latest"}')
    with pytest.raises(FleetError) as error:
        load_text(text, "ray.yaml")
    assert "ray_version" in str(error.value) and "2.48.0" in str(error.value)


def test_a_release_the_table_does_not_know_needs_a_ray_version() -> None:
    text = RAY_EXAMPLE.read_text().replace('version: "0.32.0"', 'version: "0.31.0"')
    with pytest.raises(FleetError) as error:
        load_text(text, "ray.yaml")
    assert "no Ray is known for vLLM 0.31.0" in str(error.value)
    assert "multinode.ray_version" in str(error.value)


def test_the_cpu_build_is_refused_over_ray_with_vllms_own_words() -> None:
    text = (RAY_EXAMPLE.read_text().replace("variant: cu130", "variant: cpu")
            .replace('    cuda: "13.0"\n', "")
            .replace('    nvidia: {driver: "580.65.06", persistence: true, fabric_manager: true}\n',
                     ""))
    with pytest.raises(FleetError) as error:
        load_text(text, "ray.yaml")
    message = str(error.value)
    assert "ValueError: current platform cpu does not support ray." in message
    assert "multinode.launcher" in message and "launcher: native" in message


def test_the_cpu_refusal_is_what_vllms_own_code_raises() -> None:
    """The words of the refusal, read from the installed vLLM's source (the e2e no longer starts
    a CPU vLLM over Ray to see them: ~90 s of CI for one line of its journal): the Ray cluster
    setup raises them for a platform without a Ray device key, and the CPU platform has none."""
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vLLM installed (set FLEET_VLLM_PYTHON)")
    found = subprocess.run(
        [python, "-c", "import importlib.util as u; "
         "print(u.find_spec('vllm').submodule_search_locations[0])"],
        capture_output=True, text=True, timeout=60, check=True)
    vllm = Path(found.stdout.strip())
    ray_utils = (vllm / "v1" / "executor" / "ray_utils.py").read_text()
    setup = ray_utils.split("def initialize_ray_cluster(", 1)[1].split("\ndef ", 1)[0]
    assert ('device_str = current_platform.ray_device_key if not device_str: raise ValueError( '
            'f"current platform {current_platform.device_name} does not support ray."'
            ) in " ".join(setup.split())
    cpu = (vllm / "platforms" / "cpu.py").read_text()
    assert 'device_name: str = "cpu"' in cpu and "ray_device_key" not in cpu
    assert 'ray_device_key: str = ""' in (vllm / "platforms" / "interface.py").read_text()
    assert CPU_RAY_ERROR == "current platform cpu does not support ray."


# --- the head: a Ray head unit, then vLLM over Ray ---------------------------------------------


def test_the_head_runs_a_ray_head_on_the_declared_interface_with_its_gpus() -> None:
    ray = server(HEAD).ray_head
    assert ray.unit == "vllm-deepseek-ray.service"
    assert ray.unit_path == "/etc/systemd/system/vllm-deepseek-ray.service"
    [line] = directives(ray.unit_text, "ExecStart")
    assert "/hostside/ray_node.py --interface ens8f0 -- " in line
    assert ray_words(line) == [
        "/opt/vllm-fleet/venv/bin/ray", "start", "--block", "--head", "--port", "6379",
        "--include-dashboard=false", "--node-manager-port", "6380", "--object-manager-port",
        "6381", "--min-worker-port", "10002", "--max-worker-port", "10999", "--num-gpus", "8",
        "--resources", '{"fleet_member_hgx-h200-01":1}', "--temp-dir",
        "/run/vllm-fleet/ray/deepseek", "--disable-usage-stats"]
    assert directives(ray.unit_text, "RuntimeDirectory") == ["vllm-fleet/ray/deepseek"]


def test_the_ray_head_unit_is_hardened_with_the_devices_ray_needs() -> None:
    text = server(HEAD).ray_head.unit_text
    assert text.startswith("# Managed by vllm-fleet — edit the fleet file, not this unit.\n")
    for line in ("User=vllm", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                 "CapabilityBoundingSet=", "DevicePolicy=closed", "LimitMEMLOCK=infinity",
                 "DeviceAllow=/dev/nvidia7 rw", "DeviceAllow=char-infiniband_verbs rw",
                 "SystemCallFilter=@system-service", "Restart=always"):
        assert line in text.splitlines(), line
    assert "EnvironmentFile=/etc/vllm-fleet/deepseek.env" in text  # NCCL/GLOO interface


def test_the_heads_vllm_starts_after_its_ray_head_and_waits_for_every_node() -> None:
    text = server(HEAD).unit_text
    assert directives(text, "Requires") == ["vllm-deepseek-ray.service"]
    assert "vllm-deepseek-ray.service" in directives(text, "After")
    assert directives(text, "Environment") == ["RAY_ADDRESS=10.10.0.1:6379"]
    assert directives(text, "ReadWritePaths") == ["-/run/vllm-fleet/ray/deepseek"]
    [wait] = directives(text, "ExecStartPre")
    assert wait == ("+/opt/vllm-fleet/venv/bin/python /usr/local/lib/vllm-fleet/hostside/"
                    "ray_joined.py --ray /opt/vllm-fleet/venv/bin/ray --address 10.10.0.1:6379 "
                    "--member hgx-h200-01 --member hgx-h200-02 --gpus 16 --timeout 600")
    # the wait is part of the start: the start timeout covers it
    assert directives(text, "TimeoutStartSec") == [str(900 + 600)]


def test_the_native_head_has_no_ray() -> None:
    [entry] = plan(HEAD, NATIVE_EXAMPLE).servers
    assert entry.ray_head is None
    for key in ("Requires", "ExecStartPre", "Environment"):
        assert directives(entry.unit_text, key) == []


@pytest.fixture(scope="module")
def parsed_head() -> list:
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vLLM installed (set FLEET_VLLM_PYTHON)")
    return vllm_parse(python, {HEAD: exec_start(server(HEAD).unit_text)})[HEAD]


def test_vllm_reads_the_heads_command_line_over_ray(parsed_head) -> None:
    code, message, args = parsed_head
    assert code == 0, message
    assert args["distributed_executor_backend"] == "ray"
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (8, 2)
    assert not args.get("headless") and args.get("nnodes") in (None, 1)


# --- the worker: a Ray worker unit ------------------------------------------------------------


def test_the_worker_runs_only_a_ray_node_joining_the_head() -> None:
    entry = server(WORKER)
    assert entry.ray_head is None and entry.unit == "vllm-deepseek.service"
    [line] = directives(entry.unit_text, "ExecStart")
    assert " --interface ens8f0 -- " in line
    assert ray_words(line) == [
        "/opt/vllm-fleet/venv/bin/ray", "start", "--block", "--address", "10.10.0.1:6379",
        "--node-manager-port", "6380", "--object-manager-port", "6381", "--min-worker-port",
        "10002", "--max-worker-port", "10999", "--num-gpus", "8", "--resources",
        '{"fleet_member_hgx-h200-02":1}', "--temp-dir", "/run/vllm-fleet/ray/deepseek",
        "--disable-usage-stats"]
    # Ray's temp dir is the head's path on every node: the worker's unit makes it its own
    assert directives(entry.unit_text, "RuntimeDirectory") == [
        "vllm-fleet/servers/deepseek vllm-fleet/ray/deepseek"]
    # joined: a process of the unit holds a link to the Ray head's GCS port
    [post] = directives(entry.unit_text, "ExecStartPost")
    assert "wait_joined.py --head hgx-h200-01 --connect 10.10.0.1:6379 " in post


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_every_member_talks_over_the_declared_interface(host: str) -> None:
    env = server(host).env_text
    assert "NCCL_SOCKET_IFNAME=ens8f0\n" in env and "GLOO_SOCKET_IFNAME=ens8f0\n" in env


def test_the_api_key_stays_on_the_head() -> None:
    assert "VLLM_API_KEY" in server(HEAD).env_text
    assert "VLLM_API_KEY" not in server(WORKER).env_text
    # the Ray head reads the same env file (NCCL/GLOO settings) but drops the key
    assert directives(server(HEAD).ray_head.unit_text, "UnsetEnvironment") == ["VLLM_API_KEY"]


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_rays_own_parser_accepts_every_ray_start(host: str) -> None:
    scripts = importlib.import_module("ray.scripts.scripts")  # a dev dependency (pyproject)
    entry = server(host)
    text = entry.ray_head.unit_text if entry.ray_head else entry.unit_text
    [line] = directives(text, "ExecStart")
    words = ray_words(line)
    context = scripts.start.make_context("start", [*words[2:], "--node-ip-address", "10.10.0.1"])
    params = context.params
    assert params["block"] and params["head"] is (host == HEAD)
    assert params["num_gpus"] == 8
    assert params["include_dashboard"] is (False if host == HEAD else None)
    assert json.loads(params["resources"]) == {f"fleet_member_{host}": 1}


# --- members sharing one network (sandbox hosts): each Ray node on ports of its own -------------

SANDBOX_RAY = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  tiny: {{url: "http://127.0.0.1:1/t.tar.gz", sha256: "{sha}"}}
hosts:
  a:
    address: sandbox
    servers:
      g:
        model: tiny
        port: 18507
        worker_hosts: [b]
        multinode: {{launcher: ray, {where}ray_port: 18502, ray_node_manager_port: {nm},
                    ray_object_manager_port: {om}, ray_min_worker_port: {low},
                    ray_max_worker_port: {high}}}
        args: {{tensor-parallel-size: 2}}
  b:
    address: sandbox
"""


def sandbox_ray(nm: int = 18503, om: int = 18504, low: int = 18508, high: int = 18517,
                where: str = "interface: eth0, head_address: 192.0.2.2, ") -> str:
    return SANDBOX_RAY.format(sha="a" * 64, nm=nm, om=om, low=low, high=high, where=where)


def sandbox_plans(text: str) -> dict[str, object]:
    """Both members' plans, rendered past ``fleet check`` (which refuses the cpu build over
    Ray, whatever the ports: tests/e2e/test_multinode_e2e.py runs these units)."""
    raw, _ = parse_yaml(text, "ray.yaml")
    fleet = Fleet.model_validate(merge_defaults(raw)[0])
    return {host: host_plan(fleet, host, secrets=lambda ref: "") for host in ("a", "b")}


def ray_start_of(plan) -> list[str]:
    [entry] = plan.servers
    text = entry.ray_head.unit_text if entry.ray_head else entry.unit_text
    [line] = directives(text, "ExecStart")
    return ray_words(line)


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_sandbox_members_each_get_their_own_ray_ports() -> None:
    plans = sandbox_plans(sandbox_ray())
    ports = {host: [option(ray_start_of(plan), flag) for flag in (
        "--node-manager-port", "--object-manager-port", "--min-worker-port", "--max-worker-port")]
        for host, plan in plans.items()}
    assert ports == {"a": ["18503", "18504", "18508", "18512"],
                     "b": ["18505", "18506", "18513", "18517"]}
    assert option(ray_start_of(plans["b"]), "--address") == "192.0.2.2:18502"


def test_hosts_of_their_own_keep_the_ports_written_on_every_member() -> None:
    starts = [ray_start_of(plan(host)) for host in (HEAD, WORKER)]
    for flag in ("--node-manager-port", "--object-manager-port", "--min-worker-port",
                 "--max-worker-port"):
        assert option(starts[0], flag) == option(starts[1], flag)


def problems_of(text: str) -> list[str]:
    with pytest.raises(FleetError) as error:
        load_text(text, "ray.yaml")
    return [f"{'.'.join(map(str, p.path))}: {p.message}" for p in error.value.problems]


def test_sandbox_ray_ports_that_collide_are_located_errors() -> None:
    cpu = ("hosts.a.servers.g.multinode.launcher: the cpu build of vLLM cannot serve over Ray: "
           "vLLM 0.32.0 says `ValueError: current platform cpu does not support ray.`")
    assert problems_of(sandbox_ray()) == [cpu]  # the e2e's ports: only the cpu refusal
    # b's node manager port (18503 + 2) is a's object manager port
    collide = problems_of(sandbox_ray(om=18505))
    assert ("hosts.a.servers.g.multinode.ray_node_manager_port: port 18505 on b is claimed "
            "twice: by the Ray object manager of group a/g (Ray head) "
            "(hosts.a.servers.g.multinode.ray_object_manager_port) and by the Ray node manager "
            "of group a/g (worker b) (sandbox hosts share this machine's network)") in collide
    inside = problems_of(sandbox_ray(low=18500, high=18510))
    assert ("hosts.a.servers.g.multinode.ray_min_worker_port: ports 18500–18504 of the Ray "
            "worker port range of group a/g (Ray head) on a take in port 18502 of the Ray GCS of "
            "group a/g (Ray head) (hosts.a.servers.g.multinode.ray_port)") in inside, inside
    narrow = problems_of(sandbox_ray(low=18510, high=18510))
    assert any("fewer ports than the group's 2 members" in p for p in narrow), narrow


def test_a_ray_head_on_loopback_is_a_located_error() -> None:
    # measured on the sandbox pair: Ray replaced --node-ip-address 127.0.0.1 by the machine's
    # address (192.0.2.2), and the worker's raylet joined the GCS there, never at 127.0.0.1
    problems = problems_of(sandbox_ray(where=""))  # sandbox hosts: the head at 127.0.0.1
    assert ("hosts.a.servers.g.multinode.head_address: a Ray head cannot be reached at "
            "127.0.0.1: Ray runs no node on a loopback address (it takes the machine's own "
            "instead, and its workers join the head there)") in problems
