"""Tests for ``fleet bench`` against a server whose timing the test controls.

The fake server (:mod:`cli.bench.fakeserver`) waits a known time before the first token and
between tokens, so the reported TTFT, ITL, TPOT and E2E must match those delays within a small
tolerance (the machine is small and shared: the tolerance is a few tens of milliseconds on
delays of 100–200 ms, never a ratio that would hide a wrong definition).
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import statistics
import sys
from pathlib import Path

import pytest

from cli.bench import report, stats
from cli.bench.client import RequestResult
from cli.bench.prompts import PromptError, load_jsonl, synthetic_prompts
from cli.bench.runner import Options, Runner, Step, StepRun, Target, server_tokenizer
from cli.bench.tunnel import free_port
from cli.main import main
from tests.support.fakeserver import FakeServer

TTFT = 0.15
ITL = 0.04
CHUNKS = 6
#: Allowed timing error (scheduling on a busy 2-core machine): far below what a wrong
#: definition would give (a TTFT from the role chunk is ~0, a per-chunk TPOT with 3 tokens a
#: chunk is 3 × too large).
TOLERANCE = 0.04
GAP_TOLERANCE = 0.012
#: How much later than scripted a moment may be seen on a loaded machine (a sleep only
#: overshoots; a run beside other jobs saw the last token 0.1 s late): still below what a wrong
#: definition gives (a TTFT taken at the last token is 0.2 s late, one at the role chunk early).
LATE = 0.15


def seen_at(measured: float, scripted: float) -> bool:
    """A moment measured no earlier than scripted (less the timing error), and not much later.

    Example:
        >>> seen_at(0.19, 0.15), seen_at(0.05, 0.15), seen_at(0.40, 0.15)
        (True, False, False)
    """
    return scripted - TOLERANCE <= measured <= scripted + LATE


@pytest.fixture(scope="module")
def server():
    with FakeServer() as fake:
        yield fake


def run_steps(url: str, model: str, steps: list[Step], api: str = "completions",
              options: Options | None = None, key: str | None = None) -> list[StepRun]:
    target = Target(url, model, api, api_key=key)
    prompts = synthetic_prompts(4, input_len=8, output_len=CHUNKS)
    options = options or Options(timeout=10, sample_interval=0.05)
    return asyncio.run(Runner(target, prompts, options).run(steps))


def one(url: str, model: str, api: str = "completions", timeout: float = 10) -> RequestResult:
    runs = run_steps(url, model, [Step(concurrency=1, requests=1)], api,
                     Options(timeout=timeout, scrape_metrics=False))
    return runs[0].results[0]


SCRIPT = f"ttft={TTFT},itl={ITL},chunks={CHUNKS}"


@pytest.fixture(scope="module")
def timed(server) -> RequestResult:
    return one(server.url, SCRIPT)


def test_ttft_is_the_delay_before_the_first_token(timed: RequestResult) -> None:
    assert timed.ok, timed.detail
    assert seen_at(timed.ttft, TTFT), timed.ttft


def test_itl_is_the_gap_between_token_chunks(timed: RequestResult) -> None:
    assert len(timed.itl) == CHUNKS - 1
    assert sum(timed.itl) / len(timed.itl) == pytest.approx(ITL, abs=GAP_TOLERANCE)


def test_e2e_ends_at_the_last_token(timed: RequestResult) -> None:
    assert seen_at(timed.e2e, TTFT + (CHUNKS - 1) * ITL), timed.e2e


def test_tpot_divides_by_output_tokens_minus_one(timed: RequestResult) -> None:
    assert timed.output_tokens == CHUNKS
    assert timed.tpot == pytest.approx(ITL, abs=GAP_TOLERANCE)


def test_output_tokens_come_from_usage_not_chunks(server) -> None:
    result = one(server.url, f"{SCRIPT},tokens_per_chunk=3")
    assert result.chunks == CHUNKS
    assert result.output_tokens == 3 * CHUNKS
    assert result.usage_reported
    expected = (CHUNKS - 1) * ITL / (3 * CHUNKS - 1)
    assert result.tpot == pytest.approx(expected, abs=GAP_TOLERANCE / 4)


def test_without_usage_chunks_are_counted_and_flagged(server) -> None:
    result = one(server.url, f"{SCRIPT},usage=0,tokens_per_chunk=3")
    assert result.ok and not result.usage_reported
    assert result.output_tokens == CHUNKS


def test_role_only_and_empty_chunks_do_not_count(server) -> None:
    result = one(server.url, f"{SCRIPT},role_chunk=1,empty_chunks=1", api="chat")
    assert result.ok, result.detail
    assert result.chunks == CHUNKS
    assert seen_at(result.ttft, TTFT), result.ttft
    assert len(result.itl) == CHUNKS - 1
    assert min(result.itl) > ITL / 2


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_chunks_count_only_when_they_carry_a_token(server, api: str) -> None:
    """vLLM streams a chunk with an empty text for a token that is part of a character not
    complete yet: it is a token (TTFT and ITL see it); a chunk with no choice or an empty
    delta is not."""
    result = one(server.url, f"{SCRIPT},blank_tokens=1,empty_chunks=1", api=api)
    assert result.ok, result.detail
    assert result.chunks == CHUNKS
    assert seen_at(result.ttft, TTFT), result.ttft
    assert len(result.itl) == CHUNKS - 1
    assert statistics.mean(result.itl) == pytest.approx(ITL, abs=GAP_TOLERANCE)


def test_chat_request_is_timed_like_completions(server) -> None:
    result = one(server.url, SCRIPT, api="chat")
    assert seen_at(result.ttft, TTFT), result.ttft
    assert result.tpot == pytest.approx(ITL, abs=GAP_TOLERANCE)


@pytest.mark.parametrize(
    ("model", "kind"),
    [
        ("status=500", "http_500"),
        ("status=429", "http_429"),
        ("hang=3", "timeout"),
        ("chunks=3,error_after=1", "stream_error"),
        ("chunks=3,drop_after=1", "disconnected"),
    ],
)
def test_errors_are_counted_by_kind(server, model: str, kind: str) -> None:
    result = one(server.url, model, timeout=1.0)
    assert not result.ok
    assert result.error == kind
    assert result.tpot is None and result.e2e is None


def test_connection_refused_is_its_own_kind() -> None:
    result = one(f"http://127.0.0.1:{free_port()}", "x")
    assert result.error == "connection_refused"


def test_step_report_counts_errors_and_excludes_them_from_timings(server) -> None:
    runs = run_steps(server.url, "ttft=0.01,chunks=4", [Step(concurrency=2, requests=4)])
    bad = run_steps(server.url, "status=500", [Step(concurrency=2, requests=3)])
    merged = StepRun(runs[0].step, runs[0].results + bad[0].results, [], runs[0].start,
                     runs[0].end)
    figures = report.step_report(merged)
    assert figures["errors"] == {"http_500": 3}
    assert figures["ok"] == 4 and figures["failed"] == 3
    assert figures["ttft_ms"]["count"] == 4


def test_warmup_requests_are_excluded(server) -> None:
    runs = run_steps(server.url, "chunks=2", [Step(concurrency=2, requests=5, warmup=3)])
    assert len(runs[0].results) == 5 and len(runs[0].warmup) == 3
    assert all(r.warmup for r in runs[0].warmup) and not any(r.warmup for r in runs[0].results)
    assert report.step_report(runs[0])["requests"] == 5


def test_concurrency_is_held(server) -> None:
    runs = run_steps(server.url, "ttft=0.2,chunks=1", [Step(concurrency=4, requests=8)])
    starts = sorted(r.start for r in runs[0].results)
    assert starts[3] - starts[0] < 0.1  # four at once
    assert starts[4] - starts[0] >= 0.18  # the fifth waits for a free slot
    assert runs[0].seconds == pytest.approx(0.4, abs=0.1)


def test_rate_mode_sends_poisson_arrivals(server) -> None:
    runs = run_steps(server.url, "chunks=1", [Step(rate=40, requests=40)],
                     options=Options(timeout=10, seed=3, scrape_metrics=False))
    results = runs[0].results
    assert len(results) == 40 and all(r.ok for r in results)
    starts = sorted(r.start for r in results)
    mean_gap = (starts[-1] - starts[0]) / (len(starts) - 1)
    assert mean_gap == pytest.approx(1 / 40, rel=0.5)


def test_duration_mode_stops_starting_requests(server) -> None:
    runs = run_steps(server.url, "ttft=0.05,chunks=1",
                     [Step(concurrency=1, duration=0.5)])
    assert 5 <= len(runs[0].results) <= 11


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


def test_api_key_is_sent_as_bearer_token() -> None:
    with FakeServer(api_key="k-123") as fake:
        good = run_steps(fake.url, "chunks=2", [Step(concurrency=1, requests=1)], key="k-123")
        bad = run_steps(fake.url, "chunks=2", [Step(concurrency=1, requests=1)])
    assert good[0].results[0].ok
    assert bad[0].results[0].error == "http_401"


# ------------------------------------------------------------------ statistics


def test_percentiles_on_known_samples() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == pytest.approx(50.5)
    assert stats.percentile(values, 90) == pytest.approx(90.1)
    assert stats.percentile(values, 95) == pytest.approx(95.05)
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.summarize(values)["mean"] == pytest.approx(50.5)


def test_percentile_of_one_sample_is_that_sample() -> None:
    assert stats.percentile([0.25], 99) == 0.25


@pytest.mark.parametrize(
    ("throughput", "latency", "knee"),
    [
        ([100, 200, 400, 500, 510], [1.0, 1.0, 1.1, 2.0, 4.0], 4),  # 4 → 8: ×1.25 work, ×1.8 wait
        ([100, 200, 400, 800, 1600], [1.0, 1.0, 1.0, 1.0, 1.0], None),  # linear: no knee
        ([100, 105, 110, 115, 120], [1.0, 2.0, 4.0, 8.0, 16.0], 1),  # saturated from the start
    ],
)
def test_knee_on_synthetic_steps(throughput, latency, knee) -> None:
    assert stats.find_knee([1, 2, 4, 8, 16], throughput, latency) == knee


def test_goodput_counts_requests_within_every_slo() -> None:
    slo = stats.parse_slo("ttft=500ms,tpot=50ms")
    requests = [
        {"ttft": 0.2, "tpot": 0.04},  # good
        {"ttft": 0.6, "tpot": 0.04},  # TTFT too long
        {"ttft": 0.2, "tpot": 0.06},  # TPOT too long
        {"ttft": 0.5, "tpot": None},  # one token, on the TTFT limit: good
    ]
    assert stats.goodput(requests, slo, seconds=4.0) == {
        "good": 2, "total": 4, "fraction": 0.5, "requests_per_s": 0.5,
    }


def test_goodput_in_a_step_report(server) -> None:
    runs = run_steps(server.url, "ttft=0.1,itl=0.01,chunks=3", [Step(concurrency=1, requests=2)])
    tight = report.step_report(runs[0], stats.parse_slo("ttft=50ms"))
    loose = report.step_report(runs[0], stats.parse_slo("ttft=1s,tpot=100ms"))
    assert tight["goodput"]["good"] == 0
    assert loose["goodput"]["good"] == 2


@pytest.mark.parametrize("text", ["ttft", "ttft=fast", "speed=1s"])
def test_bad_slo_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        stats.parse_slo(text)


# ------------------------------------------------------------------ prompts


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "one", "output_tokens": 5}\n'
        "# a comment\n"
        '{"messages": [{"role": "user", "content": "two"}]}\n'
    )
    prompts = load_jsonl(path, output_len=9)
    assert [(p.text, p.output_tokens) for p in prompts] == [("one", 5), (None, 9)]
    assert prompts[1].chat_messages() == [{"role": "user", "content": "two"}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "p.jsonl:1: not JSON"),
        ('{"output_tokens": 3}', "exactly one of 'prompt'"),
        ('{"prompt": "x", "output_tokens": 0}', "positive integer"),
        ("[1, 2]", "expected an object"),
    ],
)
def test_bad_jsonl_lines_are_located(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(PromptError, match=message):
        load_jsonl(path, output_len=4)


def test_jsonl_prompts_reach_the_server(server, tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a b", "output_tokens": 3}\n{"prompt": "c", "output_tokens": 5}\n')
    target = Target(server.url, "fake")
    runs = asyncio.run(Runner(target, load_jsonl(path, 4), Options(scrape_metrics=False))
                       .run([Step(concurrency=1, requests=2)]))
    assert [r.output_tokens for r in runs[0].results] == [3, 5]


def test_synthetic_prompts_are_calibrated_with_the_server_tokenizer(server) -> None:
    tokenizer = server_tokenizer(Target(server.url, "fake"))
    assert tokenizer is not None
    tokenize, detokenize = tokenizer
    prompts = synthetic_prompts(3, 17, 2, 5, tokenize, detokenize)
    assert [len(tokenizer[0](p.text or "")) for p in prompts] == [17, 17, 17]


def test_without_a_tokenizer_prompts_count_words() -> None:
    assert server_tokenizer(Target(f"http://127.0.0.1:{free_port()}", "x")) is None


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


# ------------------------------------------------------------------ GPUs, loads, tunnel


def test_gpu_sampler_reads_nvidia_smi_lines() -> None:
    from cli.bench.gpu import GpuSampler, summarize_gpus

    script = (
        "import time\n"
        "for i in range(3):\n"
        "    print(f'0, {50 + 10 * i}, {1000 + i}, 24564', flush=True)\n"
        "    print('1, [N/A], [N/A], [N/A]', flush=True)\n"
        "    time.sleep(0.05)\n"
    )

    async def sample() -> GpuSampler:
        sampler = GpuSampler([sys.executable, "-c", script])
        await sampler.start()
        await asyncio.sleep(0.5)
        await sampler.stop()
        return sampler

    sampler = asyncio.run(sample())
    summary = summarize_gpus(sampler.samples)
    assert summary == {"0": {"util_mean": 60.0, "util_max": 70.0, "mem_used_max_mib": 1002.0,
                             "mem_total_mib": 24564.0, "samples": 3}}


@pytest.mark.parametrize(
    ("text", "loads"),
    [("4", [4]), ("1,2,8", [1, 2, 8]), ("1..8", [1, 2, 4, 8]), ("2..10", [2, 4, 8, 10])],
)
def test_loads(text: str, loads: list[int]) -> None:
    from cli.bench.runner import parse_loads

    assert parse_loads(text) == loads


@pytest.mark.parametrize("text", ["0", "8..2", "a,b", ""])
def test_bad_loads_are_refused(text: str) -> None:
    from cli.bench.runner import parse_loads

    with pytest.raises(ValueError):
        parse_loads(text)


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
