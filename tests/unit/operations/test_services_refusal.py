"""Servers that span hosts are planned but not deployed yet: the deploy says so before acting."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys.services import services
from fleet.load import load_fleet
from fleet.render import host_plan
from tests.support.opharness import FakeHost

EXAMPLE = Path(__file__).resolve().parents[3] / "inventory" / "examples" / "h200-pair.yaml"


def test_multi_node_server_is_refused_before_any_operation() -> None:
    fleet = load_fleet(EXAMPLE)
    head = next(
        name for name, host in fleet.hosts.items()
        if any(server.worker_hosts for server in host.servers.values())
    )
    fake = FakeHost({})
    fake.data = {"fleet": host_plan(fleet, head, secrets=lambda ref: "secret")}
    with ctx_host.use(fake), pytest.raises(DeployError, match="worker_hosts"):
        services._inner(venv_changed=None, models_changed={})
