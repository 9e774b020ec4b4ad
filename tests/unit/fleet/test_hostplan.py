"""The typed host plan: every valid fleet file gives typed parts all the way down, and the rules
that once lived only in deploys are decided in fleet (``fleet check`` says so first).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cli.main import main
from fleet.catalog import paths
from fleet.hostplan.render import host_plan
from fleet.hostplan.types import (
    CudaStack,
    DeclaredGpus,
    GovernorUnit,
    HostPlan,
    HostProgram,
    ModelInstall,
    NofileLimit,
    NvidiaStack,
    ServerUnit,
    StackPlan,
)
from fleet.load import load_fleet, load_text

ROOT = Path(__file__).resolve().parents[3]
FILES = sorted((ROOT / "tests" / "data" / "valid").glob("*.yaml")) + sorted(
    (ROOT / "inventory").rglob("*.yaml")
)
CASES = [(path, name) for path in FILES for name in load_fleet(path).hosts]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair.yaml"
#: The same deployment over Ray (the head gets a Ray head unit of its own).
RAY_EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"


def ident(case: tuple[Path, str]) -> str:
    return f"{case[0].stem}/{case[1]}"


def is_typed_tuple(value: object, kind: type) -> bool:
    return isinstance(value, tuple) and all(isinstance(item, kind) for item in value)


@pytest.fixture(scope="module", params=CASES, ids=ident)
def plan(request: pytest.FixtureRequest) -> HostPlan:
    path, name = request.param
    return host_plan(load_fleet(path), name, secrets=lambda ref: "secret")


def test_plan_is_a_host_plan(plan: HostPlan) -> None:
    assert isinstance(plan, HostPlan)
    assert dataclasses.is_dataclass(plan)


def test_every_server_is_a_server_unit(plan: HostPlan) -> None:
    assert is_typed_tuple(plan.servers, ServerUnit)
    for server in plan.servers:
        assert is_typed_tuple(server.worker_hosts, str) and is_typed_tuple(server.after, str)


def test_every_program_a_server_restarts_on_is_uploaded(plan: HostPlan) -> None:
    # the deploys read both from the plan: a name missing here is a KeyError at deploy time
    assert is_typed_tuple(plan.programs, HostProgram)
    names = [program.name for program in plan.programs]
    assert len(names) == len(set(names))
    for server in plan.servers:
        assert server.restarts_on and set(server.restarts_on) <= set(names), server.name


def test_every_path_of_a_server_is_the_plans_own(plan: HostPlan) -> None:
    for server in plan.servers:
        assert server.previous == paths.previous_paths(server.name)
        assert server.unit_path == paths.unit_path(server.name)
        assert server.env_path == paths.env_path(server.name)
        if server.ray_head is not None:
            assert server.ray_head.previous == f"{paths.PREVIOUS_DIR}/{server.ray_head.unit}"


def names(plan: HostPlan) -> list[str]:
    return [program.name for program in plan.programs]


def test_a_host_of_single_servers_gets_no_group_or_ray_programs() -> None:
    plan = host_plan(load_fleet(ROOT / "inventory" / "sandbox.yaml"), "sandbox-1",
                     secrets=lambda ref: "")
    assert names(plan) == ["wait_healthy", "validate_args", "check_ready", "restart_or_restore",
                           "request", "startup_phases", "roll_replica"]
    assert [server.restarts_on for server in plan.servers] == [("wait_healthy",)]


def test_group_members_get_the_group_programs_and_restart_on_them() -> None:
    for host in ("hgx-h200-01", "hgx-h200-02"):
        plan = host_plan(load_fleet(EXAMPLE), host, secrets=lambda ref: "")
        assert {"vllm_serve", "wait_joined", "group_wait"} <= set(names(plan))
        assert not {"ray_node", "ray_joined"} & set(names(plan))
        [server] = plan.servers
        assert server.restarts_on == ("vllm_serve", "wait_joined", "wait_healthy")


def test_over_ray_both_members_get_the_ray_programs_and_the_head_waits_on_ray_joined() -> None:
    fleet = load_fleet(RAY_EXAMPLE)
    head, worker = (host_plan(fleet, host, secrets=lambda ref: "")
                    for host in ("hgx-h200-01", "hgx-h200-02"))
    for plan in (head, worker):
        assert {"ray_node", "ray_joined"} <= set(names(plan))
    assert "ray_joined" in head.servers[0].restarts_on
    assert worker.servers[0].restarts_on == ("vllm_serve", "wait_joined", "wait_healthy",
                                             "ray_node")


def test_only_a_canary_replica_host_gets_the_canary_keeper() -> None:
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "endpoint-canary.yaml")
    with_canary = [host for host in fleet.hosts
                   if "canary_saved" in names(host_plan(fleet, host, secrets=lambda ref: ""))]
    assert with_canary
    plain = host_plan(load_fleet(EXAMPLE), "hgx-h200-01", secrets=lambda ref: "")
    assert "canary_saved" not in names(plain)


def test_every_model_is_a_model_install(plan: HostPlan) -> None:
    assert is_typed_tuple(plan.models, ModelInstall)


def test_the_stack_is_typed(plan: HostPlan) -> None:
    stack = plan.stack
    assert isinstance(stack, StackPlan)
    assert isinstance(stack.gpus, DeclaredGpus)
    assert isinstance(stack.nofile, NofileLimit)
    assert stack.nvidia is None or isinstance(stack.nvidia, NvidiaStack)
    assert stack.cuda is None or isinstance(stack.cuda, CudaStack)
    assert stack.governor is None or isinstance(stack.governor, GovernorUnit)


def test_sequences_are_tuples(plan: HostPlan) -> None:
    assert is_typed_tuple(plan.pip_remove, str) and is_typed_tuple(plan.apt_packages, str)


def test_every_part_is_frozen(plan: HostPlan) -> None:
    parts = [plan, plan.stack, plan.stack.gpus, plan.stack.nofile, *plan.servers, *plan.models]
    parts += [p for p in (plan.stack.nvidia, plan.stack.cuda, plan.stack.governor) if p]
    for part in parts:
        field = dataclasses.fields(part)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, field, None)


def test_servers_start_after_servers_of_the_same_host(plan: HostPlan) -> None:
    names = [server.name for server in plan.servers]
    for position, server in enumerate(plan.servers):
        assert set(server.after) <= set(names[:position])


def test_every_server_model_is_installed(plan: HostPlan) -> None:
    installed = {model.name for model in plan.models}
    assert {server.model for server in plan.servers} == installed


def test_servers_of_a_model() -> None:
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "quad-4090d.yaml")
    plan = host_plan(fleet, "quad-4090d", secrets=lambda ref: "")
    for model in plan.models:
        assert plan.servers_of(model.name)
        assert all(server.model == model.name for server in plan.servers_of(model.name))


# --- rules decided in fleet, not in the deploys ----------------------------------------------


def test_a_server_across_hosts_over_ray_has_no_deploy_warning_any_more() -> None:
    found: list = []
    load_fleet(RAY_EXAMPLE, warnings=found)
    assert [w for w in found if "multinode" in w.path] == []


def test_a_server_across_hosts_with_the_native_launcher_has_no_warning() -> None:
    found: list = []
    load_fleet(EXAMPLE, warnings=found)
    # The example's identity file is not on this machine (fleet.checks.localfiles): not the
    # launcher's.
    found = [p for p in found if p.path[-2:] != ("ssh", "key")]
    # TP 8 over an HGX board's two sockets is the one warning: no NUMA binding (fleet.planner.numa).
    assert [p.message for p in found if "NUMA" not in p.message] == []
    assert all(p.path[-1] == "gpus" or "NUMA" in p.message for p in found)


@pytest.mark.parametrize("command", ["check", "plan"])
@pytest.mark.parametrize("example", [EXAMPLE, RAY_EXAMPLE], ids=["native", "ray"])
def test_the_examples_with_a_server_across_hosts_stay_valid(command: str, example) -> None:
    assert main([command, str(example)]) == 0


def test_the_plan_deploys_both_launchers() -> None:
    [server] = host_plan(load_fleet(RAY_EXAMPLE), "hgx-h200-01", secrets=lambda ref: "s").servers
    assert server.ray_head is not None
    [native] = host_plan(load_fleet(EXAMPLE), "hgx-h200-01", secrets=lambda ref: "s").servers
    assert native.ray_head is None


CUDA_FLEET = """\
version: 1
hosts:
  box:
    address: 10.0.0.1
    gpus: {count: 1}
    os:
      nvidia: {driver: "570", source: SOURCE}
      cuda: "12.8"
    vllm: {version: "0.32.0", variant: cu129}
"""


def test_cuda_with_nvidias_driver_is_valid() -> None:
    fleet = load_text(CUDA_FLEET.replace("SOURCE", "nvidia"), "f.yaml")
    assert host_plan(fleet, "box", secrets=lambda ref: "").stack.cuda is not None
