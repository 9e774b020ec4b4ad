"""Gather what :func:`cli.drift.compare.compare` needs from every host, with pyinfra's API.

Facts are read with ``Inventory`` / ``State``, ``host.connect()`` and ``host.get_fact``, using
the very fact classes the deploys use. Hosts are contacted one after another; a host that
cannot be reached (or whose sandbox is not running) becomes an ``error`` row and the report
goes on.

Example:
    rows = drift("inventory/sandbox.yaml")      # every host's rows
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import Callable
from typing import Any

from pyinfra.facts.deb import DebArch
from pyinfra.facts.server import LinuxDistribution, Sysctl

from cli.drift.compare import (
    ERROR,
    Row,
    compare,
    host_driver_layout,
    watched_files,
    watched_units,
)
from cli.factsession import fact_inventory
from cli.inventory import connection_data
from cli.models import INSTALLER
from facts.gpuhealth import GpuHealth
from facts.gpus import NvidiaSmiGpus, PciGpus
from facts.host import CpuGovernor, FileDigests, FleetServerUnits, UnitStates
from facts.models import InstalledModels
from facts.nvidia import (
    CudaToolkits,
    DebPackageStates,
    FabricManager,
    HeldPackages,
    NvidiaDriverLoaded,
)
from facts.router import FleetRouterUnits
from facts.sysctl import SysctlWritable
from facts.vllm import ModelManifest, VenvPackages
from fleet.hostplan.render import host_plan
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.types import HostPlan, ServerUnit
from fleet.load import load_fleet
from fleet.read.problems import FleetError


def gather(pyinfra_host: Any, plan: HostPlan) -> dict[str, Any]:
    """Read every fact :func:`compare` needs from one connected pyinfra host."""

    get = pyinfra_host.get_fact
    stack = plan.stack
    keys = sorted(plan.sysctl)
    facts: dict[str, Any] = {
        "digests": get(FileDigests, paths=watched_files(plan)),
        "units": get(UnitStates, units=watched_units(plan)),
        "held": get(HeldPackages),
        "fleet_units": get(FleetServerUnits, unit_dir=plan.unit_dir),
        "installed_models": get(InstalledModels, script=INSTALLER, models_dir=plan.models_dir),
        "governor": get(CpuGovernor),
        "sysctl": get(Sysctl, keys=keys) if keys else {},
        "sysctl_writable": get(SysctlWritable, keys=keys) if keys else {},
    }
    packages: list[str] = []
    if stack.nvidia:
        facts["distro"] = get(LinuxDistribution)
        facts["arch"] = get(DebArch)
        facts["pci"] = get(PciGpus)
        facts["smi"] = get(NvidiaSmiGpus)
        facts["loaded"] = get(NvidiaDriverLoaded)
        facts["fabric_manager"] = get(FabricManager)
        facts["health"] = get(GpuHealth)
        with contextlib.suppress(ValueError):
            packages += host_driver_layout(plan, facts).packages
    if stack.cuda:
        facts["cuda"] = get(CudaToolkits)
        packages.append(stack.cuda.package)
    facts["packages"] = get(DebPackageStates, packages=sorted(packages)) if packages else {}
    if stack.serves:
        facts["venv"] = get(VenvPackages, venv=plan.venv)
        facts["models"] = {m.name: get(ModelManifest, path=m.path) for m in plan.models}
    facts["router_units"] = get(FleetRouterUnits, unit_dir=plan.unit_dir)
    if plan.routers:
        facts["router_venv"] = get(VenvPackages, venv=plan.routers[0].venv)
    return facts


def plan_or_error(fleet: Any, name: str, path: str) -> tuple[dict | None, HostPlan | None, str]:
    """(connection data, plan, error) of one host; secrets that are missing here only blank
    the comparison of that server's environment file (``fleet drift`` and ``fleet doctor``).

    Example:
        data, plan, error = plan_or_error(load_fleet(path), "box", path)
        # → ({"ssh_hostname": …}, HostPlan(…), "") or (None, None, "hosts.box.ssh: …")
    """
    missing: list[str] = []
    # A stand-in that no real secret equals and every env-file quoting carries.
    marker = f"vllm-fleet-secret-not-here-{secrets.token_hex(8)}"

    def secret(ref: Any) -> str:
        try:
            return read_secret(ref)
        except ValueError:
            missing.append(ref.env or ref.file)
            return marker

    try:
        data = connection_data(name, fleet.hosts[name], path)
    except FleetError as error:
        return None, None, "; ".join(p.message for p in error.problems)
    plan = host_plan(fleet, name, secrets=secret)
    servers = tuple(
        dataclasses.replace(server, env_text=None)
        if server.env_text is not None and marker in server.env_text else server
        for server in plan.servers
    )  # fmt: skip
    servers = tuple(_tls_known(server, marker) for server in servers)
    return data, dataclasses.replace(plan, servers=servers), ""


def _tls_known(server: ServerUnit, marker: str) -> ServerUnit:
    """``server`` with each TLS file not readable here blanked (compared as "not available")."""
    if server.tls is None:
        return server
    files = tuple(dataclasses.replace(f, text="") if marker in f.text else f
                  for f in server.tls.files)
    return dataclasses.replace(server, tls=dataclasses.replace(server.tls, files=files))


def drift(path: str, only: str | None = None,
          progress: Callable[[str], None] | None = None) -> list[Row]:
    """Check every host of a fleet file (or only ``only``); unreachable hosts are error rows.

    + path: the fleet file
    + only: one host's name, or None for all
    + progress: called with each host's name before it is contacted
    """

    fleet = load_fleet(path)
    results: dict[str, list[Row]] = {}
    targets: list[tuple[str, dict, HostPlan]] = []
    for name in fleet.hosts:
        if only and name != only:
            continue
        data, plan, error = plan_or_error(fleet, name, path)
        if error or data is None or plan is None:
            results[name] = [Row(name, "reachable", "yes", error, ERROR)]
            continue
        results[name] = []
        targets.append((name, data, plan))
    if targets:
        inventory = fact_inventory([(name, data) for name, data, _ in targets])
        for name, _, plan in targets:
            if progress:
                progress(name)
            results[name] = _check(inventory.get_host(name), plan)
    return [row for rows in results.values() for row in rows]


def _check(host: Any, plan: HostPlan) -> list[Row]:
    """One host's rows; any failure to connect or to read is one error row."""
    try:
        host.connect(raise_exceptions=True, show_errors=False)
        return compare(plan, gather(host, plan))
    except Exception as error:  # one host's failure is one error row, not the end
        message = " ".join(f"{type(error).__name__}: {error}".split())
        return [Row(plan.host, "reachable", "yes", message, ERROR)]
    finally:
        if host.connected:
            host.disconnect()
