"""``fleet bench`` against a server whose timing the test controls: its step report (errors,
throughput, server-side figures, goodput), the command's files and tables, the tunnel.

How each request is timed is :mod:`loadgen`'s, tested in tests/unit/loadgen/.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import pytest

from cli.bench import report
from cli.bench.command import add_parser, resolve_target
from cli.bench.tunnel import free_port
from cli.main import main
from loadgen import stats
from loadgen.runner import Step, StepRun
from tests.support.fakeserver import FakeServer
from tests.support.loadsteps import TOLERANCE, run_steps


@pytest.fixture(scope="module")
def server():
    with FakeServer() as fake:
        yield fake


def test_step_report_counts_errors_and_excludes_them_from_timings(server) -> None:
    runs = run_steps(server.url, "ttft=0.01,chunks=4", [Step(concurrency=2, requests=4)])
    bad = run_steps(server.url, "status=500", [Step(concurrency=2, requests=3)])
    merged = StepRun(runs[0].step, runs[0].results + bad[0].results, [], runs[0].start,
                     runs[0].end)
    figures = report.step_report(merged)
    assert figures["errors"] == {"http_500": 3}
    assert figures["ok"] == 4 and figures["failed"] == 3
    assert figures["ttft_ms"]["count"] == 4


def test_step_report_leaves_out_warmup_requests(server) -> None:
    runs = run_steps(server.url, "chunks=2", [Step(concurrency=2, requests=5, warmup=3)])
    assert report.step_report(runs[0])["requests"] == 5


def test_throughput_uses_the_measured_window(server) -> None:
    runs = run_steps(server.url, "ttft=0.1,chunks=5,tokens_per_chunk=2",
                     [Step(concurrency=2, requests=4)])
    figures = report.step_report(runs[0])
    assert figures["output_tokens"] == 4 * 10
    assert figures["output_tokens_per_s"] == pytest.approx(40 / runs[0].seconds)
    assert figures["requests_per_s"] == pytest.approx(4 / runs[0].seconds)


def test_server_metrics_are_differenced_per_step(server) -> None:
    runs = run_steps(server.url, "ttft=0.12,itl=0.05,chunks=6",
                     [Step(concurrency=2, requests=4)])
    figures = report.step_report(runs[0])
    assert figures["server"]["ttft"]["count"] == 4
    assert figures["server"]["ttft"]["mean"] == pytest.approx(0.12, abs=TOLERANCE)
    assert 0.1 <= figures["server"]["ttft"]["p50"] <= 0.25  # inside the (0.1, 0.25] bucket
    assert "preemptions" in figures["server"]
    assert figures["server_gauges"]["kv_cache_usage"]["max"] == pytest.approx(0.2)


def test_goodput_in_a_step_report(server) -> None:
    runs = run_steps(server.url, "ttft=0.1,itl=0.01,chunks=3", [Step(concurrency=1, requests=2)])
    tight = report.step_report(runs[0], stats.parse_slo("ttft=50ms"))
    loose = report.step_report(runs[0], stats.parse_slo("ttft=1s,tpot=100ms"))
    assert tight["goodput"]["good"] == 0
    assert loose["goodput"]["good"] == 2


# ------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def cli_run(server, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("bench")
    os.environ["FLEET_TEST_BENCH_KEY"] = "bench-secret-1f2e"
    try:
        code = main([
            "bench", "--url", server.url, "--model", "ttft=0.02,itl=0.005", "--concurrency",
            "1..4", "--requests", "6", "--output-len", "8", "--slo", "ttft=500ms,tpot=50ms",
            "--out", str(out), "--no-progress", "--api-key-env", "FLEET_TEST_BENCH_KEY",
            "--sample-interval", "0.05",
        ])
    finally:
        del os.environ["FLEET_TEST_BENCH_KEY"]
    return code, out


def test_cli_writes_json_csv_and_png(cli_run) -> None:
    code, out = cli_run
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    assert [s["load"] for s in data["steps"]] == [1, 2, 4]
    assert all(s["ok"] == 6 for s in data["steps"])
    assert data["steps"][0]["ttft_ms"]["p99"] > 0
    assert "goodput" in data["steps"][0]
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [r["load"] for r in rows] == ["1", "2", "4"]
    assert float(rows[0]["tpot_p50_ms"]) > 0
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_never_writes_the_api_key(cli_run, server) -> None:
    _, out = cli_run
    assert "bench-secret-1f2e" not in (out / "bench.json").read_text()
    assert json.loads((out / "bench.json").read_text())["target"]["api_key"] == "set"
    assert "Bearer bench-secret-1f2e" in server.authorizations


def test_cli_prints_a_summary_table(server, tmp_path: Path, capsys) -> None:
    code = main(["bench", "--url", server.url, "--model", "chunks=2", "--concurrency", "1",
                 "--requests", "2", "--out", str(tmp_path), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "TTFT p50" in printed and "knee: not reached" in printed
    assert "no GPU sampling" in printed


def test_cli_fails_when_every_request_fails(tmp_path: Path) -> None:
    code = main(["bench", "--url", f"http://127.0.0.1:{free_port()}", "--model", "x",
                 "--concurrency", "1", "--requests", "2", "--out", str(tmp_path),
                 "--no-progress", "--prompts", str(_jsonl(tmp_path))])
    assert code == 1
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["steps"][0]["errors"] == {"connection_refused": 2}


def _jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "hello"}\n')
    return path


FLEET = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  m: {{url: "http://127.0.0.1:1/m.tar.gz", sha256: "{sha}"}}
hosts:
  box:
    address: 127.0.0.1
    servers:
      chat:
        model: m
        port: {port}
        served_model_name: "ttft=0.01,chunks=3"
        api_key: {{env: FLEET_TEST_FLEET_KEY}}
"""


