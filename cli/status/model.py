"""``fleet status`` as data: each server's and each GPU's row, judged against the healthy
ranges of :mod:`fleet.judge.health`. Pure: host probes (and Prometheus answers) in, rows out.

A host that did not answer makes every one of its servers ``down`` with the reason; a server
whose unit runs but whose ``/health`` does not answer is ``down`` too; ``starting`` while
systemd still activates it (vLLM loads its model, the deploy's health wait runs).

TTFT p50 is over the last minute when an earlier scrape of at least a minute ago is at hand
(``--watch`` keeps them, Prometheus computes it with ``rate(…[1m])``), else since the server
started (``ttft_window_s`` None), and says so.

Example:
    >>> row = ServerRow(host="a", server="s", model="m", port=1, health="up", state="active")
    >>> judge_server(row); row.levels
    {'health': 'ok'}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from cli.status.probe import HostProbe, monitoring_units
from facts.gpuhealth import parse_health
from facts.host import UnitStates
from fleet.hostplan.types import HostPlan
from fleet.judge import health
from loadgen.servermetrics import Scrape, histogram_quantile, parse_prometheus

UP, STARTING, DOWN = "up", "starting", "down"
TTFT = "vllm:time_to_first_token_seconds"
#: An earlier scrape this old or older turns TTFT p50 into "over the last minute".
WINDOW_S = 60.0


@dataclass
class ServerRow:
    """One server: health, what it serves, its load and its restarts.

    + health: up | starting | down; state: systemd's words (or why it is down)
    + running, waiting: requests now; kv_cache_pct: KV cache in use (0–100)
    + preemptions: since the server started; restarts: systemd's NRestarts
    + ttft_p50_s: median time to first token; ttft_window_s: over how many seconds (None:
      since the server started)
    + levels: figure → ok | warn | bad | idle (:func:`fleet.judge.health.level`)
    """

    host: str
    server: str
    model: str
    port: int
    health: str
    state: str
    running: float | None = None
    waiting: float | None = None
    kv_cache_pct: float | None = None
    preemptions: float | None = None
    ttft_p50_s: float | None = None
    ttft_window_s: float | None = None
    restarts: int | None = None
    source: str = "host"
    levels: dict[str, str] = field(default_factory=dict)


@dataclass
class GpuRow:
    """One GPU: memory, utilisation, temperature, power against its limit, PCIe link.

    + problems: PCIe fallback and uncorrected ECC errors (:func:`fleet.judge.health.gpu_problems`)
    + throttle: clock-event reasons active now (thermal, power)
    """

    host: str
    index: int | None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    memory_pct: float | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_pct: float | None = None
    pcie: dict[str, int | None] = field(default_factory=dict)
    pcie_text: str = ""
    ecc_corrected: int | None = None
    problems: list[str] = field(default_factory=list)
    throttle: list[str] = field(default_factory=list)
    clock_events: list[str] = field(default_factory=list)
    source: str = "host"
    levels: dict[str, str] = field(default_factory=dict)


@dataclass
class MonitorRow:
    """One monitoring part of a host (exporter, GPU feeder, Prometheus, Alertmanager).

    + part: node | gpu-metrics | dcgm | prometheus | alertmanager | vllm-router
    + health: up | starting | down; state: systemd's words, or Prometheus's scrape error
    + source: host (its unit's state) or prometheus (its ``up`` series)
    """

    host: str
    part: str
    health: str
    state: str
    source: str = "host"


@dataclass
class FleetStatus:
    """The whole screen: servers, GPUs, monitoring parts, hosts that did not answer, when it
    was taken, and the Prometheus the figures came from (None: from the hosts)."""

    servers: list[ServerRow]
    gpus: list[GpuRow]
    unreachable: dict[str, str]
    taken_at: float
    prometheus: str | None = None
    monitoring: list[MonitorRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``.

        Example:
            >>> FleetStatus([], [], {}, 0.0).to_json()["servers"]
            []
        """
        return asdict(self)


def _pct(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return round(100.0 * part / whole, 1)


def ttft_p50(now: Scrape, before: Scrape | None, model: str | None) -> float | None:
    """Median TTFT from the histogram: between two scrapes, or since start without ``before``.

    Example:
        >>> page = 'vllm:time_to_first_token_seconds_bucket{{le="{}"}} {}\\n'.format
        >>> a = parse_prometheus(page(0.1, 1) + page(0.5, 1) + page("+Inf", 1))
        >>> b = parse_prometheus(page(0.1, 1) + page(0.5, 3) + page("+Inf", 3))
        >>> round(ttft_p50(b, a, None), 3), round(ttft_p50(b, None, None), 3)
        (0.3, 0.2)
    """
    buckets = now.buckets(f"{TTFT}", model)
    if before is not None:
        old = dict(before.buckets(TTFT, model))
        buckets = [(bound, count - old.get(bound, 0.0)) for bound, count in buckets]
    return histogram_quantile(0.5, buckets)


def _answer(lines: list[str]) -> dict[str, Any] | None:
    """The request program's JSON answer, or None when nothing answered."""
    for line in lines:
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def server_rows(
    plan: HostPlan,
    found: HostProbe,
    history: dict[tuple[str, str], list[tuple[float, Scrape]]] | None = None,
) -> list[ServerRow]:
    """The rows of one host's servers.

    + plan: the host's plan; found: its probe
    + history: earlier scrapes per (host, server), oldest first, as ``(taken_at, Scrape)``;
      this scrape is appended (``--watch`` keeps it between refreshes)
    """
    rows = []
    for server in plan.servers:
        if server.worker_hosts:  # a server across hosts: not probed (yet)
            continue
        row = ServerRow(
            found.host, server.name, server.served_name, server.port, DOWN, found.error or ""
        )
        rows.append(row)
        if found.error is not None:
            row.state = f"host unreachable: {found.error}"
            judge_server(row)
            continue
        units = UnitStates().process(found.sections.get(("unit", server.name), []))
        unit = units.get(server.unit, {})
        active = unit.get("ActiveState") or "unknown"
        row.state = f"{active} ({unit['SubState']})" if unit.get("SubState") else active
        restarts = unit.get("NRestarts", "")
        row.restarts = int(restarts) if restarts.isdigit() else None
        alive = _answer(found.sections.get(("http-health", server.name), []))
        if active == "activating":
            row.health = STARTING
        elif active == "active" and alive is not None and alive.get("status") == 200:
            row.health = UP
        elif active == "active":
            row.state += ", /health not answering"
        metrics = _answer(found.sections.get(("metrics", server.name), []))
        if metrics is not None and metrics.get("status") == 200:
            scrape = parse_prometheus(metrics["body"])
            model = server.served_name
            row.running = scrape.first(("vllm:num_requests_running",), model)
            row.waiting = scrape.first(("vllm:num_requests_waiting",), model)
            usage = scrape.first(
                (
                    "vllm:kv_cache_usage_perc",
                    "vllm:gpu_cache_usage_perc",
                    "vllm:cpu_cache_usage_perc",
                ),
                model,
            )
            row.kv_cache_pct = round(100.0 * usage, 1) if usage is not None else None
            row.preemptions = scrape.first(("vllm:num_preemptions_total",), model)
            past = (history if history is not None else {}).setdefault(
                (found.host, server.name), []
            )
            before = next((s for t, s in reversed(past) if found.taken_at - t >= WINDOW_S), None)
            window = next(
                (found.taken_at - t for t, s in reversed(past) if found.taken_at - t >= WINDOW_S),
                None,
            )
            row.ttft_p50_s = ttft_p50(scrape, before, model)
            row.ttft_window_s = round(window) if window is not None else None
            past.append((found.taken_at, scrape))
            del past[:-64]
        judge_server(row)
    return rows


def monitor_rows(plan: HostPlan, found: HostProbe) -> list[MonitorRow]:
    """The rows of one host's monitoring parts, from their units' states."""
    rows = []
    for part, unit in monitoring_units(plan):
        row = MonitorRow(found.host, part, DOWN, f"host unreachable: {found.error}")
        rows.append(row)
        if found.error is not None:
            continue
        states = UnitStates().process(found.sections.get(("monitoring", part), []))
        state = states.get(unit, {})
        active = state.get("ActiveState") or "unknown"
        row.state = f"{active} ({state['SubState']})" if state.get("SubState") else active
        row.health = {"active": UP, "activating": STARTING}.get(active, DOWN)
    return rows


def judge_server(row: ServerRow) -> None:
    """Set ``row.levels`` from its figures (:func:`fleet.judge.health.level`)."""
    levels = {"health": {UP: health.OK, STARTING: health.WARN}.get(row.health, health.BAD)}
    for key, value in (
        ("waiting", row.waiting),
        ("preemptions", row.preemptions),
        ("kv_cache_pct", row.kv_cache_pct),
        ("restarts", row.restarts),
    ):
        judged = health.level(key, value)
        if judged is not None:
            levels[key] = judged
    row.levels = levels


def gpu_rows(found: HostProbe) -> list[GpuRow]:
    """The rows of one host's GPUs (none when it has no NVIDIA stack or did not answer)."""
    lines = found.sections.get(("health", ""))
    if found.error is not None or lines is None:
        return []
    report = parse_health(lines)
    rows = []
    for gpu in report["gpus"]:
        row = GpuRow(
            host=found.host,
            index=gpu["index"],
            memory_used_mib=gpu["memory_used_mib"],
            memory_total_mib=gpu["memory_total_mib"],
            memory_pct=_pct(gpu["memory_used_mib"], gpu["memory_total_mib"]),
            utilization_pct=gpu["utilization_pct"],
            temperature_c=gpu["temperature_c"],
            power_w=gpu["power_w"],
            power_limit_w=gpu["power_limit_w"],
            power_pct=_pct(gpu["power_w"], gpu["power_limit_w"]),
            pcie=gpu["pcie"],
            pcie_text=health.pcie_text(gpu),
            ecc_corrected=gpu["ecc"]["corrected_volatile"],
            problems=health.gpu_problems(gpu),
            throttle=gpu["throttle"],
            clock_events=gpu["clock_events"],
        )
        rows.append(row)
    return rows


def judge_gpus(rows: list[GpuRow], busy_hosts: set[str]) -> None:
    """Set each GPU row's levels; utilisation is judged only on hosts with requests running."""
    for row in rows:
        levels = {}
        for key in ("memory_pct", "temperature_c", "utilization_pct"):
            judged = health.level(key, getattr(row, key), busy=row.host in busy_hosts)
            if judged is not None:
                levels[key] = judged
        power = health.power_level(row.power_pct, row.utilization_pct)
        if power is not None:
            levels["power_pct"] = power
        levels["pcie"] = (
            health.BAD if any(p.startswith("PCIe") for p in row.problems) else (health.OK)
        )
        levels["ecc"] = (
            health.BAD if any(p.startswith("ECC") for p in row.problems) else (health.OK)
        )
        if row.throttle:
            levels["throttle"] = health.WARN
        row.levels = levels


def fleet_status(
    plans: dict[str, HostPlan], probes: dict[str, HostProbe], history: dict | None = None
) -> FleetStatus:
    """Every row of the fleet from its hosts' probes.

    Example:
        >>> fleet_status({}, {}).servers
        []
    """
    servers: list[ServerRow] = []
    gpus: list[GpuRow] = []
    monitors: list[MonitorRow] = []
    unreachable = {}
    taken = 0.0
    for name, plan in plans.items():
        found = probes[name]
        taken = max(taken, found.taken_at)
        if found.error is not None:
            unreachable[name] = found.error
        servers += server_rows(plan, found, history)
        gpus += gpu_rows(found)
        monitors += monitor_rows(plan, found)
    busy = {row.host for row in servers if row.running}
    judge_gpus(gpus, busy)
    return FleetStatus(servers, gpus, unreachable, taken, monitoring=monitors)
