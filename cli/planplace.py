"""``fleet plan --place`` and ``--from-host``: GPUs chosen for servers that declare none, and
the plan held against what a host's GPUs really have free.

``--place`` prints the ``gpus:`` each unplaced server would get, with the reason and the
alternatives rejected (:mod:`fleet.planner.placement`), then the memory plan of the placed fleet;
``--write`` puts the chosen lines into the fleet file (:mod:`fleet.planner.gpuswrite`), keeping
every
other byte. ``--from-host`` reads the GPUs over SSH with pyinfra facts (``nvidia-smi -q -x``:
total, reserved, used and free memory, the processes holding it; ``nvidia-smi topo -m``) and
plans against them: the CUDA total is the host's ``total − reserved``, and memory that other
processes hold is taken.

Example:
    $ fleet plan --place inventory/examples/quad-4090d.yaml
    $ fleet plan --place --write fleet.yaml
    $ fleet plan --from-host hgx-h200-01 fleet.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table

from cli.console import err, out, plural, report
from cli.factsession import fact_inventory
from cli.inventory import connection_data
from cli.planview import placed_lines, print_table, reasons, tables, write_lines
from facts.gpumemory import GpuMemory
from facts.gpus import GpuTopology
from fleet.catalog import gpus as gpu_table
from fleet.load import load_fleet, load_text
from fleet.planner.fit import plan_fleet
from fleet.planner.gpuswrite import WriteProblem, write_gpus
from fleet.planner.placement import (
    HEADROOM_GIB,
    GpuProcess,
    GpuRoom,
    GpuState,
    Placement,
    gib,
    measured,
    measured_sources,
    place_fleet,
    placed,
    rooms,
    unplaced,
)
from fleet.read.problems import FleetError
from fleet.spec.models import Fleet, Variant


def states_of(fact: dict[str, Any]) -> list[GpuState]:
    """The :class:`GpuState` list of a :class:`facts.gpumemory.GpuMemory` answer; raise
    ValueError when it has an error or a GPU lacks its memory figures.

    Example:
        >>> xml = open("tests/fixtures/nvidia/h200x2-busy/nvidia-smi-q.xml").read()
        >>> [(s.index, s.used_mib, s.processes[0].used_mib)
        ...  for s in states_of(GpuMemory().process(xml.splitlines()))]
        [(0, 1551, 1542), (1, 2575, 2566)]
    """
    if fact.get("error"):
        raise ValueError(f"nvidia-smi: {fact['error']}")
    states = []
    for gpu in fact.get("gpus", []):
        total, used, free = gpu.get("total_mib"), gpu.get("used_mib"), gpu.get("free_mib")
        if None in (total, used, free):
            raise ValueError(f"GPU {gpu.get('index')}: nvidia-smi gives no memory figures")
        states.append(GpuState(
            index=gpu["index"], name=gpu.get("name") or "?", total_mib=total,
            reserved_mib=gpu.get("reserved_mib"), used_mib=used, free_mib=free,
            processes=tuple(
                GpuProcess(p.get("pid") or 0, p.get("name") or "?", p.get("used_mib") or 0)
                for p in gpu.get("processes", [])
            ),
        ))
    if not states:
        raise ValueError("nvidia-smi lists no GPU")
    return states


def links_of(fact: dict[str, Any]) -> gpu_table.Links | None:
    """GPU-to-GPU links of a :class:`facts.gpus.GpuTopology` answer (NICs left out).

    Example:
        >>> links_of({"links": {"GPU0": {"GPU1": "NV18", "NIC0": "SYS"},
        ...                     "GPU1": {"GPU0": "NV18"}}})
        {(0, 1): 'NV18'}
    """
    links: gpu_table.Links = {}
    for row, cells in (fact.get("links") or {}).items():
        for col, link in cells.items():
            a, b = re.fullmatch(r"GPU(\d+)", row), re.fullmatch(r"GPU(\d+)", col)
            if a and b and re.fullmatch(gpu_table.LINK_PATTERN, link):
                links[tuple(sorted((int(a[1]), int(b[1]))))] = link  # type: ignore[index]
    return links or None


def read_hosts(
    fleet: Fleet, path: str, names: list[str]
) -> tuple[dict[str, list[GpuState]], dict[str, gpu_table.Links], list[str]]:
    """Read each named host's GPUs over SSH: (states, links, errors), one error per host."""
    errors: list[str] = []
    targets = []
    for name in names:
        try:
            targets.append((name, connection_data(name, fleet.hosts[name], path)))
        except FleetError as error:
            errors.append(f"{name}: " + "; ".join(p.message for p in error.problems))
    found_states, found_links, failed = read_targets(targets)
    return found_states, found_links, errors + failed


