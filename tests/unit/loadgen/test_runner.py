"""The load generator (:mod:`loadgen`) against a server whose timing the test controls.

The fake server (:mod:`tests.support.fakeserver`) runs in this process and notes the moment it
writes each token, so the measured TTFT, ITL, TPOT and E2E must match those moments: a client
moment no earlier than the write and at most the delivery time after it (0.12 s, below the 0.2 s
between the first token and the last), a mean gap within 12 ms of the written one (a wrong
definition is off by a ratio: a per-chunk TPOT with three tokens a chunk is 3.4 × too large).
The script's delays are not the truth: a busy machine's sleeps overshoot.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

import pytest

from cli.bench.tunnel import free_port
from loadgen.gpu import GpuSampler, summarize_gpus
from loadgen.prompts import load_jsonl, synthetic_prompts
from loadgen.runner import Options, Runner, Step, Target, parse_loads, server_tokenizer
from loadgen.timing import RequestResult
from tests.support.fakeserver import FakeServer
from tests.support.loadsteps import (
    CHUNKS,
    GAP_TOLERANCE,
    SCRIPT,
    delivered,
    mean_gap,
    one,
    run_steps,
)


@pytest.fixture(scope="module")
def server():
    with FakeServer() as fake:
        yield fake


def assert_first_token_seen(result: RequestResult, written: list[float]) -> None:
    """The TTFT ends when the first token arrived: not before it was written, soon after."""
    assert result.ttft is not None, result
    seen = result.start + result.ttft
    assert delivered(seen, written[0]), (
        f"TTFT {result.ttft:.3f} s; the server wrote the first token at "
        f"{written[0] - result.start:.3f} s, the last at {written[-1] - result.start:.3f} s")


@pytest.fixture(scope="module")
def timed(server) -> tuple[RequestResult, list[float]]:
    result = one(server.url, SCRIPT)
    return result, server.token_moments[-1]


def test_ttft_is_the_moment_of_the_first_token(timed) -> None:
    result, written = timed
    assert result.ok, result.detail
    assert_first_token_seen(result, written)


def test_itl_is_the_gap_between_token_chunks(timed) -> None:
    result, written = timed
    assert len(result.itl) == CHUNKS - 1
    assert statistics.mean(result.itl) == pytest.approx(mean_gap(written), abs=GAP_TOLERANCE)


def test_e2e_ends_at_the_last_token(timed) -> None:
    result, written = timed
    assert result.e2e is not None, result
    assert delivered(result.start + result.e2e, written[-1]), (result.e2e, written, result.start)


def test_tpot_divides_by_output_tokens_minus_one(timed) -> None:
    result, written = timed
    assert result.output_tokens == CHUNKS
    assert result.tpot == pytest.approx(mean_gap(written), abs=GAP_TOLERANCE)


def test_output_tokens_come_from_usage_not_chunks(server) -> None:
    result = one(server.url, f"{SCRIPT},tokens_per_chunk=3")
    written = server.token_moments[-1]
    assert result.chunks == CHUNKS
    assert result.output_tokens == 3 * CHUNKS
    assert result.usage_reported
    # six chunks of three tokens: the span of the chunks over 17 gaps, not over 5 (3.4 × more)
    expected = (written[-1] - written[0]) / (3 * CHUNKS - 1)
    assert result.tpot == pytest.approx(expected, abs=GAP_TOLERANCE / 4)


def test_without_usage_chunks_are_counted_and_flagged(server) -> None:
    result = one(server.url, f"{SCRIPT},usage=0,tokens_per_chunk=3")
    assert result.ok and not result.usage_reported
    assert result.output_tokens == CHUNKS


def test_role_only_and_empty_chunks_do_not_count(server) -> None:
    result = one(server.url, f"{SCRIPT},role_chunk=1,empty_chunks=1", api="chat")
    written = server.token_moments[-1]
    assert result.ok, result.detail
    assert result.chunks == CHUNKS
    # the role chunk comes at once: a TTFT taken there is before the first token was written
    assert_first_token_seen(result, written)
    assert len(result.itl) == CHUNKS - 1
    # the mean gap, (last token - first) / (n - 1): a chunk read late on a busy machine shortens
    # the next gap by what it lengthens its own, so the mean holds where a minimum would not
    assert statistics.mean(result.itl) == pytest.approx(mean_gap(written), abs=GAP_TOLERANCE)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_chunks_count_only_when_they_carry_a_token(server, api: str) -> None:
    """vLLM streams a chunk with an empty text for a token that is part of a character not
    complete yet: it is a token (TTFT and ITL see it); a chunk with no choice or an empty
    delta is not."""
    result = one(server.url, f"{SCRIPT},blank_tokens=1,empty_chunks=1", api=api)
    written = server.token_moments[-1]
    assert result.ok, result.detail
    assert result.chunks == CHUNKS
    assert_first_token_seen(result, written)
    assert len(result.itl) == CHUNKS - 1
    assert statistics.mean(result.itl) == pytest.approx(mean_gap(written), abs=GAP_TOLERANCE)


def test_chat_request_is_timed_like_completions(server) -> None:
    result = one(server.url, SCRIPT, api="chat")
    written = server.token_moments[-1]
    assert_first_token_seen(result, written)
    assert result.tpot == pytest.approx(mean_gap(written), abs=GAP_TOLERANCE)


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


def test_warmup_requests_are_excluded(server) -> None:
    runs = run_steps(server.url, "chunks=2", [Step(concurrency=2, requests=5, warmup=3)])
    assert len(runs[0].results) == 5 and len(runs[0].warmup) == 3
    assert all(r.warmup for r in runs[0].warmup) and not any(r.warmup for r in runs[0].results)


def test_concurrency_is_held(server) -> None:
    """Four at once, never five, judged by each request's start and end (not by wall times,
    which a busy machine stretches)."""
    runs = run_steps(server.url, "ttft=0.2,chunks=1", [Step(concurrency=4, requests=8)])
    results = runs[0].results
    assert len(results) == 8 and all(r.ok for r in results)
    first_done = min(r.done for r in results)
    assert sum(r.start < first_done for r in results) == 4  # four at once, before any ended
    for r in results:  # and a fifth only when one of them ended
        assert sum(o.start <= r.start < o.done for o in results) <= 4


def test_rate_mode_sends_poisson_arrivals(server) -> None:
    """10 a second for 3 s: gaps of 0.1 s on average. (40 a second once measured 0.056 s
    with other processes keeping both cores busy: the loop's lateness, not the schedule.)"""
    runs = run_steps(server.url, "chunks=1", [Step(rate=10, requests=30)],
                     options=Options(timeout=10, seed=3, scrape_metrics=False))
    results = runs[0].results
    assert len(results) == 30 and all(r.ok for r in results)
    starts = sorted(r.start for r in results)
    mean_gap = (starts[-1] - starts[0]) / (len(starts) - 1)
    assert mean_gap == pytest.approx(1 / 10, rel=0.5)


def test_duration_mode_stops_starting_requests(server) -> None:
    """Requests start until the duration is over and none after it, however long each takes
    (a busy machine once let only 2 of 50 ms requests fit in 0.5 s)."""
    runs = run_steps(server.url, "ttft=0.05,chunks=1",
                     [Step(concurrency=1, duration=0.5)])
    results = runs[0].results
    assert results and all(r.ok for r in results)
    began = min(r.start for r in results)
    assert all(r.start < began + 0.5 + 0.05 for r in results)  # none started after it
    assert max(r.done for r in results) >= began + 0.5 - 0.05  # and none stopped early


def test_api_key_is_sent_as_bearer_token() -> None:
    with FakeServer(api_key="k-123") as fake:
        good = run_steps(fake.url, "chunks=2", [Step(concurrency=1, requests=1)], key="k-123")
        bad = run_steps(fake.url, "chunks=2", [Step(concurrency=1, requests=1)])
    assert good[0].results[0].ok
    assert bad[0].results[0].error == "http_401"


# ------------------------------------------------------------------ prompts at the server


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


# ------------------------------------------------------------------ GPUs, loads


def test_gpu_sampler_reads_nvidia_smi_lines() -> None:
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
        assert await sampler.ended(60), "the sampled command did not end"
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
    assert parse_loads(text) == loads


@pytest.mark.parametrize("text", ["0", "8..2", "a,b", ""])
def test_bad_loads_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_loads(text)
