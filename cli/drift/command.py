"""``fleet drift [FLEET] [--host H] [--json] [--textfile]``: the report, as a table or JSON
(``--textfile``: also each monitored host's drift count for Prometheus, :mod:`cli.drift.textfile`).

Exit status: 0 clean, 2 drift, 1 error.

Example:
    $ fleet drift inventory/sandbox.yaml --json
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from rich.table import Table

from cli.console import err, out
from cli.drift.compare import DRIFT, ERROR, NA, OK, Row, exit_status
from cli.drift.gather import drift
from cli.drift.textfile import publish
from fleet.read.problems import FleetError


def to_json(rows: list[Row]) -> str:
    """The report as JSON: ``{"status": "drift", "rows": [...]}``.

    Example:
        >>> json.loads(to_json([Row("a", "x", "1", "1", "ok")]))["status"]
        'clean'
    """
    status = {0: "clean", 1: "error", 2: "drift"}[exit_status(rows)]
    return json.dumps({"status": status, "rows": [asdict(row) for row in rows]}, indent=2)


def _table(rows: list[Row]) -> Table:
    colours = {OK: "green", DRIFT: "bold red", NA: "dim", ERROR: "bold magenta"}
    table = Table("host", "item", "expected", "actual", "status")
    for row in rows:
        colour = colours.get(row.status, "")
        table.add_row(row.host, row.item, row.expected, row.actual,
                      f"[{colour}]{row.status}[/]")  # fmt: skip
    return table


def cmd_drift(args: Any) -> int:
    """``fleet drift [FLEET] [--host H] [--json]``: exit 0 clean, 2 drift, 1 error."""
    try:
        rows = drift(args.fleet, only=args.host,
                     progress=None if args.json else lambda n: err.print(f"checking {n}…"))
    except FleetError as error:
        err.print(f"[bold red]{args.fleet}: invalid[/]")
        for problem in error.problems:
            err.print(f"  {problem}", markup=False, soft_wrap=True)
        return 1
    status = exit_status(rows)
    if getattr(args, "textfile", False):
        for host, said in publish(args.fleet, rows, args.host).items():
            err.print(f"{host}: {said}", markup=False, soft_wrap=True)
    if args.json:
        print(to_json(rows))
        return status
    out.print(_table(rows))
    counts = {s: sum(1 for r in rows if r.status == s) for s in (OK, DRIFT, NA, ERROR)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = {0: "[green]no drift[/]", 1: "[bold magenta]errors[/]", 2: "[bold red]drift[/]"}
    out.print(f"{verdict[status]} ({summary})")
    return status


def add_parser(sub: Any, default: str) -> None:
    """Register ``fleet drift`` on the CLI's subparsers."""
    parser = sub.add_parser(
        "drift", help="compare every host with the fleet file (exit 0 clean, 2 drift, 1 error)"
    )
    parser.add_argument("fleet", nargs="?", default=default)
    parser.add_argument("--host", help="check only this host")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--textfile",
        action="store_true",
        help="also write each monitored host's drift count for its node exporter "
        "(vllm_fleet_drift_findings: the FleetDriftFound alert)",
    )
    parser.set_defaults(func=cmd_drift)
