"""The typed host plan: every valid fleet file gives typed parts all the way down, and the rules
that once lived only in deploys are decided in fleet (``fleet check`` says so first).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cli.main import main
from fleet.checks import MULTI_NODE_REFUSAL
from fleet.hostplan import (
    CudaStack,
    DeclaredGpus,
    GovernorUnit,
    HostPlan,
    ModelInstall,
    NofileLimit,
    NvidiaStack,
    ServerUnit,
    StackPlan,
)
from fleet.load import load_fleet, load_text
from fleet.render import host_plan

ROOT = Path(__file__).resolve().parents[3]
FILES = sorted((ROOT / "tests" / "data" / "valid").glob("*.yaml")) + sorted(
    (ROOT / "inventory").rglob("*.yaml")
)
CASES = [(path, name) for path in FILES for name in load_fleet(path).hosts]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair.yaml"
#: The same deployment over Ray: planned and checked, refused at deploy by this version.
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
    assert all(MULTI_NODE_REFUSAL not in w.message for w in found)


def test_a_server_across_hosts_with_the_native_launcher_has_no_warning() -> None:
    found: list = []
    load_fleet(EXAMPLE, warnings=found)
    # TP 8 over an HGX board's two sockets is the one warning: no NUMA binding (fleet.numa).
    assert [p.message for p in found if "NUMA" not in p.message] == []
    assert all(p.path[-1] == "gpus" or "NUMA" in p.message for p in found)


@pytest.mark.parametrize("command", ["check", "plan"])
@pytest.mark.parametrize("example", [EXAMPLE, RAY_EXAMPLE], ids=["native", "ray"])
def test_the_examples_with_a_server_across_hosts_stay_valid(command: str, example, capsys):
    assert main([command, str(example)]) == 0
    if command == "check" and example == RAY_EXAMPLE:
        assert "planned and checked, not deployed by this version" not in capsys.readouterr().err


def test_the_plan_deploys_both_launchers() -> None:
    [server] = host_plan(load_fleet(RAY_EXAMPLE), "hgx-h200-01", secrets=lambda ref: "s").servers
    assert server.refusal is None and server.ray_head is not None
    [native] = host_plan(load_fleet(EXAMPLE), "hgx-h200-01", secrets=lambda ref: "s").servers
    assert native.refusal is None and native.ray_head is None


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