def read_targets(
    targets: list[tuple[str, dict[str, Any]]],
) -> tuple[dict[str, list[GpuState]], dict[str, gpu_table.Links], list[str]]:
    """Read the GPUs of pyinfra hosts ``[(name, data)]``: (states, links, errors)."""
    states: dict[str, list[GpuState]] = {}
    links: dict[str, gpu_table.Links] = {}
    errors: list[str] = []
    if not targets:
        return states, links, errors
    inventory = fact_inventory(targets)
    for name, _ in targets:
        host = inventory.get_host(name)
        try:
            host.connect(raise_exceptions=True, show_errors=False)
            states[name] = states_of(host.get_fact(GpuMemory))
            found = links_of(host.get_fact(GpuTopology))
            if found:
                links[name] = found
        except Exception as error:  # one host's failure is one line, not a traceback
            errors.append(f"{name}: " + " ".join(f"{type(error).__name__}: {error}".split()))
        finally:
            if host.connected:
                host.disconnect()
    return states, links, errors


def placement_lines(placement: Placement) -> list[str]:
    """The ``gpus:`` lines it would write, each with its reason and rejected alternatives.

    Example:
        >>> from fleet.planner.placement import Choice
        >>> placement_lines(Placement([Choice("h", "s", [0], "why", ["GPU 1: no"])], []))
        ['h/s: gpus: [0]', '  why', '  rejected: GPU 1: no']
    """
    lines = list(placement.summary.values())
    for choice in placement.choices:
        lines.append(f"{choice.host}/{choice.server}: gpus: "
                     f"[{', '.join(str(i) for i in choice.gpus)}]")
        lines.append(f"  {choice.reason}")
        lines += [f"  rejected: {why}" for why in choice.rejected]
    return lines


def rooms_table(found: dict[str, list[GpuRoom]], states: dict[str, list[GpuState]]) -> Table:
    """Every GPU: its CUDA total, what is taken and by whom, and what is left."""
    table = Table(title=f"GPUs after placement: GiB ({HEADROOM_GIB:g} GiB headroom kept)")
    for column in ("GPU", "CUDA total", "taken", "on it", "left", "read from"):
        table.add_column(column, justify="right" if column in ("CUDA total", "taken", "left")
                         else "left")
    for host, gpus in found.items():
        by_index = {s.index: s for s in states.get(host, [])}
        for gpu in gpus:
            state = by_index.get(gpu.index)
            source = "the fleet file"
            if state is not None:
                source = f"the host: {state.name}, reserved {state.reserved_mib} MiB"
                if state.processes:
                    source += "; " + ", ".join(f"pid {p.pid} {p.name} {p.used_mib} MiB"
                                               for p in state.processes)
            left = gpu.room
            colour = "red" if left < 0 else "green"
            on_it = ", ".join(gpu.users + ([f"others {gib(gpu.foreign)}"] if gpu.foreign else []))
            table.add_row(f"{host}:{gpu.index}", f"{gpu.total / 2**30:.2f}",
                          f"{gpu.taken / 2**30:.2f}", on_it or "—",
                          f"[{colour}]{left / 2**30:.2f}[/]", source)
    return table


