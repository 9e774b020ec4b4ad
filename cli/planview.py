"""``fleet plan``'s presentation: the memory plan as rich tables and one line per verdict.

The arithmetic is :mod:`fleet.planner.fit`'s; this only shows it.

Example:
    >>> from fleet.load import load_fleet
    >>> from fleet.planner.fit import plan_fleet
    >>> [t.title for t in tables(plan_fleet(load_fleet("inventory/sandbox.yaml")))]
    ['servers: GiB per GPU', 'GPUs: GiB']
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet.planner.fit import FleetPlan, GiB
from fleet.spec.models import Fleet


def _tokens(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _num(value: float | None) -> str:
    """GiB with two decimals, or "?"."""
    return "?" if value is None else f"{value / GiB:.2f}"


#: Rows above which a table is printed as plain aligned text: rich measures every cell before
#: it draws a table (some 2 ms a row here), which took a 10,000-host plan 80 s; plain text
#: takes microseconds a row (benchmarks/fleet_scale.py).
RICH_ROWS = 500
_COLOUR = {"fits": "green", "tight": "yellow", "does not fit": "red", "unknown": "dim"}


def _server_rows(plan: FleetPlan) -> list[list[str]]:
    rows = []
    for s in plan.servers:
        where = ",".join(str(i) for i in s.gpus) or "cpu"
        if s.tp * s.pp > 1:
            where += f" TP{s.tp}×PP{s.pp}"
        if s.worker_hosts:
            where += f", {1 + len(s.worker_hosts)} hosts"
        rows.append([
            f"{s.host}/{s.server}",
            where,
            _num(s.budget_bytes),
            _num(s.weights_per_gpu_bytes) if s.gpus else "—",
            _num(s.overhead_bytes) if s.gpus else "—",
            _num(s.kv_budget_bytes),
            _tokens(s.kv_bytes_per_token),
            _tokens(s.kv_cache_tokens),
            _tokens(s.max_model_len),
            "?" if s.max_concurrency is None else f"{s.max_concurrency:.1f}",
            s.verdict,
        ])
    return rows


def _gpu_rows(plan: FleetPlan) -> list[list[str]]:
    return [[f"{g.host}:{g.index}", g.model or "?", _num(g.memory_bytes), ", ".join(g.servers),
             f"{g.utilization_sum:.2f}", _num(g.headroom_bytes), _num(g.outside_bytes),
             g.verdict] for g in plan.gpus]


def _table(title: str, columns: list[str], right: set[str], rows: list[list[str]]) -> Table | Text:
    """A rich table, or for more than :data:`RICH_ROWS` rows the same as aligned text."""
    if len(rows) > RICH_ROWS:
        widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]

        def line(cells: list[str]) -> str:
            return "  ".join(cell.rjust(w) if col in right else cell.ljust(w)
                             for cell, w, col in zip(cells, widths, columns, strict=True)).rstrip()

        text = "\n".join([title, line(columns), line(["-" * w for w in widths]),
                          *(line(r) for r in rows)])
        return Text(text, no_wrap=True, overflow="ignore")
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    for row in rows:
        table.add_row(*row[:-1], f"[{_COLOUR[row[-1]]}]{row[-1]}[/]")
    return table


def tables(plan: FleetPlan) -> list[Table | Text]:
    """The plan as rich tables (servers, then GPUs), for ``fleet plan``; a table of more than
    :data:`RICH_ROWS` rows as aligned text.

    Example:
        >>> from fleet.load import load_fleet
        >>> from fleet.planner.fit import plan_fleet
        >>> [t.title for t in tables(plan_fleet(load_fleet("inventory/sandbox.yaml")))]
        ['servers: GiB per GPU', 'GPUs: GiB']
    """
    server_columns = ["server", "GPUs", "budget", "weights", "overhead", "KV", "KV B/token",
                      "KV tokens", "max len", "concurrency", "verdict"]
    gpu_columns = ["GPU", "model", "memory", "servers", "Σ utilization", "left over",
                   "needed there", "verdict"]
    return [
        _table("servers: GiB per GPU", server_columns,
               set(server_columns) - {"server", "GPUs", "verdict"}, _server_rows(plan)),
        _table("GPUs: GiB", gpu_columns, {"memory", "Σ utilization", "left over",
                                          "needed there"}, _gpu_rows(plan)),
    ]


def write_lines(console: Console, lines: Iterable[str]) -> None:
    """Print plain lines as they are, in one write: rich renders each line it prints (some
    70 µs a line: seconds for the 200,000 lines of a 10,000-host plan), and would read
    ``:name:`` as an emoji.

    Example:
        >>> import io
        >>> console = Console(file=io.StringIO())
        >>> write_lines(console, ["a :smile:", "b"])
        >>> console.file.getvalue()
        'a :smile:\\nb\\n'
    """
    console.file.write("".join(f"{line}\n" for line in lines))
    console.file.flush()


def print_table(console: Console, table: Table | Text) -> None:
    """Print one of :func:`tables`: a rich table through rich, aligned text in one write (rich
    renders a long text line by line, seconds for a 10,000-host plan's 80,000 GPU rows)."""
    if isinstance(table, Text):
        write_lines(console, [table.plain])
    else:
        console.print(table)


def reasons(plan: FleetPlan) -> list[str]:
    """One line per server and GPU: its verdict and why.

    Example:
        >>> from fleet.load import load_fleet
        >>> from fleet.planner.fit import plan_fleet
        >>> reasons(plan_fleet(load_fleet("inventory/sandbox.yaml")))[0][:40]
        'sandbox-1/tiny: unknown — cannot check: '
    """
    lines = []
    for s in plan.servers:
        lines.append(f"{s.host}/{s.server}: {s.verdict} — {s.reason}")
        if s.overhead_terms:
            lines.append(f"  overhead per GPU ({s.release_model}):")
            lines += [f"    {t['name']} {_num(t['bytes'])} GiB: {t['source']}"
                      for t in s.overhead_terms]
        if s.cuda_total_source:
            lines.append(f"  CUDA total: {s.cuda_total_source}")
        lines += [f"  {t['name']} {_num(t['bytes'])} GiB: {t['source']}" for t in s.weights_terms]
        lines += [f"  warning: {text}" for text in s.warnings]
    lines += [f"{g.host}:GPU{g.index}: {g.verdict} — {g.reason}" for g in plan.gpus]
    return lines


def placed_lines(fleet: Fleet) -> list[str]:
    """One line per replica the planner placed from an endpoint's count: where, and why.

    Example:
        >>> from fleet.load import load_fleet
        >>> placed_lines(load_fleet("tests/data/valid/endpoint-replica-count.yaml"))[1][:61]
        'gpu-b/chat-2: replica 2 of endpoint chat, placed by its count'
    """
    lines = []
    for name, endpoint in fleet.endpoints.items():
        for index, (ref, why) in enumerate(endpoint.placed.items(), 1):
            lines.append(f"{ref}: replica {index} of endpoint {name}, placed by its count: "
                         + "; ".join(why))  # fmt: skip
    return lines

