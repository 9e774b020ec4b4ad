"""Servers across hosts: the group's members, its rules, and what each member runs.

A server with ``worker_hosts`` is one **group**: its own host is the head (node rank 0), each
worker host a member in the order written (node ranks 1…). vLLM forms the group itself — with
its own launcher (``--nnodes/--node-rank/--master-addr/--master-port``, ``--headless`` on the
workers; for data parallel ``--data-parallel-size-local/--data-parallel-address/
--data-parallel-rpc-port/--data-parallel-start-rank``) or over a Ray cluster
(``--distributed-executor-backend ray``). This module decides who is a member, which flags and
environment each member gets, and the rules ``fleet check`` holds the group to.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/examples/h200-pair.yaml")
    >>> [m.host for m in group_members(fleet, "hgx-h200-01", "deepseek")]
    ['hgx-h200-01', 'hgx-h200-02']
    >>> member_flags(fleet, "hgx-h200-01", "deepseek", 1)[:6]
    ['--nnodes', '2', '--node-rank', '1', '--master-addr', '10.10.0.1']
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

from fleet.problems import Finding
from fleet.ray import VLLM_RAY, NodePorts, node_ports, ray_pin
from fleet.spec import Fleet, Host, Launcher, MultiNode, Server

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


def member_flags(fleet: Fleet, head: str, name: str, rank: int) -> list[str]:
    """The vLLM flags that make a member of the group (after the server's own flags).

    Tensor/pipeline parallel across nodes: ``--nnodes --node-rank --master-addr
    --master-port`` (and ``--headless`` on workers). Data parallel (data-parallel-size > 1):
    each node runs its share of the ranks (``--data-parallel-size-local``), the workers headless
    from their first rank on. Ray: only ``--distributed-executor-backend ray`` on the head (Ray
    places the workers); Ray's workers run no vLLM process of their own.
    """
    server = fleet.hosts[head].servers[name]
    group = settings(server)
    address = head_address(fleet, head, server)
    if group.launcher is Launcher.ray:
        if "distributed-executor-backend" in server.args:
            return []
        return ["--distributed-executor-backend", "ray"]
    count = nodes(server)
    if server.dp > 1:
        local = server.dp // count
        flags = ["--data-parallel-size-local", str(local),
                 "--data-parallel-address", address,
                 "--data-parallel-rpc-port", str(group.dp_rpc_port)]
        if rank:
            flags += ["--data-parallel-start-rank", str(rank * local), "--headless"]
        return flags
    flags = ["--nnodes", str(count), "--node-rank", str(rank),
             "--master-addr", address, "--master-port", str(group.master_port)]
    return [*flags, "--headless"] if rank else flags


def member_env(server: Server, cpu: bool = False) -> dict[str, str]:
    """Environment every member needs: the interface torch.distributed (gloo), NCCL and Ray's
    node IP resolve from; on the CPU build with ``enforce-eager``, no torch.compile at all.

    vLLM 0.32 compiles one tensor-parallel helper (``get_masked_input_and_mask`` of
    ``vocab_parallel_embedding.py``) with torch.compile whatever ``enforce-eager`` says; on the
    CPU build that is inductor's C++ backend, and on a host without ``g++`` the group's first
    completion fails (``InvalidCxxCompiler: No working C++ compiler found in
    torch._inductor.config.cpp.cxx: (None, 'g++')``, then ``EngineDeadError``), measured on
    sandbox hosts. ``TORCH_COMPILE_DISABLE=1`` runs it eagerly, as ``enforce-eager`` asks.

    Example:
        >>> from fleet.spec import MultiNode
        >>> member_env(Server(model="m", port=1, worker_hosts=["b"],
        ...                   multinode=MultiNode(interface="ens8f0")))
        {'GLOO_SOCKET_IFNAME': 'ens8f0', 'NCCL_SOCKET_IFNAME': 'ens8f0'}
        >>> member_env(Server(model="m", port=1, worker_hosts=["b"],
        ...                   args={"enforce-eager": True}), cpu=True)
        {'TORCH_COMPILE_DISABLE': '1'}
    """
    env = {}
    if cpu and server.worker_hosts and server.args.get("enforce-eager") is True:
        env["TORCH_COMPILE_DISABLE"] = "1"
    interface = settings(server).interface
    if interface is not None:
        env.update({"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface})
    return env


def group_revision(parts: list[str]) -> str:
    """One short hash over every member's rendered configuration: written into each member's
    unit, so that a change to any member changes every member's unit, and the deploy restarts
    the whole group (in order) instead of one member that can no longer join the others.

    Example:
        >>> group_revision(["a", "b"]) == group_revision(["a", "b"]) != group_revision(["a"])
        True
    """
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def shares_network(fleet: Fleet, head: str, server: Server) -> bool:
    """Whether every member of the group shares one network: sandbox hosts (this machine's),
    so each member's Ray node needs ports of its own (:func:`fleet.ray.node_ports`).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("inventory/examples/h200-pair-ray.yaml")
        >>> shares_network(fleet, "hgx-h200-01", fleet.hosts["hgx-h200-01"].servers["deepseek"])
        False
    """
    members = [head, *server.worker_hosts]
    return all(m in fleet.hosts and fleet.hosts[m].is_sandbox for m in members)


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


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_group(
    fleet: Fleet, name: str, host: Host, sbase: tuple[str | int, ...], server: Server
) -> Iterator[Finding]:
    """The rules of one server across hosts (``fleet check``); nothing for one-host servers."""
    if server.multinode is not None and not server.worker_hosts:
        yield ((*sbase, "multinode"), "multinode settings on a server without worker_hosts",
               "add worker_hosts: [other hosts], or remove multinode")
        return
    if not server.worker_hosts:
        return
    group = settings(server)
    backend = server.args.get("distributed-executor-backend")
    if group.launcher is Launcher.native and backend is not None and backend != "mp":
        yield ((*sbase, "args", "distributed-executor-backend"),
               f"distributed-executor-backend {backend} with the native multi-node launcher",
               "write multinode: {launcher: ray} for a Ray cluster, or remove the flag")
    if group.launcher is Launcher.ray and backend not in (None, "ray"):
        yield ((*sbase, "args", "distributed-executor-backend"),
               f"distributed-executor-backend {backend} with multinode.launcher ray",
               "remove the flag: the Ray launcher sets distributed-executor-backend ray")
    count = nodes(server)
    world = server.tp * server.pp * server.dp
    if world % count:
        yield ((*sbase, "args"),
               f"TP × PP × DP = {server.tp} × {server.pp} × {server.dp} = {world} GPUs (or CPU "
               f"workers) cannot be split evenly over {count} hosts",
               "make tensor/pipeline/data-parallel sizes a multiple of the number of hosts")
    if server.dp > 1 and server.dp % count:
        yield ((*sbase, "args", "data-parallel-size"),
               f"data-parallel-size {server.dp} is not a multiple of the group's {count} hosts",
               "give every host the same number of data-parallel ranks")
    for key in ("data-parallel-address", "data-parallel-rpc-port", "data-parallel-start-rank",
                "data-parallel-size-local"):
        if key in server.args:
            yield ((*sbase, "args", key), f"{key} is set per member by worker_hosts and "
                   "multinode", f"remove {key} from args")
    address = head_address(fleet, name, server)
    members = [name, *server.worker_hosts]
    remote = [m for m in members if m in fleet.hosts and not fleet.hosts[m].is_sandbox]
    if _is_loopback(address) and remote:
        workers = ", ".join(server.worker_hosts)
        yield ((*sbase, "multinode", "head_address"),
               f"the head is reached at {address}, a loopback address, but its workers "
               f"({workers}) run on other machines",
               "give the address the workers reach this host at (multinode.head_address)")
    if group.launcher is Launcher.ray:
        yield from _check_ray(host, sbase, group)
        yield from _check_shared_ray_ports(fleet, name, sbase, server)
        if _is_loopback(address):
            yield ((*sbase, "multinode", "head_address"),
                   f"a Ray head cannot be reached at {address}: Ray runs no node on a loopback "
                   "address (it takes the machine's own instead, and its workers join the head "
                   "there)", "give the address the workers reach this host at "
                   "(multinode.head_address) and its interface (multinode.interface)")
    if group.ray_min_worker_port > group.ray_max_worker_port:
        yield ((*sbase, "multinode", "ray_min_worker_port"),
               "ray_min_worker_port is above ray_max_worker_port", None)
    yield from _check_member_ports(fleet, name, sbase, server)


#: vLLM 0.32's own words when its CPU platform is asked to serve over Ray
#: (``vllm/v1/executor/ray_utils.py``: the CPU platform has no ``ray_device_key``).
CPU_RAY_ERROR = "current platform cpu does not support ray."


def _check_ray(host: Host, sbase: tuple[str | int, ...], group: MultiNode) -> Iterator[Finding]:
    """The Ray launcher needs a GPU build, and a Ray known for the vLLM release (or named)."""
    if host.vllm.variant.value == "cpu":
        yield ((*sbase, "multinode", "launcher"),
               f"the cpu build of vLLM cannot serve over Ray: vLLM {host.vllm.version} says "
               f"`ValueError: {CPU_RAY_ERROR}`",
               "use launcher: native (the default) on cpu hosts")
    if group.ray_version is None and ray_pin(host.vllm.version) is None:
        yield ((*sbase, "multinode", "launcher"),
               f"no Ray is known for vLLM {host.vllm.version} (fleet/ray.py knows "
               + ", ".join(".".join(map(str, first[:2])) for first, *_ in VLLM_RAY) + ")",
               "name the Ray to install: multinode.ray_version")


def _check_member_ports(
    fleet: Fleet, head: str, sbase: tuple[str | int, ...], server: Server
) -> Iterator[Finding]:
    """Each member's group ports are free there: no server of that host listens on them."""
    for rank, member in enumerate([head, *server.worker_hosts]):
        host = fleet.hosts.get(member)
        if host is None:
            continue
        role = "head" if rank == 0 else "worker"
        taken = {other.port: other_name for other_name, other in host.servers.items()}
        node = member_ray_ports(fleet, head, server, rank)
        for key, port in ports(server, role, node).items():
            if port in taken:
                yield ((*sbase, "multinode", key),
                       f"port {port} on {member} is server {taken[port]}'s API port",
                       "choose another port for the group")
        if rank and sbase[-1] in host.servers:
            yield ((*sbase, "worker_hosts", rank - 1),
                   f"{member} has a server named {sbase[-1]!r} of its own: the group's member "
                   "unit there would have the same name", "rename one of the two servers")


def _check_shared_ray_ports(
    fleet: Fleet, head: str, sbase: tuple[str | int, ...], server: Server
) -> Iterator[Finding]:
    """On members sharing one network (sandbox hosts), every member's Ray ports are its own:
    no two members' (nor the head's GCS port) coincide, and each has a worker port."""
    if not shares_network(fleet, head, server):
        return
    group = settings(server)
    members = [head, *server.worker_hosts]
    if group.ray_max_worker_port - group.ray_min_worker_port + 1 < len(members):
        yield ((*sbase, "multinode", "ray_min_worker_port"),
               f"the worker port range has fewer ports than the group's {len(members)} members, "
               "which share one network (sandbox hosts) and split it",
               "widen ray_min_worker_port…ray_max_worker_port")
        return
    seen = {group.ray_port: f"{head}'s ray_port"}
    for rank, member in enumerate(members):
        node = member_ray_ports(fleet, head, server, rank)
        for label, port in (("node manager", node.node_manager),
                            ("object manager", node.object_manager)):
            if port in seen:
                yield ((*sbase, "multinode", "ray_node_manager_port"),
                       f"the members share one network (sandbox hosts), so each Ray node gets "
                       f"its own ports (node/object manager + 2 × node rank): {member}'s {label} "
                       f"port {port} is also {seen[port]}",
                       "space ray_node_manager_port, ray_object_manager_port and ray_port apart")
                return
            seen[port] = f"{member}'s {label} port"
    low, high = group.ray_min_worker_port, group.ray_max_worker_port
    inside = sorted(port for port in seen if low <= port <= high)
    if inside:
        yield ((*sbase, "multinode", "ray_min_worker_port"),
               f"port {inside[0]} ({seen[inside[0]]}) lies in Ray's worker port range "
               f"{low}–{high}", "move the worker port range away from the other Ray ports")
