"""Time to ready from a server's own log lines: a real vLLM CPU 0.32 start of the tiny test
model (``tests/data/vllm-startup/cpu-v032-tiny.log``, captured on this machine with arrival
timestamps), and GPU-only lines written from vLLM 0.32's own format strings (named as such)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cli.status.startup import PHASES, split_line, starts

LOG = Path(__file__).resolve().parents[2] / "data" / "vllm-startup" / "cpu-v032-tiny.log"
DATA_JOURNAL = LOG.with_name("sandbox-cpu-v032-bench.journal.txt")
REAL = LOG.read_bytes().decode().rstrip("\n").split("\n")  # tqdm's "\r" stays inside its line


def shifted(lines: list[str], seconds: float) -> list[str]:
    """The same lines, ``seconds`` later (a second start of the same server)."""
    out = []
    for line in lines:
        stamp, _, rest = line.partition(" ")
        when = datetime.fromisoformat(stamp) + timedelta(seconds=seconds)
        out.append(f"{when.isoformat()} {rest}")
    return out


def systemd(stamp: str, text: str) -> str:
    return f"{stamp} e2e-vllm systemd[1]: {text}"


def test_real_cpu_start_has_every_phase_a_cpu_build_logs() -> None:
    (start,) = starts(REAL)
    assert start.version == "0.32.0" and start.ready
    phases = start.phases
    assert phases["CUDA graph capture"] is None  # the CPU build captures no graph
    logged = [p for p in PHASES if p != "CUDA graph capture"]
    assert all(phases[p] is not None and phases[p] >= 0 for p in logged), phases
    # the weights load in the worker's own figure's range ("Loading weights took 0.01 seconds",
    # after "Initializing model took 0.08 seconds")
    assert phases["weight loading"] < 1
    assert start.total_s == pytest.approx(sum(phases[p] for p in logged), abs=0.05)


def test_each_start_of_a_journal_is_kept_oldest_first() -> None:
    first = [systemd(REAL[0].split()[0], "Starting vllm-tiny.service - vLLM server tiny"), *REAL]
    second = shifted(first, 3600)
    found = starts([*first, systemd(second[0].split()[0], "Stopped vllm-tiny.service"), *second])
    assert len(found) == 2
    assert found[0].began_at < found[1].began_at
    assert found[0].total_s == found[1].total_s


def test_start_under_way_is_not_ready() -> None:
    cut = next(i for i, line in enumerate(REAL) if "Application startup complete" in line)
    (start,) = starts(REAL[:cut])
    assert not start.ready and start.total_s is None
    assert start.phases["API server"] is None and start.phases["weight loading"] is not None


#: GPU-only messages, written from vLLM 0.32's format strings (gpu_model_runner.py "Model
#: loading took %s GiB memory and %.6f seconds", gpu_worker.py "Available KV cache memory: %s
#: GiB", kv_cache_utils.py "%s KV cache size: %s tokens, …", gpu_model_runner.py "Graph
#: capturing finished in %.0f secs, took %.2f GiB", core.py "init engine (profile, create kv
#: cache, warmup model) took %.2f s"), not captured from a GPU.
GPU_LINES = [
    "2026-12-01T10:00:00.000000+00:00 h systemd[1]: Starting vllm-chat.service - vLLM server",
    "2026-12-01T10:00:20.000000+00:00 h python[7]: (APIServer pid=7) INFO 12-01 10:00:20 "
    "[api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0",
    "2026-12-01T10:00:30.000000+00:00 h python[7]: (Worker pid=9) INFO 12-01 10:00:30 "
    "[gpu_model_runner.py:5100] Starting to load model /m...",
    "2026-12-01T10:01:10.000000+00:00 h python[7]: (Worker pid=9) INFO 12-01 10:01:10 "
    "[gpu_model_runner.py:5150] Model loading took 15.26 GiB memory and 39.812345 seconds",
    "2026-12-01T10:02:00.000000+00:00 h python[7]: (Worker pid=9) INFO 12-01 10:02:00 "
    "[gpu_worker.py:760] Available KV cache memory: 108.4 GiB",
    "2026-12-01T10:02:01.000000+00:00 h python[7]: (EngineCore pid=8) INFO 12-01 10:02:01 "
    "[kv_cache_utils.py:2328] GPU KV cache size: 789,000 tokens, Maximum concurrency for "
    "8,192 tokens per request: 96.31x",
    "2026-12-01T10:02:30.000000+00:00 h python[7]: (Worker pid=9) INFO 12-01 10:02:30 "
    "[gpu_model_runner.py:6582] Graph capturing finished in 25 secs, took 0.53 GiB",
    "2026-12-01T10:02:31.000000+00:00 h python[7]: (EngineCore pid=8) INFO 12-01 10:02:31 "
    "[core.py:402] init engine (profile, create kv cache, warmup model) took 81.20 s",
    "2026-12-01T10:02:35.000000+00:00 h python[7]: INFO:     Application startup complete.",
    '2026-12-01T10:02:36.000000+00:00 h python[7]: INFO:     127.0.0.1:5 - "POST '
    '/v1/completions HTTP/1.1" 200 OK',
]


def test_gpu_start_splits_graph_capture_from_kv_cache() -> None:
    (start,) = starts(GPU_LINES)
    assert start.phases == {
        "process start": 30.0, "weight loading": 40.0, "compile + profile": 50.0,
        "KV cache + warmup": 6.0, "CUDA graph capture": 25.0, "API server": 4.0,
        "first completion": 1.0,
    }  # fmt: skip
    assert start.total_s == 156.0


def test_lines_without_a_timestamp_are_skipped() -> None:
    assert split_line("-- No entries --") is None
    assert starts(["-- No entries --"]) == []


def test_real_journal_of_a_deployed_server() -> None:
    """``journalctl -u vllm-bench.service -o short-iso-precise`` on the e2e sandbox host, after
    the deploy (its readiness check is the first completion) and the bench ladder."""
    journal = DATA_JOURNAL.read_bytes().decode().split("\n")
    (start,) = starts(journal)
    assert start.began_at.startswith("2026-12-01T12:35:58") and start.version == "0.32.0"
    assert start.phases == {
        "process start": 27.9, "weight loading": 0.07, "compile + profile": 0.73,
        "KV cache + warmup": 0.49, "CUDA graph capture": None, "API server": 0.88,
        "first completion": 0.5,
    }  # fmt: skip
    assert start.total_s == 30.57
