"""The alert catalogue: every alert of the fleet's Prometheus as one record, with its thresholds
and the healthy range ``fleet status`` judges the same figure by.

One record per alert, read by everything that needs it: the rules file
(:func:`fleet.hostplan.monitoring.alert_rules`), ``fleet check``'s check of
``monitoring.thresholds`` and ``monitoring.alert_for_s``
(:func:`fleet.checks.monitoring.check_thresholds`), the healthy ranges of ``fleet status``
(:func:`fleet.judge.health.ranges`) and the docs test (``tests/unit/fleet/test_monitoring_docs.py``,
which holds docs/monitoring.md's table to it).
A new alert is one entry of :data:`ALERTS`. The numbers are the 4×4090 D field report's table
of healthy ranges (issue 14) where it gives one, vllm-fleet's own choices elsewhere (each
threshold says which).

Example:
    >>> alert = ALERTS["VllmKvCacheHigh"]
    >>> alert.expression({"kv_cache_usage_percent": 95}), alert.wait, alert.severity
    ('vllm:kv_cache_usage_perc * 100 > 95', '5m', 'warning')
    >>> THRESHOLDS["gpu_memory_percent"].default, ALERTS["GpuMemoryHigh"].status.figure
    (95, 'memory_pct')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from string import Template


@dataclass(frozen=True)
class Threshold:
    """An alert threshold the fleet file may override (``monitoring.thresholds``).

    + default: its value unless the fleet file gives one; low, high: the range accepted
    + unit: what the number counts; metric: the series it is compared with
    + source: where the default comes from
    """

    default: float
    low: float
    high: float
    unit: str
    metric: str
    source: str


@dataclass(frozen=True)
class Status:
    """The healthy range ``fleet status`` judges one figure by (:class:`fleet.judge.health.Range`).

    + figure: the figure's key in ``fleet status`` (a field of its server or GPU row)
    + warn: the first value that warns; bad: the first value that is bad (None: never). Either
      is a number or the name of a threshold of the catalogue, whose default it then is
    + why: where the range comes from, in a few words
    + above: higher is worse (else lower is worse)
    + ceiling: where lower is worse, a value above which it warns too (None: none)
    + loaded: judged only while the host serves requests (``idle`` otherwise)
    """

    figure: str
    warn: float | str
    bad: float | str | None
    why: str
    above: bool = True
    ceiling: float | None = None
    loaded: bool = False


@dataclass(frozen=True)
class Alert:
    """One alerting rule of the rules file (fleet-rules.yml), by the name it fires as.

    + expr: its PromQL expression, ``$name`` where threshold ``name``'s value goes
    + wait: its ``for`` as Prometheus writes it (``0m``: it fires at once); the fleet file's
      ``monitoring.alert_for_s`` overrides it
    + severity: ``critical`` or ``warning``; summary: its annotation (Prometheus template text)
    + source: why it fires, and where its numbers come from (docs/monitoring.md's table)
    + thresholds: the thresholds it owns, by the name ``monitoring.thresholds`` uses
    + status: the healthy range ``fleet status`` judges its figure by; None: status has none
    """

    expr: str
    wait: str
    severity: str
    summary: str
    source: str
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    status: Status | None = None

    def expression(self, values: Mapping[str, float]) -> str:
        """The expression with threshold values filled in (each as PromQL writes it).

        Example:
            >>> Alert("x > $t", "5m", "warning", "", "").expression({"t": 0.5})
            'x > 0.5'
        """
        return Template(self.expr).substitute({name: number(v) for name, v in values.items()})

    def named(self) -> list[str]:
        """The thresholds its expression names.

        Example:
            >>> Alert("x > $a and y < $b", "5m", "warning", "", "").named()
            ['a', 'b']
        """
        return Template(self.expr).get_identifiers()


def number(value: float) -> str:
    """A threshold as PromQL (and ``fleet check``'s messages) write it: ``95``, ``0.5``.

    Example:
        >>> number(95.0), number(0.5)
        ('95', '0.5')
    """
    return str(int(value)) if float(value).is_integer() else repr(float(value))


#: The 4×4090 D field report's table of healthy ranges (issue 14).
FIELD_REPORT = "field report (4×4090 D)"

#: The longest ``monitoring.alert_for_s`` accepted (a day).
MAX_ALERT_FOR_S = 86400

#: Every alert, in the order of the rules file.
ALERTS: dict[str, Alert] = {
    "VllmServerDown": Alert(
        expr='up{job="vllm"} == 0',
        wait="1m",
        severity="critical",
        summary="vLLM server {{ $labels.server }} on {{ $labels.host }} does not answer /metrics",
        source="vllm-fleet: the server does not answer `/metrics`",
    ),
    "VllmReadinessLost": Alert(
        expr="sum by (host, server) (vllm:num_requests_running + vllm:num_requests_waiting) > 0 "
        "unless on (host, server) "
        "sum by (host, server) (increase(vllm:request_success_total[5m])) > 0",
        wait="5m",
        severity="critical",
        summary="{{ $labels.server }} on {{ $labels.host }} has requests but finished none in "
        "5 min",
        source="vllm-fleet: requests in flight but none finished in 5 min (the engine answers "
        "`/metrics` but does not serve; readiness is a real completion, which Prometheus cannot "
        "send)",
    ),
    "VllmRestartsLooping": Alert(
        expr='changes(process_start_time_seconds{job="vllm"}[15m]) >= $restarts_per_15m',
        wait="0m",
        severity="critical",
        summary="{{ $labels.server }} on {{ $labels.host }} restarted {{ $value }} times in 15 min",
        source="vllm-fleet: the units restart always after 5 s; 3 restarts in 15 min is a loop",
        thresholds={
            "restarts_per_15m": Threshold(
                3,
                1,
                1000,
                "starts in 15 min",
                "process_start_time_seconds",
                "vllm-fleet: the units restart always (RestartSec 5 s); 3 starts in 15 min is a "
                "loop",
            )
        },
        status=Status("restarts", 1, 5, "restarts > 0: the server died; many: it is looping"),
    ),
    "VllmQueueWaiting": Alert(
        expr="vllm:num_requests_waiting > $queue_waiting_requests",
        wait="5m",
        severity="warning",
        summary="{{ $labels.server }} on {{ $labels.host }}: {{ $value }} requests waiting for "
        "5 min (not enough throughput)",
        source="field report: queue mostly 0; waiting > 0 for long means not enough throughput",
        thresholds={
            "queue_waiting_requests": Threshold(
                0,
                0,
                100000,
                "requests",
                "vllm:num_requests_waiting",
                f"{FIELD_REPORT}: queue mostly 0; waiting > 0 for long: not enough throughput",
            )
        },
        status=Status("waiting", 1, None, "waiting > 0 for long: not enough throughput"),
    ),
    "VllmPreemptions": Alert(
        expr="increase(vllm:num_preemptions_total[5m]) > $preemptions",
        wait="0m",
        severity="warning",
        summary="{{ $labels.server }} on {{ $labels.host }} preempted requests (not enough KV "
        "cache)",
        source="field report: preemptions 0; > 0 means not enough KV cache memory",
        thresholds={
            "preemptions": Threshold(
                0,
                0,
                100000,
                "preemptions in 5 min",
                "vllm:num_preemptions_total",
                f"{FIELD_REPORT}: preemptions 0; > 0: not enough KV cache memory",
            )
        },
        status=Status("preemptions", 1, None, "preemptions > 0: not enough KV cache memory"),
    ),
    "VllmKvCacheHigh": Alert(
        expr="vllm:kv_cache_usage_perc * 100 > $kv_cache_usage_percent",
        wait="5m",
        severity="warning",
        summary="{{ $labels.server }} on {{ $labels.host }}: KV cache {{ $value | humanize }} % "
        "full",
        source="vllm-fleet: a cache this full is one step from preemptions (vLLM's gauge: 1 = "
        "100 %)",
        thresholds={
            "kv_cache_usage_percent": Threshold(
                95,
                1,
                100,
                "%",
                "vllm:kv_cache_usage_perc",
                "vllm-fleet: a KV cache this full is one step from preemptions",
            )
        },
        status=Status("kv_cache_pct", 90, 98, "KV cache nearly full: requests queue, then preempt"),
    ),
    "ExporterDown": Alert(
        expr='up{job=~"node|dcgm|vllm-router"} == 0',
        wait="2m",
        severity="warning",
        summary="{{ $labels.job }} on {{ $labels.host }} does not answer",
        source="an unreachable exporter (or router) fires instead of silently missing",
    ),
    "FleetDriftFound": Alert(
        expr="vllm_fleet_drift_findings > $drift_findings",
        wait="0m",
        severity="warning",
        summary="fleet drift found {{ $value }} differences on {{ $labels.host }}",
        source="vllm-fleet: a host as deployed has no drift (see below)",
        thresholds={
            "drift_findings": Threshold(
                0,
                0,
                100000,
                "findings",
                "vllm_fleet_drift_findings",
                "vllm-fleet: fleet drift finds nothing on a host as deployed",
            )
        },
    ),
    "GpuMemoryHigh": Alert(
        expr="100 * vllm_fleet_gpu_memory_used_bytes / vllm_fleet_gpu_memory_total_bytes "
        "> $gpu_memory_percent",
        wait="5m",
        severity="critical",
        summary="GPU {{ $labels.gpu }} on {{ $labels.host }}: memory {{ $value | humanize }} % "
        "used",
        source="field report: above 95 % an OOM can come at any time",
        thresholds={
            "gpu_memory_percent": Threshold(
                95,
                1,
                100,
                "%",
                "vllm_fleet_gpu_memory_used_bytes",
                f"{FIELD_REPORT}: above 95 % an OOM can come at any time",
            )
        },
        status=Status(
            "memory_pct", 90, "gpu_memory_percent", "above 95 % of GPU memory: OOM at any time"
        ),
    ),
    "GpuTemperatureHigh": Alert(
        expr="vllm_fleet_gpu_temperature_celsius > $gpu_temperature_warning_celsius",
        wait="5m",
        severity="warning",
        summary="GPU {{ $labels.gpu }} on {{ $labels.host }} at {{ $value }} °C",
        source="field report: healthy below 80 °C",
        thresholds={
            "gpu_temperature_warning_celsius": Threshold(
                80,
                30,
                120,
                "°C",
                "vllm_fleet_gpu_temperature_celsius",
                f"{FIELD_REPORT}: healthy below 80 °C",
            )
        },
    ),
    "GpuTemperatureCritical": Alert(
        expr="vllm_fleet_gpu_temperature_celsius > $gpu_temperature_critical_celsius",
        wait="1m",
        severity="critical",
        summary="GPU {{ $labels.gpu }} on {{ $labels.host }} at {{ $value }} °C: it throttles",
        source="field report: above 85 °C the card throttles",
        thresholds={
            "gpu_temperature_critical_celsius": Threshold(
                85,
                30,
                120,
                "°C",
                "vllm_fleet_gpu_temperature_celsius",
                f"{FIELD_REPORT}: above 85 °C the card throttles",
            )
        },
        status=Status(
            "temperature_c",
            "gpu_temperature_warning_celsius",
            "gpu_temperature_critical_celsius",
            "above 85 °C the card throttles",
        ),
    ),
    "GpuUnderused": Alert(
        expr="avg_over_time(vllm_fleet_gpu_utilization_percent[10m]) "
        "< $gpu_utilization_low_percent and "
        "on (host) (sum by (host) (vllm:num_requests_running) > 0)",
        wait="10m",
        severity="warning",
        summary="GPU {{ $labels.gpu }} on {{ $labels.host }} {{ $value }} % busy while serving: "
        "the bottleneck is elsewhere",
        source="field report: below 30 % (under load) the bottleneck is elsewhere; an idle host "
        "does not fire",
        thresholds={
            "gpu_utilization_low_percent": Threshold(
                30,
                0,
                100,
                "%",
                "vllm_fleet_gpu_utilization_percent",
                f"{FIELD_REPORT}: below 30 % under load, the bottleneck is elsewhere",
            )
        },
        status=Status(
            "utilization_pct",
            "gpu_utilization_healthy_percent",
            "gpu_utilization_low_percent",
            "under load: 60–95 % healthy, below 30 % the bottleneck is elsewhere",
            above=False,
            ceiling=95,
            loaded=True,
        ),
    ),
    "GpuPowerAtLimit": Alert(
        expr="100 * vllm_fleet_gpu_power_watts / vllm_fleet_gpu_power_limit_watts "
        ">= $gpu_power_limit_percent and on (host, gpu) "
        "vllm_fleet_gpu_utilization_percent < $gpu_utilization_healthy_percent",
        wait="10m",
        severity="warning",
        summary="GPU {{ $labels.gpu }} on {{ $labels.host }} at its power limit without full load",
        source="field report: power at TDP only under full load (healthy load 60–95 %)",
        thresholds={
            "gpu_power_limit_percent": Threshold(
                98,
                50,
                100,
                "% of the power limit",
                "vllm_fleet_gpu_power_watts",
                f"{FIELD_REPORT}: at TDP only under full load",
            ),
            "gpu_utilization_healthy_percent": Threshold(
                60,
                0,
                100,
                "%",
                "vllm_fleet_gpu_utilization_percent",
                f"{FIELD_REPORT}: healthy 60–95 % (power at TDP only under full load)",
            ),
        },
        status=Status(
            "power_pct", "gpu_power_limit_percent", None, "power at its limit only under full load"
        ),
    ),
}


def thresholds_of(alerts: Mapping[str, Alert]) -> dict[str, Threshold]:
    """Every threshold of a catalogue, by name, in the order of its alerts.

    Example:
        >>> list(thresholds_of({"A": Alert("x > $t", "5m", "warning", "", "",
        ...     {"t": Threshold(1, 0, 2, "", "x", "")})}))
        ['t']
    """
    return {name: entry for alert in alerts.values() for name, entry in alert.thresholds.items()}


#: Every threshold, by the name the fleet file's ``monitoring.thresholds`` uses.
THRESHOLDS: dict[str, Threshold] = thresholds_of(ALERTS)


def defaults(alerts: Mapping[str, Alert] = ALERTS) -> dict[str, float]:
    """Every threshold's default value, by name.

    Example:
        >>> defaults()["gpu_temperature_critical_celsius"]
        85
    """
    return {name: entry.default for name, entry in thresholds_of(alerts).items()}