def _write(path: str, placement: Placement) -> bool:
    """Write the chosen gpus into the file (validated first, replaced atomically)."""
    target = Path(path)
    try:
        text = target.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        err.print(f"{path}: cannot write gpus: {error}", markup=False)
        return False
    try:
        new = write_gpus(text, placement.gpus_of())
        load_text(new, path, capacity=False)
    except WriteProblem as problem:
        err.print(f"{path}: not written: {problem}", markup=False, soft_wrap=True)
        return False
    except FleetError as error:
        report(path, error, "not written: the placed file would be invalid")
        return False
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(new.encode("utf-8"))
        os.chmod(temporary, target.stat().st_mode & 0o7777)
        os.replace(temporary, target)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        err.print(f"{path}: cannot write: {error}", markup=False)
        return False
    out.print(f"{path}: wrote {plural(len(placement.choices), 'gpus: line')}", markup=False)
    return True


def cmd_plan_place(args: argparse.Namespace) -> int:
    """``fleet plan`` with ``--place`` and/or ``--from-host``."""
    try:
        fleet = load_fleet(args.fleet, capacity=False, unplaced=args.place)
    except FleetError as error:
        report(args.fleet, error)
        return 1
    states: dict[str, list[GpuState]] = {}
    links: dict[str, gpu_table.Links] = {}
    if args.from_host is not None:
        names = [args.from_host] if args.from_host else [
            name for name, host in fleet.hosts.items() if host.vllm.variant is not Variant.cpu
        ]
        missing = [name for name in names if name not in fleet.hosts]
        if missing:
            err.print(f"{args.fleet}: no host {missing[0]!r} (hosts: "
                      f"{', '.join(fleet.hosts)})", markup=False)
            return 1
        states, links, errors = read_hosts(fleet, args.fleet, names)
        for line in errors:
            err.print(f"cannot read GPUs of {line}", markup=False, soft_wrap=True)
        if errors:
            return 1
        for name, found in states.items():
            declared = fleet.hosts[name].gpus.count
            if declared and declared != len(found):
                err.print(f"{name}: the fleet file says {declared} GPUs, the host has "
                          f"{len(found)}: planning with the host's", markup=False)
    fleet = measured(fleet, states)
    placement = Placement([], [], rooms(fleet, states))
    if args.place:
        placement = place_fleet(fleet, states, links)
        if not unplaced(fleet):
            out.print("every GPU server declares its gpus: nothing to place", markup=False)
    planned = placed(fleet, placement)
    plan = plan_fleet(planned, measured_sources(states))
    refused = [f"{r.host}/{r.server}: cannot place: {r.message}; {r.hint}"
               for r in placement.refused]
    if args.json:
        document = {
            "placement": [vars(c) for c in placement.choices],
            "refused": [vars(r) for r in placement.refused],
            **plan.to_json(),
        }
        out.print(json.dumps(document, indent=2), markup=False, soft_wrap=True)
    else:
        for line in placement_lines(placement):
            out.print(line, markup=False, soft_wrap=True)
        for table in tables(plan):
            print_table(out, table)
        if args.place or states:
            out.print(rooms_table(placement.rooms, states))
        write_lines(out, reasons(plan) + placed_lines(fleet))
    for line in refused:
        err.print(line, markup=False, soft_wrap=True)
    over = [f"{g.host}:GPU{g.index}: {gib(g.taken - g.total)} more than it has"
            for gpus in placement.rooms.values() for g in gpus if g.taken > g.total]
    for line in over:
        err.print(f"overcommitted: {line}", markup=False)
    bad = [s for s in plan.servers if s.fits is False] + [g for g in plan.gpus if g.fits is False]
    if refused or over or bad:
        if args.write:
            err.print(f"{args.fleet}: not written", markup=False)
        return 1
    if args.write and placement.choices and not _write(args.fleet, placement):
        return 1
    return 0
