"""Servers across hosts: who is a member of a group, where the head is, and the ports each
member opens.

A server with ``worker_hosts`` is one **group**: its own host is the head (node rank 0), each
worker host a member in the order written (node ranks 1…). vLLM forms the group itself — with
its own launcher or over a Ray cluster (docs/multinode.md). This module decides, from the
fleet file alone, the members and their ranks, the head's address, and each member's ports;
the rules ``fleet check`` holds a group to are :mod:`fleet.checks.groups`', the flags and
environment each member runs with :mod:`fleet.hostplan.groups`'.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/examples/h200-pair.yaml")
    >>> [m.host for m in group_members(fleet, "hgx-h200-01", "deepseek")]
    ['hgx-h200-01', 'hgx-h200-02']
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.spec.models import Fleet, Launcher, MultiNode, Server

#: The address sandbox hosts reach each other at: they share this machine's network.
SANDBOX_HEAD_ADDRESS = "127.0.0.1"


@dataclass(frozen=True)
class Member:
    """One host of a group: its name, its node rank (0 is the head) and its role.

    Example:
        >>> Member("box-2", 1).role
        'worker'
    """

    host: str
    rank: int

    @property
    def role(self) -> str:
        """``head`` for node rank 0, else ``worker``."""
        return "head" if self.rank == 0 else "worker"


def settings(server: Server) -> MultiNode:
    """The group's settings: ``multinode`` as written, or its defaults.

    Example:
        >>> settings(Server(model="m", port=1, worker_hosts=["b"])).launcher.value
        'native'
    """
    return server.multinode or MultiNode()


def group_members(fleet: Fleet, head: str, name: str) -> list[Member]:
    """Every member of server ``name`` of host ``head``, the head first (node rank order)."""
    server = fleet.hosts[head].servers[name]
    return [Member(host, rank) for rank, host in enumerate([head, *server.worker_hosts])]


def groups_with_member(fleet: Fleet, host_name: str) -> list[tuple[str, str, Member]]:
    """The groups that ``host_name`` joins as a worker: (head host, server name, member).

    Example:
        >>> from fleet.load import load_fleet
        >>> groups_with_member(load_fleet("inventory/examples/h200-pair.yaml"), "hgx-h200-02")
        [('hgx-h200-01', 'deepseek', Member(host='hgx-h200-02', rank=1))]
    """
    found = []
    for head, host in fleet.hosts.items():
        for name, server in host.servers.items():
            if host_name in server.worker_hosts and head != host_name:
                member = next(m for m in group_members(fleet, head, name) if m.host == host_name)
                found.append((head, name, member))
    return found


def head_address(fleet: Fleet, head: str, server: Server) -> str:
    """Where the workers reach the head: ``multinode.head_address``, else the head's address
    (sandbox hosts share this machine's network: 127.0.0.1)."""
    given = settings(server).head_address
    if given is not None:
        return given
    host = fleet.hosts[head]
    return SANDBOX_HEAD_ADDRESS if host.is_sandbox else host.address


def nodes(server: Server) -> int:
    """How many hosts the group spans."""
    return 1 + len(server.worker_hosts)


def shares_network(fleet: Fleet, head: str, server: Server) -> bool:
    """Whether every member of the group shares one network: sandbox hosts (this machine's),
    so each member's Ray node needs ports of its own (:func:`node_ports`).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("inventory/examples/h200-pair-ray.yaml")
        >>> shares_network(fleet, "hgx-h200-01", fleet.hosts["hgx-h200-01"].servers["deepseek"])
        False
    """
    members = [head, *server.worker_hosts]
    return all(m in fleet.hosts and fleet.hosts[m].is_sandbox for m in members)


@dataclass(frozen=True)
class NodePorts:
    """The ports one member's Ray node opens: node manager, object manager, worker range.

    Example:
        >>> NodePorts(6380, 6381, 10002, 10999).listed()
        [6380, 6381]
    """

    node_manager: int
    object_manager: int
    min_worker: int
    max_worker: int

    def listed(self) -> list[int]:
        """The node's two fixed ports (the worker range aside)."""
        return [self.node_manager, self.object_manager]


def node_ports(group: MultiNode, rank: int, members: int, shared_network: bool) -> NodePorts:
    """The Ray ports of the member of node rank ``rank`` in a group of ``members`` hosts.

    Hosts of their own (each its own network) all open the ports the fleet file names, as Ray
    is usually run. Members that share one network (sandbox hosts: this machine's) cannot: the
    second raylet would find the first's ports taken. There, member ``rank`` gets the node and
    object manager ports moved up by ``2 × rank`` and its own equal slice of the worker range
    (``fleet check`` says when these collide with each other or with the GCS port).

    Example:
        >>> group = MultiNode(ray_node_manager_port=18503, ray_object_manager_port=18504,
        ...                   ray_min_worker_port=18507, ray_max_worker_port=18518)
        >>> node_ports(group, 1, 2, shared_network=True)
        NodePorts(node_manager=18505, object_manager=18506, min_worker=18513, max_worker=18518)
        >>> node_ports(group, 1, 2, shared_network=False).node_manager
        18503
    """
    low, high = group.ray_min_worker_port, group.ray_max_worker_port
    if not shared_network:
        return NodePorts(group.ray_node_manager_port, group.ray_object_manager_port, low, high)
    width = max(1, (high - low + 1) // members)
    return NodePorts(group.ray_node_manager_port + 2 * rank,
                     group.ray_object_manager_port + 2 * rank,
                     low + rank * width, low + (rank + 1) * width - 1)


def member_ray_ports(fleet: Fleet, head: str, server: Server, rank: int) -> NodePorts:
    """The Ray ports of the group's member of node rank ``rank`` (head: 0)."""
    return node_ports(settings(server), rank, nodes(server), shares_network(fleet, head, server))


def ports(server: Server, role: str, node: NodePorts | None = None) -> dict[str, int]:
    """The ports a member of the group listens on, by the multinode key that sets each
    (``node``: that member's Ray ports, where they are not the fleet file's own)."""
    group = settings(server)
    if group.launcher is Launcher.ray:
        found = {"ray_node_manager_port": group.ray_node_manager_port,
                 "ray_object_manager_port": group.ray_object_manager_port}
        if node is not None:
            found = {"ray_node_manager_port": node.node_manager,
                     "ray_object_manager_port": node.object_manager}
        if role == "head":
            found["ray_port"] = group.ray_port
        return found
    if role != "head":
        return {}
    if server.dp > 1:
        return {"dp_rpc_port": group.dp_rpc_port}
    return {"master_port": group.master_port}
