"""GPU health as the driver reports it: PCIe link, ECC errors, clock-event (throttle) reasons,
clocks, power, temperature, utilisation and memory, from one ``nvidia-smi --query-gpu`` CSV.

The field names are exactly those ``nvidia-smi --help-query-gpu`` lists (captured from the H200
machines in ``tests/fixtures/nvidia/h200x2-idle/help-query-gpu.txt``); the parser is tested on
real captures of this very query. Values nvidia-smi cannot give (``[N/A]``, ``[Not
Supported]``) become None, never zero: a missing ECC counter is not a clean one.

Example (the captured H200 under load, ``h200x1-health/query-health-load.csv``, cut short):
    >>> gpu = parse_health(["index, pcie.link.gen.current, pcie.link.gen.max, power.draw [W], "
    ...     "clocks_event_reasons.active", "0, 5, 5, 692.82 W, 0x0000000000000004"])["gpus"][0]
    >>> gpu["pcie"]["gen"], gpu["power_w"], gpu["clock_events"], gpu["throttle"]
    (5, 692.82, ['sw_power_cap'], [])
"""

from __future__ import annotations

import csv
import re
from typing import Any

from pyinfra.api import FactBase

#: The fields asked for, in order (names from ``nvidia-smi --help-query-gpu``).
HEALTH_FIELDS = (
    "index",
    "pci.bus_id",
    "pstate",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "clocks_event_reasons.active",
    "clocks.current.sm",
    "clocks.max.sm",
    "clocks.current.memory",
    "clocks.max.memory",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.reserved",
    "memory.used",
)
#: The clock-event reasons that mean the card is slowed by heat or by its hardware. The software
#: power cap is not one: under full load a card runs at its power limit, as it should (the
#: captured H200 under load: ``0x4``, 693 of 700 W, 100 % utilisation).
THROTTLE_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
#: The bits of ``clocks_event_reasons.active`` (NVML's nvmlClocksEventReason* constants).
EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}
#: Other names nvidia-smi accepts for a field (``--help-query-gpu``: "clocks.sm" or …); a
#: header always prints the first.
ALIASES = {
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.max.mem": "clocks.max.memory",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "gpu_bus_id": "pci.bus_id",
    **{
        f"clocks_throttle_reasons.{r}": f"clocks_event_reasons.{r}"
        for r in ("sw_power_cap", *THROTTLE_REASONS)
    },
}
#: The command-line value of ``--query-gpu``.
HEALTH_QUERY = ",".join(HEALTH_FIELDS)


def _value(text: str) -> str | None:
    """A CSV cell, or None for what nvidia-smi cannot give.

    Example:
        >>> _value("[N/A]"), _value("[Not Supported]"), _value(" 5 ")
        (None, None, '5')
    """
    text = text.strip()
    if not text or text in ("N/A", "[N/A]") or text.startswith("[Not Supported"):
        return None
    if text.startswith("[") and text.endswith("]"):  # [Unknown Error], [GPU is lost], …
        return None
    return text


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _whole(text: str | None) -> int | None:
    number = _number(text)
    return int(number) if number is not None else None


def parse_health(lines: list[str], fields: tuple[str, ...] = HEALTH_FIELDS) -> dict[str, Any]:
    """Parse ``--query-gpu=<fields> --format=csv[,noheader][,nounits]`` output.

    A header line names the columns (nvidia-smi prints a field's first name there, whatever
    alias was asked); without one, ``fields`` does. Units (``MiB``, ``W``) are dropped.

    + lines: the command's output lines
    + fields: the fields the query asked for, in order (any subset of :data:`HEALTH_FIELDS`
      plus others, which are kept under ``raw``)

    Returns ``{"gpus": [...], "error": None | "the lines that were not rows"}``.
    """
    gpus, other = [], []
    names = [ALIASES.get(name, name) for name in fields]
    for line in lines:
        if not line.strip():
            continue
        cells = [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True))]
        if cells and cells[0] == "index":  # a header: it names the columns
            names = [ALIASES.get(n, n) for n in (_UNIT.sub("", cell) for cell in cells)]
            continue
        if len(cells) != len(names):
            other.append(line.strip())
            continue
        raw = {name: _value(_UNIT_VALUE.sub("", cell)) for name, cell in zip(names, cells,
               strict=True)}  # fmt: skip
        gpus.append(_gpu(raw))
    return {"gpus": gpus, "error": " ".join(other) or None}


