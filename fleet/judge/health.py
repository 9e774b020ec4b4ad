"""Healthy ranges of a serving GPU host, and the GPU health rules of drift, verify and status.

The ranges are the 4×4090 D field report's table (issue 14), read from the alert catalogue
(:mod:`fleet.catalog.alerts`: each alert's ``status``): GPU utilisation 60–95 % under
load (below 30 % the bottleneck is elsewhere), GPU memory below 95 % (above: OOM at any time),
temperature below 80 °C (above 85 °C the card throttles), power at its limit only under full
load, vLLM's queue mostly 0, preemptions 0; and the system checks: PCIe at the card's
generation and width. Every level is one of ``ok``, ``warn``, ``bad`` or ``idle`` (nothing to
judge: no load), or None when the value is unknown.

Example:
    >>> level("temperature_c", 82), level("memory_pct", 96), level("waiting", 0)
    ('warn', 'bad', 'ok')
    >>> gpu_problems({"index": 0, "pstate": "P0",
    ...     "pcie": {"gen": 1, "gen_max": 5, "width": 8, "width_max": 16},
    ...     "ecc": {"uncorrected_volatile": 0, "uncorrected_aggregate": 2}})
    ['PCIe Gen1 of Gen5', 'PCIe x8 of x16', 'ECC: 2 uncorrected (aggregate)']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.catalog.alerts import ALERTS, Alert, defaults

OK, WARN, BAD, IDLE = "ok", "warn", "bad", "idle"


@dataclass(frozen=True)
class Range:
    """Where a figure turns from ok to warn to bad (``above``: higher is worse).

    + warn: the first value that warns
    + bad: the first value that is bad (None: never)
    + why: where the threshold comes from, in a few words
    + ceiling: where lower is worse, a value above which it warns too (None: none)
    + loaded: judged only under load (``idle`` otherwise)

    Example:
        >>> Range(80, 85, "").judge(84.9), Range(60, 30, "", above=False, ceiling=95).judge(99)
        ('warn', 'warn')
    """

    warn: float
    bad: float | None
    why: str
    above: bool = True
    ceiling: float | None = None
    loaded: bool = False

    def judge(self, value: float) -> str:
        """ok, warn or bad for one value."""
        if self.above:
            if self.bad is not None and value >= self.bad:
                return BAD
            return WARN if value >= self.warn else OK
        if self.ceiling is not None and value > self.ceiling:
            return WARN
        if self.bad is not None and value <= self.bad:
            return BAD
        return WARN if value <= self.warn else OK


def ranges(alerts: Mapping[str, Alert] = ALERTS) -> dict[str, Range]:
    """The healthy ranges of the alert catalogue (each alert's ``status``), by figure, a
    threshold's name read as its default.

    Example:
        >>> temperature = ranges()["temperature_c"]
        >>> temperature.warn, temperature.bad, temperature.why
        (80, 85, 'above 85 °C the card throttles')
    """
    values = defaults(alerts)

    def number(given: float | str) -> float:
        return values[given] if isinstance(given, str) else given

    found = {}
    for alert in alerts.values():
        status = alert.status
        if status is not None:
            bad = None if status.bad is None else number(status.bad)
            found[status.figure] = Range(
                number(status.warn), bad, status.why, status.above, status.ceiling, status.loaded
            )
    return found


#: The healthy ranges, by the figure's key in ``fleet status`` (from
#: :data:`fleet.catalog.alerts.ALERTS`).
RANGES: dict[str, Range] = ranges()

#: PCIe performance states in which a card may lower its link generation to save power
#: (it returns to its maximum under load): P8 and deeper.
IDLE_PSTATES = frozenset(f"P{n}" for n in range(8, 16))


def level(
    key: str, value: float | None, busy: bool = True, table: Mapping[str, Range] = RANGES
) -> str | None:
    """The level of one figure against :data:`RANGES` (None when the value is unknown).

    + key: a key of ``table``
    + value: the figure
    + busy: whether the server has load; a figure judged only under load (utilisation) is
      ``idle`` without
    + table: the ranges (:func:`ranges` of a catalogue)

    Example:
        >>> level("utilization_pct", 5, busy=False), level("utilization_pct", 5)
        ('idle', 'bad')
    """
    if value is None:
        return None
    judged = table[key]
    if judged.loaded and not busy:
        return IDLE
    return judged.judge(value)


def power_level(power_pct: float | None, utilization_pct: float | None) -> str | None:
    """Power at the card's limit is healthy under full load, and a warning without it.

    Example:
        >>> power_level(99, 100), power_level(99, 20), power_level(40, 0)
        ('ok', 'warn', 'ok')
    """
    if power_pct is None:
        return None
    loaded = RANGES["utilization_pct"].warn  # the healthy load: 60 %
    if power_pct >= RANGES["power_pct"].warn and (utilization_pct or 0) < loaded:
        return WARN
    return OK


def pcie_problems(gpu: dict[str, Any]) -> list[str]:
    """A link running below the card's maximum generation or width.

    A lower generation in an idle power state (P8 and deeper) is power saving, not a fault:
    the link returns to its maximum under load. A narrower link is always a fault (a card
    badly seated, a riser, a slot wired x8).

    Example:
        >>> pcie_problems({"pstate": "P8", "pcie": {"gen": 1, "gen_max": 4, "width": 16,
        ...     "width_max": 16}})
        []
    """
    pcie = gpu.get("pcie") or {}
    problems = []
    gen, gen_max = pcie.get("gen"), pcie.get("gen_max")
    fell_back = gen is not None and gen_max is not None and gen < gen_max
    if fell_back and gpu.get("pstate") not in IDLE_PSTATES:
        problems.append(f"PCIe Gen{gen} of Gen{gen_max}")
    width, width_max = pcie.get("width"), pcie.get("width_max")
    if width is not None and width_max is not None and width < width_max:
        problems.append(f"PCIe x{width} of x{width_max}")
    return problems


def ecc_problems(gpu: dict[str, Any]) -> list[str]:
    """Uncorrected ECC errors, since the driver loaded (volatile) or ever (aggregate).

    Corrected errors are the ECC doing its job and are not a fault here; ``fleet status``
    shows them.

    Example:
        >>> ecc_problems({"ecc": {"uncorrected_volatile": 1, "uncorrected_aggregate": 1}})
        ['ECC: 1 uncorrected (volatile)', 'ECC: 1 uncorrected (aggregate)']
    """
    ecc = gpu.get("ecc") or {}
    return [
        f"ECC: {ecc[key]} uncorrected ({key.split('_')[1]})"
        for key in ("uncorrected_volatile", "uncorrected_aggregate")
        if ecc.get(key)
    ]


def gpu_problems(gpu: dict[str, Any]) -> list[str]:
    """Everything wrong with one card: PCIe fallback and uncorrected ECC errors.

    Example:
        >>> gpu_problems({"pcie": {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16},
        ...     "ecc": {"uncorrected_volatile": 0, "uncorrected_aggregate": 0}})
        []
    """
    return pcie_problems(gpu) + ecc_problems(gpu)


def pcie_text(gpu: dict[str, Any]) -> str:
    """``Gen5 x16`` with the maximum where the link runs below it (``Gen1/5 x8/16``).

    Example:
        >>> pcie_text({"pcie": {"gen": 1, "gen_max": 5, "width": 16, "width_max": 16}})
        'Gen1/5 x16'
    """
    pcie = gpu.get("pcie") or {}

    def part(prefix: str, now: int | None, top: int | None) -> str:
        if now is None:
            return f"{prefix}?"
        return f"{prefix}{now}" if top in (None, now) else f"{prefix}{now}/{top}"

    return (
        f"{part('Gen', pcie.get('gen'), pcie.get('gen_max'))} "
        f"{part('x', pcie.get('width'), pcie.get('width_max'))}"
    )
