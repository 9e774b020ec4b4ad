"""A refusal to deploy is decided in fleet and carried by the plan; the deploy turns it into its
DeployError before acting. Servers across hosts over Ray deploy now (on GPU builds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys.plan import current_plan
from fleet.load import load_fleet
from fleet.render import host_plan
from tests.support.opharness import FakeHost

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"
SANDBOX = ROOT / "inventory" / "sandbox.yaml"


def test_a_server_across_hosts_over_ray_is_no_longer_refused() -> None:
    # both launchers deploy on GPU builds (the cpu build is refused by `fleet check`: test_ray)
    fleet = load_fleet(EXAMPLE)
    plans = [host_plan(fleet, name, secrets=lambda ref: "secret") for name in fleet.hosts]
    assert [server.refusal for plan in plans for server in plan.servers] == [None, None]


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
