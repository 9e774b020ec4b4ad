"""The host plan that inventory.py computed from the fleet file (``host.data.fleet``).

Deploys read it, never the fleet file: validation and rendering happened before any host was
contacted.

Example:
    from deploys.plan import current_plan
    plan = current_plan()   # a fleet.hostplan.HostPlan
    plan.venv               # '/opt/vllm-fleet/venv'
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from fleet.hostplan import HostPlan
from fleet.inventory import PLAN_KEY
from fleet.paths import remote_program
from hostside import local_path


def current_plan() -> HostPlan:
    """This host's plan; a DeployError if the inventory is not vllm-fleet's."""
    plan = host.data.get(PLAN_KEY)
    if not isinstance(plan, HostPlan):
        raise DeployError(
            f"host {host.name} has no fleet plan: run pyinfra with vllm-fleet's inventory.py "
            "(pyinfra inventory.py deploy.py), which reads the fleet file"
        )
    return plan


def upload_program(program: str, what: str) -> tuple[str, OperationMeta]:
    """Upload one host-side program (root-owned, 755); return its path there and the operation.

    + program: the module's name in the ``hostside`` package (``wait_healthy``)
    + what: what it is, for the operation's name (``the health waiter``)

    Example (inside a deploy):
        path, op = upload_program("wait_healthy", "the health waiter")
        # path == '/usr/local/lib/vllm-fleet/hostside/wait_healthy.py'
    """
    dest = remote_program(program)
    return dest, files.put(
        name=f"Upload {what}",
        src=str(local_path(program)),
        dest=dest,
        user="root",
        group="root",
        mode="755",
    )
