"""``fleet status`` with a Prometheus: a real one (Debian's ``prometheus``, run here) scraping
the real vLLM CPU 0.32 ``/metrics`` page with the fleet's labels, queried through its HTTP API.

The page is served by a loopback HTTP server that adds two fast requests to the TTFT histogram
at every scrape, so ``rate(…[1m])`` has something to measure; a second target points at a
closed port (its ``up`` is 0: that server shows as down).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cli.bench.tunnel import free_port
from cli.status import prometheus
from cli.status.model import DOWN, UP, FleetStatus, ServerRow, judge_server
from tests.unit.cli.test_status import METRICS

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="Debian's prometheus package is not installed"
)

_BUCKET = re.compile(
    r"^(vllm:time_to_first_token_seconds_"
    r'(?:bucket\{.*le="([^"]+)".*\}|count\{.*\})) (\S+)$'
)


def page(scrapes: int) -> str:
    """The real page, with 2 more requests of TTFT ≤ 0.02 s for every earlier scrape."""
    lines = []
    for line in METRICS.splitlines():
        match = _BUCKET.match(line)
        if match and (
            match.group(2) is None or float(match.group(2).replace("+Inf", "inf")) >= 0.02
        ):
            line = f"{match.group(1)} {float(match.group(3)) + 2 * scrapes}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory) -> str:
    served = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page(served["n"]).encode()
            served["n"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    metrics = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    tmp = tmp_path_factory.mktemp("prometheus")
    closed = free_port()
    (tmp / "prometheus.yml").write_text(f"""\
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: ["127.0.0.1:{metrics.server_address[1]}"]
        labels: {{host: cpu-1, server: tiny, model: tiny}}
      - targets: ["127.0.0.1:{closed}"]
        labels: {{host: cpu-1, server: other, model: other}}
""")
    port = free_port()
    process = subprocess.Popen(
        ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                ready = prometheus.query(url, prometheus.QUERIES["ttft_p50_s"])
                if (
                    any(value == value for _, value in ready)
                    and len(prometheus.query(url, prometheus.QUERIES["up"])) == 2
                ):
                    break
            except prometheus.PrometheusError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus had no TTFT rate after 60 s")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        metrics.shutdown()


def rows() -> FleetStatus:
    """What the hosts said: both servers up, no figures yet."""
    servers = [ServerRow("cpu-1", name, name, port, UP, "active (running)")
               for name, port in (("tiny", 18000), ("other", 18001))]  # fmt: skip
    for row in servers:
        judge_server(row)
    return FleetStatus(servers, [], {}, time.time())


def test_server_figures_come_from_prometheus(prom: str) -> None:
    status = prometheus.merge(rows(), prom)
    tiny = status.servers[0]
    assert (tiny.source, tiny.running, tiny.waiting, tiny.kv_cache_pct) == ("prometheus", 0, 0, 0)
    assert tiny.preemptions == 0
    assert 0.01 < tiny.ttft_p50_s <= 0.02 and tiny.ttft_window_s == 60
    assert status.prometheus == prom


def test_a_target_prometheus_cannot_scrape_is_down(prom: str) -> None:
    other = prometheus.merge(rows(), prom).servers[1]
    assert other.health == DOWN and "Prometheus: scrape failed" in other.state


def test_unreachable_prometheus_is_an_error_not_a_crash() -> None:
    with pytest.raises(prometheus.PrometheusError, match=r"127\.0\.0\.1"):
        prometheus.merge(rows(), f"http://127.0.0.1:{free_port()}")
