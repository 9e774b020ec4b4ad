"""``fleet drift``: compare what each host has with what its fleet file declares.

Facts are gathered with pyinfra's API (``Inventory`` / ``State``, ``host.connect()``,
``host.get_fact``) using the very fact classes the deploys use: drift and deploy cannot
disagree about how a version, a hold or a file is read, and every parser is the one tested on
real captures. Hosts are contacted one after another; a host that cannot be reached (or whose
sandbox is not running) becomes an ``error`` row and the report goes on.

:func:`compare` is pure (plan + facts → rows) and holds every rule; :func:`gather` only reads.

Statuses: ``ok``; ``drift`` (the host differs from the declaration); ``n/a`` (cannot apply
here, e.g. a kernel parameter that is read-only in a container; not counted as drift);
``error`` (could not be checked). Exit status of the command: 0 clean, 2 drift, 1 error.

Example:
    >>> from fleet.load import load_text
    >>> from fleet.hostplan.render import host_plan
    >>> fleet = load_text("version: 1\\nhosts:\\n  a:\\n    address: sandbox\\n    vllm: "
    ...                   "{version: 0.32.0, variant: cpu}\\n", "f.yaml")
    >>> plan = host_plan(fleet, "a", secrets=lambda ref: "")
    >>> rows = compare(plan, {"digests": {plan.stack.nofile.path: sha256_text(
    ...     plan.stack.nofile.text), plan.sysctl_path: None}, "held": []})
    >>> [(r.item, r.status) for r in rows]
    [('nofile drop-in', 'ok'), ('sysctl drop-in', 'ok')]
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cli.models import undeclared
from fleet.hostplan.stack import (
    DriverLayout,
    driver_layout,
    driver_matches,
    pin_text,
    source_text,
    upstream_version,
)
from fleet.hostplan.types import HostPlan
from fleet.judge.health import gpu_problems, pcie_text
from fleet.planner.fit import gib

OK, DRIFT, NA, ERROR = "ok", "drift", "n/a", "error"


@dataclass
class Row:
    """One checked item of one host.

    + host: inventory name
    + item: what was checked (``driver``, ``sysctl vm.swappiness``, ``unit vllm-chat.service``)
    + expected: what the fleet file declares
    + actual: what the host has
    + status: ok | drift | n/a | error
    """

    host: str
    item: str
    expected: str
    actual: str
    status: str


def sha256_text(text: str) -> str:
    """SHA256 of a text as written to a file (UTF-8).

    Example:
        >>> sha256_text("")[:12]
        'e3b0c44298fc'
    """
    return hashlib.sha256(text.encode()).hexdigest()


def exit_status(rows: list[Row]) -> int:
    """0 when every row is ok or n/a, 1 when any is an error, else 2 (drift).

    Example:
        >>> exit_status([Row("a", "x", "1", "2", "drift"), Row("b", "y", "", "", "ok")])
        2
    """
    statuses = {row.status for row in rows}
    if ERROR in statuses:
        return 1
    return 2 if DRIFT in statuses else 0


# --------------------------------------------------------------------------------------------
# What a host should have
# --------------------------------------------------------------------------------------------


def host_driver_layout(plan: HostPlan, facts: dict[str, Any]) -> DriverLayout:
    """Repository folders and driver packages for this host (the deploy's own rule)."""
    nvidia = plan.stack.nvidia
    if nvidia is None:
        raise ValueError(f"{plan.host} declares no NVIDIA driver")
    return driver_layout(nvidia, facts.get("distro") or {}, facts.get("arch"),
                         facts.get("pci", {}).get("nvswitches"))


def watched_files(plan: HostPlan) -> list[str]:
    """Every file whose content drift compares (paths only: they do not depend on the host)."""
    stack = plan.stack
    paths = [stack.nofile.path, plan.sysctl_path]
    if stack.nvidia:
        nvidia = stack.nvidia
        paths += [nvidia.persistenced_path, nvidia.preferences_path,
                  nvidia.sources_path, nvidia.nouveau_path]  # fmt: skip
    if stack.cuda:
        paths.append(stack.cuda.profile_path)
    if stack.governor:
        paths.append(stack.governor.unit_path)
    if stack.serves:
        for server in plan.servers:
            paths += [server.unit_path, server.env_path,
                      *(f.path for f in (server.tls.files if server.tls else ()))]
    paths += [router.unit_path for router in plan.routers]
    return paths


def watched_units(plan: HostPlan) -> list[str]:
    """Every systemd unit whose state drift checks."""
    stack = plan.stack
    units = []
    if stack.nvidia:
        units += ["nvidia-persistenced.service", "nvidia-fabricmanager.service"]
    if stack.governor:
        units.append(stack.governor.unit)
    if stack.serves:
        units += [server.unit for server in plan.servers]
    units += [router.unit for router in plan.routers]
    return units


# --------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------


def _file_row(host: str, item: str, path: str, text: str | None, digests: dict) -> Row:
    """Compare a file's digest with the text it should hold (None: it should be absent)."""
    have = digests.get(path, "?")
    if have == "?":
        return Row(host, item, path, "not read", ERROR)
    if text is None:
        return Row(host, item, "absent", "absent" if have is None else f"present: {path}",
                   OK if have is None else DRIFT)  # fmt: skip
    if have is None:
        return Row(host, item, "as rendered", f"missing: {path}", DRIFT)
    if have == sha256_text(text):
        return Row(host, item, "as rendered", "as rendered", OK)
    return Row(host, item, "as rendered", f"differs from the fleet file: {path}", DRIFT)


def _held(name: str, states: dict[str, Any]) -> str:
    state = states.get(name)
    if state is None:
        return f"{name} not installed"
    held = "held" if state["held"] else "NOT held"
    return f"{name} {upstream_version(state['version'])} {held}"


def _nvidia_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    stack = plan.stack
    nvidia = stack.nvidia
    if nvidia is None:
        return
    try:
        layout = host_driver_layout(plan, facts)
    except ValueError as error:
        yield Row(host, "driver", nvidia.driver, str(error), ERROR)
        return
    states = facts.get("packages", {})
    smi = facts.get("smi") or {"gpus": [], "error": "not read"}
    gpus = stack.gpus
    # GPUs, as the driver sees them
    seen = smi["gpus"]
    names = sorted({gpu["name"] for gpu in seen})
    actual = f"{len(seen)} × {', '.join(names)}" if seen else f"none ({smi['error']})"
    yield Row(host, "gpus", gpus.label, actual, OK if len(seen) == gpus.count else DRIFT)
    # the driver: every package at one version that satisfies the declaration, all held
    probe = states.get(layout.probe)
    installed = upstream_version(probe["version"]) if probe else None
    problems = [
        _held(p, states) for p in layout.driver_parts
        if p not in states or not states[p]["held"]
        or upstream_version(states[p]["version"]) != installed
    ]  # fmt: skip
    loaded = (facts.get("loaded") or {}).get("version")
    if loaded is None and seen:
        loaded = seen[0]["driver_version"]
    parts = [f"{installed or 'not installed'}"]
    if problems:
        parts.append("; ".join(problems))
    elif installed:
        parts.append("held")
    if installed and loaded != installed:
        parts.append(f"loaded {loaded or 'none'}: reboot pending")
    good = driver_matches(nvidia.driver, installed) and not problems and loaded == installed
    yield Row(host, "driver", f"{nvidia.driver}, held, loaded", ", ".join(parts),
              OK if good else DRIFT)  # fmt: skip
    # fabric manager: exactly the driver's version, held, running
    fm_package = layout.fabric_manager
    fm = facts.get("fabric_manager") or {}
    if fm_package is None:
        yield Row(host, "fabric manager", "not needed (no NVSwitch)",
                  fm.get("active") or "inactive", OK)  # fmt: skip
    else:
        state = states.get(fm_package)
        version = upstream_version(state["version"]) if state else None
        actual = _held(fm_package, states) + f", {fm.get('active') or 'inactive'}"
        good = (version == installed and version is not None and state["held"]
                and fm.get("active") == "active")  # fmt: skip
        expected = f"{fm_package} {installed or '?'} (= driver), held, active"
        yield Row(host, "fabric manager", expected, actual, OK if good else DRIFT)
    # persistence: the daemon with --persistence-mode, and the GPUs really in that mode
    units = facts.get("units", {})
    unit = units.get("nvidia-persistenced.service", {})
    if nvidia.persistence:
        on = sum(1 for gpu in seen if gpu["persistence"])
        dropin = _file_row(host, "", nvidia.persistenced_path, nvidia.persistenced_text,
                           facts.get("digests", {}))  # fmt: skip
        actual = (f"drop-in {dropin.actual}; daemon {unit.get('ActiveState', '?')}, "
                  f"{unit.get('UnitFileState') or '?'}; {on}/{len(seen)} GPUs on")  # fmt: skip
        running = unit.get("ActiveState") == "active" and unit.get("UnitFileState") == "enabled"
        good = dropin.status == OK and running and bool(seen) and on == len(seen)
        yield Row(host, "persistence", "drop-in as rendered; daemon active, enabled; all GPUs on",
                  actual, OK if good else DRIFT)  # fmt: skip
    else:
        yield _file_row(host, "persistence drop-in", nvidia.persistenced_path, None,
                        facts.get("digests", {}))  # fmt: skip
    digests = facts.get("digests", {})
    yield _file_row(host, "apt pin", nvidia.preferences_path,
                    pin_text(layout.packages, nvidia.driver), digests)  # fmt: skip
    if nvidia.source == "nvidia":
        yield _file_row(host, "apt source", nvidia.sources_path,
                        source_text(nvidia, layout.distro, layout.arch), digests)  # fmt: skip


def _cuda_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    cuda = plan.stack.cuda
    if cuda is None:
        return
    toolkits = (facts.get("cuda") or {}).get("toolkits", {})
    states = facts.get("packages", {})
    held = _held(cuda.package, states)
    state = states.get(cuda.package)
    profile = _file_row(host, "", cuda.profile_path, cuda.profile_text,
                        facts.get("digests", {}))  # fmt: skip
    found = ", ".join(f"{k} (nvcc {v})" for k, v in sorted(toolkits.items())) or "none"
    good = cuda.version in toolkits and state is not None and state["held"]
    yield Row(host, "cuda", f"{cuda.version} ({cuda.package}, held)",
              f"{found}; {held}", OK if good else DRIFT)  # fmt: skip
    yield Row(host, "cuda on PATH", profile.expected, profile.actual, profile.status)


def _tuning_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    stack = plan.stack
    digests = facts.get("digests", {})
    governor = stack.governor
    if governor is not None:
        unit = _file_row(host, "", governor.unit_path, governor.unit_text, digests)
        enabled = facts.get("units", {}).get(governor.unit, {}).get("UnitFileState") or "?"
        live = facts.get("governor") or {}
        now = ", ".join(f"{n} on {c}" for n, c in sorted(live.items())) or "no cpufreq here"
        good = unit.status == OK and enabled == "enabled" and set(live) <= {governor.name}
        yield Row(host, "governor", f"{governor.name} (unit as rendered, enabled)",
                  f"unit {unit.actual}, {enabled}; {now}", OK if good else DRIFT)  # fmt: skip
    yield _file_row(host, "nofile drop-in", stack.nofile.path, stack.nofile.text, digests)
    yield _file_row(host, "sysctl drop-in", plan.sysctl_path, plan.sysctl_text or None, digests)
    values = facts.get("sysctl", {})
    writable = facts.get("sysctl_writable", {})
    for key, wanted in plan.sysctl.items():
        have = values.get(key)
        if str(have) == str(wanted):
            yield Row(host, f"sysctl {key}", str(wanted), str(have), OK)
        elif not writable.get(key, True):
            yield Row(host, f"sysctl {key}", str(wanted), f"{have} (read-only here)", NA)
        else:
            yield Row(host, f"sysctl {key}", str(wanted), str(have), DRIFT)


def _held_row(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    stack = plan.stack
    wanted: list[str] = []
    if stack.nvidia:
        with contextlib.suppress(ValueError):
            wanted += host_driver_layout(plan, facts).packages
    if stack.cuda:
        wanted.append(stack.cuda.package)
    if not wanted:
        return
    held = set(facts.get("held", []))
    missing = [p for p in wanted if p not in held]
    yield Row(host, "held packages", ", ".join(wanted),
              "all held" if not missing else f"not held: {', '.join(missing)}",
              OK if not missing else DRIFT)  # fmt: skip


def _vllm_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    venv = facts.get("venv")
    name = plan.vllm_name
    have = (venv or {}).get("packages", {}).get(name)
    good = have is not None and upstream_release(have) == plan.vllm_version
    yield Row(host, "vllm", f"{name} {plan.vllm_version}", have or "not installed",
              OK if good else DRIFT)  # fmt: skip
    python = (venv or {}).get("python")
    wanted = plan.python
    if wanted:
        good = python is not None and ".".join(python.split(".")[:2]) == wanted
        yield Row(host, "python", wanted, python or "no venv", OK if good else DRIFT)
    else:
        yield Row(host, "python", "the distribution's python3", python or "no venv",
                  OK if python else DRIFT)  # fmt: skip
    digests = facts.get("digests", {})
    units = facts.get("units", {})
    for server in plan.servers:
        yield _file_row(host, f"unit {server.unit}", server.unit_path,
                        server.unit_text, digests)  # fmt: skip
        env_text = server.env_text
        if env_text is None:
            yield Row(host, f"env {server.name}", server.env_path,
                      "not compared: its secret is not available here", NA)  # fmt: skip
        else:
            yield _file_row(host, f"env {server.name}", server.env_path, env_text, digests)
        for tls_file in server.tls.files if server.tls else ():
            item = f"tls {tls_file.part} {server.name}"
            if not tls_file.text:  # drift's plan blanks a file not readable here
                yield Row(host, item, tls_file.path, "not compared: it is not available here",
                          NA)
            else:
                yield _file_row(host, item, tls_file.path, tls_file.text, digests)
        state = units.get(server.unit, {})
        active = state.get("ActiveState", "?")
        yield Row(host, f"service {server.unit}", "active",
                  f"{active} ({state.get('SubState', '?')})",
                  OK if active == "active" else DRIFT)  # fmt: skip
    manifests = facts.get("models", {})
    for model in plan.models:
        manifest = manifests.get(model.name)
        have = (manifest or {}).get("sha256")
        want = model.id
        actual = f"sha256 {have[:16]}…" if have else "not installed"
        yield Row(host, f"model {model.name}", f"sha256 {(want or '?')[:16]}…", actual,
                  OK if have and have == want else DRIFT)  # fmt: skip


def _retired_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    """A row for each server unit vllm-fleet wrote that the fleet file no longer declares."""
    declared = {server.unit for server in plan.servers}
    declared |= {server.ray_head.unit for server in plan.servers if server.ray_head}
    for unit in facts.get("fleet_units", []):
        if unit not in declared:
            yield Row(host, f"unit {unit}", "not declared (removed from the fleet file)",
                      "still installed: the next deploy stops and removes it", DRIFT)  # fmt: skip


def _undeclared_model_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    """A row for each model on the host that no server of the fleet file uses any more."""
    for model in undeclared(facts.get("installed_models", []), plan):
        yield Row(host, f"model {model['name']}", "not declared (no server uses it)",
                  f"installed, {gib(model['bytes'])} on disk: `fleet models prune` "
                  "removes it", DRIFT)  # fmt: skip


def _router_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    """The endpoint routers of the host: pinned release, rendered unit, service state, and
    router units vllm-fleet wrote that the fleet file no longer declares."""
    digests = facts.get("digests", {})
    units = facts.get("units", {})
    if plan.routers:
        venv = facts.get("router_venv") or {}
        have = venv.get("packages", {}).get("vllm-router")
        want = plan.routers[0].version
        yield Row(host, "vllm-router", f"vllm-router {want}", have or "not installed",
                  OK if have == want else DRIFT)  # fmt: skip
    for router in plan.routers:
        yield _file_row(host, f"unit {router.unit}", router.unit_path, router.unit_text, digests)
        state = units.get(router.unit, {})
        active = state.get("ActiveState", "?")
        yield Row(host, f"service {router.unit}", "active",
                  f"{active} ({state.get('SubState', '?')})",
                  OK if active == "active" else DRIFT)  # fmt: skip
    declared = {router.unit for router in plan.routers}
    for unit in facts.get("router_units", []):
        if unit not in declared:
            yield Row(host, f"unit {unit}", "not declared (endpoint removed or moved)",
                      "still installed: the next deploy stops and removes it", DRIFT)  # fmt: skip


def upstream_release(version: str) -> str:
    """A Python package version without its local part: ``0.32.0+cpu`` → ``0.32.0``.

    Example:
        >>> upstream_release("0.32.0+cpu")
        '0.32.0'
    """
    return version.split("+", 1)[0]


def _gpu_health_rows(host: str, plan: HostPlan, facts: dict[str, Any]) -> Iterator[Row]:
    """Each card's PCIe link against its maximum and its uncorrected ECC errors
    (:func:`fleet.judge.health.gpu_problems`); nothing on hosts without the NVIDIA stack."""
    if plan.stack.nvidia is None or "health" not in facts:
        return
    health = facts["health"] or {"gpus": [], "error": "not read"}
    if health.get("error") and not health["gpus"]:
        yield Row(host, "gpu health", "readable", health["error"], ERROR)
    for gpu in health["gpus"]:
        problems = gpu_problems(gpu)
        ecc = gpu.get("ecc") or {}
        errors = [ecc.get("uncorrected_volatile"), ecc.get("uncorrected_aggregate")]
        actual = "; ".join(problems) or (
            f"{pcie_text(gpu)}, ECC uncorrected "
            + ("?" if None in errors else str(sum(errors)))
        )
        yield Row(host, f"gpu{gpu['index']} health", "PCIe at its max, no uncorrected ECC",
                  actual, DRIFT if problems else OK)  # fmt: skip


def compare(plan: HostPlan, facts: dict[str, Any]) -> list[Row]:
    """Every row of one host: its plan (``host.data.fleet``) against its gathered facts."""
    host = plan.host
    stack = plan.stack
    rows: list[Row] = []
    rows += _nvidia_rows(host, plan, facts)
    rows += _cuda_rows(host, plan, facts)
    rows += _held_row(host, plan, facts)
    rows += _tuning_rows(host, plan, facts)
    if stack.serves:
        rows += _vllm_rows(host, plan, facts)
    rows += _retired_rows(host, plan, facts)
    rows += _undeclared_model_rows(host, plan, facts)
    rows += _router_rows(host, plan, facts)
    rows += _gpu_health_rows(host, plan, facts)
    return rows


# --------------------------------------------------------------------------------------------
# Gathering (pyinfra)
# --------------------------------------------------------------------------------------------


