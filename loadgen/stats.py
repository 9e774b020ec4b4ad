"""Statistics of a benchmark step: percentiles, summaries, SLOs, goodput and the knee.

Everything here is pure: lists of numbers in, numbers out. Latencies are in seconds inside the
code and in milliseconds in reports.

Example:
    >>> summarize([0.1, 0.2, 0.3, 0.4])["p50"]
    0.25
    >>> parse_slo("ttft=500ms,tpot=50ms")
    {'ttft': 0.5, 'tpot': 0.05}
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence

#: The percentiles reported for every metric.
PERCENTILES = (50, 90, 95, 99)
#: Metrics an SLO can name, and what each means.
SLO_METRICS = {
    "ttft": "time to first token",
    "tpot": "time per output token",
    "itl": "largest inter-token latency of the request",
    "e2e": "end-to-end latency",
}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|µs|ms|s)?\s*$")
_UNIT = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-3}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100) with linear interpolation, as numpy's default.

    + values: samples, in any order
    + q: percentile, 0 to 100

    Example:
        >>> percentile([1, 2, 3, 4], 50)
        2.5
        >>> percentile([10, 20, 30, 40, 50], 90)
        46.0
        >>> percentile([], 99) is None
        True
    """
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, mean, min, max and the :data:`PERCENTILES` of ``values`` (None when empty).

    Example:
        >>> s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
        >>> s["mean"], s["p50"], s["p99"], s["count"]
        (3.0, 3.0, 4.96, 5)
    """
    summary: dict[str, float | int | None] = {
        "count": len(values),
        "mean": sum(values) / len(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }
    for q in PERCENTILES:
        value = percentile(values, q)
        summary[f"p{q}"] = round(value, 12) if value is not None else None
    return summary


def parse_duration(text: str) -> float:
    """Seconds from ``"500ms"``, ``"0.5s"``, ``"250us"`` or a bare number (milliseconds).

    Example:
        >>> parse_duration("500ms"), parse_duration("2s"), parse_duration("50")
        (0.5, 2.0, 0.05)
    """
    match = _DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (like 500ms, 0.5s or 250us)")
    return float(match.group(1)) * _UNIT[match.group(2)]


def parse_slo(text: str) -> dict[str, float]:
    """SLOs from ``"ttft=500ms,tpot=50ms"``: metric → limit in seconds.

    Metrics: ``ttft``, ``tpot``, ``itl`` (the request's largest gap), ``e2e``.

    Example:
        >>> parse_slo("e2e=2s, itl=100ms")
        {'e2e': 2.0, 'itl': 0.1}
        >>> parse_slo("ttfb=1s")
        Traceback (most recent call last):
        ...
        ValueError: unknown SLO metric 'ttfb' (known: ttft, tpot, itl, e2e)
    """
    slo: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise ValueError(f"SLO {part!r} is not METRIC=DURATION (like ttft=500ms)")
        if key not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {key!r} (known: {', '.join(SLO_METRICS)})")
        slo[key] = parse_duration(value)
    return slo


def meets_slo(request: Mapping[str, float | None], slo: Mapping[str, float]) -> bool:
    """Whether one request's figures are all within the SLOs.

    A request with one output token has no TPOT; it meets any TPOT SLO (as in vLLM's bench).
    ``itl`` is checked against the request's largest inter-token gap.

    Example:
        >>> meets_slo({"ttft": 0.4, "tpot": 0.06, "e2e": 1.0}, {"ttft": 0.5})
        True
        >>> meets_slo({"ttft": 0.4, "tpot": 0.06, "e2e": 1.0}, {"ttft": 0.5, "tpot": 0.05})
        False
    """
    for key, limit in slo.items():
        value = request.get("itl_max" if key == "itl" else key)
        if value is not None and value > limit:
            return False
    return True


def goodput(
    requests: Iterable[Mapping[str, float | None]], slo: Mapping[str, float], seconds: float
) -> dict[str, float | int]:
    """Requests per second that met every SLO, and how many did.

    + requests: successful requests' figures (``ttft``, ``tpot``, ``itl_max``, ``e2e``)
    + slo: metric → limit in seconds (see :func:`parse_slo`)
    + seconds: the measured window

    Example:
        >>> reqs = [{"ttft": 0.1, "tpot": 0.01}, {"ttft": 0.9, "tpot": 0.01}]
        >>> goodput(reqs, {"ttft": 0.5}, seconds=2.0)
        {'good': 1, 'total': 2, 'fraction': 0.5, 'requests_per_s': 0.5}
    """
    items = list(requests)
    good = sum(1 for r in items if meets_slo(r, slo))
    return {
        "good": good,
        "total": len(items),
        "fraction": good / len(items) if items else 0.0,
        "requests_per_s": good / seconds if seconds > 0 else 0.0,
    }


def find_knee(
    loads: Sequence[float], throughput: Sequence[float | None], latency: Sequence[float | None]
) -> float | None:
    """The load after which P99 latency grows faster than throughput, or None if it never does.

    For consecutive steps i → i+1 the relative growths are compared: the knee is the first
    step i where ``latency[i+1] / latency[i] > throughput[i+1] / throughput[i]``, i.e. adding
    load past it buys proportionally more waiting than work. Steps with a missing figure are
    skipped.

    + loads: the steps' concurrency (or request rate), in running order
    + throughput: output tokens per second at each step
    + latency: P99 end-to-end latency at each step

    Example:
        >>> find_knee([1, 2, 4, 8], [100, 195, 380, 400], [1.0, 1.02, 1.1, 2.0])
        4
        >>> find_knee([1, 2], [100, 200], [1.0, 1.0]) is None
        True
    """
    points = [
        (load, thr, lat)
        for load, thr, lat in zip(loads, throughput, latency, strict=True)
        if thr and lat
    ]
    for (load, thr, lat), (_, next_thr, next_lat) in itertools.pairwise(points):
        if next_lat / lat > next_thr / thr:
            return load
    return None
