"""The command lines of a Ray group's units: ``ray start`` of the head and of each worker.

Which Ray a vLLM release runs on is in :mod:`fleet.catalog.ray`; the ports of each member's
node come from :func:`fleet.planner.groups.node_ports`.
"""

from __future__ import annotations

import json

#: The custom resource each member's Ray node carries, so that the wait can name the member
#: whose node has not joined (Ray's own node ids say nothing about the fleet's hosts).
MEMBER_RESOURCE = "fleet_member_"


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
