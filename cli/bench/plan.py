"""The staged load-test plan of ``fleet bench --plan``: what to run, read from flags or a file.

Four stages, after the 4×4090 D field report's load-test plan:

- **baseline** (stage 0): single requests, one at a time: the server's unloaded TTFT;
- **ladder** (stage 1): the concurrency ladder (``1..64``), latency–concurrency curves, the knee;
- **soak** (stage 2): the knee's concurrency held for a duration (30 minutes by default): error
  rate, latency drift from the first to the last quarter, memory growth;
- **mixed** (stage 3): every server that shares a GPU with another loaded at once, each against
  its own solo run at the same load and duration (what sharing costs).

A plan file is YAML; every key is optional (the defaults are the field report's)::

    stages: [baseline, ladder, soak, mixed]
    baseline: {requests: 5}
    ladder: {concurrency: 1..64, requests: 40}     # or duration: 20s per step
    soak: {duration: 30m, concurrency: knee, windows: 12}
    mixed: {duration: 2m, concurrency: knee}

Example:
    >>> parse_span("1h30m"), parse_span("2.5s"), parse_span("90")
    (5400.0, 2.5, 90.0)
    >>> plan = plan_from_text("soak: {duration: 3s}\\nstages: [ladder, soak]\\n", "p.yaml")
    >>> plan.stages, plan.soak_duration, plan.ladder
    (('ladder', 'soak'), 3.0, '1..64')
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.load import parse_yaml
from fleet.read.problems import FleetError, Problem, suggest
from fleet.read.yamlread import Positions
from fleet.spec.models import Fleet, Variant
from loadgen.runner import parse_loads

#: The stages, in running order, and what each measures.
STAGES = {
    "baseline": "stage 0: single requests, one at a time (unloaded TTFT)",
    "ladder": "stage 1: the concurrency ladder and its knee",
    "soak": "stage 2: the knee's load held for a duration (errors, drift, memory)",
    "mixed": "stage 3: the servers sharing a GPU loaded at once, against their solo runs",
}
_SPAN = re.compile(r"(?:([0-9]*\.?[0-9]+)h)?(?:([0-9]*\.?[0-9]+)m)?(?:([0-9]*\.?[0-9]+)s?)?")
#: Longest span a plan may ask for: one day.
MAX_SPAN = 86400.0


class PlanError(Exception):
    """A plan that cannot run; ``problems`` are located (file, line, key, what to write)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def parse_span(text: str | float | int) -> float:
    """A duration in seconds from ``30m``, ``90s``, ``1h30m``, ``2.5s`` or a bare number (s).

    Example:
        >>> parse_span("30m"), parse_span(12)
        (1800.0, 12.0)
        >>> parse_span("soon")
        Traceback (most recent call last):
        ...
        ValueError: 'soon' is not a duration: write 30m, 90s, 1h30m or a number of seconds
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration: write 30m, 90s, 1h30m or a number "
                         "of seconds")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _SPAN.fullmatch(text.strip())
        if not text.strip() or match is None or not any(match.groups()):
            raise ValueError(f"{text!r} is not a duration: write 30m, 90s, 1h30m or a number "
                             "of seconds")
        hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if not 0 < seconds <= MAX_SPAN:
        raise ValueError(f"{text!r}: a duration must be more than 0 and at most 24h")
    return seconds


@dataclass(frozen=True)
class Plan:
    """What ``fleet bench --plan`` runs (see the module docstring).

    + stages: the stages to run, in running order
    + baseline_requests: single requests of stage 0
    + ladder: the ladder's loads (``1..64``, ``1,2,4``)
    + ladder_requests: measured requests per ladder step (None: max(10, 4 × load))
    + ladder_duration: seconds per ladder step instead of a request count
    + soak_duration: seconds of the soak
    + soak_concurrency: the soak's load (None: the ladder's knee)
    + soak_windows: how many windows the soak's figures are cut into over time
    + mixed_duration: seconds of each solo and of the shared run of stage 3
    + mixed_concurrency: each server's load in stage 3 (None: its own knee)

    Example:
        >>> Plan().stages
        ('baseline', 'ladder', 'soak', 'mixed')
    """

    stages: tuple[str, ...] = tuple(STAGES)
    baseline_requests: int = 5
    ladder: str = "1..64"
    ladder_requests: int | None = None
    ladder_duration: float | None = None
    soak_duration: float = 1800.0
    soak_concurrency: int | None = None
    soak_windows: int = 12
    mixed_duration: float = 120.0
    mixed_concurrency: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON data (what the run directory keeps)."""
        data = dataclasses.asdict(self)
        data["stages"] = list(self.stages)
        return data


