"""Where each server's operations sit in the one operation order pyinfra runs on every host.

pyinfra runs a deploy as one list of operations, each across every host that has it, and it
matches one host's operation with another's by where it was called from. Called in a loop, the
n-th server of every host would share operations whatever it is, and two hosts that hold one
endpoint's replica at different places of their server lists (a host with pinned servers
before its replica beside a host with the replica alone) would order the same operations both
ways: pyinfra's "Cycle detected in operation ordering DAG". So the plan gives every server a
*slot*, one number per fleet, that the deploys hand to pyinfra (``deploys.plan.slot``):

- the replicas of one endpoint share slots across hosts, by their rank on their host (the first
  replica of ``chat`` on each host is one operation, rolled across hosts ``max_unavailable`` at
  a time);
- the members of one group across hosts share the group's slot (its workers restart before its
  head, on every host at once);
- a server of neither kind shares a slot with the servers at the same place after the same
  replica (or at the start) on other hosts, so that a plain fleet still runs every host at once.

Slots follow each host's server order (a server sharing a GPU starts after the one declared
before it, as its unit's ``After=`` says), merged over the hosts; where two hosts order two
endpoints' replicas both ways, those replicas get a slot of their own per host instead (their
hosts then take turns, never a cycle).

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/examples/fleet-endpoint-monitoring.yaml")
    >>> slots = deploy_slots(fleet)
    >>> slots[("quad-4090d-a", "chat-1")] == slots[("quad-4090d-b", "chat-2")]
    True
    >>> slots[("quad-4090d-a", "guard")] < slots[("quad-4090d-a", "chat-1")]
    True
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from collections import defaultdict
from collections.abc import Hashable, Iterable

from fleet.spec.models import Fleet

Key = tuple[Hashable, ...]
_last: tuple[weakref.ref[Fleet], dict[tuple[str, str], int]] | None = None


def deploy_slots(fleet: Fleet) -> dict[tuple[str, str], int]:
    """Every server's slot, by (host, server name): the host's own servers and the groups it
    joins as a worker, each (head host, server name) under the joining host's name too.

    Computed once per fleet (the plan of each host asks; a thousand hosts ask a thousand times).
    """
    global _last
    if _last is not None and _last[0]() is fleet:
        return _last[1]
    slots = _compute(fleet)
    _last = (weakref.ref(fleet), slots)
    return slots


def _compute(fleet: Fleet) -> dict[tuple[str, str], int]:
    replica_of = {ref: name for name, endpoint in fleet.endpoints.items()
                  for ref in endpoint.replicas}  # fmt: skip
    joined: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for head, host in fleet.hosts.items():
        for name, server in host.servers.items():
            for worker in server.worker_hosts:
                if worker != head:
                    joined[worker].append((head, name))
    singles: dict[str, list[tuple[str, Key]]] = {}
    groups: dict[str, list[tuple[str, Key]]] = {}
    for host_name, host in fleet.hosts.items():
        singles[host_name], groups[host_name] = [], []
        ranks: dict[str, int] = defaultdict(int)
        last: Key = ("start",)
        offset = 0
        for name, server in host.servers.items():
            if server.worker_hosts:
                groups[host_name].append((name, ("group", host_name, name)))
                continue
            endpoint = replica_of.get(f"{host_name}/{name}")
            if endpoint is None:
                singles[host_name].append((name, ("plain", last, offset)))
                offset += 1
                continue
            last = ("replica", endpoint, ranks[endpoint])
            ranks[endpoint] += 1
            offset = 0
            singles[host_name].append((name, last))
        for head, name in joined[host_name]:
            groups[host_name].append((name, ("group", head, name)))
    single_order = _merged(singles)
    group_order = _merged(groups)
    index = {key: n for n, key in enumerate(single_order + group_order)}
    return {(host_name, name): index[key]
            for sequences in (singles, groups)
            for host_name, sequence in sequences.items()
            for name, key in sequence}  # fmt: skip


def _merged(sequences: dict[str, list[tuple[str, Key]]]) -> list[Key]:
    """The keys of every host's sequence in one order that keeps each host's order; keys that
    two hosts order both ways are split into one key per host (``("own", host, key)``), in
    place in ``sequences``.

    Example:
        >>> seqs = {"a": [("x", ("e",)), ("y", ("f",))], "b": [("y", ("f",)), ("x", ("e",))]}
        >>> _merged(seqs)
        [('own', 'a', ('e',)), ('own', 'a', ('f',)), ('own', 'b', ('f',)), ('own', 'b', ('e',))]
    """
    order = _topological(sequences.values())
    if order is not None:
        return order
    # Two hosts disagree: split every shared key between the hosts that disagree about it,
    # one pair at a time, until the rest can be merged.
    while True:
        clash = _clash(sequences)
        if clash is None:
            break
        for host_name, sequence in sequences.items():
            sequence[:] = [(name, ("own", host_name, key) if key in clash else key)
                           for name, key in sequence]  # fmt: skip
    order = _topological(sequences.values())
    assert order is not None, "no clash left, yet no order"
    return order


def _clash(sequences: dict[str, list[tuple[str, Key]]]) -> set[Key] | None:
    """Two keys that two hosts order both ways, or None."""
    position: dict[Key, dict[str, int]] = defaultdict(dict)
    for host_name, sequence in sequences.items():
        for n, (_, key) in enumerate(sequence):
            position[key][host_name] = n
    shared = [key for key, where in position.items() if len(where) > 1]
    for i, first in enumerate(shared):
        for second in shared[i + 1:]:
            common = position[first].keys() & position[second].keys()
            before = {position[first][h] < position[second][h] for h in common}
            if len(before) > 1:
                return {first, second}
    return None


def _topological(sequences: Iterable[list[tuple[str, Key]]]) -> list[Key] | None:
    """One order of every key that keeps each sequence's order (ties: first seen first); None
    when the sequences disagree."""
    after: dict[Key, set[Key]] = defaultdict(set)
    waiting: dict[Key, int] = {}
    seen: dict[Key, int] = {}
    for sequence in sequences:
        keys = [key for _, key in sequence]
        for key in keys:
            seen.setdefault(key, len(seen))
            waiting.setdefault(key, 0)
        for earlier, later in itertools.pairwise(keys):
            if later not in after[earlier]:
                after[earlier].add(later)
                waiting[later] += 1
    ready = [(seen[key], key) for key, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[Key] = []
    while ready:
        _, key = heapq.heappop(ready)
        order.append(key)
        for later in after[key]:
            waiting[later] -= 1
            if waiting[later] == 0:
                heapq.heappush(ready, (seen[later], later))
    return order if len(order) == len(waiting) else None
