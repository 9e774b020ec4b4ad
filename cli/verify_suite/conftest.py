"""Targets of the verify suite: every (host, server) of the fleet file ``$FLEET``.

``fleet verify`` sets FLEET and FLEET_SSH_CONFIG (an ssh_config with one Host entry per fleet
host) and runs this folder with pytest; each test gets a ``target`` with the testinfra host and
the server's plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
import testinfra

from fleet.hostplan.render import host_plan
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.types import HostPlan, RouterUnit, ServerUnit
from fleet.load import load_fleet
from fleet.spec.models import PemRef, SecretRef


@dataclass
class Target:
    """One server of one host, reached through testinfra."""

    host_name: str
    host: Any  # testinfra.host.Host
    plan: HostPlan
    server: ServerUnit

    def __str__(self) -> str:
        return f"{self.host_name}/{self.server.name}"


def _pem_only(ref: SecretRef) -> str:
    """What verify reads of the fleet's secrets: a server's TLS files (to compare with the
    deployed ones by digest, and the certificate's fingerprint with the served one), nothing
    else (an API key is not needed to check a host)."""
    return read_secret(ref) if isinstance(ref, PemRef) else ""


def _targets() -> list[tuple[str, HostPlan, ServerUnit]]:
    fleet = load_fleet(os.environ["FLEET"])
    found = []
    for name in fleet.hosts:
        plan = host_plan(fleet, name, secrets=_pem_only)
        for server in plan.servers:
            found.append((name, plan, server))
    return found


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "router_target" in metafunc.fixturenames:
        routers = _routers()
        metafunc.parametrize(
            "router_spec", routers, ids=[f"{h}/{r.endpoint}" for h, _, r in routers]
        )
    if "target" in metafunc.fixturenames:
        targets = _targets()
        metafunc.parametrize(
            "target_spec", targets, ids=[f"{h}/{s.name}" for h, _, s in targets],
            indirect=False,
        )


_hosts: dict[str, Any] = {}


@pytest.fixture
def target(target_spec) -> Target:
    """The testinfra host and server plan for one (host, server) pair."""
    name, plan, server = target_spec
    if name not in _hosts:
        _hosts[name] = testinfra.get_host(
            f"ssh://{name}", ssh_config=os.environ["FLEET_SSH_CONFIG"]
        )
    return Target(name, _hosts[name], plan, server)


@dataclass
class RouterTarget:
    """One endpoint router of one host, reached through testinfra."""

    host_name: str
    host: Any  # testinfra.host.Host
    plan: HostPlan
    router: RouterUnit

    def __str__(self) -> str:
        return f"{self.host_name}/{self.router.unit}"


def _routers() -> list[tuple[str, HostPlan, RouterUnit]]:
    fleet = load_fleet(os.environ["FLEET"])
    found = []
    for name in fleet.hosts:
        plan = host_plan(fleet, name, secrets=lambda ref: "")
        found += [(name, plan, router) for router in plan.routers]
    return found


@pytest.fixture
def router_target(router_spec) -> RouterTarget:
    """The testinfra host and router plan of one endpoint's router."""
    name, plan, router = router_spec
    if name not in _hosts:
        _hosts[name] = testinfra.get_host(
            f"ssh://{name}", ssh_config=os.environ["FLEET_SSH_CONFIG"]
        )
    return RouterTarget(name, _hosts[name], plan, router)
