"""The servers' deploy as pyinfra orders it across hosts (tests/support/deployharness.py, with
fake facts): one endpoint's replicas on two hosts are rolled by one operation (so
``max_unavailable`` counts across hosts), and hosts that hold replicas at different places of
their server lists — or two endpoints' replicas in both orders — deploy without an order cycle.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.fleet.test_deployorder import HEADER, endpoint, server
from tests.unit.operations.test_services_deploy import steps_of

ROOT = Path(__file__).resolve().parents[3]


def rolls(steps) -> dict[str, set[str]]:
    """Each host's roll operations, by the names pyinfra holds for each (one set per
    operation, across the hosts that run it)."""
    found: dict[str, set[str]] = {}
    for step in steps:
        names = " | ".join(step.names)
        if "| Roll " in names:
            found.setdefault(step.host, set()).add(names)
    return found


@pytest.mark.parametrize("name", ["tests/data/valid/endpoint-two-replicas.yaml",
                                  "inventory/examples/fleet-endpoint-monitoring.yaml"])
def test_one_endpoints_replicas_on_two_hosts_are_one_roll(name: str) -> None:
    plans, steps = steps_of(ROOT / name)
    replicas = [(host, entry.unit) for host, plan in plans.items() for entry in plan.servers
                if entry.rollout is not None]
    assert len({host for host, _ in replicas}) == 2, replicas
    found = rolls(steps)
    (first,), (second,) = (found[host] for host in sorted({h for h, _ in replicas}))
    assert first == second  # one operation: its names hold both hosts' replicas
    assert all(unit in first for _, unit in replicas), first


def test_replicas_ordered_both_ways_on_two_hosts_deploy(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(HEADER + f"""\
hosts:
  r: {{address: 10.0.0.9}}
  a:
    address: 10.0.0.1
    servers: {{e-a: {server(8001)}, f-a: {server(8002)}}}
  b:
    address: 10.0.0.2
    servers: {{solo: {server(8005)}, f-b: {server(8002)}, e-b: {server(8001)}}}
endpoints:
{endpoint("e", "a/e-a, b/e-b", 8100)}{endpoint("f", "a/f-a, b/f-b", 8200)}""")
    plans, steps = steps_of(path)  # pyinfra's "Cycle detected" would raise here
    for host in ("a", "b"):
        order = [s for s in steps if s.host == host and "| Roll " in " | ".join(s.names)]
        assert [next(u for u in (e.unit for e in plans[host].servers) if u in " ".join(s.names))
                for s in order] == [e.unit for e in plans[host].servers if e.rollout], host
