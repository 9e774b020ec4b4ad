"""The rules ``fleet check`` holds a server across hosts to (its group: head and workers).

The members, the head's address and each member's ports are :mod:`fleet.planner.groups`'; that
no two owners' ports coincide is :mod:`fleet.checks.ledger`'s.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/examples/h200-pair.yaml")
    >>> host = fleet.hosts["hgx-h200-01"]
    >>> base = ("hosts", "hgx-h200-01", "servers", "deepseek")
    >>> list(check_group(fleet, "hgx-h200-01", host, base, host.servers["deepseek"]))
    []
"""

from __future__ import annotations

from collections.abc import Iterator

from fleet.catalog.ray import VLLM_RAY, ray_pin
from fleet.planner.groups import head_address, nodes, settings, shares_network
from fleet.read.problems import Finding
from fleet.spec.addresses import is_loopback, machine_key
from fleet.spec.models import Fleet, Host, Launcher, MultiNode, Server
from fleet.spec.wording import listing


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
    if is_loopback(address) and remote:
        workers = listing(server.worker_hosts)
        yield ((*sbase, "multinode", "head_address"),
               f"the head is reached at {address}, a loopback address, but its workers "
               f"({workers}) run on other machines",
               "give the address the workers reach this host at (multinode.head_address)")
    given = group.head_address
    elsewhere = [
        m for m in server.worker_hosts
        if given is not None and m in fleet.hosts and not fleet.hosts[m].is_sandbox
        and machine_key(fleet.hosts[m].address) == machine_key(given)
    ]
    if elsewhere:
        yield ((*sbase, "multinode", "head_address"),
               f"the head is reached at {given}, the address of its worker {elsewhere[0]}: the "
               "workers would look for the head on that machine",
               f"give the address the workers reach {name} at (or leave head_address out for "
               f"{host.address})")
    if group.launcher is Launcher.ray:
        yield from _check_ray(host, sbase, group)
        yield from _check_shared_ray_ports(fleet, name, sbase, server)
        if is_loopback(address):
            yield ((*sbase, "multinode", "head_address"),
                   f"a Ray head cannot be reached at {address}: Ray runs no node on a loopback "
                   "address (it takes the machine's own instead, and its workers join the head "
                   "there)", "give the address the workers reach this host at "
                   "(multinode.head_address) and its interface (multinode.interface)")
    if group.ray_min_worker_port > group.ray_max_worker_port:
        yield ((*sbase, "multinode", "ray_min_worker_port"),
               "ray_min_worker_port is above ray_max_worker_port", None)


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
               f"no Ray is known for vLLM {host.vllm.version} (fleet/catalog/ray.py knows "
               + ", ".join(".".join(map(str, first[:2])) for first, *_ in VLLM_RAY) + ")",
               "name the Ray to install: multinode.ray_version")


def _check_shared_ray_ports(
    fleet: Fleet, head: str, sbase: tuple[str | int, ...], server: Server
) -> Iterator[Finding]:
    """On members sharing one network (sandbox hosts), each member has a worker port of its own
    (that no two members' ports, nor any other's, coincide is :mod:`fleet.checks.ledger`'s)."""
    if not shares_network(fleet, head, server):
        return
    group = settings(server)
    members = [head, *server.worker_hosts]
    if group.ray_max_worker_port - group.ray_min_worker_port + 1 < len(members):
        yield ((*sbase, "multinode", "ray_min_worker_port"),
               f"the worker port range has fewer ports than the group's {len(members)} members, "
               "which share one network (sandbox hosts) and split it",
               "widen ray_min_worker_port…ray_max_worker_port")
