"""``fleet status`` on screen: a servers table and a GPUs table, each figure coloured by its
level (green ok, yellow warn, red bad, dim idle or unknown), and the starts table of
``--startup``.

Example:
    >>> from cli.status.model import FleetStatus, ServerRow, judge_server
    >>> row = ServerRow("a", "s", "m", 18000, "down", "failed")
    >>> judge_server(row)
    >>> table = servers_table(FleetStatus([row], [], {}, 0.0))
    >>> table.row_count, cell(None)
    (1, '[dim]—[/]')
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from cli.status.model import FleetStatus
from cli.status.startup import PHASES, Start
from fleet.judge.health import BAD, IDLE, OK, WARN

COLOURS = {OK: "green", WARN: "yellow", BAD: "bold red", IDLE: "dim"}


def cell(text: object, level: str | None = None) -> str:
    """A table cell: ``text`` in its level's colour (``—`` dim when there is no value).

    Example:
        >>> cell("91 %", "warn")
        '[yellow]91 %[/]'
    """
    if text is None or text == "":
        return "[dim]—[/]"
    colour = COLOURS.get(level or "", "")
    value = str(text).replace("[", "\\[")
    return f"[{colour}]{value}[/]" if colour else value


def _number(value: float | None, unit: str = "", digits: int = 0) -> str | None:
    if value is None:
        return None
    return f"{value:.{digits}f}{unit}"


def _ms(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds * 1000:.0f} ms"


def servers_table(status: FleetStatus) -> Table:
    """One row per server: health, model, load, KV cache, preemptions, TTFT p50, restarts."""
    table = Table(
        "server",
        "health",
        "model",
        "run",
        "wait",
        "KV cache",
        "preempt",
        "TTFT p50",
        "restarts",
        "state",
        title="servers",
        title_justify="left",
    )
    for row in status.servers:
        lv = row.levels
        window = "1 min" if row.ttft_window_s else "since start"
        ttft = _ms(row.ttft_p50_s)
        table.add_row(
            f"{row.host}/{row.server}",
            cell(row.health, lv.get("health")),
            cell(row.model),
            cell(_number(row.running)),
            cell(_number(row.waiting), lv.get("waiting")),
            cell(_number(row.kv_cache_pct, " %", 1), lv.get("kv_cache_pct")),
            cell(_number(row.preemptions), lv.get("preemptions")),
            cell(f"{ttft} ({window})" if ttft else None),
            cell(row.restarts, lv.get("restarts")),
            cell(row.state, None if row.health == "up" else lv.get("health")),
        )
    return table


def gpus_table(status: FleetStatus) -> Table:
    """One row per GPU: memory, utilisation, temperature, power against limit, PCIe, faults."""
    table = Table(
        "gpu",
        "memory",
        "util",
        "temp",
        "power",
        "PCIe",
        "problems",
        title="GPUs",
        title_justify="left",
    )
    for row in status.gpus:
        lv = row.levels
        memory = None
        if row.memory_used_mib is not None and row.memory_total_mib:
            memory = (
                f"{row.memory_used_mib / 1024:.1f}/{row.memory_total_mib / 1024:.1f} GiB "
                f"({row.memory_pct:.0f} %)"
            )
        power = None
        if row.power_w is not None:
            limit = f"/{row.power_limit_w:.0f}" if row.power_limit_w else ""
            power = f"{row.power_w:.0f}{limit} W"
        problems = row.problems + [f"throttle: {r}" for r in row.throttle]
        note = "power cap (at its limit)" if "sw_power_cap" in row.clock_events else "none"
        table.add_row(
            f"{row.host}/gpu{row.index}",
            cell(memory, lv.get("memory_pct")),
            cell(_number(row.utilization_pct, " %"), lv.get("utilization_pct")),
            cell(_number(row.temperature_c, " °C"), lv.get("temperature_c")),
            cell(power, lv.get("power_pct")),
            cell(row.pcie_text, lv.get("pcie")),
            cell(
                "; ".join(problems) or note, BAD if row.problems else WARN if row.throttle else OK
            ),
        )
    return table


def monitoring_table(status: FleetStatus) -> Table:
    """One row per monitoring part: exporters, the GPU feeder, Prometheus, Alertmanager."""
    table = Table("host", "part", "health", "state", "from", title="monitoring",
                  title_justify="left")  # fmt: skip
    levels = {"up": OK, "starting": WARN}
    for row in status.monitoring:
        level = levels.get(row.health, BAD)
        table.add_row(row.host, row.part, cell(row.health, level),
                      cell(row.state, None if level == OK else level), row.source)  # fmt: skip
    return table


def screen(status: FleetStatus) -> Group:
    """The whole screen: servers, GPUs (where any), monitoring parts (where the fleet has
    monitoring), hosts that did not answer, and where the figures came from."""
    parts: list = [servers_table(status)]
    if status.gpus:
        parts.append(gpus_table(status))
    if status.monitoring:
        parts.append(monitoring_table(status))
    for host, why in status.unreachable.items():
        parts.append(Text.from_markup(f"[bold red]{host} did not answer:[/] {cell(why)}"))
    if status.prometheus:
        parts.append(Text(f"figures from Prometheus at {status.prometheus}", style="dim"))
    return Group(*parts)


def startup_table(found: dict[str, list[Start]], last: int = 5) -> Table:
    """The last ``last`` starts of each server, a column per phase (seconds)."""
    table = Table(
        "server",
        "started",
        "vLLM",
        "model install",
        *PHASES,
        "total",
        title="time to ready (s)",
        title_justify="left",
    )
    for name, kept in found.items():
        for start in kept[-last:]:
            total = _number(start.total_s, digits=1)
            table.add_row(
                name,
                start.began_at,
                cell(start.version),
                cell(_number(start.model_install_s, digits=1)),
                *[cell(_number(start.phases.get(p), digits=1)) for p in PHASES],
                cell(total, OK if start.ready else BAD),
            )
    return table