#: Keys of each section of a plan file: key → (Plan field, kind).
_SECTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "baseline": {"requests": ("baseline_requests", "count")},
    "ladder": {"concurrency": ("ladder", "loads"), "requests": ("ladder_requests", "count"),
               "duration": ("ladder_duration", "span")},
    "soak": {"duration": ("soak_duration", "span"), "concurrency": ("soak_concurrency", "load"),
             "windows": ("soak_windows", "count")},
    "mixed": {"duration": ("mixed_duration", "span"),
              "concurrency": ("mixed_concurrency", "load")},
}
_HINTS = {
    "count": "write a whole number of at least 1",
    "span": "write a duration: 30m, 90s, 1h30m or a number of seconds",
    "loads": "write a ladder (1..64) or a list (1,2,4,8)",
    "load": "write a whole number of requests in flight, or knee",
}


def _value(kind: str, value: Any) -> Any:
    """A plan file's value converted to its field's kind (ValueError when it is not one)."""
    if kind == "count" or (kind == "load" and value != "knee"):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100000:
            raise ValueError(f"{value!r} is not a whole number from 1 to 100000")
        return value
    if kind == "load":
        return None
    if kind == "span":
        return parse_span(value)
    parse_loads(str(value))
    return str(value)


def plan_from_text(text: str, file: str) -> Plan:
    """A plan from a plan file's text; raises :class:`PlanError` with every located problem.

    Example:
        >>> try:
        ...     plan_from_text("soak:\\n  duraton: 5m\\n", "p.yaml")
        ... except PlanError as error:
        ...     print(error)
        p.yaml:2:3: soak.duraton: unknown key; did you mean 'duration'?
    """
    try:
        data, positions = parse_yaml(text, file)
    except FleetError as error:
        raise PlanError(error.problems) from None
    if data is None:
        data = {}
    problems: list[Problem] = []

    def problem(path: tuple[Any, ...], message: str, hint: str | None = None,
                value: bool = False) -> None:
        line, column = positions.find(path, value=value)
        problems.append(Problem(file, line, column, path, message, hint))

    if not isinstance(data, dict):
        problem((), "a plan file is a mapping of stages and settings",
                "see docs/bench.md, 'The staged plan'")
        raise PlanError(problems)
    fleet_keys = [key for key in ("version", "hosts", "models") if key in data]
    if fleet_keys:
        problem((fleet_keys[0],), "this is a fleet file, not a plan file",
                "--plan takes an optional plan file next to it: name the fleet file first "
                "(fleet bench FLEET --plan …) or write --plan=PLAN.yaml")
        raise PlanError(problems)
    fields: dict[str, Any] = {}
    for key, section in data.items():
        if key == "stages":
            fields["stages"] = _stages(section, positions, file, problems)
            continue
        if key not in _SECTIONS:
            problem((key,), "unknown key", suggest(str(key), ["stages", *_SECTIONS]))
            continue
        if not isinstance(section, dict):
            problem((key,), f"{key} is a mapping of settings",
                    "e.g. " + ", ".join(f"{k}: …" for k in _SECTIONS[key]), value=True)
            continue
        for name, value in section.items():
            if name not in _SECTIONS[key]:
                problem((key, name), "unknown key", suggest(str(name), _SECTIONS[key]))
                continue
            field_name, kind = _SECTIONS[key][name]
            try:
                fields[field_name] = _value(kind, value)
            except ValueError as error:
                problem((key, name), str(error), _HINTS[kind], value=True)
    if problems:
        raise PlanError(problems)
    return Plan(**fields)


def _stages(value: Any, positions: Positions, file: str, problems: list[Problem]) -> tuple:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        line, column = positions.find(("stages",), value=True)
        problems.append(Problem(file, line, column, ("stages",), "a list of stages",
                                "e.g. [baseline, ladder, soak, mixed]"))
        return ()
    stages = []
    for index, name in enumerate(value):
        if name not in STAGES:
            line, column = positions.find(("stages", index), value=True)
            problems.append(Problem(file, line, column, ("stages", index),
                                    f"unknown stage {name!r}",
                                    suggest(str(name), STAGES) or "the stages: "
                                    + ", ".join(STAGES)))
        elif name not in stages:
            stages.append(name)
    return tuple(sorted(stages, key=list(STAGES).index))


