"""``fleet status [FLEET] [--watch] [--json] [--startup] [--prometheus URL] [--host H]``.

Every host is probed at once (one ssh round trip each, in threads); a host or server that
does not answer shows as down and the report goes on. ``--watch`` refreshes in place (rich
``Live``) every ``--interval`` seconds, keeping earlier scrapes so TTFT p50 turns into "over
the last minute"; ``--json`` prints the same data for scripts; ``--startup`` adds each
server's starts, cut into phases (:mod:`cli.status.startup`).

Figures come from the fleet's own Prometheus where its ``monitoring`` section has one (or
``--prometheus URL``), on top of what the hosts answer; a Prometheus that does not answer is
said on the screen and the hosts' own figures stay (``--from-hosts``: never ask it).

Exit status: 0 every server and monitoring part up and no GPU fault, 2 something down or
faulty, 1 the fleet file could not be read.

Example:
    $ fleet status inventory/sandbox.yaml
    $ fleet status --watch --interval 5
    $ fleet status --json | jq '.servers[] | select(.health != "up")'
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rich.console import Group
from rich.live import Live

from cli.console import err, out
from cli.inventory import connection_data
from cli.status import prometheus
from cli.status.model import UP, FleetStatus, fleet_status
from cli.status.probe import HostProbe, probe
from cli.status.startup import Start, merge_recorded, starts
from cli.status.view import screen, startup_table
from fleet.hostplan.render import host_plan
from fleet.hostplan.types import HostPlan
from fleet.load import load_fleet
from fleet.planner.monitoring import monitoring_host, prometheus_is_remote_only, prometheus_url
from fleet.read.problems import FleetError
from fleet.spec.models import Fleet


def targets(
    path: str, only: str | None = None, fleet: Fleet | None = None
) -> tuple[dict[str, HostPlan], dict[str, dict], dict[str, str]]:
    """(plans, connection data, errors) of the fleet's hosts; secrets are not read (the
    status needs none: API keys stay on the hosts)."""
    fleet = fleet if fleet is not None else load_fleet(path)
    plans, data, errors = {}, {}, {}
    for name in fleet.hosts:
        if only and name != only:
            continue
        plans[name] = host_plan(fleet, name, secrets=lambda ref: "")
        try:
            data[name] = connection_data(name, fleet.hosts[name], path)
        except FleetError as error:
            errors[name] = "; ".join(p.message for p in error.problems)
    return plans, data, errors


def probe_all(
    plans: dict[str, HostPlan], data: dict[str, dict], errors: dict[str, str], startup: bool = False
) -> dict[str, HostProbe]:
    """Every host's probe, in parallel; hosts without connection data are errors."""
    found = {name: HostProbe(name, error=why, taken_at=time.time()) for name, why in errors.items()}
    reachable = [name for name in plans if name in data]
    if reachable:
        with ThreadPoolExecutor(max_workers=min(16, len(reachable))) as pool:
            answers = pool.map(lambda n: probe(n, data[n], plans[n], startup=startup), reachable)
            found.update(zip(reachable, answers, strict=True))
    return found


def prometheus_source(
    fleet: Fleet, path: str, given: str | None
) -> tuple[str | None, prometheus.Ask]:
    """Which Prometheus the figures come from, and how to ask it: ``--prometheus URL`` when
    given, else the fleet's own (its ``monitoring`` section), asked over ssh on its host when
    it listens on loopback there; ``(None, …)`` without either.

    Example:
        >>> from fleet.load import load_text
        >>> fleet = load_text("version: 1\\nmonitoring: {host: a, prometheus: {port: 18600}}\\n"
        ...     "hosts: {a: {address: sandbox, vllm: {version: 0.32.0, variant: cpu}}}\\n", "f")
        >>> prometheus_source(fleet, "f", None)[0]
        'http://127.0.0.1:18600'
    """
    if given:
        return given, prometheus.query
    url = prometheus_url(fleet)
    name = monitoring_host(fleet)
    if url is None or name is None or fleet.monitoring is None:
        return None, prometheus.query
    if prometheus_is_remote_only(fleet):
        data = connection_data(name, fleet.hosts[name], path)
        return url, prometheus.over_ssh(data, fleet.monitoring.prometheus.port)
    return url, prometheus.query


