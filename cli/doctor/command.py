"""``fleet doctor [FLEET] [HOST[/SERVER]] [--json]``: why a server is not serving, and the fix.

Reads every server's state over SSH; for those not active, not answering /health or
restarting, gathers bounded evidence (:mod:`cli.doctor.gather`) and names the most likely
cause (:mod:`fleet.judge.diagnosis`). Changes nothing on any host.

Example:
    $ fleet doctor inventory/sandbox.yaml sandbox-1/tiny
"""

from __future__ import annotations

import os
from typing import Any

from cli.console import err
from cli.doctor.benchcheck import BENCH_RESULTS
from cli.doctor.gather import gather_fleet
from cli.doctor.report import exit_status, text, to_json
from fleet.judge.diagnosis import diagnose
from fleet.read.problems import FleetError


def _split(args: Any, default: str) -> tuple[str, str | None]:
    """(fleet file, HOST[/SERVER]) from one or two positional words."""
    words = [w for w in (args.fleet, args.target) if w]
    if len(words) == 2:
        return words[0], words[1]
    if len(words) == 1 and not (os.path.exists(words[0]) or words[0].endswith((".yaml", ".yml"))):
        return default, words[0]
    return (words[0] if words else default), None


def cmd_doctor(args: Any) -> int:
    """``fleet doctor``: exit 0 nothing wrong, 2 problems found, 1 could not diagnose."""
    path, target = _split(args, args.default_fleet)
    bench_dir = None if args.no_bench else args.bench_results
    try:
        evidence = gather_fleet(path, only=target,
                                progress=None if args.json else lambda n: err.print(
                                    f"examining {n}…"), bench_dir=bench_dir)  # fmt: skip
    except FleetError as error:
        err.print(f"[bold red]{path}: invalid[/]")
        for problem in error.problems:
            err.print(f"  {problem}", markup=False, soft_wrap=True)
        return 1
    except KeyError as error:
        err.print(f"[bold red]{error.args[0]}[/]", markup=True)
        return 1
    diagnoses = [diagnose(ev) for ev in evidence]
    print(to_json(diagnoses) if args.json else text(diagnoses))
    return exit_status(diagnoses)


def add_parser(sub: Any, default: str) -> None:
    """Register ``fleet doctor`` on the CLI's subparsers."""
    parser = sub.add_parser(
        "doctor",
        help="name why servers are not serving, with evidence and the fix (read only; "
        "exit 0 nothing wrong, 2 problems, 1 could not diagnose)",
    )
    parser.add_argument("fleet", nargs="?", help=f"the fleet file (default {default})")
    parser.add_argument("target", nargs="?", metavar="HOST[/SERVER]",
                        help="only this host, or one server of it")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--bench-results", metavar="DIR", default=BENCH_RESULTS,
                        help="where fleet bench archived its runs: a healthy server with a run "
                        f"there is measured again and compared with it (default {BENCH_RESULTS})")
    parser.add_argument("--no-bench", action="store_true",
                        help="skip the slow check (send no requests)")
    parser.set_defaults(func=cmd_doctor, default_fleet=default)
