"""The host plan that inventory.py computed from the fleet file (``host.data.fleet``).

Deploys read it, never the fleet file: validation and rendering happened before any host was
contacted.

Example:
    from deploys.plan import current_plan
    plan = current_plan()   # a fleet.hostplan.types.HostPlan
    plan.venv               # '/opt/vllm-fleet/venv'
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyinfra import host
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from fleet.catalog.paths import REMOTE_DIR, remote_program
from fleet.hostplan.types import PLAN_KEY, HostPlan
from hostside import ROOT_DIR, program_files


def current_plan() -> HostPlan:
    """This host's plan; a DeployError if the inventory is not vllm-fleet's."""
    plan = host.data.get(PLAN_KEY)
    if not isinstance(plan, HostPlan):
        raise DeployError(
            f"host {host.name} has no fleet plan: run pyinfra with vllm-fleet's inventory.py "
            "(pyinfra inventory.py deploy.py), which reads the fleet file"
        )
    return plan


@contextmanager
def slot(position: int) -> Iterator[None]:
    """Operations called inside are the ones at ``position`` of the deploy's order on every
    host (a server's :attr:`~fleet.hostplan.types.ServerUnit.slot`): the same call for two servers
    of one slot on two hosts is one pyinfra operation, for two slots two, whatever place
    each server has in its host's list (pyinfra's own ``host.loop`` counts places).

    Example (inside a deploy):
        for entry in current_plan().servers:
            with slot(entry.slot):
                files.put(name=f"Write {entry.unit}", ...)
    """
    host.loop_position.append(position)
    try:
        yield
    finally:
        host.loop_position.pop()


def upload_programs(programs: dict[str, str]) -> dict[str, tuple[str, list[OperationMeta]]]:
    """Upload host-side programs with the package modules they import, each file once and only
    when its content differs (:func:`files.put`); return each program's path and the operations
    of exactly the files it runs, so that a change reaches only what uses it.

    + programs: module name in the ``hostside`` package → what it is (``the health waiter``)

    Example (inside a deploy):
        uploaded = upload_programs({"check_ready": "the readiness check"})
        path, ops = uploaded["check_ready"]
        # path == '/usr/local/lib/vllm-fleet/hostside/check_ready.py'
        # ops: hostside/check_ready.py, hostside/envfile.py and hostside/__init__.py
    """
    done: dict[str, OperationMeta] = {}
    uploaded = {}
    for program, what in programs.items():
        needed = program_files(program)
        for relative in needed:
            if relative in done:
                continue
            main = relative == f"hostside/{program}.py"
            done[relative] = files.put(
                name=f"Upload {what}" if main else f"Upload {relative} (for {what})",
                src=str(ROOT_DIR / relative),
                dest=f"{REMOTE_DIR}/{relative}",
                user="root",
                group="root",
                mode="755" if main else "644",
            )
        uploaded[program] = (remote_program(program), [done[relative] for relative in needed])
    return uploaded


def upload_program(program: str, what: str) -> tuple[str, list[OperationMeta]]:
    """Upload one host-side program and what it imports (:func:`upload_programs`).

    Example (inside a deploy):
        path, ops = upload_program("wait_healthy", "the health waiter")
    """
    return upload_programs({program: what})[program]
