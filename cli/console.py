"""The CLI's one pair of consoles, and how it reports problems and reaches hosts.

Piped output (CI logs, files) gets wide lines: rich would otherwise wrap tables at 80.

Example:
    from cli.console import connect, out
    hosts = connect("inventory/sandbox.yaml")   # [(name, pyinfra data)] or None, reported
    out.print("done")
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from cli.inventory import inventory_hosts
from fleet.read.problems import FleetError

out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


def plural(count: int, word: str) -> str:
    """``plural(2, "host")`` → ``'2 hosts'``.

    Example:
        >>> plural(1, "host"), plural(3, "server")
        ('1 host', '3 servers')
    """
    return f"{count} {word}{'' if count == 1 else 's'}"


def report(path: str, error: FleetError, headline: str = "invalid") -> None:
    """Print a fleet file's located problems, one per line, on stderr."""
    err.print(f"[bold red]{path}: {headline}[/] ({plural(len(error.problems), 'problem')})")
    for problem in error.problems:
        err.print(f"  {problem}", markup=False, soft_wrap=True)


def connect(path: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The inventory of a fleet file (hosts with their plans), or None once reported."""
    try:
        return inventory_hosts(path)
    except FleetError as error:
        report(path, error, "cannot reach hosts")
        return None
