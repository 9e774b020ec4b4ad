"""The canary gate's measurement and decision (hostside/canary.py), against real streaming
servers whose timing is known (tests/support/fakeserver.py): a slower one fails the gate, an
equal one passes, both figures are printed either way."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from hostside import ROOT_DIR, canary, program_files
from hostside.canary import Figures, verdict
from loadgen.timing import RequestResult, StreamTimer
from tests.support.fakeserver import FakeServer, Script


@pytest.mark.parametrize(
    ("new", "old", "ok", "words"),
    [
        (Figures(10.0, 5.0), Figures(10.0, 5.0), True, "passed: TTFT +0 % (margin 25 %)"),
        (Figures(12.4, 6.2), Figures(10.0, 5.0), True, "TPOT +24 % (margin 25 %)"),
        (Figures(5.0, 2.0), Figures(10.0, 5.0), True, "passed: TTFT -50 %"),
        (Figures(13.0, 5.0), Figures(10.0, 5.0), False,
         "failed: TTFT P50 13.0 ms against 10.0 ms (+30 %, margin 25 %)"),
        (Figures(10.0, 9.0), Figures(10.0, 5.0), False,
         "failed: TPOT P50 9.00 ms against 5.00 ms (+80 %, margin 25 %)"),
        (Figures(30.0, 9.0), Figures(10.0, 5.0), False, "against 10.0 ms (+200 %, margin 25 %); "
         "TPOT P50 9.00 ms against 5.00 ms"),
        # slower by more than the margin, but by less than the floor (2 ms): noise of tiny figures
        (Figures(1.9, 0.9), Figures(0.5, 0.3), True, "passed: TTFT +280 %"),
    ],
)  # fmt: skip
def test_verdict(new: Figures, old: Figures, ok: bool, words: str) -> None:
    got_ok, got_words = verdict(new, old, ttft_margin=0.25, tpot_margin=0.25, floor_ms=2.0)
    assert got_ok is ok
    assert words in got_words


def test_a_zero_margin_and_floor_fails_any_slowdown() -> None:
    assert not verdict(Figures(10.1, 5.0), Figures(10.0, 5.0), 0, 0, 0)[0]
    assert verdict(Figures(10.0, 5.0), Figures(10.0, 5.0), 0, 0, 0)[0]


def test_the_stream_timing_counts_usage_tokens_not_chunks() -> None:
    stream = [
        (1.2, b'data: {"choices": [{"text": "ab"}]}'),
        (1.8, b'data: {"choices": [{"text": "cd", "finish_reason": "length"}]}'),
        (1.8, b'data: {"choices": [], "usage": {"completion_tokens": 4}}'),
        (1.8, b"data: [DONE]"),
    ]
    ttft, tpot = canary.timed(stream, 1.0)
    assert ttft == pytest.approx(0.2)
    assert tpot == pytest.approx(0.2)  # (1.8 - 1.2) / (4 - 1)


def test_a_stream_error_is_a_canary_error() -> None:
    with pytest.raises(canary.CanaryError, match="error"):
        canary.timed([(1.0, b'data: {"error": {"message": "boom"}}')], 0.0)


def _run(new: FakeServer, old: FakeServer, *extra: str) -> int:
    return canary.main([
        "--label", "tiny/a/new", "--new", new.url, "--old", f"tiny/b/old={old.url}",
        "--model", "tiny", "--requests", "4", "--input-len", "8", "--output-len", "6", *extra,
    ])  # fmt: skip


def test_a_replica_with_a_slower_first_token_fails_with_both_figures(capsys) -> None:
    with (
        FakeServer(script=Script(ttft=0.2, itl=0.002)) as new,
        FakeServer(script=Script(ttft=0.01, itl=0.002)) as old,
    ):
        assert _run(new, old) == 1
        assert new.requests == old.requests == 5  # one warm-up, then the same prompts
    out = capsys.readouterr().out
    assert "tiny/a/new (new configuration): TTFT P50 " in out
    assert "tiny/b/old (old configuration): TTFT P50 " in out
    assert out.strip().splitlines()[-1].split(": ", 2)[2].startswith("failed: TTFT P50 ")


def test_an_equal_replica_passes(capsys) -> None:
    script = Script(ttft=0.01, itl=0.003)
    with FakeServer(script=script) as new, FakeServer(script=script) as old:
        # generous margins: the two servers are equal, the host's load is not
        assert _run(new, old, "--ttft-margin", "1", "--tpot-margin", "1", "--floor-ms", "20") == 0
    out = capsys.readouterr().out
    assert "(new configuration): TTFT P50" in out and "(old configuration): TTFT P50" in out
    assert ": passed: TTFT" in out


def test_the_key_is_read_from_the_file_and_sent(tmp_path, capsys) -> None:
    key_file = tmp_path / "router.env"
    key_file.write_text('VLLM_API_KEY="k 1"\n')
    with FakeServer(api_key="k 1") as new, FakeServer(api_key="k 1") as old:
        assert _run(new, old, "--key-file", str(key_file)) == 0
    with FakeServer(api_key="k 1") as new, FakeServer(api_key="k 1") as old:
        assert _run(new, old) == 2  # no key: HTTP 401, nothing measured
    assert "could not measure: tiny/a/new: HTTP 401" in capsys.readouterr().out


def test_no_old_replica_answering_skips_the_canary(capsys) -> None:
    with FakeServer() as new:
        assert canary.main([
            "--label", "tiny/a/new", "--new", new.url, "--old", "tiny/b/old=http://127.0.0.1:9",
            "--model", "tiny",
        ]) == 0  # fmt: skip
        assert new.requests == 0
    assert "skipped: no replica on the old configuration answers" in capsys.readouterr().out


def test_the_canary_runs_from_its_uploaded_files_alone(tmp_path) -> None:
    """The host's layout: only what the deploy uploads (hostside/ and loadgen/'s core) below one
    folder, run by its file with an isolated python (no checkout, no PYTHONPATH)."""
    for relative in program_files("canary"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT_DIR / relative, tmp_path / relative)
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "hostside" / "canary.py"), "--label", "t/a/new",
         "--new", "http://127.0.0.1:9", "--old", "t/b/old=http://127.0.0.1:9", "--model", "m"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "skipped: no replica on the old configuration answers" in result.stdout
    assert (tmp_path / "loadgen" / "timing.py").is_file()
    assert not (tmp_path / "loadgen" / "client.py").exists()  # aiohttp's part stays home


def test_the_canary_times_a_stream_as_fleet_bench_does() -> None:
    """One definition: the canary's figures are loadgen's StreamTimer's on the same stream."""
    stream = [
        (1.2, b'data: {"choices": [{"text": ""}]}'),  # a token whose character is not complete
        (1.5, b'data: {"choices": [{"text": "ab"}]}'),
        (1.9, b'data: {"choices": [], "usage": {"completion_tokens": 5}}'),
    ]
    timer = StreamTimer(RequestResult(start=1.0))
    for at, line in stream:
        timer.data(line[5:].strip(), at)
    bench = timer.finish()
    assert canary.timed(stream, 1.0) == (bench.ttft, bench.tpot)
    assert bench.ttft == pytest.approx(0.2) and bench.tpot == pytest.approx(0.3 / 4)
