"""The host plan that inventory.py computed from the fleet file (``host.data.fleet``).

Deploys read it, never the fleet file: validation and rendering happened before any host was
contacted.

Example:
    from deploys.plan import current_plan
    plan = current_plan()
    plan["venv"]   # '/opt/vllm-fleet/venv'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

REMOTE_SCRIPTS = Path(__file__).resolve().parent / "remote"


def current_plan() -> dict[str, Any]:
    """This host's plan; a DeployError if the inventory is not vllm-fleet's."""
    plan = host.data.get("fleet")
    if not plan:
        raise DeployError(
            f"host {host.name} has no fleet plan: run pyinfra with vllm-fleet's inventory.py "
            "(pyinfra inventory.py deploy.py), which reads the fleet file"
        )
    return plan


def script(name: str) -> str:
    """Local path of a host-side script shipped with the deploys."""
    return str(REMOTE_SCRIPTS / name)


def upload_script(name: str, what: str, dest: str | None = None) -> tuple[str, OperationMeta]:
    """Upload one host-side script (root-owned, 755); return its path there and the operation.

    + name: the script's file name under deploys/remote
    + what: what it is, for the operation's name (``the health waiter``)
    + dest: its path on the host (default: ``<remote_dir>/<name>``)

    Example (inside a deploy):
        path, op = upload_script("wait_healthy.py", "the health waiter")
        # path == '/usr/local/lib/vllm-fleet/wait_healthy.py'
    """
    dest = dest or f"{current_plan()['remote_dir']}/{name}"
    return dest, files.put(
        name=f"Upload {what}",
        src=script(name),
        dest=dest,
        user="root",
        group="root",
        mode="755",
    )
