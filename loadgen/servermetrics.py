"""The server's own view: vLLM's Prometheus ``/metrics``, scraped before and after each step.

Counters and histograms are differenced between the two scrapes, so the figures cover exactly
the step (other traffic to the server during the step would be counted too). Gauges (KV cache
usage, running and waiting requests) are sampled during the step. Percentiles from a histogram
are estimated as Prometheus' ``histogram_quantile`` does: linearly inside the bucket.

Example:
    >>> text = '''# TYPE vllm:num_preemptions_total counter
    ... vllm:num_preemptions_total{engine="0",model_name="tiny"} 3.0
    ... vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25'''
    >>> m = parse_prometheus(text)
    >>> m.value("vllm:num_preemptions_total"), m.value("vllm:kv_cache_usage_perc")
    (3.0, 0.25)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

#: Histograms reported per step: our name → vLLM's metric family.
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
}
#: Counters reported per step (first name found wins: vLLM renamed some).
COUNTERS = {
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "requests_finished": ("vllm:request_success_total",),
}
#: Gauges sampled during a step.
GAUGES = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                       "vllm:cpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
}


@dataclass
class Scrape:
    """One parsed ``/metrics`` page: samples by metric name, as ``(labels, value)`` pairs.

    Example:
        >>> Scrape({"a": [({}, 1.0), ({}, 2.0)]}).value("a")
        3.0
    """

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def _rows(self, name: str, model: str | None) -> list[tuple[dict[str, str], float]]:
        """The samples of ``name``: one model's when the page labels that model, else all."""
        rows = self.samples.get(name, [])
        if model is not None and any(labels.get("model_name") == model for labels, _ in rows):
            rows = [(labels, v) for labels, v in rows if labels.get("model_name") == model]
        return rows

    def value(self, name: str, model: str | None = None) -> float | None:
        """The sum over all label sets of ``name`` (one model's only, if given), or None."""
        if name not in self.samples:
            return None
        return sum(v for _, v in self._rows(name, model))

    def first(self, names: tuple[str, ...], model: str | None = None) -> float | None:
        """The value of the first of ``names`` that the page has."""
        for name in names:
            value = self.value(name, model)
            if value is not None:
                return value
        return None

    def buckets(self, family: str, model: str | None = None) -> list[tuple[float, float]]:
        """A histogram's cumulative buckets ``[(upper bound, count), …]``, summed over labels."""
        totals: dict[float, float] = {}
        for labels, value in self._rows(f"{family}_bucket", model):
            bound = float(labels.get("le", "inf").replace("+Inf", "inf"))
            totals[bound] = totals.get(bound, 0.0) + value
        return sorted(totals.items())


def parse_prometheus(text: str) -> Scrape:
    """Parse Prometheus' text exposition format (comments and malformed lines are skipped).

    Example:
        >>> s = parse_prometheus('h_bucket{le="0.1"} 2\\nh_bucket{le="+Inf"} 5\\n')
        >>> s.buckets("h")
        [(0.1, 2.0), (inf, 5.0)]
    """
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line.strip())
        if not match:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), number))
    return Scrape(samples)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Estimate the ``q`` quantile (0–1) from cumulative buckets, as Prometheus does.

    Example:
        >>> histogram_quantile(0.5, [(1.0, 0), (2.0, 10), (float("inf"), 10)])
        1.5
        >>> histogram_quantile(0.5, [(float("inf"), 0)]) is None
        True
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return previous_bound
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count
            )
        previous_bound, previous_count = bound, count
    return previous_bound


def _delta_buckets(
    before: Scrape, after: Scrape, family: str, model: str | None
) -> list[tuple[float, float]]:
    old = dict(before.buckets(family, model))
    return [(bound, count - old.get(bound, 0.0)) for bound, count in after.buckets(family, model)]


def step_figures(before: Scrape, after: Scrape, model: str | None = None) -> dict[str, Any]:
    """Server-side figures for the step between two scrapes.

    Histograms give ``count``, ``mean``, ``p50``, ``p90``, ``p99`` (seconds); counters their
    increase. Absent metrics are left out.

    Example:
        >>> b = parse_prometheus("vllm:num_preemptions_total 1\\n")
        >>> a = parse_prometheus("vllm:num_preemptions_total 4\\n")
        >>> step_figures(b, a)
        {'preemptions': 3.0}
    """
    figures: dict[str, Any] = {}
    for key, family in HISTOGRAMS.items():
        count_after = after.value(f"{family}_count", model)
        if count_after is None:
            continue
        count = count_after - (before.value(f"{family}_count", model) or 0.0)
        total = (after.value(f"{family}_sum", model) or 0.0) - (
            before.value(f"{family}_sum", model) or 0.0
        )
        buckets = _delta_buckets(before, after, family, model)
        figures[key] = {
            "count": count,
            "mean": total / count if count > 0 else None,
            **{f"p{q}": histogram_quantile(q / 100, buckets) for q in (50, 90, 99)},
        }
    for key, names in COUNTERS.items():
        value = after.first(names, model)
        if value is not None:
            figures[key] = value - (before.first(names, model) or 0.0)
    return figures


def gauge_values(scrape: Scrape, model: str | None = None) -> dict[str, float]:
    """The sampled gauges of one scrape (KV cache usage as a fraction, request counts).

    Example:
        >>> gauge_values(parse_prometheus("vllm:num_requests_running 2\\n"))
        {'running': 2.0}
    """
    values = {}
    for key, names in GAUGES.items():
        value = scrape.first(names, model)
        if value is not None:
            values[key] = value
    return values


def gauge_summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean and max of each sampled gauge over a step.

    Example:
        >>> gauge_summary([{"kv_cache_usage": 0.2}, {"kv_cache_usage": 0.4}])
        {'kv_cache_usage': {'mean': 0.30000000000000004, 'max': 0.4, 'samples': 2}}
    """
    keys = sorted({key for sample in samples for key in sample})
    summary = {}
    for key in keys:
        values = [sample[key] for sample in samples if key in sample]
        summary[key] = {"mean": sum(values) / len(values), "max": max(values),
                        "samples": len(values)}
    return summary
