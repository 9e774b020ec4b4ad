"""Servers that span hosts over Ray are planned but not deployed yet: the plan carries that
decision (made in fleet), and the deploy turns it into its DeployError before acting."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys.plan import current_plan
from deploys.services import services
from fleet.load import load_fleet
from fleet.render import host_plan
from tests.support.opharness import FakeHost

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"
SANDBOX = ROOT / "inventory" / "sandbox.yaml"


def test_multi_node_server_is_refused_before_any_operation() -> None:
    fleet = load_fleet(EXAMPLE)
    head = next(
        name for name, host in fleet.hosts.items()
        if any(server.worker_hosts for server in host.servers.values())
    )
    fake = FakeHost({})
    fake.data = {"fleet": host_plan(fleet, head, secrets=lambda ref: "secret")}
    with ctx_host.use(fake), pytest.raises(DeployError, match="launcher ray"):
        services._inner(venv_changed=None, models_changed={})


def test_the_refusal_is_decided_in_the_plan() -> None:
    fleet = load_fleet(EXAMPLE)
    plans = [host_plan(fleet, name, secrets=lambda ref: "secret") for name in fleet.hosts]
    refused = [server for plan in plans for server in plan.servers if server.refusal]
    # the head's unit and the worker's member unit: the whole group is refused
    assert [server.worker_hosts for server in refused] == [("hgx-h200-02",)] * 2
    assert "not deployed by this version" in refused[0].refusal


def test_single_host_servers_are_not_refused() -> None:
    fleet = load_fleet(SANDBOX)
    assert [s.refusal for s in host_plan(fleet, "sandbox-1", secrets=lambda ref: "").servers] == [
        None
    ]


@pytest.mark.parametrize("data", [{}, {"fleet": {"servers": []}}], ids=["none", "a-dict"])
def test_a_deploy_without_a_typed_plan_is_refused(data: dict) -> None:
    fake = FakeHost({})
    fake.data = data
    fake.name = "box"
    with ctx_host.use(fake), pytest.raises(DeployError, match="has no fleet plan"):
        current_plan()
