"""Each server's slot in the deploy's one operation order (fleet/hostplan/deployorder.py):
replicas of one endpoint share slots across hosts by rank, group members share their group's,
and every host's own order is kept, also where two hosts order two endpoints' replicas both
ways."""

from __future__ import annotations

from pathlib import Path

from fleet.hostplan.deployorder import deploy_slots
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet

HEADER = """\
version: 1
defaults:
  vllm: {version: "0.32.0", variant: cpu}
models:
  m:
    url: "https://models.example/m.tar.gz"
    sha256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
"""


def server(port: int) -> str:
    return f"{{model: m, port: {port}, host: 0.0.0.0}}"


def endpoint(name: str, replicas: str, port: int) -> str:
    return (f"  {name}:\n    replicas: [{replicas}]\n"
            f"    router: {{host: r, port: {port}, bind: 127.0.0.1, metrics_port: {port + 9}}}\n")


def load(tmp_path: Path, text: str):
    path = tmp_path / "fleet.yaml"
    path.write_text(HEADER + text)
    return load_fleet(path)


def test_plain_servers_share_slots_by_place_so_every_host_runs_at_once(tmp_path) -> None:
    fleet = load(tmp_path, "hosts:\n" + "".join(
        f"  h{i}:\n    address: 10.0.0.{i}\n    servers:\n      a{i}: {server(8001)}\n"
        f"      b{i}: {server(8002)}\n" for i in range(3)))
    slots = deploy_slots(fleet)
    assert len({slots[(f"h{i}", f"a{i}")] for i in range(3)}) == 1
    assert len({slots[(f"h{i}", f"b{i}")] for i in range(3)}) == 1
    assert slots[("h0", "a0")] < slots[("h0", "b0")]


def test_replicas_share_a_slot_by_rank_wherever_they_sit(tmp_path) -> None:
    fleet = load(tmp_path, f"""\
hosts:
  r: {{address: 10.0.0.9}}
  a:
    address: 10.0.0.1
    servers: {{pinned: {server(8001)}, chat-a: {server(8002)}, chat-a2: {server(8003)}}}
  b:
    address: 10.0.0.2
    servers: {{chat-b: {server(8002)}, after: {server(8004)}}}
endpoints:
{endpoint("chat", "a/chat-a, a/chat-a2, b/chat-b", 8100)}""")
    slots = deploy_slots(fleet)
    assert slots[("a", "chat-a")] == slots[("b", "chat-b")]  # rank 0 of chat on each host
    assert slots[("a", "chat-a2")] not in {slots[("b", n)] for n in ("chat-b", "after")}
    # each host's order is kept (a server sharing a GPU starts after the one before it)
    assert slots[("a", "pinned")] < slots[("a", "chat-a")] < slots[("a", "chat-a2")]
    assert slots[("b", "chat-b")] < slots[("b", "after")]
    # and the plan carries it
    assert host_plan(fleet, "b", secrets=lambda ref: "k").servers[0].slot == slots[("b", "chat-b")]


def test_two_hosts_ordering_two_endpoints_both_ways_get_slots_of_their_own(tmp_path) -> None:
    fleet = load(tmp_path, f"""\
hosts:
  r: {{address: 10.0.0.9}}
  a:
    address: 10.0.0.1
    servers: {{e-a: {server(8001)}, f-a: {server(8002)}}}
  b:
    address: 10.0.0.2
    servers: {{f-b: {server(8002)}, e-b: {server(8001)}}}
endpoints:
{endpoint("e", "a/e-a, b/e-b", 8100)}{endpoint("f", "a/f-a, b/f-b", 8200)}""")
    slots = deploy_slots(fleet)
    assert slots[("a", "e-a")] < slots[("a", "f-a")]
    assert slots[("b", "f-b")] < slots[("b", "e-b")]
    assert len({slots[k] for k in [("a", "e-a"), ("a", "f-a"), ("b", "f-b"), ("b", "e-b")]}) == 4


def test_group_members_share_their_groups_slot() -> None:
    fleet = load_fleet("inventory/examples/h200-pair.yaml")
    slots = deploy_slots(fleet)
    assert slots[("hgx-h200-01", "deepseek")] == slots[("hgx-h200-02", "deepseek")]


def test_a_fleet_is_ordered_once_however_many_hosts_ask(tmp_path) -> None:
    fleet = load(tmp_path, f"hosts:\n  a: {{address: 10.0.0.1, servers: {{x: {server(8001)}}}}}\n")
    assert deploy_slots(fleet) is deploy_slots(fleet)
