"""Server figures from the fleet's Prometheus, through its HTTP API (``/api/v1/query``).

Series carry the labels the fleet's scrape configuration gives every vLLM target
(``host``, ``server``); TTFT p50 is over the last minute (``rate(…[1m])``). A Prometheus that
does not answer is reported and the figures come from the hosts instead; it never stops the
report.

GPU figures come from the GPU series (``vllm_fleet_gpu_*``: the textfile feeder, or DCGM's
recorded under the same names) where Prometheus has them, and each monitoring part's health
from its ``up`` series (an exporter Prometheus cannot scrape is down). A Prometheus bound to
loopback on a remote host is asked there, over ssh, through the request program.

Example:
    >>> QUERIES["ttft_p50_s"].startswith("histogram_quantile(0.5, sum by (host, server, le)")
    True
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from cli import remote
from cli.status.model import DOWN, UP, FleetStatus, GpuRow, MonitorRow, judge_gpus, judge_server

#: ServerRow field → PromQL, each answering one series per (host, server).
QUERIES = {
    "up": 'up{job="vllm"}',
    "running": "sum by (host, server) (vllm:num_requests_running)",
    "waiting": "sum by (host, server) (vllm:num_requests_waiting)",
    "kv_cache_pct": "100 * max by (host, server) (vllm:kv_cache_usage_perc)",
    "preemptions": "sum by (host, server) (vllm:num_preemptions_total)",
    "ttft_p50_s": "histogram_quantile(0.5, sum by (host, server, le) "
    "(rate(vllm:time_to_first_token_seconds_bucket[1m])))",
}


#: GpuRow field → PromQL, each answering one series per (host, gpu).
GPU_QUERIES = {
    "utilization_pct": "max by (host, gpu) (vllm_fleet_gpu_utilization_percent)",
    "memory_used_mib": "max by (host, gpu) (vllm_fleet_gpu_memory_used_bytes) / 1048576",
    "memory_total_mib": "max by (host, gpu) (vllm_fleet_gpu_memory_total_bytes) / 1048576",
    "temperature_c": "max by (host, gpu) (vllm_fleet_gpu_temperature_celsius)",
    "power_w": "max by (host, gpu) (vllm_fleet_gpu_power_watts)",
    "power_limit_w": "max by (host, gpu) (vllm_fleet_gpu_power_limit_watts)",
}
#: Fields kept as whole numbers (nvidia-smi reports them so).
_WHOLE = {"utilization_pct", "memory_used_mib", "memory_total_mib", "temperature_c"}
#: Every monitoring target's health: one series per (host, job).
MONITORING_UP = 'up{job=~"node|dcgm|vllm-router|prometheus"}'

Ask = Callable[[str, str], list[tuple[dict[str, str], float]]]


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or answered an error."""


def query(url: str, promql: str, timeout: float = 5.0) -> list[tuple[dict[str, str], float]]:
    """One instant query: ``[(labels, value)]``.

    + url: Prometheus' base URL (``http://10.0.0.5:9090``)
    + promql: the query
    """
    address = f"{url.rstrip('/')}{query_path(promql)}"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as reply:
            answer = json.load(reply)
    except urllib.error.HTTPError as error:
        try:
            answer = json.load(error)
        except ValueError:
            raise PrometheusError(f"{url}: {error}") from error
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise PrometheusError(f"{url}: {error}") from error
    return _rows(url, answer)


def query_path(promql: str) -> str:
    """The API path of an instant query.

    Example:
        >>> query_path("up")
        '/api/v1/query?query=up'
    """
    return "/api/v1/query?" + urllib.parse.urlencode({"query": promql})