def collect(args: Any, history: dict) -> tuple[FleetStatus, dict[str, list[Start]]]:
    """One full reading of the fleet (and the starts, with ``--startup``): from the hosts, with
    the fleet's Prometheus (or ``--prometheus``) answering what it knows; a Prometheus that
    does not answer is said, and the figures stay the hosts' own."""
    fleet = load_fleet(args.fleet)
    plans, data, errors = targets(args.fleet, args.host, fleet)
    found = probe_all(plans, data, errors, startup=args.startup)
    status = fleet_status(plans, found, history)
    if not getattr(args, "from_hosts", False):
        try:
            url, ask = prometheus_source(fleet, args.fleet, args.prometheus)
        except FleetError as error:
            url, ask = None, prometheus.query
            status.unreachable["prometheus"] = "; ".join(p.message for p in error.problems)
        if url is not None:
            try:
                prometheus.merge(status, url, ask)
            except prometheus.PrometheusError as error:
                status.unreachable["prometheus"] = f"{error} (figures from the hosts)"
    started: dict[str, list[Start]] = {}
    if args.startup:
        for name, plan in plans.items():
            for server in plan.servers:
                lines = found[name].sections.get(("journal", server.name))
                if lines is not None:
                    recorded = found[name].sections.get(("startups", server.name), [])
                    started[f"{name}/{server.name}"] = merge_recorded(starts(lines), recorded)
    return status, started


def exit_status(status: FleetStatus) -> int:
    """0 when every server is up and no GPU is faulty, else 2.

    Example:
        >>> exit_status(FleetStatus([], [], {}, 0.0))
        0
    """
    down = any(row.health != UP for row in [*status.servers, *status.monitoring])
    return 2 if down or any(row.problems for row in status.gpus) else 0


def to_json(
    status: FleetStatus, started: dict[str, list[Start]] | None, indent: int | None = 2
) -> str:
    """The report as JSON (``startup`` only with ``--startup``)."""
    data = status.to_json()
    if started is not None:
        data["startup"] = {name: [s.to_json() for s in kept] for name, kept in started.items()}
    return json.dumps(data, indent=indent)


def _render(status: FleetStatus, started: dict[str, list[Start]], args: Any) -> Group:
    parts: list = [screen(status)]
    if args.startup:
        parts.append(startup_table(started))
    return Group(*parts)


def cmd_status(args: Any) -> int:
    """``fleet status``: print (or keep refreshing) the fleet's screen."""
    history: dict = {}
    try:
        status, started = collect(args, history)
    except FleetError as error:
        err.print(f"[bold red]{args.fleet}: invalid[/]")
        for problem in error.problems:
            err.print(f"  {problem}", markup=False, soft_wrap=True)
        return 1
    if args.json:
        # one JSON document per reading (with --watch: one per line, for a pipe)
        print(
            to_json(status, started if args.startup else None, indent=None if args.watch else 2),
            flush=True,
        )
        refreshes = 1
        while args.watch and (args.count is None or refreshes < args.count):
            time.sleep(args.interval)
            status, started = collect(args, history)
            print(to_json(status, started if args.startup else None, indent=None), flush=True)
            refreshes += 1
        return exit_status(status)
    if not args.watch:
        out.print(_render(status, started, args))
        return exit_status(status)
    refreshes = 1
    with Live(_render(status, started, args), console=out, auto_refresh=False) as live:
        while args.count is None or refreshes < args.count:
            time.sleep(args.interval)
            status, started = collect(args, history)
            live.update(_render(status, started, args), refresh=True)
            refreshes += 1
    return exit_status(status)


def add_parser(sub: Any, default: str) -> None:
    """Register ``fleet status`` on the CLI's subparsers."""
    parser = sub.add_parser(
        "status", help="one screen for the fleet: servers, load, GPUs (exit 0 all up, 2 not)"
    )
    parser.add_argument("fleet", nargs="?", default=default)
    parser.add_argument("--host", help="only this host")
    parser.add_argument("--watch", action="store_true", help="refresh in place")
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="seconds between refreshes with --watch (default 2)",
    )
    parser.add_argument(
        "--count", type=int, default=None, help="with --watch: stop after this many readings"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--startup", action="store_true", help="each server's starts, in phases (from its journal)"
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="take figures from this Prometheus (its HTTP API; default: the fleet's own, "
        "where its monitoring section has one)",
    )
    parser.add_argument(
        "--from-hosts",
        action="store_true",
        help="ask only the hosts, never Prometheus",
    )
    parser.set_defaults(func=cmd_status)