#: A header's unit (``memory.total [MiB]``) and a value's (``143771 MiB``, ``89.13 W``).
_UNIT = re.compile(r"\s*\[[^]]*\]$")
_UNIT_VALUE = re.compile(r"(?<=[0-9]) (?:MiB|W|MHz|%)$")


def clock_events(raw: dict[str, str | None]) -> list[str]:
    """The active clock-event reasons: the ``Active`` ones asked by name, else the bitmask's.

    Example:
        >>> clock_events({"clocks_event_reasons.active": "0x0000000000000004"})
        ['sw_power_cap']
    """
    named = [key.split(".", 1)[1] for key, value in raw.items()
             if key.startswith("clocks_event_reasons.") and value == "Active"]  # fmt: skip
    if named:
        return named
    mask = raw.get("clocks_event_reasons.active")
    try:
        bits = int(mask, 16) if mask else 0
    except ValueError:
        return []
    return [name for bit, name in EVENT_BITS.items() if bits & bit]


def _gpu(raw: dict[str, str | None]) -> dict[str, Any]:
    events = clock_events(raw)
    return {
        "index": _whole(raw.get("index")),
        "pci_bus_id": raw.get("pci.bus_id"),
        "pstate": raw.get("pstate"),
        "pcie": {
            "gen": _whole(raw.get("pcie.link.gen.current")),
            "gen_max": _whole(raw.get("pcie.link.gen.max")),
            "width": _whole(raw.get("pcie.link.width.current")),
            "width_max": _whole(raw.get("pcie.link.width.max")),
        },
        "ecc": {
            "mode": raw.get("ecc.mode.current"),
            "corrected_volatile": _whole(raw.get("ecc.errors.corrected.volatile.total")),
            "uncorrected_volatile": _whole(raw.get("ecc.errors.uncorrected.volatile.total")),
            "corrected_aggregate": _whole(raw.get("ecc.errors.corrected.aggregate.total")),
            "uncorrected_aggregate": _whole(raw.get("ecc.errors.uncorrected.aggregate.total")),
        },
        "clock_events_active": raw.get("clocks_event_reasons.active"),
        "clock_events": events,
        "throttle": [r for r in events if r in THROTTLE_REASONS],
        "clocks_mhz": {
            "sm": _whole(raw.get("clocks.current.sm")),
            "sm_max": _whole(raw.get("clocks.max.sm")),
            "memory": _whole(raw.get("clocks.current.memory")),
            "memory_max": _whole(raw.get("clocks.max.memory")),
        },
        "power_w": _number(raw.get("power.draw")),
        "power_limit_w": _number(raw.get("power.limit")),
        "temperature_c": _whole(raw.get("temperature.gpu")),
        "utilization_pct": _whole(raw.get("utilization.gpu")),
        "memory_utilization_pct": _whole(raw.get("utilization.memory")),
        "memory_total_mib": _whole(raw.get("memory.total")),
        "memory_reserved_mib": _whole(raw.get("memory.reserved")),
        "memory_used_mib": _whole(raw.get("memory.used")),
        "raw": {k: v for k, v in raw.items() if k not in HEALTH_FIELDS},
    }


#: The shell command of :class:`GpuHealth` (also run by ``fleet status`` over ssh).
HEALTH_COMMAND = f"nvidia-smi --query-gpu={HEALTH_QUERY} --format=csv,nounits 2>&1 || true"


class GpuHealth(FactBase):
    """Each GPU's PCIe link, ECC counters, throttle reasons, clocks, power, temperature, use.

    .. code:: python

        {"gpus": [{"index": 0, "pci_bus_id": "00000000:00:06.0", "pstate": "P0",
                   "pcie": {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16},
                   "ecc": {"mode": "Enabled", "corrected_volatile": 0, …},
                   "throttle": [], "clocks_mhz": {"sm": 1980, "sm_max": 1980, …},
                   "power_w": 120.66, "power_limit_w": 700.0, "temperature_c": 38,
                   "utilization_pct": 0, "memory_total_mib": 143771,
                   "memory_reserved_mib": 616, "memory_used_mib": 1551}],
         "error": None}
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return HEALTH_COMMAND

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_health(output)

    @staticmethod
    def default() -> dict[str, Any]:
        return {"gpus": [], "error": "nvidia-smi is not installed"}