def over_ssh(data: dict[str, Any], port: int, timeout: float = 15.0) -> Ask:
    """A query function that asks a Prometheus listening on loopback of a remote host, there
    (one ssh round trip a query, through the request program the deploy uploaded).

    + data: the monitoring host's connection data; port: Prometheus's port there
    """

    def ask(url: str, promql: str) -> list[tuple[dict[str, str], float]]:
        payload = {"port": port, "path": query_path(promql), "body": None, "auth": False,
                   "env_file": "/nonexistent"}  # fmt: skip
        try:
            result = remote.run(data, remote.REQUEST_COMMAND, json.dumps(payload), timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise PrometheusError(f"{url} (over ssh): {error}") from error
        try:
            reply = json.loads(result.stdout.strip().splitlines()[-1])
            answer = json.loads(reply["body"])
        except (ValueError, IndexError, KeyError, TypeError) as error:
            why = " ".join(result.stderr.split()) or "no answer"
            raise PrometheusError(f"{url} (over ssh): {why}") from error
        return _rows(url, answer)

    return ask


def _rows(url: str, answer: dict[str, Any]) -> list[tuple[dict[str, str], float]]:
    if answer.get("status") != "success":
        raise PrometheusError(f"{url}: {answer.get('error', 'query failed')}")
    rows = []
    for series in answer["data"]["result"]:
        try:
            rows.append((series["metric"], float(series["value"][1])))
        except (KeyError, ValueError, IndexError):
            continue
    return rows


def merge(status: FleetStatus, url: str, ask: Ask = query) -> FleetStatus:
    """Overwrite each server's figures with Prometheus' answers (NaN and missing left alone).

    A server whose ``up`` series is 0 is down (its scrape failed). ``ask(url, promql)`` is the
    query function (tests give one that answers from a real Prometheus or a recorded page).
    """
    rows = {(row.host, row.server): row for row in status.servers}
    for key, promql in QUERIES.items():
        for labels, value in ask(url, promql):
            row = rows.get((labels.get("host", ""), labels.get("server", "")))
            if row is None or value != value:  # NaN: no data in the window
                continue
            row.source = "prometheus"
            if key == "up":
                if value == 0:
                    row.health, row.state = DOWN, row.state + ", Prometheus: scrape failed"
                continue
            setattr(row, key, round(value, 4) if key != "kv_cache_pct" else round(value, 1))
            if key == "ttft_p50_s":
                row.ttft_window_s = 60
    for row in status.servers:
        judge_server(row)
    _merge_gpus(status, url, ask)
    _merge_monitoring(status, url, ask)
    status.prometheus = url
    return status


def _merge_gpus(status: FleetStatus, url: str, ask: Ask) -> None:
    """GPU figures from the GPU series; a GPU only Prometheus knows gets a row of its own."""
    rows = {(row.host, str(row.index)): row for row in status.gpus}
    hosts = {row.host for row in status.servers} | {row.host for row in status.monitoring}
    for key, promql in GPU_QUERIES.items():
        for labels, value in ask(url, promql):
            host, gpu = labels.get("host", ""), labels.get("gpu", "")
            if value != value or (hosts and host not in hosts):
                continue
            row = rows.get((host, gpu))
            if row is None:
                row = GpuRow(host=host, index=int(gpu) if gpu.isdigit() else None)
                rows[(host, gpu)] = row
                status.gpus.append(row)
            row.source = "prometheus"
            setattr(row, key, round(value) if key in _WHOLE else round(value, 1))
    for row in status.gpus:
        if row.source != "prometheus":
            continue
        if row.memory_used_mib is not None and row.memory_total_mib:
            row.memory_pct = round(100.0 * row.memory_used_mib / row.memory_total_mib, 1)
        if row.power_w is not None and row.power_limit_w:
            row.power_pct = round(100.0 * row.power_w / row.power_limit_w, 1)
    judge_gpus(status.gpus, {row.host for row in status.servers if row.running})


def _merge_monitoring(status: FleetStatus, url: str, ask: Ask) -> None:
    """Each monitoring part's health from its ``up`` series: 0 (the scrape failed) is down."""
    rows = {(row.host, row.part): row for row in status.monitoring}
    for labels, value in ask(url, MONITORING_UP):
        key = (labels.get("host", ""), labels.get("job", ""))
        row = rows.get(key)
        if row is None:
            row = MonitorRow(key[0], key[1], UP, "scraped by Prometheus")
            rows[key] = row
            status.monitoring.append(row)
        row.source = "prometheus"
        if value == 0:
            row.health = DOWN
            row.state += ", Prometheus: scrape failed"
