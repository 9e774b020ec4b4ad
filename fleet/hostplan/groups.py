"""What each member of a server across hosts runs: its vLLM flags, its environment, and the
group's revision that restarts every member together.

vLLM forms the group itself — with its own launcher (``--nnodes/--node-rank/--master-addr/
--master-port``, ``--headless`` on the workers; for data parallel ``--data-parallel-size-local/
--data-parallel-address/--data-parallel-rpc-port/--data-parallel-start-rank``) or over a Ray
cluster (``--distributed-executor-backend ray``). The members themselves are
:mod:`fleet.planner.groups`'; the units they run are built in :mod:`fleet.hostplan.render`.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/examples/h200-pair.yaml")
    >>> member_flags(fleet, "hgx-h200-01", "deepseek", 1)[:6]
    ['--nnodes', '2', '--node-rank', '1', '--master-addr', '10.10.0.1']
"""

from __future__ import annotations

import hashlib

from fleet.planner.groups import head_address, nodes, settings
from fleet.spec.models import Fleet, Launcher, Server


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
        >>> from fleet.spec.models import MultiNode
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
