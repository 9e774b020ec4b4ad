"""``fleet plan``'s presentation: the memory plan as rich tables and one line per verdict.

The arithmetic is :mod:`fleet.plan`'s; this only shows it.

Example:
    >>> from fleet.load import load_fleet
    >>> from fleet.plan import plan_fleet
    >>> [t.title for t in tables(plan_fleet(load_fleet("inventory/sandbox.yaml")))]
    ['servers: GiB per GPU', 'GPUs: GiB']
"""

from __future__ import annotations

from rich.table import Table

from fleet.plan import FleetPlan, GiB
from fleet.spec import Fleet


def _tokens(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _num(value: float | None) -> str:
    """GiB with two decimals, or "?"."""
    return "?" if value is None else f"{value / GiB:.2f}"


def tables(plan: FleetPlan) -> list[Table]:
    """The plan as rich tables (servers, then GPUs), for ``fleet plan``.

    Example:
        >>> from fleet.load import load_fleet
        >>> from fleet.plan import plan_fleet
        >>> [t.title for t in tables(plan_fleet(load_fleet("inventory/sandbox.yaml")))]
        ['servers: GiB per GPU', 'GPUs: GiB']
    """
    colour = {"fits": "green", "tight": "yellow", "does not fit": "red", "unknown": "dim"}
    servers = Table(title="servers: GiB per GPU")
    left = ("server", "GPUs", "verdict")
    for column in ("server", "GPUs", "budget", "weights", "overhead", "KV", "KV B/token",
                   "KV tokens", "max len", "concurrency", "verdict"):
        servers.add_column(column, justify="left" if column in left else "right")
    for s in plan.servers:
        where = ",".join(str(i) for i in s.gpus) or "cpu"
        if s.tp * s.pp > 1:
            where += f" TP{s.tp}×PP{s.pp}"
        if s.worker_hosts:
            where += f", {1 + len(s.worker_hosts)} hosts"
        servers.add_row(
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
            f"[{colour[s.verdict]}]{s.verdict}[/]",
        )
    gpus = Table(title="GPUs: GiB")
    numbers = ("memory", "Σ utilization", "left over", "needed there")
    for column in ("GPU", "model", *numbers[:1], "servers", *numbers[1:], "verdict"):
        gpus.add_column(column, justify="right" if column in numbers else "left")
    for g in plan.gpus:
        gpus.add_row(
            f"{g.host}:{g.index}", g.model or "?", _num(g.memory_bytes), ", ".join(g.servers),
            f"{g.utilization_sum:.2f}", _num(g.headroom_bytes), _num(g.outside_bytes),
            f"[{colour[g.verdict]}]{g.verdict}[/]",
        )
    return [servers, gpus]


def reasons(plan: FleetPlan) -> list[str]:
    """One line per server and GPU: its verdict and why.

    Example:
        >>> from fleet.load import load_fleet
        >>> from fleet.plan import plan_fleet
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

