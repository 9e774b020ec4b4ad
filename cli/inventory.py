"""pyinfra's inventory (hosts and their data) from a fleet file: the edge where the decided
plans meet the machines.

Each host's data holds its connection settings (a sandbox host's from its running container,
asked of :mod:`sandbox.hosts`) and, under :data:`fleet.hostplan.types.PLAN_KEY`, its typed
:class:`fleet.hostplan.types.HostPlan` (``host.data.fleet`` in deploys;
:func:`fleet.hostplan.types.plan_of`
elsewhere). ``inventory.py``, pyinfra's entry point, and the ``fleet`` commands read it here.

Example:
    hosts = inventory_hosts("inventory/sandbox.yaml")
    hosts[0][0], hosts[0][1]["ssh_hostname"], plan_of(hosts[0][1]).servers[0].unit
    # → ('sandbox-1', '127.0.0.1', 'vllm-tiny.service')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fleet.hostplan.render import host_plan, read_secret
from fleet.hostplan.types import PLAN_KEY
from fleet.load import FleetError, Problem, load_fleet
from fleet.spec.models import Fleet, Host
from sandbox import hosts as sandbox

DEFAULT_FLEET = "inventory/sandbox.yaml"


def fleet_path() -> Path:
    """The fleet file: ``$FLEET``, or the default sandbox fleet."""
    return Path(os.environ.get("FLEET") or DEFAULT_FLEET)


def connection_data(name: str, host: Host, file: str) -> dict[str, Any]:
    """pyinfra SSH data for one host (a sandbox host's comes from its running container).

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("inventory/examples/quad-4090d.yaml")
        >>> name, host = next(iter(fleet.hosts.items()))
        >>> connection_data(name, host, "quad-4090d.yaml")
        {'ssh_hostname': '10.0.0.21', 'ssh_port': 22, 'ssh_user': 'ubuntu', '_sudo': True}
    """
    if host.is_sandbox:

        data = sandbox.connection(name)
        if data is None:
            raise FleetError(
                [Problem(file, None, None, ("hosts", name, "address"),
                         f"sandbox host {name} is not running",
                         f"start it with: fleet sandbox up {file}")]
            )
        return data
    data: dict[str, Any] = {
        "ssh_hostname": host.address,
        "ssh_port": host.ssh.port,
        "ssh_user": host.ssh.user,
    }
    if host.ssh.key:
        data["ssh_key"] = str(Path(host.ssh.key).expanduser())
    if host.ssh.user != "root":
        data["_sudo"] = True
    return data


def inventory_hosts(path: str | Path, fleet: Fleet | None = None) -> list[tuple[str, dict]]:
    """``[(name, data), …]`` for pyinfra; raise FleetError before any host is contacted."""
    fleet = fleet or load_fleet(path)
    hosts = []
    problems = []
    for name, host in fleet.hosts.items():
        try:
            data = connection_data(name, host, str(path))
            data[PLAN_KEY] = host_plan(fleet, name, secrets=read_secret)
        except FleetError as err:
            problems += err.problems
            continue
        except ValueError as err:
            problems.append(Problem(str(path), None, None, ("hosts", name), str(err)))
            continue
        hosts.append((name, data))
    if problems:
        raise FleetError(problems)
    return hosts
