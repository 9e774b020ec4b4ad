"""Server figures from the fleet's Prometheus, through its HTTP API (``/api/v1/query``).

Series carry the labels the fleet's scrape configuration gives every vLLM target
(``host``, ``server``); TTFT p50 is over the last minute (``rate(…[1m])``). A Prometheus that
does not answer is reported and the figures come from the hosts instead; it never stops the
report.

Example:
    >>> QUERIES["ttft_p50_s"].startswith("histogram_quantile(0.5, sum by (host, server, le)")
    True
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from cli.status.model import DOWN, UP, FleetStatus, judge_server

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


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or answered an error."""


def query(url: str, promql: str, timeout: float = 5.0) -> list[tuple[dict[str, str], float]]:
    """One instant query: ``[(labels, value)]``.

    + url: Prometheus' base URL (``http://10.0.0.5:9090``)
    + promql: the query
    """
    address = f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(address, timeout=timeout) as reply:
            answer = json.load(reply)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise PrometheusError(f"{url}: {error}") from error
    if answer.get("status") != "success":
        raise PrometheusError(f"{url}: {answer.get('error', 'query failed')}")
    rows = []
    for series in answer["data"]["result"]:
        try:
            rows.append((series["metric"], float(series["value"][1])))
        except (KeyError, ValueError, IndexError):
            continue
    return rows


def merge(status: FleetStatus, url: str, ask: Any = query) -> FleetStatus:
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
                if value == 0 and row.health == UP:
                    row.health, row.state = DOWN, row.state + ", Prometheus: scrape failed"
                continue
            setattr(row, key, round(value, 4) if key != "kv_cache_pct" else round(value, 1))
            if key == "ttft_p50_s":
                row.ttft_window_s = 60
    for row in status.servers:
        judge_server(row)
    status.prometheus = url
    return status