def load_plan(path: str) -> Plan:
    """A plan from a plan file (see :func:`plan_from_text`); a missing file is a PlanError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        hint = "give a YAML plan file, or --plan alone for the default plan"
        raise PlanError([Problem(path, None, None, (), f"cannot read the plan file: {reason}",
                                 hint)]) from None
    return plan_from_text(text, path)


def stages_from_text(text: str) -> tuple[str, ...]:
    """The stages of ``--stages`` (names or numbers 0–3, comma-separated), in running order.

    Example:
        >>> stages_from_text("2,ladder,0")
        ('baseline', 'ladder', 'soak')
    """
    names = list(STAGES)
    chosen = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name = names[int(part)] if part.isdigit() and int(part) < len(names) else part
        if name not in STAGES:
            hint = suggest(part, names) or f"the stages: {', '.join(names)} (or 0–3)"
            raise ValueError(f"--stages: unknown stage {part!r}; {hint}")
        chosen.append(name)
    if not chosen:
        raise ValueError("--stages: name at least one stage")
    return tuple(sorted(set(chosen), key=names.index))


# ------------------------------------------------------------------ which servers


@dataclass(frozen=True)
class Chosen:
    """One server the plan loads: ``HOST/SERVER``, and the GPUs it runs on (() on a cpu host).

    Example:
        >>> Chosen("box", "chat", (0,)).name
        'box/chat'
    """

    host: str
    server: str
    gpus: tuple[int, ...] = ()
    cpu: bool = False

    @property
    def name(self) -> str:
        """``HOST/SERVER``."""
        return f"{self.host}/{self.server}"


def choose_servers(fleet: Fleet, selector: str, gpu: int | None, file: str) -> list[Chosen]:
    """The servers ``--server`` names: ``HOST/SERVER``, a unique ``SERVER``, or a ``HOST`` (all
    its servers; with ``gpu``, those that run on that GPU). Raises ValueError saying what exists.

    Example:
        >>> from fleet.spec.models import Fleet
        >>> f = Fleet.model_validate({"version": 1, "models": {"m": {"url": "http://x/m.tgz",
        ...     "sha256": "a" * 64}}, "hosts": {"box": {"address": "10.0.0.1", "vllm": {"version":
        ...     "0.32.0", "variant": "cu129"}, "servers": {"a": {"model": "m", "port": 8000,
        ...     "gpus": [0]}, "b": {"model": "m", "port": 8001, "gpus": [0, 1]}}}}})
        >>> [c.name for c in choose_servers(f, "box", 1, "f.yaml")]
        ['box/b']
    """
    matches = [
        (host_name, server_name)
        for host_name, host in fleet.hosts.items()
        for server_name in host.servers
        if selector in (f"{host_name}/{server_name}", server_name)
    ]
    if not matches and selector in fleet.hosts:
        matches = [(selector, name) for name in fleet.hosts[selector].servers]
        if not matches:
            raise ValueError(f"host {selector!r} of {file} has no servers")
    if not matches:
        names = [f"{h}/{s}" for h, host in fleet.hosts.items() for s in host.servers]
        hint = suggest(selector, [*names, *fleet.hosts, *(n.split("/")[1] for n in names)])
        raise ValueError(f"no server or host {selector!r} in {file}"
                         + (f"; {hint}" if hint else f"; servers: {', '.join(names) or 'none'}"))
    if len({h for h, _ in matches}) > 1:
        raise ValueError(f"{selector!r} names several servers; say which: "
                         + ", ".join(f"{h}/{s}" for h, s in matches))
    chosen = []
    for host_name, server_name in matches:
        host = fleet.hosts[host_name]
        cpu = host.vllm.variant is Variant.cpu
        chosen.append(Chosen(host_name, server_name,
                             tuple(host.servers[server_name].gpus), cpu))
    if gpu is not None:
        on_gpu = [c for c in chosen if gpu in c.gpus or (not c.gpus and not c.cpu)]
        if not on_gpu:
            raise ValueError(f"no server of {selector!r} runs on GPU {gpu}; their GPUs: "
                             + ", ".join(f"{c.name} {list(c.gpus) or 'all'}" for c in chosen))
        chosen = on_gpu
    return chosen


def sharing_groups(servers: list[Chosen]) -> list[list[Chosen]]:
    """The servers that share a device, grouped: the GPUs they name overlap (a server naming
    none uses them all), or a cpu host's servers, who share its cores. Groups of one are left
    out: nothing shares with them.

    Example:
        >>> a, b, c = Chosen("h", "a", (0,)), Chosen("h", "b", (0, 1)), Chosen("h", "c", (2,))
        >>> [[s.server for s in g] for g in sharing_groups([a, b, c])]
        [['a', 'b']]
    """
    groups: list[list[Chosen]] = []
    for server in servers:
        touching = [g for g in groups if any(_share(server, other) for other in g)]
        merged = [server]
        for group in touching:
            merged = group + merged if group is touching[0] else merged + group
            groups.remove(group)
        groups.append(sorted(merged, key=servers.index))
    return [g for g in groups if len(g) > 1]


def _share(a: Chosen, b: Chosen) -> bool:
    if a.host != b.host:
        return False
    if a.cpu or b.cpu:
        return True
    return not a.gpus or not b.gpus or bool(set(a.gpus) & set(b.gpus))