def test_cli_reaches_a_fleet_server_with_its_secret(tmp_path: Path, monkeypatch) -> None:
    with FakeServer(api_key="fleet-key-9") as fake:
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(FLEET.format(sha="a" * 64, port=fake.port))
        monkeypatch.setenv("FLEET_TEST_FLEET_KEY", "fleet-key-9")
        code = main(["bench", str(fleet), "--server", "box/chat", "--tunnel", "never",
                     "--concurrency", "1", "--requests", "2", "--out", str(tmp_path),
                     "--no-progress"])
    data = json.loads((tmp_path / "bench.json").read_text())
    assert code == 0, data
    assert data["steps"][0]["ok"] == 2
    assert data["target"]["name"] == "box/chat"
    assert "box is a cpu host: no GPU sampling" in data["notes"]
    assert "fleet-key-9" not in (tmp_path / "bench.json").read_text()


def test_cli_refuses_an_unknown_server(tmp_path: Path, capsys) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.format(sha="a" * 64, port=18399))
    assert main(["bench", str(fleet), "--server", "nope", "--no-progress"]) == 1
    assert "no server 'nope'" in capsys.readouterr().err


# ------------------------------------------------------------------ tunnel


def test_tunnel_uses_the_inventory_connection_data() -> None:
    from cli.bench.tunnel import forward_argv

    argv = forward_argv({"ssh_hostname": "127.0.0.1", "ssh_port": 2230, "ssh_user": "root",
                         "ssh_key": "/k", "ssh_known_hosts_file": "/kh"}, 40000, 18300)
    joined = " ".join(argv)
    assert argv[:2] == ["ssh", "-N"]
    assert "-p 2230" in joined and "-i /k" in joined and "UserKnownHostsFile=/kh" in joined
    assert "StrictHostKeyChecking=yes" in joined and "ExitOnForwardFailure=yes" in joined
    assert argv[-1] == "root@127.0.0.1"


def test_a_failed_tunnel_says_why() -> None:
    from cli.bench.tunnel import Tunnel, TunnelError

    tunnel = Tunnel({"ssh_hostname": "127.0.0.1", "ssh_port": free_port(), "ssh_user": "root"},
                    remote_port=18300)
    with pytest.raises(TunnelError, match="failed"):
        tunnel.open(timeout=10, attempts=1)
    assert tunnel.process is None


REACH_FLEET = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  m: {{url: "http://127.0.0.1:1/m.tar.gz", sha256: "{sha}"}}
hosts:
  box:
    address: 10.44.0.11
    servers:
      chat: {{model: m, port: 18000, host: "{bind}", args: {args}}}
"""


@pytest.mark.parametrize(("bind", "args", "url"), [
    ("127.0.0.2", "{}", "http://127.0.0.2:18000"),
    ("10.44.0.12", "{}", "http://10.44.0.12:18000"),
    ("0.0.0.0", "{}", "http://10.44.0.11:18000"),
])  # a TLS server (https, its CA and name): tests/unit/cli/test_bench_tls.py
def test_a_server_is_benched_where_it_listens(tmp_path: Path, bind: str, args: str,
                                               url: str) -> None:
    """``--tunnel never``: the server's bind address (the host's for every interface) and its
    scheme, from the plan's description (issue 23)."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(REACH_FLEET.format(sha="a" * 64, bind=bind, args=args))
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), str(fleet))
    parsed = parser.parse_args(["bench", str(fleet), "--server", "box/chat", "--tunnel", "never"])
    with resolve_target(parsed) as resolved:
        assert resolved.base_url == url
